"""One-row laterals (`CROSS JOIN LATERAL (SELECT e AS a) x`, Template.auto's event ages) are read as
their expressions before grounding (relsql.sql.inline_laterals): the rows DuckDB returns are the
original query's, and a lateral stays wherever taking it out could change them."""

from __future__ import annotations

import datetime as dt

import duckdb
import numpy as np
import pytest
import sqlglot
import torch

import relsql
from relsql import sql as q
from relsql.ground import execute
from tests.tables import insert_rows


@pytest.fixture()
def con():
    con = duckdb.connect()
    con.execute("CREATE TABLE t(a INTEGER, d DATE); INSERT INTO t VALUES (1, '2020-01-01'), (2, '2021-06-01'), (3, NULL)")
    con.execute("CREATE TABLE u(a INTEGER, e DATE); INSERT INTO u VALUES (1, '2019-01-01'), (1, '2019-05-01'), (2, '2020-01-01')")
    return con


INLINED = [
    "SELECT t.a AS _h0, ag.age AS _c0, ag.two FROM t JOIN u ON u.a = t.a "
    "CROSS JOIN LATERAL (SELECT epoch(t.d) - epoch(u.e) AS age, 2 AS two) ag",
    "SELECT t.a, avg(ag.age + ag.age), max(ag.age) FROM t JOIN u ON u.a = t.a "
    "CROSS JOIN LATERAL (SELECT epoch(t.d) - epoch(u.e) AS age) ag WHERE ag.age > 0 GROUP BY t.a",
    "SELECT t.a, ag.age FROM t CROSS JOIN LATERAL (SELECT CASE WHEN t.d < DATE '2021-01-01' THEN 1 ELSE 0 END AS age) AS ag "
    "ORDER BY ag.age",
]
KEPT = [
    "SELECT t.a, age FROM t CROSS JOIN LATERAL (SELECT t.a * 2 AS age) ag",  # unqualified: could be another table's
    "SELECT t.a, ag.* FROM t CROSS JOIN LATERAL (SELECT t.a * 2 AS age) ag",
    "SELECT t.a, ag.s FROM t CROSS JOIN LATERAL (SELECT sum(u.a) AS s FROM u WHERE u.a = t.a) ag",  # rows of its own
    "SELECT t.a, ag.m FROM t CROSS JOIN LATERAL (SELECT max(t.a) AS m) ag",  # an aggregate
    "SELECT t.a, ag.r FROM t CROSS JOIN LATERAL (SELECT random() AS r) ag",  # a value per call
    "SELECT t.a, ag.b FROM t LEFT JOIN LATERAL (SELECT t.a AS b) ag ON TRUE",
    "SELECT t.a, ag.b, (SELECT count(*) FROM u WHERE u.a = ag.b) FROM t CROSS JOIN LATERAL (SELECT t.a AS b) ag",
    # laterals in a chain (one reads the other's names): neither is taken out
    "SELECT t.a, y.b + 1 FROM t CROSS JOIN LATERAL (SELECT t.a * 2 AS b) AS y CROSS JOIN LATERAL (SELECT y.b * 3 AS c) z",
]


def _rows(con, text: str) -> list:
    return sorted(con.execute(text).fetchall(), key=repr)


@pytest.mark.parametrize("text", INLINED)
def test_inlined_laterals_give_the_same_rows(con, text):
    out = q.inline_laterals(sqlglot.parse_one(text, read="duckdb")).sql("duckdb")
    assert "LATERAL" not in out.upper()
    assert _rows(con, out) == _rows(con, text)


@pytest.mark.parametrize("text", KEPT)
def test_laterals_that_could_change_the_rows_stay(text):
    tree = sqlglot.parse_one(text, read="duckdb")
    assert q.inline_laterals(tree.copy()).sql("duckdb") == tree.sql("duckdb")


def test_a_projected_lateral_column_keeps_its_name(con):
    out = q.inline_laterals(sqlglot.parse_one("SELECT ag.two FROM t CROSS JOIN LATERAL (SELECT 2 AS two) ag",
                                              read="duckdb")).sql("duckdb")
    assert [d[0] for d in con.execute(out).description] == ["two"]


def test_an_automatic_template_s_ages_ground_the_same(tmp_path, monkeypatch):
    path = tmp_path / "ages.duckdb"
    db = duckdb.connect(str(path))
    rng = np.random.default_rng(1)
    db.execute("CREATE TABLE item(item_id INTEGER PRIMARY KEY, created DATE, x DOUBLE, y DOUBLE)")
    db.execute("CREATE TABLE event(event_id INTEGER PRIMARY KEY, item_id INTEGER REFERENCES item(item_id), ts DATE, "
               "amount DOUBLE)")
    start = dt.date(2020, 1, 1)
    insert_rows(db, "item", [(i, start + dt.timedelta(days=int(rng.integers(0, 400))), float(rng.normal()),
                              float(rng.normal())) for i in range(60)])
    insert_rows(db, "event", [(e, int(rng.integers(0, 60)), start + dt.timedelta(days=int(rng.integers(0, 400))),
                               float(rng.normal())) for e in range(300)])
    db.close()
    db = relsql.connect(path)
    template = relsql.Template.auto(db, target="item.y", time_column="created")
    assert "CROSS JOIN LATERAL" in template.source
    inlined = execute.ground(template, db, progress=False)
    monkeypatch.setattr(q, "inline_laterals", lambda select: select)
    original = execute.ground(template, db, progress=False)
    compared = 0
    for name, relation in original.relations.items():
        other = inlined.relations[name]
        assert relation.keys.equals(other.keys)
        for a, b in zip(relation.rules, other.rules, strict=True):
            assert torch.equal(a.head, b.head) and all(torch.equal(x, y) for x, y in zip(a.refs, b.refs, strict=True))
            for k in a.columns:
                assert torch.equal(a.columns[k], b.columns[k])
                compared += 1
    assert compared > 0 and original.feature_stats == inlined.feature_stats
