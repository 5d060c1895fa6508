"""Every optimizer pass keeps values and gradients identical to the plain vectorized plan."""

from __future__ import annotations

import functools
import math
import warnings
from pathlib import Path

import pytest
import torch

import relsql
from relsql.compile import CompiledNet, make_plan
from relsql.compile.passes import RULES
from relsql.ground.execute import ground

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def shop():
    from demos.synthetic import build

    db = relsql.connect()
    build(db.con, customers=300, seed=1)
    return db


def run(template, db, passes, grounding=None, device="cpu"):
    """Values and gradients of the plan with `passes`: `relsql.compile` grounds the template in `db`;
    with `grounding` (what `ground(template, db)` returned), the plan is built from it, as
    `relsql.compile` does after grounding (and `relsql.tune` for each of its candidates), with the
    costs of `device` (it runs here, on CPU)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if grounding is None:
            net = relsql.compile(template, db, dtype=torch.float64, seed=11, passes=passes)
        else:
            net = CompiledNet(make_plan(template, grounding, torch.float64, passes, device=device), grounding,
                              dtype=torch.float64, seed=11)
    out = net()
    loss = sum((value.sin() * _loss_weights(value.shape, value.dtype)).sum() for value in out.values())
    loss.backward()
    grads = {name: (p.grad.clone() if p.grad is not None else torch.zeros_like(p)) for name, p in net.weights_by_name().items()}
    return {k: v.detach() for k, v in out.items()}, grads, net


@functools.cache
def _loss_weights(shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
    """1, 2, 3, 1, 2, 3, ... in `shape`: every entry's gradient depends on where it is."""
    return 1 + torch.arange(math.prod(shape), dtype=dtype).reshape(shape) % 3


def assert_same(reference, candidate, label):
    (out_a, grad_a, _), (out_b, grad_b, _) = reference, candidate
    assert out_a.keys() == out_b.keys()
    for name in out_a:
        assert torch.allclose(out_a[name], out_b[name], rtol=1e-9, atol=1e-11), f"{label}: values of {name}"
    for name in grad_a:
        assert torch.allclose(grad_a[name], grad_b[name], rtol=1e-9, atol=1e-11), f"{label}: gradient of {name}"


def templates(mutag, molecules, neuralogic_mutagenesis, shop):
    db, dataset = neuralogic_mutagenesis
    folder = dataset.template.parent
    found = {
        "gcn": (relsql.Template.from_file(ROOT / "sql" / "gcn.sql"), mutag),
        "sage": (relsql.Template.from_file(ROOT / "sql" / "sage.sql"), mutag),
        "mutagenesis.sql": (relsql.Template.from_file(ROOT / "sql" / "mutagenesis.sql"), molecules),
        "auto-shop": (relsql.Template.auto(shop, "customer.churned", hops=2), shop),
        "auto-mutagenesis": (relsql.Template.auto(molecules, "molecule.mutagenic", hops=2), molecules),
    }
    if (ROOT / "sql" / "gin.sql").exists():
        found["gin"] = (relsql.Template.from_file(ROOT / "sql" / "gin.sql"), mutag)
    for name in ("template.txt", "template_product.txt", "template_crosssum.txt", "template_graphlets.txt"):
        found[f"neuralogic {name}"] = (relsql.Template.from_file(folder / name), db)
    return found


CASES = ["gcn", "sage", "gin", "mutagenesis.sql", "auto-shop", "auto-mutagenesis", "neuralogic template.txt",
         "neuralogic template_product.txt", "neuralogic template_crosssum.txt", "neuralogic template_graphlets.txt"]


class Case:
    """One template and its database, grounded once (the plans below differ only in their passes,
    which never change the grounding), and the plain plan's values and gradients (the oracle every
    pass tuple is compared with), computed once for the module's tests."""

    def __init__(self, template, db):
        self.template, self.db = template, db

    @functools.cached_property
    def grounding(self):
        return ground(self.template, self.db)

    @functools.cached_property
    def reference(self):
        return run(self.template, self.db, ())  # relsql.compile: grounds the template itself

    def run(self, passes):
        return run(self.template, self.db, passes, self.grounding)


