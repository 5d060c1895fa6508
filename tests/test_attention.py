"""attention(score, value) and leaky_relu(x, slope): the kernel against a naive per-head,
per-segment evaluator (values and gradients, float64), the template language's checks, and
relsql/sql_templates/gat.sql trained on mini-batches and saved/loaded (PyG's GATConv is the oracle in
tests/test_pyg_oracle.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import relsql
from relsql.compile.kernels import attention

ROOT = Path(__file__).resolve().parent.parent


def naive_attention(score, value, ids, segments: int, mode: str) -> torch.Tensor:
    """One segment and one head at a time, with torch.softmax."""
    heads = score.shape[1]
    width = value.shape[1] // heads
    rows = []
    for s in range(segments):
        mine = (ids == s).nonzero().flatten()
        parts = []
        for h in range(heads):
            if len(mine) == 0:
                parts.append(value.new_zeros(width))
                continue
            alpha = torch.softmax(score[mine, h], dim=0)
            parts.append((alpha.unsqueeze(1) * value[mine, h * width:(h + 1) * width]).sum(0))
        rows.append(torch.stack(parts).mean(0) if mode == "mean" else torch.cat(parts))
    return torch.stack(rows)


@pytest.mark.parametrize("mode", ["concat", "mean"])
@pytest.mark.parametrize("heads", [1, 3])
def test_attention_kernel_equals_a_naive_softmax_per_segment_and_head(mode, heads):
    generator = torch.Generator().manual_seed(heads)
    counts = torch.tensor([3, 0, 1, 5, 0, 2])  # empty segments too
    ids = torch.repeat_interleave(torch.arange(len(counts)), counts)
    n, width = int(counts.sum()), 2
    score = (torch.randn(n, heads, dtype=torch.float64, generator=generator) * 3).requires_grad_(True)
    value = torch.randn(n, heads * width, dtype=torch.float64, generator=generator).requires_grad_(True)
    ours = attention(score, value, ids, counts, mode)
    theirs = naive_attention(score, value, ids, len(counts), mode)
    assert ours.shape == theirs.shape == (len(counts), width if mode == "mean" else heads * width)
    assert torch.allclose(ours, theirs, atol=1e-12, rtol=0)
    assert torch.equal(ours[1], torch.zeros_like(ours[1]))  # a head without groundings
    weights = torch.randn(ours.shape, dtype=torch.float64, generator=generator)
    grads = torch.autograd.grad((ours * weights).sum(), (score, value))
    expected = torch.autograd.grad((theirs * weights).sum(), (score, value))
    for a, b in zip(grads, expected):
        assert torch.allclose(a, b, atol=1e-12, rtol=0)
    assert grads[0].abs().max() > 0


def test_attention_is_stable_for_large_scores():
    """exp(1000) overflows; the softmax shifted by each segment's maximum does not."""
    score = torch.tensor([[1000.0], [999.0], [-1000.0], [5.0]], dtype=torch.float64, requires_grad=True)
    value = torch.tensor([[1.0], [2.0], [3.0], [4.0]], dtype=torch.float64)
    ids, counts = torch.tensor([0, 0, 0, 1]), torch.tensor([3, 1])
    out = attention(score, value, ids, counts)
    p = torch.softmax(torch.tensor([1.0, 0.0, -2000.0], dtype=torch.float64), 0)
    assert torch.allclose(out, torch.stack([(p * value[:3, 0]).sum(), value[3, 0]]).reshape(2, 1), atol=1e-12, rtol=0)
    out.sum().backward()
    assert torch.isfinite(score.grad).all()


def test_attention_value_must_split_into_the_heads():
    with pytest.raises(ValueError, match="does not split into 2 attention heads"):
        attention(torch.zeros(2, 2), torch.zeros(2, 3), torch.tensor([0, 0]), torch.tensor([2]))


@pytest.fixture(scope="module")
def graph():
    db = relsql.connect()
    db.execute("CREATE TABLE node AS SELECT i AS id, [sin(i), cos(i * 0.7)] AS x FROM range(12) t(i)")
    db.execute("CREATE TABLE edge AS SELECT i % 12 AS src, (i * 5 + 1) % 12 AS dst FROM range(30) t(i)")
    return db


