"""Template.auto reads each leaf of its computation tree inside the statement that aggregates it for
its parent, not through an x_ relation of its own (relsql/template/auto/layers.py). The network is
the same: checked against the form that gives every leaf its x_ relation (`INLINE_LEAVES = False`,
the form whose groundings tests/test_auto_siblings.py checks against plain loops). In float64, with
the same weights, every output row agrees to 1e-12 on hostile databases (self-referencing keys both
ways, earlier siblings with their labels, parents with a time of their own, integer years, composite
keys, a keyless table, inferred keys), on RelBench's `<=` cut and on a ranking target's towers."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

import relsql
from relsql import relbench as rb
from relsql.template.auto import layers
from tests.test_auto_ranking import _shop as ranking_shop
from tests.test_auto_siblings import _relbench_db


def both_forms(monkeypatch, db, target: str, **options) -> tuple[relsql.Template, relsql.Template]:
    """(the template with leaves read in place, the same with an x_ relation per leaf)."""
    inlined = relsql.Template.auto(db, target, **options)
    with monkeypatch.context() as patch:
        patch.setattr(layers, "INLINE_LEAVES", False)
        separate = relsql.Template.auto(db, target, **options)
    return inlined, separate


def assert_same_network(db, inlined: relsql.Template, separate: relsql.Template, output: str) -> None:
    """Both templates compiled in float64, the separate form given the inlined form's weights (drawn
    at random, away from zero): the same weight names, the same values for every row of `output`."""
    a = relsql.compile(inlined, db, dtype=torch.float64, seed=1)
    b = relsql.compile(separate, db, dtype=torch.float64, seed=2)
    wa, wb = a.weights_by_name(), b.weights_by_name()
    assert set(wa) == set(wb)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name in sorted(wa):
            wa[name].copy_(torch.randn(wa[name].shape, generator=generator, dtype=torch.float64) * 0.5)
            wb[name].copy_(wa[name])
    left, right = a.values(output), b.values(output)
    assert left.height == right.height > 0
    keys = [c for c in left.columns if c != "value"]
    left, right = left.sort(keys), right.sort(keys)
    assert left.select(keys).equals(right.select(keys))
    np.testing.assert_allclose(np.array(left["value"].to_list()), np.array(right["value"].to_list()), rtol=0, atol=1e-12)


def created(template: relsql.Template) -> set[str]:
    return {name for name in template.relations if name.startswith("x_")}


# the conftest's `hostile` databases: two in the fast suite, three more in the slow one
HOSTILE_SEEDS = [0, 3, *(pytest.param(seed, marks=pytest.mark.slow) for seed in (5, 10, 11))]


def hostile_copy(manifest: dict, tmp_path) -> relsql.Database:
    """A connection to a copy of a hostile database (the session's file stays as generated)."""
    shutil.copy(manifest["path"], tmp_path / "db.duckdb")
    return relsql.connect(tmp_path / "db.duckdb", **({"keys": manifest["keys"]} if manifest.get("keys") else {}))


@pytest.mark.parametrize("seed", HOSTILE_SEEDS)
def test_hostile_databases_the_same_network_with_fewer_relations(monkeypatch, tmp_path, hostile, seed):
    manifest = hostile[seed]
    db = hostile_copy(manifest, tmp_path)
    for entry in manifest["targets"]:
        options = {"time_column": entry["time_column"]} if entry.get("time_column") else {}
        inlined, separate = both_forms(monkeypatch, db, entry["target"], **options)
        assert created(inlined) < created(separate), json.dumps(entry)  # every leaf's relation is gone
        leaves = created(separate) - created(inlined)
        assert all(f"-- {name[2:]}: the " in inlined.source for name in leaves)  # each still said where it is read
        assert_same_network(db, inlined, separate, "predict")


def test_relbench_cut_the_same_network(monkeypatch):
    db = _relbench_db()
    inlined, separate = both_forms(monkeypatch, db, "task.y", time_column="date", time_columns=rb.time_columns(db))
    assert "x_customers__orders" in separate.relations and "x_customers__orders" not in inlined.relations
    assert "at or before" in inlined.source
    assert_same_network(db, inlined, separate, "predict")


def test_ranking_towers_the_same_network(monkeypatch):
    db = relsql.connect()
    ranking_shop(db)
    inlined, separate = both_forms(monkeypatch, db, "task_rec.item_id", time_column="snapshot")
    assert created(inlined) < created(separate)
    assert_same_network(db, inlined, separate, "predict")


def test_a_leaf_timed_through_a_date_dimension_the_same_network(monkeypatch, tmp_path):
    """Sales with only a date key, one hop from the customer: a leaf whose time (and age) comes from
    date_dim, joined in the statement that aggregates it (alias yd)."""
    db = relsql.connect(tmp_path / "shop.duckdb")
    db.execute("""
        CREATE TABLE date_dim(d_date_sk INTEGER PRIMARY KEY, d_date DATE);
        CREATE TABLE customer(c_customer_sk INTEGER PRIMARY KEY, snapshot DATE, age DOUBLE, label BOOLEAN);
        CREATE TABLE sales(sale_id INTEGER PRIMARY KEY, customer_sk INTEGER REFERENCES customer(c_customer_sk),
                           sold_date_sk INTEGER REFERENCES date_dim(d_date_sk), amount DOUBLE);
        INSERT INTO date_dim SELECT i, DATE '2020-01-01' + INTERVAL (i) DAY FROM range(1, 400) t(i);
        INSERT INTO customer SELECT i, DATE '2020-03-01' + INTERVAL (i * 7) DAY, 20 + i, i % 2 = 0 FROM range(30) t(i);
        INSERT INTO sales SELECT i, i % 30, 1 + (i * 37) % 399, i % 11 FROM range(300) t(i);""")
    inlined, separate = both_forms(monkeypatch, db, "customer.label", hops=1, time_column="snapshot")
    assert created(inlined) == set() and created(separate) == {"x_sales"}
    assert 'JOIN "date_dim" yd ON yd."d_date_sk" = y."sold_date_sk" AND yd."d_date" < p."snapshot"' in inlined.source
    assert "epoch(yd.\"d_date\")" in inlined.source  # the sale's age, from its date dimension
    assert_same_network(db, inlined, separate, "predict")
