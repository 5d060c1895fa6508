"""Shared partial aggregation (relsql/compile/passes/shared_aggregation.py): HAG's greedy finds the
partial sums that overlapping heads share; the factored products keep values and gradients of the
plain plan (float64), and nothing is factored where no pair of sources is shared."""

from __future__ import annotations

import importlib

import numpy as np
import pytest
import torch

import relsql
from bench.shared_aggregation import GRAPHS, load, template
from relsql.compile import sparse
from relsql.compile.passes import RULES, shared_aggregation
from tests.plan_check import assert_same, fired_counts, run

module = importlib.import_module("relsql.compile.passes.shared_aggregation")


def forced(plan):
    """The pass without its timing: it factors wherever the greedy saves stored entries."""
    return shared_aggregation(plan, force=True)


FORCED = tuple(forced if rule is shared_aggregation else rule for rule in RULES)


def _matrix(heads: list[list[int]], sources: int, values: list[list[float]] | None = None) -> torch.Tensor:
    rows = [h for h, cols in enumerate(heads) for _ in cols]
    cols = [c for cols in heads for c in cols]
    vals = [v for row in values for v in row] if values else [1.0] * len(cols)
    return sparse.from_coo(torch.tensor(rows), torch.tensor(cols), torch.tensor(vals, dtype=torch.float64), (len(heads), sources))


def test_hand_made_optimum():
    """Six heads read sources 0-3 and one source of their own: 30 entries. Summing 0-3 once takes
    three binary aggregates (0+1, 2+3, then both: 6 entries, two levels) and leaves each head two
    entries (12): 18 in all, the fewest binary aggregates can reach. With one level only, the heads
    keep three entries each: 18 + 4 = 22."""
    heads = [[0, 1, 2, 3, 4 + h] for h in range(6)]
    matrix = _matrix(heads, 10)
    f = module.factor(matrix)
    assert (f.nnz_before, f.nnz_after, f.aggregates, len(f.levels)) == (30, 18, 3, 2)
    pairs_only = module.factor(matrix, max_levels=1)
    assert (pairs_only.nnz_after, pairs_only.aggregates, len(pairs_only.levels)) == (22, 2, 1)
    x = torch.randn(10, 3, dtype=torch.float64)
    for found in (f, pairs_only):
        assert torch.allclose(module.apply(found, x), sparse.matmul(matrix, x), rtol=1e-12, atol=1e-12)


def test_weights_share_only_with_equal_ratios():
    """avg (one value per head) shares freely; a pair read with different weight ratios by
    different heads is two different partial sums, and a pair in two heads only saves nothing."""
    heads = [[0, 1, 2 + h] for h in range(4)]
    avg = module.factor(_matrix(heads, 6, [[1 / 3] * 3] * 4))
    assert (avg.nnz_before, avg.nnz_after) == (12, 10)
    mixed = [[1.0, 2.0, 1.0], [1.0, 2.0, 1.0], [2.0, 1.0, 1.0], [2.0, 1.0, 1.0]]  # ratio 2 twice, 1/2 twice
    assert module.factor(_matrix(heads, 6, mixed)) is None
    scaled = [[1.0, 2.0, 1.0], [0.5, 1.0, 1.0], [3.0, 6.0, 1.0], [-1.0, -2.0, 1.0]]  # ratio 2 everywhere
    f = module.factor(_matrix(heads, 6, scaled))
    assert f is not None and f.nnz_after == 10
    x = torch.randn(6, 2, dtype=torch.float64)
    assert torch.allclose(module.apply(f, x), sparse.matmul(_matrix(heads, 6, scaled), x), rtol=1e-12)


def test_no_pair_is_shared_in_a_tree():
    """In a tree two nodes have at most one common neighbour: no pair is in three heads."""
    rng = np.random.default_rng(3)
    n = 2000
    parent = np.array([rng.integers(0, i) for i in range(1, n)])
    child = np.arange(1, n)
    heads: list[list[int]] = [[i] for i in range(n)]  # self loops, as GCN adds them
    for a, b in zip(parent, child):
        heads[a].append(int(b))
        heads[b].append(int(a))
    assert module.factor(_matrix([sorted(h) for h in heads], n)) is None


