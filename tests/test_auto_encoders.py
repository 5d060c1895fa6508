"""Template.auto's encoders (numbers="ple", the default): what each column kind becomes, the
earlier encoders kept under numbers="standardized", dropout, the head's direct read of the target
row, and the age of events at the target row's time in a temporal template."""

from __future__ import annotations

import re

import duckdb
import numpy as np
import pytest

import relsql
from relsql.errors import SchemaError
from tests.tables import insert_rows


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    """customer(level: 5 values, score: 40 values, joined DATE, vip BOOLEAN, city: 3 codes + 1 rare,
    note: long text) <- orders(amount, at DATE); label `recent`: the latest order is at most 30 days
    before the customer's snapshot (recency: only an event's age at the snapshot tells it)."""
    path = tmp_path_factory.mktemp("auto_encoders") / "shop.duckdb"
    con = duckdb.connect(str(path))
    rng = np.random.default_rng(0)
    n = 1200
    con.execute("CREATE TABLE customer(customer_id INTEGER PRIMARY KEY, level DOUBLE, score DOUBLE, joined DATE, "
                "vip BOOLEAN, city VARCHAR, note VARCHAR, snapshot DATE, recent BOOLEAN)")
    con.execute("CREATE TABLE orders(order_id INTEGER PRIMARY KEY, customer_id INTEGER REFERENCES customer(customer_id), "
                "amount DOUBLE, ordered DATE)")
    rows, orders, oid = [], [], 0
    for c in range(n):
        snapshot = np.datetime64("2025-01-01") + int(rng.integers(0, 300))
        gaps = rng.integers(1, 120, size=int(rng.integers(1, 5)))
        for g in gaps:
            orders.append((oid, c, float(rng.gamma(2, 10)), str(snapshot - int(g))))
            oid += 1
        city = "rare town" if c == 7 else ["north", "south", "east"][c % 3]
        rows.append((c, float(c % 5), float(rng.integers(0, 40)), str(np.datetime64("2020-01-01") + int(rng.integers(0, 1500))),
                     bool(c % 2), city, " ".join(f"w{int(w)}" for w in rng.integers(0, 3000, size=4)), str(snapshot),
                     bool(gaps.min() <= 30)))
    insert_rows(con, "customer", rows)
    insert_rows(con, "orders", orders)
    con.close()
    return relsql.connect(str(path))


def _encoder(source: str, table: str) -> str:
    return re.search(rf"CREATE TABLE enc_{table} AS\nSELECT .*?;", source, re.S).group(0)


def test_each_column_kind_gets_its_encoder(db):
    source = relsql.Template.auto(db, target="customer.recent", hops=1).source
    enc = _encoder(source, "customer")
    assert re.search(r"ple\(t\.\"level\", t\.\"score\", 8\)", enc)  # numbers cut into 8 ranges
    assert 'calendar(t."joined", t."snapshot")' in enc and 'features(t."vip")' in enc
    assert "embed(t.\"city\", 16, 'enc_customer_city', min_count=3)" in enc  # codes with a rare bucket
    assert "text(t.\"note\", 16" in enc  # long text, hashed
    assert "embed(t.\"level\"" in enc and "embed(t.\"score\"" not in enc  # 5 values: also a code; 40: a number only
    assert "linear(e.h, 1, 'w_out_own')" in source  # the head reads the target row's own encoding


def test_standardized_keeps_the_earlier_encoders_and_dropout_follows_each_layer(db):
    old = relsql.Template.auto(db, target="customer.recent", hops=1, numbers="standardized").source
    enc = _encoder(old, "customer")
    assert "features(t.\"level\", t.\"score\", t.\"joined\", t.\"vip\", t.\"snapshot\")" in enc
    assert "ple(" not in old and "calendar(" not in old and "min_count" not in old and "text(" not in old
    dropped = relsql.Template.auto(db, target="customer.recent", hops=1, dropout=0.2).source
    assert dropped.count("dropout(tanh(") == dropped.count("tanh(") > 0
    with pytest.raises(SchemaError, match="numbers must be one of"):
        relsql.Template.auto(db, target="customer.recent", numbers="raw")
    with pytest.raises(SchemaError, match="dropout must be"):
        relsql.Template.auto(db, target="customer.recent", dropout=1.0)


def test_a_temporal_template_encodes_each_events_age_and_learns_recency(db):
    tpl = relsql.Template.auto(db, target="customer.recent", time_column="snapshot", hops=1)
    assert "ln(1 + abs((epoch(r.\"snapshot\") - epoch(x.\"ordered\")) / 86400.0)) AS age" in tpl.source
    scores = {}
    for numbers in ("ple", "standardized"):
        tpl = relsql.Template.auto(db, target="customer.recent", time_column="snapshot", hops=1, numbers=numbers)
        model = relsql.Model(db, tpl, target="customer.recent", time_column="snapshot", seed=0, progress=False)
        model.fit(epochs=150, hybrid=False)
        scores[numbers] = model.evaluate()["roc_auc"]
    # the dates alone (standardized epoch seconds of each order and of the snapshot) leave recency to
    # a difference the network must find; the age gives it directly
    assert scores["ple"] > 0.9 and scores["ple"] > scores["standardized"] + 0.02, scores


def test_events_two_hops_away_in_a_temporal_template_ground(db, tmp_path):
    """Event rows two hops away carry their age too (issue 44: the statement joins the target table
    again for its time): the visit's lines, and the store's earlier visits (the visit's siblings);
    the template grounds and trains."""
    con = duckdb.connect(str(tmp_path / "two_hops.duckdb"))
    con.execute("CREATE TABLE store(store_id INTEGER PRIMARY KEY, size DOUBLE)")
    con.execute("CREATE TABLE visit(visit_id INTEGER PRIMARY KEY, store_id INTEGER REFERENCES store(store_id), "
                "seen DATE, label BOOLEAN)")
    con.execute("CREATE TABLE line(line_id INTEGER PRIMARY KEY, visit_id INTEGER REFERENCES visit(visit_id), "
                "qty DOUBLE, seen DATE)")
    con.execute("INSERT INTO store SELECT i, i % 7 FROM range(20) r(i)")
    con.execute("INSERT INTO visit SELECT i, i % 20, DATE '2025-01-01' + (i % 90)::INTEGER, i % 3 = 0 FROM range(300) r(i)")
    con.execute("INSERT INTO line SELECT i, i % 300, i % 5, DATE '2025-01-01' + (i % 80)::INTEGER FROM range(900) r(i)")
    con.close()
    two = relsql.connect(str(tmp_path / "two_hops.duckdb"))
    tpl = relsql.Template.auto(two, target="visit.label", time_column="seen", time_columns={"line": "seen"}, hops=2)
    assert tpl.source.count("CROSS JOIN LATERAL") == 2  # the lines, and the store's earlier visits two hops away
    assert "x_store__visit" in tpl.source
    model = relsql.Model(two, tpl, target="visit.label", time_column="seen", seed=0, progress=False)
    assert len(model.fit(epochs=3, hybrid=False).history) == 3