@pytest.fixture(scope="module")
def cases(mutag, molecules, neuralogic_mutagenesis, shop) -> dict[str, Case]:
    return {name: Case(template, db) for name, (template, db) in templates(mutag, molecules, neuralogic_mutagenesis, shop).items()}


def _case_and_pass() -> list:
    """(case, pass) for every case and every pass alone (a pass RULES runs more than once is the same
    pass alone), then (case, None): all passes together. Ids are 'case-pass' so that `-k fuse_affine`
    selects one pass and `-k "gcn and all_passes"` one case."""
    passes = [*dict.fromkeys(RULES), None]
    return [pytest.param(case, rule, id=f"{case}-{rule.__name__ if rule else 'all_passes'}") for case in CASES for rule in passes]


@pytest.mark.parametrize("case, rule", _case_and_pass())
def test_each_pass_alone_and_all_together(case, rule, cases):
    case, name = cases[case], case
    if rule is not None:
        assert_same(case.reference, case.run((rule,)), f"{name} with {rule.__name__}")
    else:
        optimized = case.run(None)
        assert_same(case.reference, optimized, f"{name} with all passes")


def _fired(net) -> dict[str, int]:
    """pass name -> the sum of the numbers its log line reports (how much it changed)."""
    counts = {}
    for line in net.plan.log:
        name, _, rest = line.partition(": ")
        counts[name] = counts.get(name, 0) + sum(int(w) for w in rest.split() if w.isdigit())
    return counts


@pytest.fixture(scope="module")
def random_graphs():
    """Graph batches with continuous random features: nothing is isomorphic, unlike MUTAG."""
    import numpy as np

    from bench.gnn import Graphs, load_graphs

    rng = np.random.default_rng(5)
    nodes, graphs, edges = 3000, 60, 12000
    graph_of_node = np.sort(np.concatenate([np.arange(1, graphs + 1), rng.integers(1, graphs + 1, nodes - graphs)]))
    src, dst = rng.integers(1, nodes + 1, edges), rng.integers(1, nodes + 1, edges)
    db = relsql.connect()
    load_graphs(db.con, Graphs("random", rng.standard_normal((nodes, 12)), graph_of_node,
                               np.stack([src, dst], 1), rng.integers(0, 2, graphs)))
    return db


def test_passes_fire_where_expected(mutag, random_graphs):
    fired: dict[str, int] = {}
    for name, db in [(m, d) for m in ("gcn", "sage", "gin") for d in (mutag, random_graphs)]:
        _, _, net = run(relsql.Template.from_file(ROOT / "sql" / f"{name}.sql"), db, None)
        for key, count in _fired(net).items():
            fired[key] = fired.get(key, 0) + count
        kinds = [op.kind for op in net.plan.ops]
        assert "scatter" not in kinds and kinds.count("segment") <= 1, f"{name}: aggregations left as scatters: {kinds}"
        assert kinds.count("spmm") + kinds.count("addspmm") >= 1, f"{name}: {kinds}"
    for name in ("compress_groundings", "deduplicate_rows", "identity_gather", "propagate_gathers",
                 "common_subexpressions", "linear_across_sparse", "gather_into_sparse", "merge_sparse_sums",
                 "scatter_through_weights", "fuse_affine", "fold_constants", "sparse_backward"):
        assert fired.get(name, 0) > 0, f"{name} never fired on the GNN templates: {fired}"


def test_edges_between_distinct_rows_are_not_compressed(random_graphs):
    """On a graph whose nodes are all different, a neighbour mean has as many grounding classes as
    rows it reads: compression would only add a gather of representatives. The plan skips it and
    still folds every aggregation into a sparse matmul, with the values of the plain plan."""
    template = relsql.Template.from_file(ROOT / "sql" / "sage.sql")
    reference, optimized = run(template, random_graphs, ()), run(template, random_graphs, None)
    assert_same(reference, optimized, "uncompressed sage")
    assert _fired(optimized[2])["compress_groundings"] == 0
    kinds = [op.kind for op in optimized[2].plan.ops]
    assert "gather" not in kinds and "scatter" not in kinds, kinds
    assert _fired(optimized[2])["scatter_through_weights"] >= 1


