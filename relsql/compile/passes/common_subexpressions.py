"""The same op on the same inputs is computed once."""

from __future__ import annotations

from relsql.compile.passes._rewrite import redirect
from relsql.compile.plan import Plan


def common_subexpressions(plan: Plan) -> Plan:
    seen: dict[tuple, int] = {}
    mapping: dict[int, int] = {}
    kept = []
    for op in plan.ops:
        args = tuple(mapping.get(a, a) for a in op.args)
        key = (op.kind, args, repr(sorted(op.attrs.items())))
        if key in seen:
            mapping[op.out] = seen[key]
            continue
        seen[key] = op.out
        op.args = args
        kept.append(op)
    plan.ops = kept
    redirect(plan, mapping)
    plan.log.append(f"common_subexpressions: {len(mapping)} repeated ops reuse an earlier result")
    return plan
