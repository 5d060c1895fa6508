"""Grounding a relation whose statements differ in shape: one temp table and one index query
serve all of them (relsql/ground/execute.py), so each statement's columns must keep their own
types, rows and encodings. Checked against a direct numpy evaluation of the same template."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import relsql
from relsql.compile.passes import RULES
from relsql.ground import execute

TEMPLATE = """
CREATE TABLE h AS SELECT n.id, linear(n.v, 3, 'wv') AS h FROM node n;
CREATE TABLE h AS SELECT n.id, linear(n.s, 3, 'ws') AS h FROM node n WHERE n.id > 1;
CREATE TABLE h AS SELECT n.id, embed(n.c, 3, 'ec') AS h FROM node n WHERE n.c IS NOT NULL;
CREATE TABLE h AS SELECT n.id, linear(features(n.f), 3, 'wf') AS h FROM node n;
CREATE TABLE agg AS SELECT e.dst AS id, sum(linear(x.h, 2, 'wa')) AS h FROM edge e JOIN h x ON x.id = e.src GROUP BY e.dst;
CREATE TABLE agg AS SELECT x.id, linear(x.h, 2, 'wb') AS h FROM h x;
"""

NODES = [  # id, v (list), s (scalar), c (category), f (numeric feature with a NULL)
    (1, [1.0, 0.0], 0.5, "a", 2.0),
    (2, [0.0, 2.0], -1.0, "b", None),
    (3, [1.0, 1.0], 2.0, "a", 4.0),
    (4, [3.0, -1.0], 0.0, None, 6.0),
]
EDGES = [(1, 2), (3, 2), (2, 3), (4, 1), (1, 1)]


@pytest.fixture
def db(tmp_path):
    db = relsql.connect(tmp_path / "g.duckdb")
    db.execute("CREATE TABLE node(id INT, v DOUBLE[], s DOUBLE, c VARCHAR, f DOUBLE); CREATE TABLE edge(src INT, dst INT)")
    for row in NODES:
        db.con.execute("INSERT INTO node VALUES (?, ?, ?, ?, ?)", list(row))
    db.con.executemany("INSERT INTO edge VALUES (?, ?)", EDGES)
    yield db
    db.con.close()


def expected(net) -> tuple[np.ndarray, np.ndarray]:
    """h and agg by id 1..4, straight from the template's definition."""
    w = {name: p.detach().numpy() for name, p in net.named_weights().items()}
    codes = {r["value"]: r["code"] for r in net.grounding.dictionaries["ec"].to_pylist()}
    present = np.array([f for *_, f in NODES if f is not None])
    mean, std = present.mean(), present.std()
    h = np.zeros((4, 3))
    for i, (node, v, s, c, f) in enumerate(NODES):
        h[i] += w["wv"] @ np.array(v)
        if node > 1:
            h[i] += w["ws"] @ np.array([s])
        if c is not None:
            h[i] += w["ec"][codes[c]]
        h[i] += w["wf"] @ np.array([0.0 if f is None else (f - mean) / std, float(f is None)])
    agg = h @ w["wb"].T
    for src, dst in EDGES:
        agg[dst - 1] += w["wa"] @ h[src - 1]
    return h, agg


@pytest.mark.parametrize("per_rule", [False, True], ids=["one-index-query", "query-per-rule"])
@pytest.mark.parametrize("passes", [(), RULES], ids=["plain", "optimized"])
def test_statements_of_different_shapes_ground_into_one_relation(db, passes, per_rule, monkeypatch):
    if per_rule:  # what a large relation gets: no query whose rows carry every rule's columns
        monkeypatch.setattr(execute, "PADDING_CELLS", 0)
    net = relsql.compile(relsql.Template.from_sql(TEMPLATE), db, dtype=torch.float64, seed=3, passes=passes)
    out = net()
    want_h, want_agg = expected(net)
    for name, want in (("h", want_h), ("agg", want_agg)):
        ids = net.grounding.relations[name].keys.column("id").to_pylist()
        assert sorted(ids) == [1, 2, 3, 4]
        got = out[name].detach().numpy()[np.argsort(ids)]
        assert np.allclose(got, want, atol=1e-12), name
    rules = net.grounding.relations["h"].rules
    assert [r.size for r in rules] == [4, 3, 3, 4]  # each statement keeps only its own rows


def test_a_failing_statement_is_named_in_the_error(db):
    bad = TEMPLATE.replace("linear(n.s, 3, 'ws') AS h FROM node n WHERE n.id > 1",
                           "linear(n.s, 3, 'ws') AS h FROM node n WHERE n.id > CAST(n.c AS INT)")
    with pytest.raises(relsql.RelsqlError, match=r"h, statement 2"):
        relsql.compile(relsql.Template.from_sql(bad), db)


@pytest.mark.smoke
@pytest.mark.parametrize("hidden", [False, True], ids=["visible", "hidden-literal"])
def test_datalog_facts_are_a_set_whatever_the_table_repeats(tmp_path, hidden):
    """A fact stored twice, or twice with different values of a column the literal does not use,
    is one fact: h(a) averages over the substitutions Y=b and Y=c, not over joined rows."""
    db = relsql.connect(tmp_path / "facts.duckdb")
    db.execute("CREATE TABLE e(src VARCHAR, dst VARCHAR, extra INT); CREATE TABLE n(id VARCHAR, value DOUBLE)")
    db.con.executemany("INSERT INTO e VALUES (?, ?, ?)", [("a", "b", 1), ("a", "b", 2), ("a", "c", 1), ("a", "b", 1)])
    db.con.executemany("INSERT INTO n VALUES (?, ?)", [("b", 2.0), ("c", 3.0), ("b", 2.0)])
    text = "h(X) :- {1,1} e(X, Y), *n(Y)." if hidden else "h(X) :- {1,1} e(X, Y), n(Y)."
    net = relsql.compile(relsql.Template.from_datalog(text), db, dtype=torch.float64, seed=1)
    (w,) = [float(p.detach()) for p in net.named_weights().values()]
    got = float(net()["h"].detach().reshape(-1)[0])
    assert got == pytest.approx(w if hidden else w + (2.0 + 3.0) / 2, abs=1e-12)  # a repeated row would shift it
    assert net.grounding.relations["h"].rules[0].size == 2
    db.con.close()