def test_attention_and_leaky_relu_slope_in_a_template_equal_a_hand_computation(graph):
    template = relsql.Template.from_sql("""
        CREATE TABLE node_x AS SELECT n.id, n.x AS h FROM node n;
        CREATE TABLE att AS
        SELECT e.dst AS id, attention(leaky_relu(linear(s.h, 2, 'a_src') + linear(d.h, 2, 'a_dst'), -0.3),
                                      linear(s.h, 6, 'w'), 'mean') AS h
        FROM edge e JOIN node_x s ON s.id = e.src JOIN node_x d ON d.id = e.dst
        GROUP BY e.dst;
    """)
    net = relsql.compile(template, graph, dtype=torch.float64, seed=3)
    out = net()["att"]
    weights = net.named_weights()
    x = torch.tensor(graph.con.execute("SELECT x FROM node ORDER BY id").fetchall(), dtype=torch.float64).reshape(12, 2)
    edges = graph.con.execute("SELECT src, dst FROM edge").fetchall()
    keys = net.values("att", net()).get_column("id").to_list()
    assert len(keys) == out.shape[0] == 12 and out.shape[1] == 3  # 2 heads of 3, averaged
    for row, head in enumerate(keys):
        sources = [s for s, d in edges if d == head]
        logits = F.leaky_relu(x[sources] @ weights["a_src"].T + x[head] @ weights["a_dst"].T, -0.3)
        alpha = torch.softmax(logits, dim=0)  # (groundings, heads)
        values = (x[sources] @ weights["w"].T).reshape(len(sources), 2, 3)
        expected = (alpha.unsqueeze(2) * values).sum(0).mean(0)
        assert torch.allclose(out[row], expected.detach(), atol=1e-12, rtol=0), head
    assert "attention(softmax(" in net.explain() and "slope=-0.3" in net.explain()


@pytest.mark.parametrize("body, message", [
    ("attention(linear(s.h, 1), s.h)", "GROUP BY"),
    ("sum(attention(linear(s.h, 1), s.h))", "nested"),
    ("attention(linear(s.h, 1))", "attention\\(score, value"),
    ("attention(linear(s.h, 1), s.h, 'max')", "attention\\(score, value"),
    ("leaky_relu(s.h, 'x')", "negative slope must be a number"),
    ("leaky_relu(s.h, 0.1, 0.2)", "optional negative slope"),
    ("attention(sum_per_head(s.h), s.h)", "sum_per_head\\(x, heads\\)"),
    ("attention(sum_per_head(s.h, 0), s.h)", "number of heads"),
])
def test_bad_attention_and_slopes_are_refused(body, message):
    group = "GROUP BY e.dst" if "GROUP BY" not in message else ""
    with pytest.raises(relsql.TemplateError, match=message):
        relsql.Template.from_sql(f"CREATE TABLE node_x AS SELECT n.id, n.x AS h FROM node n;\n"
                                 f"CREATE TABLE a AS SELECT e.dst AS id, {body} AS h FROM edge e "
                                 f"JOIN node_x s ON s.id = e.src {group};")


def test_gat_template_trains_on_mini_batches_and_reloads(tmp_path, mutag):
    """One batch of every graph is full-batch training; a saved GAT predicts the same after loading."""
    kwargs = dict(target="graph.label", seed=0, dtype=torch.float64, progress=False)
    full = relsql.Model(mutag, relsql.sql_templates.path("gat"), **kwargs).fit(epochs=3, lr=0.01)
    batched = relsql.Model(mutag, relsql.sql_templates.path("gat"), batch_size=100_000, **kwargs).fit(epochs=3, lr=0.01)
    assert batched.mini_batches and full.batched is None
    for a, b in zip(full.history, batched.history):
        assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-10, abs=1e-12)
    small = relsql.Model(mutag, relsql.sql_templates.path("gat"), batch_size=32, **kwargs)  # batches see parts of the graph
    untrained = relsql.Model(mutag, relsql.sql_templates.path("gat"), **kwargs)
    ours, theirs = small.predict(), untrained.predict()  # the same initial weights
    assert ours.columns == theirs.columns and ours.height == theirs.height == 188
    for column in ours.columns:
        if ours[column].dtype.is_float():
            assert (ours[column] - theirs[column]).abs().max() < 1e-10, column
        else:
            assert ours[column].to_list() == theirs[column].to_list(), column
    small.fit(epochs=2, lr=0.01)
    loaded = relsql.Model.load(small.save(tmp_path / "gat.pt"), mutag)
    assert loaded.predict().equals(small.predict())