def test_uniform_segments_become_dense(tmp_path):
    db = relsql.connect()
    db.execute("CREATE TABLE e(a INT, b INT, w DOUBLE); INSERT INTO e SELECT i // 3, i % 7, i * 0.1 FROM range(30) t(i);")
    tpl = relsql.Template.from_sql("CREATE TABLE m AS SELECT e.a, max(linear(e.w, 2, 'w')) FROM e GROUP BY e.a;")
    reference, optimized = run(tpl, db, ()), run(tpl, db, None)
    assert_same(reference, optimized, "uniform")
    assert "dense_reduce" in [op.kind for op in optimized[2].plan.ops]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
def test_optimized_plan_on_cuda(mutag):
    tpl = relsql.Template.from_file(ROOT / "sql" / "gcn.sql")
    from relsql.compile import costs

    cpu = relsql.compile(tpl, mutag, dtype=torch.float64, seed=1)()
    net = relsql.compile(tpl, mutag, dtype=torch.float64, seed=1, device="cuda")
    gpu = net()
    assert all(torch.allclose(cpu[k], gpu[k].cpu(), atol=1e-10) for k in cpu)
    assert net.plan.device == "cuda" and costs.for_device("cuda").measured  # its costs are the GPU's


def test_segment_kernel_choice_is_exact_whatever_it_picks():
    from relsql.compile.passes import choose_segment_kernels

    db = relsql.connect()
    db.execute("CREATE TABLE big AS SELECT i % 997 AS k, (i % 13) * 0.5 AS v, (i % 7) * 0.25 AS w FROM range(60000) t(i);")
    tpl = relsql.Template.from_sql("CREATE TABLE m AS SELECT b.k, sum(tanh(linear(features(b.v, b.w), 8, 'w'))) FROM big b GROUP BY b.k;")
    reference, chosen = run(tpl, db, ()), run(tpl, db, (choose_segment_kernels,))
    assert_same(reference, chosen, "segment kernel choice")
    assert "choose_segment_kernels: 1 reductions timed" in chosen[2].explain()


def test_identical_groundings_are_computed_once(neuralogic_mutagenesis):
    """NeuraLogic's long-body templates: few distinct grounding classes, same numbers."""
    db, dataset = neuralogic_mutagenesis
    tpl = relsql.Template.from_file(dataset.template.parent / "template_elementProduct.txt")
    reference, compressed = run(tpl, db, ()), run(tpl, db, None)
    assert_same(reference, compressed, "compressed")
    assert "compress_groundings: 0 " not in compressed[2].explain()
    rows = {op.rows for op in compressed[2].plan.ops if op.kind == "combine"}
    groundings = {op.rows for op in reference[2].plan.ops if op.kind == "combine"}
    assert max(rows) * 2 <= max(groundings)


@pytest.mark.parametrize("case", ["gin", "mutagenesis.sql", "neuralogic template.txt", "neuralogic template_graphlets.txt"])
def test_gather_strength_presets_agree(case, cases):
    from relsql.compile.passes.propagate_gathers import PRESETS
    from relsql.compile.tune import with_strength

    case, name = cases[case], case
    for strength in PRESETS:
        assert_same(case.reference, case.run(with_strength(strength)), f"{name} at gather strength {strength}")


@pytest.mark.parametrize("case", ["sage", "gin", "auto-mutagenesis", "neuralogic template.txt"])
def test_every_prefix_of_the_pipeline_keeps_values(case, cases):
    """Each pass applied to what the passes before it produced (not only to the plain plan)."""
    case, name = cases[case], case
    for end in range(2, len(RULES)):
        assert_same(case.reference, case.run(RULES[:end]), f"{name} through {RULES[end - 1].__name__}")


def test_consecutive_gathers_become_slices():
    db = relsql.connect()
    db.execute("CREATE TABLE t AS SELECT i AS id, i * 0.5 AS v FROM range(40) r(i)")
    tpl = relsql.Template.from_sql("""
    CREATE TABLE a AS SELECT t.id, tanh(linear(t.v, 3, 'w')) FROM t;
    CREATE TABLE b AS SELECT t.id, relu(linear(x.h, 2, 'u')) FROM t JOIN a x ON x.id = t.id WHERE t.id >= 10 AND t.id < 30;
    """)
    reference, optimized = run(tpl, db, ()), run(tpl, db, None)
    assert_same(reference, optimized, "slices")
    kinds = [op.kind for op in optimized[2].plan.ops]
    assert "slice" in kinds and "gather" not in kinds, kinds