@pytest.fixture(scope="module")
def graphs():
    return {name: load(GRAPHS[name](0.01, seed=1)) for name in ("collaboration", "hubs", "bipartite", "no_overlap")}


@pytest.mark.parametrize("kind", ["avg", "sum", "gcn"])
@pytest.mark.parametrize("graph", ["collaboration", "hubs", "bipartite"])
def test_values_and_gradients_equal_the_plain_plan(graph, kind, graphs):
    """Two layers (6 features, width 4: the first weight stays before its product, so both are factored),
    with the pass forced on, against the plain plan, in float64."""
    tpl = relsql.Template.from_sql(template(kind, hidden=4, layers=2))
    reference, factored = run(tpl, graphs[graph], ()), run(tpl, graphs[graph], FORCED)
    assert_same(reference, factored, f"{graph} {kind}")
    log = next(line for line in factored[2].plan.log if line.startswith("shared_aggregation"))
    assert fired_counts(factored[2])["shared_aggregation"] > 0 and not log.startswith("shared_aggregation: 0 "), log
    before, after = (int(w) for w in log.split("(")[1].split(" stored")[0].split(" -> "))
    assert after < before
    assert "shared partial sums" in factored[2].explain()


def test_does_not_fire_without_overlap(graphs):
    tpl = relsql.Template.from_sql(template("avg", hidden=4, layers=2))
    factored = run(tpl, graphs["no_overlap"], FORCED)
    assert "shared_aggregation: 0 " in factored[2].explain()
    assert_same(run(tpl, graphs["no_overlap"], ()), factored, "no overlap")


def test_default_pass_leaves_small_products_alone(graphs):
    """Below MIN_NNZ nothing is timed or factored; the pass is part of RULES and of `explain`."""
    tpl = relsql.Template.from_sql(template("avg", hidden=4, layers=2))
    assert shared_aggregation in RULES
    optimized = run(tpl, graphs["collaboration"], None)
    assert "shared_aggregation: 0 " in optimized[2].explain()
    assert module.MIN_NNZ > run(tpl, graphs["collaboration"], ())[2].grounding.relations["layer1"].rules[0].size


def test_the_greedy_runs_only_where_it_could_pay_for_itself(graphs, monkeypatch):
    """With every product eligible (MIN_NNZ 0): a plain product too fast to repay the greedy within
    PAYBACK_STEPS steps is left alone without running it; a slow one (timed as such) is factored
    and keeps the plain plan's values."""
    tpl = relsql.Template.from_sql(template("avg", hidden=4, layers=2))
    reference = run(tpl, graphs["collaboration"], ())
    monkeypatch.setattr(module, "MIN_NNZ", 0)
    greedy = module.factor
    calls = []
    monkeypatch.setattr(module, "factor", lambda matrix, **kw: calls.append(matrix) or greedy(matrix, **kw))
    monkeypatch.setattr(module, "plain_seconds", lambda plan, matrix, width: 1e-9)
    fast = run(tpl, graphs["collaboration"], None)
    assert calls == [] and "shared_aggregation: 0 " in fast[2].explain()
    monkeypatch.setattr(module, "plain_seconds", lambda plan, matrix, width: 10.0)
    monkeypatch.setattr(module, "_pays", lambda plan, f, width, plain: plain == 10.0)
    slow = run(tpl, graphs["collaboration"], None)
    assert calls
    assert fired_counts(slow[2])["shared_aggregation"] > 0
    assert_same(reference, slow, "collaboration avg, factored by the default pass")


def test_payback_bound_against_the_measured_greedy():
    """The bound's constants: a product of 51,924 entries (the outside corpus's Lahman salaries)
    taking 0.8 ms forward + backward cannot repay the greedy's ~0.3 s; one of 20 ms could."""
    matrix = _matrix([[i % 7, (i + 1) % 7] for i in range(25_962)], 7)
    assert matrix.values().numel() == 51_924
    assert not module.worth_factoring(matrix, 0.0008) and module.worth_factoring(matrix, 0.020)