def test_gat_written_in_one_statement_computes_w_x_once_per_node(graph):
    """The issue's one-statement GAT names W three times; the passes find the common product, so
    W x is one product over the 12 nodes (not three per edge), and the values are those of the
    form with intermediate relations (relsql/sql_templates/gat.sql's)."""
    one = relsql.Template.from_sql("""
        CREATE TABLE node_x AS SELECT n.id, n.x AS h FROM node n;
        CREATE TABLE gat AS
        SELECT e.dst AS id, attention(leaky_relu(linear(linear(d.h, 8, 'W'), 1, 'att_dst')
                                                 + linear(linear(s.h, 8, 'W'), 1, 'att_src'), 0.2),
                                      linear(s.h, 8, 'W')) AS h
        FROM edge e JOIN node_x s ON s.id = e.src JOIN node_x d ON d.id = e.dst GROUP BY e.dst;
    """)
    layered = relsql.Template.from_sql("""
        CREATE TABLE wx AS SELECT n.id, linear(n.x, 8, 'W') AS h FROM node n;
        CREATE TABLE src AS SELECT w.id, linear(w.h, 1, 'att_src') AS h FROM wx w;
        CREATE TABLE dst AS SELECT w.id, linear(w.h, 1, 'att_dst') AS h FROM wx w;
        CREATE TABLE gat AS
        SELECT e.dst AS id, attention(leaky_relu(s.h + d.h, 0.2), w.h) AS h
        FROM edge e JOIN src s ON s.id = e.src JOIN dst d ON d.id = e.dst JOIN wx w ON w.id = e.src GROUP BY e.dst;
    """)
    a = relsql.compile(one, graph, dtype=torch.float64, seed=0)
    b = relsql.compile(layered, graph, dtype=torch.float64, seed=5)
    with torch.no_grad():
        for name, weight in a.named_weights().items():
            b.named_weights()[name].copy_(weight)
    assert torch.allclose(a()["gat"], b()["gat"], atol=1e-12, rtol=0)
    w = next(op.out for op in a.plan.ops if op.kind == "param" and op.attrs["name"] == "W")
    products = [op for op in a.plan.ops if op.kind == "linear" and op.args[0] == w]
    assert len(products) == 1 and products[0].rows == 12


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("heads", [1, 2])
def test_sparse_attention_pass_reads_source_rows_in_place_and_keeps_values_and_gradients(dtype, heads):
    """The optimized GAT layer (the sparse_attention pass: value gathers, the scatter into the
    relation's rows and the bias folded into one CSR kernel) against the plain vectorized plan:
    values read through a third column (`via`: the entries are reordered by (row, column)),
    repeated edges, nodes without in-edges."""
    db = relsql.connect()
    db.execute("CREATE TABLE node AS SELECT i AS id, [sin(i), cos(i * 0.7), i / 10] AS x FROM range(15) t(i)")
    db.execute("CREATE TABLE edge AS SELECT (i * 7 + 3) % 13 AS src, (i * i) % 11 AS dst, (i * 4) % 15 AS via "
               "FROM range(40) t(i) UNION ALL SELECT 4, 1, 2 UNION ALL SELECT 4, 1, 2")
    template = relsql.Template.from_sql(f"""
        CREATE TABLE wx AS SELECT n.id, linear(n.x, 6, 'W') AS h FROM node n;
        CREATE TABLE src AS SELECT w.id, linear(w.h, {heads}, 'att_src') AS h FROM wx w;
        CREATE TABLE dst AS SELECT w.id, linear(w.h, {heads}, 'att_dst') AS h FROM wx w;
        CREATE TABLE gat AS
        SELECT e.dst AS id, attention(leaky_relu(s.h + d.h, 0.2), w.h) AS h
        FROM edge e JOIN src s ON s.id = e.src JOIN dst d ON d.id = e.dst JOIN wx w ON w.id = e.via GROUP BY e.dst;
        CREATE TABLE gat AS SELECT n.id, bias(6, 'b') AS h FROM node n;
    """)
    fast = relsql.compile(template, db, dtype=dtype, seed=0)
    plain = relsql.compile(template, db, dtype=dtype, seed=0, passes=())
    kinds = [op.kind for op in fast.plan.ops]
    assert "sparse_attention" in kinds and "attention" not in kinds and "scatter" not in kinds
    assert not any(op.kind == "gather" and op.shape == (6,) for op in fast.plan.ops)  # no per-edge copy of W h
    assert any(op.kind == "gather" and op.attrs.get("relation") == "entries by (row, column)" for op in fast.plan.ops)
    assert "sparse_attention: 1 attentions" in fast.explain() and "+ t" in fast.explain()
    with torch.no_grad():
        for name, weight in plain.named_weights().items():
            weight.copy_(torch.randn(weight.shape, generator=torch.Generator().manual_seed(len(name))))
            fast.named_weights()[name].copy_(weight)
    ours, theirs = fast()["gat"], plain()["gat"]
    tolerance = 1e-12 if dtype == torch.float64 else 1e-5
    assert torch.allclose(ours, theirs, atol=tolerance, rtol=0)
    assert torch.equal(ours[14], fast.named_weights()["b"].detach())  # no in-edges: the bias only
    target = torch.randn(ours.shape, dtype=dtype, generator=torch.Generator().manual_seed(1))
    (ours * target).sum().backward()
    (theirs * target).sum().backward()
    for name, weight in plain.named_weights().items():
        assert torch.allclose(fast.named_weights()[name].grad, weight.grad, atol=tolerance * 10, rtol=0), name


