"""The choose_segment_kernels pass (relsql/compile/passes/choose_segment_kernels.py): what it changes in a plan, with the plain
plan's values and gradients (tests/test_passes.py runs every pass alone and together on the
template corpus)."""

from __future__ import annotations

import pytest

import relsql
from tests.plan_check import assert_same, run


@pytest.mark.parametrize(("width", "as_csr"), [(8, 1), (128, 0)])
def test_the_cpu_choice_is_a_rule_by_width_and_exact(width, as_csr):
    """On the CPU the kernel is chosen by width, not by timing (the machine's load must not change
    the summation order), and either kernel gives the plain plan's values and gradients."""
    from relsql.compile.passes import choose_segment_kernels

    db = relsql.connect()
    db.execute("CREATE TABLE big AS SELECT i % 997 AS k, (i % 13) * 0.5 AS v, (i % 7) * 0.25 AS w FROM range(60000) t(i);")
    tpl = relsql.Template.from_sql(
        f"CREATE TABLE m AS SELECT b.k, sum(tanh(linear(features(b.v, b.w), {width}, 'w'))) FROM big b GROUP BY b.k;")
    reference, chosen = run(tpl, db, ()), run(tpl, db, (choose_segment_kernels,))
    assert_same(reference, chosen, "segment kernel choice")
    assert f"choose_segment_kernels: 1 reductions chosen by width, {as_csr} faster as CSR matmuls" in chosen[2].explain()
    assert sum(op.kind == "spmm" for op in chosen[2].plan.ops) == as_csr