def test_a_gather_that_keeps_few_rows_is_pulled_before_the_op(neuralogic_mutagenesis):
    """template_product scales a matrix per bond fact, of which compression keeps a handful:
    the matrix is scaled for the kept rows only."""
    db, dataset = neuralogic_mutagenesis
    tpl = relsql.Template.from_file(dataset.template.parent / "template_product.txt")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plain = relsql.compile(tpl, db, dtype=torch.float64, seed=2, passes=())
        optimized = relsql.compile(tpl, db, dtype=torch.float64, seed=2, outputs=["predict"])
    assert torch.allclose(plain()["predict"], optimized()["predict"], rtol=1e-9, atol=1e-12)
    bonds = db.con.execute("SELECT count(*) FROM bond").fetchone()[0]
    widest = {op.rows for op in plain.plan.ops if op.kind == "linear" and len(op.shape) == 2}
    assert max(widest) >= bonds  # the plain plan scales the matrix for every bond fact
    assert max(op.rows for op in optimized.plan.ops if op.kind == "linear" and len(op.shape) == 2) < 100
    assert "propagate_gathers: 0 gathers pulled" not in optimized.explain()


def test_per_rule_scatters_are_stacked_and_weight_columns_read_as_rows(neuralogic_mutagenesis):
    """NeuraLogic's one rule per atom type: one stacked tensor instead of a scatter and a matmul per rule."""
    db, dataset = neuralogic_mutagenesis
    tpl = relsql.Template.from_file(dataset.template.parent / "template_graphlets.txt")
    reference, optimized = run(tpl, db, ()), run(tpl, db, None)
    assert_same(reference, optimized, "stacked")
    kinds = [op.kind for op in optimized[2].plan.ops]
    assert kinds.count("weight_rows") == 2 and "scatter" not in kinds, kinds
    per_rule = [op.kind for op in reference[2].plan.ops].count("scatter")
    assert per_rule >= 14  # 8 atom types and 6 bond types, each a rule of its own
    # the rows' reordering gather is read off as the stack's order; the graphlet rule's gathers
    # of atom and bond values, summed, are one product by a matrix of counts per source
    stacks = {op.out for op in optimized[2].plan.ops if op.kind == "weight_rows"}
    assert not [op for op in optimized[2].plan.ops if op.kind == "gather" and op.args[0] in stacks]
    counts = [optimized[2].plan.inputs[op.args[0]] for op in optimized[2].plan.ops if op.kind == "spmm"]
    assert sorted(m.shape[1] for m in counts if m.shape[0] != 188) == [6, 8]  # bond and atom types
    assert all(float(m.to_dense().sum(1).max()) >= 2 for m in counts if m.shape[0] != 188)


@pytest.mark.parametrize("overlap", [False, True])
def test_stacked_scatters_of_partial_and_overlapping_rules(overlap):
    """Rules filling some rows of a relation (a scatter stays) or the same rows twice (values add)."""
    db = relsql.connect()
    db.execute("CREATE TABLE n(id INT, kind VARCHAR, x DOUBLE, y DOUBLE);"
               "INSERT INTO n SELECT i, ['a', 'b', 'c'][i % 3 + 1], i * 0.3, sin(i) FROM range(12) t(i);")
    third = "CREATE TABLE r AS SELECT n.id, linear(features(n.x), 3, 'd') AS h FROM n WHERE n.kind = 'a';" if overlap else ""
    tpl = relsql.Template.from_sql(f"""
        CREATE TABLE r AS SELECT n.id, tanh(linear(features(n.x, n.y), 3, 'a')) AS h FROM n WHERE n.kind = 'a';
        CREATE TABLE r AS SELECT n.id, linear(features(n.y), 3, 'b') AS h FROM n WHERE n.kind = 'b';
        {third}
        CREATE TABLE s AS SELECT n.id, linear(r.h, 2, 'c') FROM n JOIN r ON r.id = n.id;
    """)
    reference, optimized = run(tpl, db, ()), run(tpl, db, None)
    assert_same(reference, optimized, f"overlap={overlap}")
    assert "stack_scatters: 1 " in optimized[2].explain()
    kinds = [op.kind for op in optimized[2].plan.ops]
    assert kinds.count("scatter") == (1 if overlap else 0) and kinds.count("cat") == 1, kinds


