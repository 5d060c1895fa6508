"""Typed linears, linear(x, d, 'name', t.type): one matrix per value of a categorical column.
Checked against a hand computation per grounding, in mini-batches, saved and loaded, and with
a type the model never saw (PyG's RGCNConv is the oracle in tests/test_pyg_oracle.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import relsql

ROOT = Path(__file__).resolve().parent.parent
TYPED = """
CREATE TABLE node_x AS SELECT n.id, n.x AS h FROM node n;
CREATE TABLE layer AS
SELECT e.dst AS id, sum(linear(s.h, 3, 'w', e.kind)) AS h
FROM edge e JOIN node_x s ON s.id = e.src
GROUP BY e.dst;
CREATE TABLE layer AS SELECT n.id, linear(n.x, 3, 'root') AS h FROM node n;
CREATE TABLE out AS SELECT l.id, linear(relu(l.h), 1, 'out') AS h FROM layer l;
"""


def graph(path=None) -> relsql.Database:
    db = relsql.connect(path) if path else relsql.connect()
    db.execute("CREATE TABLE node AS SELECT i AS id, [sin(i), cos(i * 0.3)] AS x, i % 3 = 0 AS y FROM range(60) t(i)")
    db.execute("CREATE TABLE edge AS SELECT (i * 7) % 60 AS src, (i * 11 + 1) % 60 AS dst, "
               "['bond', 'ring', 'link'][1 + i % 3] AS kind FROM range(200) t(i)")
    return db


def test_typed_linear_picks_the_matrix_of_each_groundings_type():
    db = graph()
    net = relsql.compile(relsql.Template.from_sql(TYPED), db, dtype=torch.float64, seed=1)
    weights = net.weights_by_name()
    assert tuple(weights["w"].shape) == (3, 3, 2)  # (types, out, in)
    codes = dict(zip(net.grounding.dictionaries["w"].column("value").to_pylist(),
                     net.grounding.dictionaries["w"].column("code").to_pylist()))
    assert sorted(codes) == ["bond", "link", "ring"]
    named = net.named_weights()  # one matrix per type, named by its value; writing into one sets it
    assert sorted(named) == ["out", "root", "w[bond]", "w[link]", "w[ring]"]
    with torch.no_grad():
        for kind in codes:
            named[f"w[{kind}]"].copy_(torch.full((3, 2), float(len(kind) + codes[kind])))
    for kind, code in codes.items():
        assert torch.equal(weights["w"][code], torch.full((3, 2), float(len(kind) + code), dtype=torch.float64))
    out = net()["layer"]
    x = torch.tensor(db.con.execute("SELECT x FROM node ORDER BY id").fetchall(), dtype=torch.float64).reshape(60, 2)
    edges = db.con.execute("SELECT src, dst, kind FROM edge").fetchall()
    ids = net.values("layer", net()).get_column("id").to_list()
    for row, node in enumerate(ids):
        expected = weights["root"] @ x[node]
        for src, dst, kind in edges:
            if dst == node:
                expected = expected + weights["w"][codes[kind]] @ x[src]
        assert torch.allclose(out[row], expected.detach(), atol=1e-12, rtol=0), node
    assert "one matrix per type" in net.explain() and "3 of 3 types present" in net.explain()


def test_typed_linear_trains_in_mini_batches_and_an_unseen_type_adds_nothing(tmp_path):
    """One batch of every row is full-batch training. A saved model meeting edges of a type it
    never saw gives them a zero matrix: its predictions are those without these edges."""
    db = graph(tmp_path / "graph.duckdb")
    kwargs = dict(target="node.y", seed=0, dtype=torch.float64, progress=False)
    template = relsql.Template.from_sql(TYPED)
    full = relsql.Model(db, template, **kwargs).fit(epochs=3, lr=0.05)
    batched = relsql.Model(db, template, batch_size=10_000, **kwargs).fit(epochs=3, lr=0.05)
    for a, b in zip(full.history, batched.history):
        assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-10, abs=1e-12)
    small = relsql.Model(db, template, batch_size=16, **kwargs).fit(epochs=2, lr=0.05)
    path = small.save(tmp_path / "typed.pt")
    before = relsql.Model.load(path, db).predict()
    assert before.equals(small.predict())
    db.execute("INSERT INTO edge SELECT i, (i * 13) % 60, 'new' FROM range(60) t(i)")
    after = relsql.Model.load(path, db).predict()
    assert after.columns == before.columns
    for column in before.columns:
        if before[column].dtype.is_float():
            assert (after[column] - before[column]).abs().max() < 1e-12, column
    db.close()


@pytest.mark.parametrize("call, message", [
    ("linear(s.h, 3, 'w', s.h)", "categorical database column"),
    ("linear(s.h, 3, 'w', 'kind')", "categorical database column"),
    ("linear(s.h, 3, 4, e.kind)", "weight name must be a string"),
    ("linear(s.h, 3, 'w', e.kind, e.kind)", "linear\\(x, out_width"),
])
def test_bad_typed_linears_are_refused(call, message):
    with pytest.raises(relsql.TemplateError, match=message):
        relsql.Template.from_sql("CREATE TABLE node_x AS SELECT n.id, n.x AS h FROM node n;\n"
                                 f"CREATE TABLE a AS SELECT e.dst AS id, sum({call}) AS h FROM edge e "
                                 "JOIN node_x s ON s.id = e.src GROUP BY e.dst;")


def test_a_weight_is_typed_everywhere_or_nowhere():
    with pytest.raises(relsql.TemplateError, match="shared name must keep its kind"):
        relsql.Template.from_sql("CREATE TABLE node_x AS SELECT n.id, n.x AS h FROM node n;\n"
                                 "CREATE TABLE a AS SELECT e.dst AS id, sum(linear(s.h, 3, 'w', e.kind)) AS h FROM edge e "
                                 "JOIN node_x s ON s.id = e.src GROUP BY e.dst;\n"
                                 "CREATE TABLE a AS SELECT n.id, linear(n.h, 3, 'w') AS h FROM node_x n;")
