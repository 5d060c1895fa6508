"""Child tables without a key of their own (event logs, with duplicate rows) in the automatic
template: their rows are encoded inside the aggregates that read them, so the network reads them
(before, such a table was "not reachable" and only the GBM's one-hop features counted it); under a
time column, only rows earlier than the target row's time reach its prediction. Checked on a
planted signal (the label is the number of visits) and against copies of the database whose
later rows, or earlier ones, are changed."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pytest
import torch

import relsql

CUSTOMERS = 240


def _rows(seed: int = 0) -> tuple[list, list]:
    """customer(id, snapshot, age, churned), visits(customer_id, seen, page, seconds): churned = fewer
    than 3 visits before the snapshot; each customer also has visits after it (noise for the
    label), and some visits are exact duplicates (the table has no key)."""
    rng = np.random.default_rng(seed)
    customers, visits = [], []
    for c in range(CUSTOMERS):
        snapshot = dt.date(2024, 6, 1) + dt.timedelta(days=int(rng.integers(0, 60)))
        before = int(rng.integers(0, 7))
        for _ in range(before):
            row = (c, snapshot - dt.timedelta(days=int(rng.integers(1, 200))), str(rng.choice(["home", "cart", "faq"])),
                   float(rng.gamma(2.0, 30.0)))
            visits.append(row)
            if rng.random() < 0.2:
                visits.append(row)  # an exact duplicate: no key can name the rows
        for _ in range(int(rng.integers(0, 7))):
            visits.append((c, snapshot + dt.timedelta(days=int(rng.integers(1, 100))), "home", float(rng.gamma(2.0, 30.0))))
        customers.append((c, snapshot, float(rng.integers(18, 80)), before < 3))
    return customers, visits


def _database(path, customers, visits) -> relsql.Database:
    db = relsql.connect(path)
    db.execute("""
        CREATE TABLE customer(id INT PRIMARY KEY, snapshot DATE, age DOUBLE, churned BOOLEAN);
        CREATE TABLE visits(customer_id INT REFERENCES customer(id), seen DATE, page VARCHAR, seconds DOUBLE);""")
    db.con.executemany("INSERT INTO customer VALUES (?, ?, ?, ?)", customers)
    db.con.executemany("INSERT INTO visits VALUES (?, ?, ?, ?)", visits)
    return db


@pytest.fixture(scope="module")
def shop(tmp_path_factory):
    customers, visits = _rows()
    db = _database(tmp_path_factory.mktemp("keyless") / "shop.duckdb", customers, visits)
    yield db, customers, visits
    db.con.close()


def test_a_keyless_child_table_is_read_by_the_network(shop):
    db, _, _ = shop
    template = relsql.Template.auto(db, target="customer.churned")
    assert "left out (not reachable" not in template.source
    assert 'JOIN "visits" y ON y."customer_id" = p."id"' in template.source
    assert "no key of its own" in template.source
    model = relsql.Model(db, template, target="customer.churned", seed=0, dtype=torch.float64, progress=False)
    model.fit(hybrid=False, epochs=150)
    # without a time column every visit counts, the later ones too: the count still orders the label
    assert model.evaluate("test")["roc_auc"] > 0.8  # the customer's own columns alone carry no signal


def test_only_visits_before_the_snapshot_reach_a_prediction(shop, tmp_path):
    db, customers, visits = shop
    options = {"time_column": "snapshot", "time_columns": {"visits": "seen"}}
    template = relsql.Template.auto(db, target="customer.churned", **options)
    assert 'y."seen" < p."snapshot"' in template.source
    model = relsql.Model(db, template, target="customer.churned", seed=0, dtype=torch.float64, progress=False,
                         time_column="snapshot")
    model.fit(hybrid=False, epochs=150, refit=False)  # the selected model: a refit saturates some past a 1e-6 move
    assert model.evaluate("test")["roc_auc"] > 0.9  # the planted count, before the snapshot
    model.save(tmp_path / "m.pt")
    expected = model.predict().sort("id")["probability"].to_numpy()
    snapshots = {c: s for c, s, _, _ in customers}
    later = [(c, at, "cart", s * 10) if at > snapshots[c] else (c, at, p, s) for c, at, p, s in visits]
    later += [(c, snapshots[c] + dt.timedelta(days=3), "faq", 1.0) for c in range(0, CUSTOMERS, 2)]
    changed = _database(tmp_path / "later.duckdb", customers, later)
    found = relsql.Model.load(tmp_path / "m.pt", changed).predict().sort("id")["probability"].to_numpy()
    changed.con.close()
    assert np.allclose(found, expected, rtol=0, atol=1e-12)  # later visits, changed or added, move nothing
    earlier = visits + [(c, snapshots[c] - dt.timedelta(days=3), "faq", 1.0) for c in range(0, CUSTOMERS, 2)]
    moved = _database(tmp_path / "earlier.duckdb", customers, earlier)
    again = relsql.Model.load(tmp_path / "m.pt", moved).predict().sort("id")["probability"].to_numpy()
    moved.con.close()
    assert np.abs(again - expected)[0::2].min() > 1e-6  # an earlier visit more moves every such customer
    assert np.allclose(again[1::2], expected[1::2], rtol=0, atol=1e-12)  # and no other
