"""Ops and inputs nothing reads any more (after other passes) are dropped."""

from __future__ import annotations

from relsql.compile.plan import Plan


def dead_code(plan: Plan) -> Plan:
    live = set(plan.outputs.values())
    kept = []
    for op in reversed(plan.ops):
        if op.out in live or op.kind == "param":
            kept.append(op)
            live.update(op.args)
    dropped = len(plan.ops) - len(kept)
    plan.ops = kept[::-1]
    unused = [slot for slot in plan.inputs if slot not in live]
    for slot in unused:
        del plan.inputs[slot]
    plan.log.append(f"dead_code: {dropped} ops and {len(unused)} inputs no longer read removed")
    return plan
