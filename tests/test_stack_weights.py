"""The stack_weights pass (relsql/compile/passes/stack_weights.py): what it changes in a plan, with the plain
plan's values and gradients (tests/test_passes.py runs every pass alone and together on the
template corpus)."""

from __future__ import annotations

import relsql
from tests.plan_check import assert_same, run


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
