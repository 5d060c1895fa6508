"""Every optimizer pass keeps values and gradients identical to the plain vectorized plan."""

from __future__ import annotations

import functools

import pytest
import torch

import relsql
from relsql.compile.passes import RULES
from relsql.ground.execute import ground
from tests.plan_check import assert_same, fired_counts, run


@pytest.fixture(scope="module")
def shop():
    from demos.synthetic import build

    db = relsql.connect()
    build(db.con, customers=300, seed=1)
    return db


def templates(mutag, molecules, neuralogic_mutagenesis, shop):
    db, dataset = neuralogic_mutagenesis
    folder = dataset.template.parent
    found = {
        "gcn": (relsql.Template.from_file(relsql.sql_templates.path("gcn")), mutag),
        "sage": (relsql.Template.from_file(relsql.sql_templates.path("sage")), mutag),
        "gin": (relsql.Template.from_file(relsql.sql_templates.path("gin")), mutag),
        "mutagenesis.sql": (relsql.Template.from_file(relsql.sql_templates.path("mutagenesis")), molecules),
        "auto-shop": (relsql.Template.auto(shop, "customer.churned", hops=2), shop),
        "auto-mutagenesis": (relsql.Template.auto(molecules, "molecule.mutagenic", hops=2), molecules),
    }
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
    return {name: Case(template, db)
            for name, (template, db) in templates(mutag, molecules, neuralogic_mutagenesis, shop).items()}


LARGE_CASES = {"mutagenesis.sql", "auto-shop", "auto-mutagenesis"}  # 2-10 s a pass: each pass alone is `slow` there

# The passes that change the plan when they run alone on the plain plan of each smaller case (CPU
# costs are constants, so this does not depend on the machine). A pass that leaves a plan as it is
# can only break it by starting to fire: those (case, pass) pairs, three in four, are `slow` (the full
# suite runs them); the fast subset checks every pair where the pass fires, and that it still fires.
FIRES = {
    "gcn": {"compress_groundings", "deduplicate_rows", "identity_gather", "propagate_gathers", "common_subexpressions",
            "sparse_aggregate", "choose_segment_kernels", "fuse_affine"},
    "sage": {"compress_groundings", "deduplicate_rows", "identity_gather", "linear_across_aggregation", "propagate_gathers",
             "common_subexpressions", "sparse_aggregate", "fuse_affine"},
    "gin": {"compress_groundings", "deduplicate_rows", "identity_gather", "propagate_gathers", "common_subexpressions",
            "sparse_aggregate", "fuse_affine"},
    "neuralogic template.txt": {"compress_groundings", "deduplicate_rows", "identity_gather", "propagate_gathers",
                                "common_subexpressions", "stack_scatters", "uniform_segments", "choose_segment_kernels",
                                "fold_constants", "inplace_activations"},
    "neuralogic template_product.txt": {"compress_groundings", "deduplicate_rows", "identity_gather", "common_subexpressions",
                                        "sparse_aggregate", "stack_scatters", "uniform_segments", "choose_segment_kernels",
                                        "fold_constants"},
    "neuralogic template_crosssum.txt": {"compress_groundings", "deduplicate_rows", "common_subexpressions", "stack_scatters",
                                         "uniform_segments", "choose_segment_kernels", "fold_constants"},
    "neuralogic template_graphlets.txt": {"compress_groundings", "deduplicate_rows", "common_subexpressions",
                                          "merge_sparse_sums", "stack_scatters", "uniform_segments", "choose_segment_kernels",
                                          "fold_constants"},
}


def _case_and_pass() -> list:
    """(case, pass) for every case and every pass alone (a pass RULES runs more than once is the same
    pass alone), then (case, None): all passes together. Ids are 'case-pass' so that `-k fuse_affine`
    selects one pass and `-k "gcn and all_passes"` one case."""
    passes = [*dict.fromkeys(RULES), None]

    def slow(case, rule) -> bool:
        return rule is not None and (case in LARGE_CASES or rule.__name__ not in FIRES[case])

    return [pytest.param(case, rule, id=f"{case}-{rule.__name__ if rule else 'all_passes'}",
                         marks=[pytest.mark.slow] if slow(case, rule) else [])
            for case in CASES for rule in passes]


@pytest.mark.parametrize("case, rule", _case_and_pass())
def test_each_pass_alone_and_all_together(case, rule, cases):
    case, name = cases[case], case
    if rule is not None:
        candidate = case.run((rule,))
        assert_same(case.reference, candidate, f"{name} with {rule.__name__}")
        fired = fired_counts(candidate[2]).get(rule.__name__, 0) > 0
        assert name not in FIRES or fired == (rule.__name__ in FIRES[name]), \
            f"{rule.__name__} {'now fires' if fired else 'no longer fires'} alone on {name}: update FIRES"
    else:
        optimized = case.run(None)
        assert_same(case.reference, optimized, f"{name} with all passes")


def test_passes_fire_where_expected(mutag, random_graphs):
    fired: dict[str, int] = {}
    for name, db in [(m, d) for m in ("gcn", "sage", "gin") for d in (mutag, random_graphs)]:
        _, _, net = run(relsql.Template.from_file(relsql.sql_templates.path(name)), db, None)
        for key, count in fired_counts(net).items():
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
    template = relsql.Template.from_file(relsql.sql_templates.path("sage"))
    reference, optimized = run(template, random_graphs, ()), run(template, random_graphs, None)
    assert_same(reference, optimized, "uncompressed sage")
    assert fired_counts(optimized[2])["compress_groundings"] == 0
    kinds = [op.kind for op in optimized[2].plan.ops]
    assert "gather" not in kinds and "scatter" not in kinds, kinds
    assert fired_counts(optimized[2])["scatter_through_weights"] >= 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
def test_optimized_plan_on_cuda(mutag):
    tpl = relsql.Template.from_file(relsql.sql_templates.path("gcn"))
    from relsql.compile import costs

    cpu = relsql.compile(tpl, mutag, dtype=torch.float64, seed=1)()
    net = relsql.compile(tpl, mutag, dtype=torch.float64, seed=1, device="cuda")
    gpu = net()
    assert all(torch.allclose(cpu[k], gpu[k].cpu(), atol=1e-10) for k in cpu)
    assert net.plan.device == "cuda" and costs.for_device("cuda").measured  # its costs are the GPU's


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


@pytest.mark.parametrize("slope, in_place", [(0.1, True), (-0.1, False)])
def test_leaky_relu_in_place_only_where_torch_can_differentiate_it(slope, in_place):
    """torch's in-place leaky_relu has no backward for a negative slope: there the activation stays
    out of place, and values and gradients equal the plan without passes."""
    from relsql.compile.passes.inplace_activations import inplace_activations

    db = relsql.connect()
    db.con.execute("CREATE TABLE a AS SELECT i AS id, (i - 20) / 7.0 AS x FROM range(40) t(i)")
    template = relsql.Template.from_sql(
        f"CREATE TABLE r AS SELECT a.id, leaky_relu(linear(a.x, 3), {slope}) AS h FROM a;\n"
        "CREATE TABLE predict AS SELECT a.id, linear(r.h, 1) AS h FROM a JOIN r ON r.id = a.id;")
    candidate = run(template, db, (inplace_activations,))
    assert_same(run(template, db, ()), candidate, f"leaky_relu({slope}) with inplace_activations")
    acts = [op for op in candidate[2].plan.ops if op.kind == "act" and op.attrs["name"] == "leaky_relu"]
    assert [op.attrs.get("inplace", False) for op in acts] == [in_place]
