"""sum/avg(W·x) = W·sum/avg(x): apply the weight on the side with fewer rows × width.

PyG hand-picks this per layer type; here it is decided by sizes: the weight moves after the
aggregation when the output is at least as wide as the input (aggregating the narrower
vectors is cheaper), which also exposes gather → aggregate to the sparse pass.
"""

from __future__ import annotations

from relsql.compile.passes._rewrite import movable, move_across, producers, readers
from relsql.compile.plan import Op, Plan, make_op


def linear_across_aggregation(plan: Plan) -> Plan:
    made, reads, made_by = 0, readers(plan), producers(plan)
    ops: list[Op] = []
    for op in plan.ops:
        linear = made_by.get(op.args[0]) if op.kind == "segment" and op.attrs["kind"] in ("sum", "avg") else None
        if movable(plan, linear, reads):
            weight, x = linear.args
            aggregated = make_op(plan, "segment", (x, *op.args[1:]), op.note, **op.attrs)
            move_across(ops, op, linear, aggregated, "linear", weight)
            made += 1
            continue
        ops.append(op)
    plan.ops = ops
    plan.log.append(f"linear_across_aggregation: {made} weights moved after sum/avg")
    return plan
