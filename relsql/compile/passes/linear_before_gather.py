"""W·gather(x) = gather(W·x): multiply the relation's rows once, not every grounding's copy.

The thesis's downward gather propagation (Pigeon's compact materialization): worth it when
the source relation has fewer rows than the gather produces.
"""

from __future__ import annotations

from relsql.compile.passes._rewrite import is_matrix_on_vectors, only_reader, producers, readers
from relsql.compile.plan import Op, Plan, make_op


def linear_before_gather(plan: Plan) -> Plan:
    made, reads, made_by = 0, readers(plan), producers(plan)
    ops: list[Op] = []
    for op in plan.ops:
        gather = made_by.get(op.args[1]) if op.kind == "linear" else None
        if gather is not None and gather.kind == "gather" and only_reader(plan, gather.out, op, reads):
            weight = op.args[0]
            source, index = gather.args
            if is_matrix_on_vectors(plan, weight, gather.out) and plan.meta[source].shape[0] < gather.rows:
                ops.remove(gather)
                product = make_op(plan, "linear", (weight, source), op.note)
                ops.append(product)
                ops.append(Op("gather", op.out, (product.out, index), dict(gather.attrs), op.rows, op.shape, op.note))
                made += 1
                continue
        ops.append(op)
    plan.ops = ops
    plan.log.append(f"linear_before_gather: {made} weights applied before their gather")
    return plan