@pytest.mark.parametrize("model", ["sage", "gin"])
def test_pooled_readout_weights_move_after_the_pooling(model, random_graphs):
    """avg over a graph's nodes of (W·h + b) is W·avg(h) + b: with only the logits asked for,
    the last layer's weights multiply one row per graph instead of one per node."""
    template = relsql.Template.from_file(ROOT / "sql" / f"{model}.sql")
    outputs = [f"{model}_out"]
    plain = relsql.compile(template, random_graphs, dtype=torch.float64, seed=4, passes=(), outputs=outputs)
    net = relsql.compile(template, random_graphs, dtype=torch.float64, seed=4, outputs=outputs)
    assert _fired(net)["distribute_aggregation"] >= 1
    graphs = random_graphs.con.execute("SELECT count(*) FROM graph").fetchone()[0]
    last = {op.out for op in net.plan.ops if op.kind == "param" and op.attrs["name"] in (f"{model}2_wr", f"{model}2_wl", f"{model}2_w2")}
    rows = [op.rows for op in net.plan.ops if op.kind in ("linear", "affine") and last & set(op.args)]
    assert rows and max(rows) == graphs, rows  # the readout layer's GEMMs run on pooled rows
    out_a, out_b = plain()[outputs[0]], net()[outputs[0]]
    assert torch.allclose(out_a, out_b, rtol=1e-9, atol=1e-11)
    (out_a.sin().sum()).backward()
    (out_b.sin().sum()).backward()
    theirs = plain.named_weights()
    for name, p in net.named_weights().items():
        assert torch.allclose(p.grad, theirs[name].grad, rtol=1e-9, atol=1e-11), name


def test_factors_of_one_are_dropped_exactly(neuralogic_mutagenesis):
    """The bond facts' value 1 multiplies every grounding of elementProduct's rule: dropping it
    leaves values and gradients bit for bit the same."""
    db, dataset = neuralogic_mutagenesis
    template = relsql.Template.from_file(dataset.template.parent / "template_elementProduct.txt")
    without = tuple(rule for rule in RULES if rule.__name__ != "unit_factors")
    (out_a, grad_a, _), (out_b, grad_b, net) = run(template, db, without), run(template, db, None)
    assert _fired(net)["unit_factors"] == 2
    assert all(torch.equal(out_a[k], out_b[k]) for k in out_a)
    assert all(torch.equal(grad_a[k], grad_b[k]) for k in grad_a)


def _matrices(net) -> list[torch.Tensor]:
    """The constant matrix of every sparse-matmul op in the module's plan."""
    at = {"spmm": 0, "addspmm": 1}
    return [net.plan.inputs[op.args[at[op.kind]]] for op in net.plan.ops if op.kind in at]


def test_small_matrices_are_dense_and_large_ones_stay_sparse(neuralogic_mutagenesis, random_graphs):
    from relsql.compile.costs import CPU

    db, dataset = neuralogic_mutagenesis
    template = relsql.Template.from_file(dataset.template.parent / "template_graphlets.txt")
    without = tuple(rule for rule in RULES if rule.__name__ != "dense_small_matrices")
    reference, sparse_only, dense = run(template, db, ()), run(template, db, without), run(template, db, None)
    assert_same(reference, dense, "graphlets with small dense matrices")
    assert all(m.layout == torch.sparse_csr for m in _matrices(sparse_only[2]))
    small = _matrices(dense[2])
    assert small and all(m.layout == torch.strided and m.shape[0] * m.shape[1] <= CPU.dense_limit for m in small)
    assert all(torch.equal(a.to_dense(), b) for a, b in zip(_matrices(sparse_only[2]), small))

    gcn = relsql.Template.from_file(ROOT / "sql" / "gcn.sql")
    large = _matrices(run(gcn, random_graphs, None)[2])
    assert large and all(m.layout == torch.sparse_csr for m in large if m.shape[0] * m.shape[1] > CPU.dense_limit)
    assert any(m.shape[0] * m.shape[1] > CPU.dense_limit for m in large)
