"""The stack_scatters pass (relsql/compile/passes/stack_scatters.py): what it changes in a plan, with the plain
plan's values and gradients (tests/test_passes.py runs every pass alone and together on the
template corpus)."""

from __future__ import annotations

import pytest

import relsql
from tests.plan_check import assert_same, run


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
