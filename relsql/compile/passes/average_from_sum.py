"""avg(x) = sum(x) / count: where a plan takes both the sum and the mean of the same groundings
(Template.auto aggregates each child term by avg, sum and max), the mean is the sum times each
segment's 1 / max(count, 1), so the groundings are added up once.

Forward: one index_add (or one sparse product, after sparse_aggregate) instead of two; backward:
the two aggregates' gradients meet at the sum and read back into the groundings once. The
mean's factor is a constant input; an empty segment's mean stays 0 (its sum is 0).
"""

from __future__ import annotations

import torch

from relsql.compile.passes._rewrite import redirect
from relsql.compile.plan import Op, Plan, make_op


def _groundings(op: Op) -> tuple:
    """What a segment op reduces: its (x, ids, counts) slots and attributes but the aggregate."""
    return op.args, repr(sorted((k, v) for k, v in op.attrs.items() if k != "kind"))


def average_from_sum(plan: Plan) -> Plan:
    summed = {_groundings(op) for op in plan.ops if op.kind == "segment" and op.attrs["kind"] == "sum"}
    sums: dict[tuple, int] = {}  # groundings (x, ids, counts) -> the slot holding their sum
    mapping: dict[int, int] = {}
    made = 0
    ops: list[Op] = []
    for op in plan.ops:
        if op.kind != "segment" or op.attrs["kind"] not in ("sum", "avg") or _groundings(op) not in summed:
            ops.append(op)
            continue
        counts = plan.inputs.get(op.args[2])
        if counts is None:  # counts computed by the net: leave both as they are
            ops.append(op)
            continue
        found = sums.get(_groundings(op))
        if op.attrs["kind"] == "sum":
            if found is None:
                sums[_groundings(op)] = op.out
                ops.append(op)
            else:
                mapping[op.out] = found
            continue
        if found is None:  # the mean comes first: the sum is computed here, the later one reuses it
            total = make_op(plan, "segment", op.args, op.note, **{**op.attrs, "kind": "sum"})
            ops.append(total)
            found = sums[_groundings(op)] = total.out
        width = [1] * (plan.meta[op.args[0]].dim() - 1)  # the factor broadcasts over a row's values
        factor = plan.add_input((1.0 / counts.to(torch.float64).clamp(min=1)).reshape(counts.shape[0], *width))
        mean = make_op(plan, "binary", (found, factor), op.note, op="*")
        ops.append(mean)
        mapping[op.out] = mean.out
        made += 1
    plan.ops = ops
    redirect(plan, mapping)
    plan.log.append(f"average_from_sum: {made} means read the sum of the same groundings")
    return plan
