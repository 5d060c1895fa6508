"""The choose_segment_kernels pass (relsql/compile/passes/choose_segment_kernels.py): what it changes in a plan, with the plain
plan's values and gradients (tests/test_passes.py runs every pass alone and together on the
template corpus)."""

from __future__ import annotations

import relsql
from tests.plan_check import assert_same, run


def test_segment_kernel_choice_is_exact_whatever_it_picks():
    from relsql.compile.passes import choose_segment_kernels

    db = relsql.connect()
    db.execute("CREATE TABLE big AS SELECT i % 997 AS k, (i % 13) * 0.5 AS v, (i % 7) * 0.25 AS w FROM range(60000) t(i);")
    tpl = relsql.Template.from_sql("CREATE TABLE m AS SELECT b.k, sum(tanh(linear(features(b.v, b.w), 8, 'w'))) FROM big b GROUP BY b.k;")
    reference, chosen = run(tpl, db, ()), run(tpl, db, (choose_segment_kernels,))
    assert_same(reference, chosen, "segment kernel choice")
    assert "choose_segment_kernels: 1 reductions timed" in chosen[2].explain()
