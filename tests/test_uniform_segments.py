"""The uniform_segments pass (relsql/compile/passes/uniform_segments.py): what it changes in a plan, with the plain
plan's values and gradients (tests/test_passes.py runs every pass alone and together on the
template corpus)."""

from __future__ import annotations

import relsql
from tests.plan_check import assert_same, run


def test_uniform_segments_become_dense(tmp_path):
    db = relsql.connect()
    db.execute("CREATE TABLE e(a INT, b INT, w DOUBLE); INSERT INTO e SELECT i // 3, i % 7, i * 0.1 FROM range(30) t(i);")
    tpl = relsql.Template.from_sql("CREATE TABLE m AS SELECT e.a, max(linear(e.w, 2, 'w')) FROM e GROUP BY e.a;")
    reference, optimized = run(tpl, db, ()), run(tpl, db, None)
    assert_same(reference, optimized, "uniform")
    assert "dense_reduce" in [op.kind for op in optimized[2].plan.ops]


def test_segments_of_one_row_each_are_no_op_at_all(tmp_path):
    # a per-path relation (one grounding per head): its mean, sum, max and min are the rows themselves
    db = relsql.connect()
    db.execute("CREATE TABLE e(a INT, w DOUBLE); INSERT INTO e SELECT i, i * 0.1 - 1 FROM range(30) t(i);")
    tpl = relsql.Template.from_sql(
        "CREATE TABLE m AS SELECT e.a, avg(linear(e.w, 2, 'w')) + max(tanh(linear(e.w, 2, 'v'))) "
        "+ sum(linear(e.w, 2, 'u')) + min(linear(e.w, 2, 'z')) AS h FROM e GROUP BY e.a;")
    reference, optimized = run(tpl, db, ()), run(tpl, db, None)
    assert_same(reference, optimized, "one row per segment")
    kinds = [op.kind for op in optimized[2].plan.ops]
    assert "dense_reduce" not in kinds and "segment" not in kinds, kinds
    assert any("uniform_segments: 0 equal-length segment reductions made dense, 4 of one row each dropped" in line
               for line in optimized[2].plan.log), optimized[2].plan.log
