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


def test_grouped_rules_compute_their_groundings_in_type_order_with_the_same_values_and_gradients(monkeypatch):
    """A grouped rule with a typed linear runs its groundings sorted by the type (the typed
    linears then multiply contiguous rows, no gather into type order and back) and gathers them
    back where they are aggregated: sum, max and attention (score and value typed) give the values
    and gradients of the grounding-order plan, with every pass and with none (float64)."""
    from relsql.compile.passes import RULES
    from relsql.compile.plan import _RuleContext

    template = relsql.Template.from_sql("""
        CREATE TABLE node_x AS SELECT n.id, n.x AS h FROM node n;
        CREATE TABLE summed AS SELECT e.dst AS id, sum(linear(s.h, 3, 'w', e.kind)) AS h
        FROM edge e JOIN node_x s ON s.id = e.src GROUP BY e.dst;
        CREATE TABLE top AS SELECT e.src AS id, max(linear(d.h, 3, 'v', e.kind) * linear(d.h, 3, 'u')) AS h
        FROM edge e JOIN node_x d ON d.id = e.dst GROUP BY e.src;
        CREATE TABLE att AS
        SELECT e.dst AS id, attention(leaky_relu(linear(linear(s.h, 4, 'k', e.kind), 2, 'a') + linear(d.h, 2, 'q'), 0.2),
                                      linear(s.h, 4, 'm', e.kind)) AS h
        FROM edge e JOIN summed s ON s.id = e.src JOIN node_x d ON d.id = e.dst GROUP BY e.dst;
    """)
    db = graph()

    def run(passes):
        net = relsql.compile(template, db, dtype=torch.float64, seed=2, passes=passes)
        out = net()
        loss = sum((value.sin() * (1 + torch.arange(value.numel(), dtype=torch.float64).reshape(value.shape) % 3)).sum()
                   for value in out.values())
        loss.backward()
        return net, out, {name: w.grad.clone() for name, w in net.weights_by_name().items()}

    uncompressed = tuple(rule for rule in RULES if rule.__name__ != "compress_groundings")  # compressed: per class
    results = [run(None), run(uncompressed), run(())]
    assert all("rows already in type order" in net.explain() for net, _, _ in results[1:])
    monkeypatch.setattr(_RuleContext, "sort_by_type", lambda self, expr: None)
    results += [run(uncompressed), run(())]
    assert "rows already in type order" not in results[-1][0].explain()
    _, out, grads = results[-1]  # grounding order, no passes: the reference
    for _, ours, our_grads in results[:-1]:
        for name, value in out.items():
            assert torch.allclose(ours[name], value, atol=1e-12, rtol=1e-10), name
        for name, grad in grads.items():
            assert torch.allclose(our_grads[name], grad, atol=1e-12, rtol=1e-10), name


@pytest.mark.parametrize("in_order", [False, True])
def test_typed_linear_kernel_gradients(in_order):
    """The kernel's own backward (per-type GEMMs writing slices) against finite differences, with
    a type that has no rows; rows given in type order or in any order."""
    from relsql.compile.kernels import typed_linear

    generator = torch.Generator().manual_seed(3)
    types = torch.tensor([2, 0, 2, 3, 0, 2, 3])  # type 1: no rows
    types = types.sort().values if in_order else types
    x = torch.randn(7, 3, dtype=torch.float64, generator=generator, requires_grad=True)
    weight = torch.randn(4, 2, 3, dtype=torch.float64, generator=generator, requires_grad=True)
    order, counts = torch.argsort(types, stable=True), torch.bincount(types, minlength=4)
    out = typed_linear(weight, x, order, counts, in_order)
    assert torch.allclose(out, torch.einsum("noi,ni->no", weight[types], x), atol=1e-12, rtol=0)
    assert torch.autograd.gradcheck(lambda w, v: typed_linear(w, v, order, counts, in_order), (weight, x))
