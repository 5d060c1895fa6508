"""The identity_gather pass (relsql/compile/passes/identity_gather.py): what it changes in a plan, with the plain
plan's values and gradients (tests/test_passes.py runs every pass alone and together on the
template corpus)."""

from __future__ import annotations

import relsql
from tests.plan_check import assert_same, run


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