@pytest.mark.parametrize("heads, outputs", [(1, None), (2, None), (2, ["gat2"])])
def test_score_linears_are_one_product_and_read_the_constant_features_exactly(heads, outputs):
    """stack_narrow_linears: each layer's two logit weights on W h become one (2 heads, C) product
    read as column slices, and the first layer's is reassociated, (A W) x, onto the constant
    features (its backward writes no per-node gradient). Values of every relation (slices among
    them) and every weight's gradient equal the plain plan's and the pipeline's without the pass.
    With only the last layer asked for, the ReLU between the layers overwrites the attention's
    result in place (its backward keeps no output)."""
    from relsql.compile.passes import RULES

    db = relsql.connect()
    db.execute("CREATE TABLE node AS SELECT i AS id, [sin(i), cos(i * 0.7), i / 10] AS x FROM range(15) t(i)")
    db.execute("CREATE TABLE edge AS SELECT (i * 7 + 3) % 13 AS src, (i * i) % 11 AS dst FROM range(40) t(i)")
    layers = ["CREATE TABLE h0 AS SELECT n.id, n.x AS h FROM node n;"]
    for layer in (1, 2):
        layers.append(f"""
            CREATE TABLE h{layer - 1} AS SELECT l.id, relu(l.h) AS h FROM gat{layer - 1} l;""" * (layer > 1) + f"""
            CREATE TABLE wx{layer} AS SELECT p.id, linear(p.h, 6, 'W{layer}') AS h FROM h{layer - 1} p;
            CREATE TABLE src{layer} AS SELECT w.id, linear(w.h, {heads}, 'src{layer}') AS h FROM wx{layer} w;
            CREATE TABLE dst{layer} AS SELECT w.id, linear(w.h, {heads}, 'dst{layer}') AS h FROM wx{layer} w;
            CREATE TABLE gat{layer} AS
            SELECT e.dst AS id, attention(leaky_relu(s.h + d.h, 0.2), w.h) AS h
            FROM edge e JOIN src{layer} s ON s.id = e.src JOIN dst{layer} d ON d.id = e.dst
            JOIN wx{layer} w ON w.id = e.src GROUP BY e.dst;
            CREATE TABLE gat{layer} AS SELECT n.id, bias(6, 'b{layer}') AS h FROM node n;""")
    template = relsql.Template.from_sql("\n".join(layers))
    without = tuple(rule for rule in RULES if rule.__name__ != "stack_narrow_linears")
    nets = [relsql.compile(template, db, dtype=torch.float64, seed=0, passes=passes, outputs=outputs)
            for passes in (None, without, ())]
    assert "stack_narrow_linears: 2 groups of narrow weights on one input stacked into one product, 1 moved" in nets[0].explain()
    assert ("relu_(" in nets[0].explain()) == (outputs is not None)
    assert [op.kind for op in nets[0].plan.ops].count("columns") == 4
    generator = torch.Generator().manual_seed(heads)
    values = {name: torch.randn(w.shape, dtype=torch.float64, generator=generator)
              for name, w in nets[0].weights_by_name().items()}
    results = []
    for net in nets:
        with torch.no_grad():
            for name, weight in net.weights_by_name().items():
                weight.copy_(values[name])
        out = net()
        loss = sum((value.sin() * (1 + torch.arange(value.numel(), dtype=torch.float64).reshape(value.shape) % 3)).sum()
                   for value in out.values())
        loss.backward()
        results.append((out, {name: w.grad for name, w in net.weights_by_name().items()}))
    for out, grads in results[1:]:
        for name, value in out.items():
            assert torch.allclose(results[0][0][name], value, atol=1e-12, rtol=1e-10), name
        for name, grad in grads.items():
            assert torch.allclose(results[0][1][name], grad, atol=1e-12, rtol=1e-10), name
