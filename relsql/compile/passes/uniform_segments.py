"""Segments that all have the same length reduce as a reshape plus a dense reduction."""

from __future__ import annotations

from relsql.compile.plan import Op, Plan


def uniform_segments(plan: Plan) -> Plan:
    made = 0
    ops: list[Op] = []
    for op in plan.ops:
        if op.kind == "segment" and op.attrs["kind"] in ("sum", "avg", "max", "min"):
            counts = plan.inputs.get(op.args[2])
            if counts is not None and counts.numel() and bool((counts == counts[0]).all()) and int(counts[0]) > 0:
                op = Op("dense_reduce", op.out, (op.args[0],), {"kind": op.attrs["kind"], "width": int(counts[0])},
                        op.rows, op.shape, op.note)
                made += 1
        ops.append(op)
    plan.ops = ops
    plan.log.append(f"uniform_segments: {made} equal-length segment reductions made dense")
    return plan
