"""A gather of every row in order is the source itself: read the source instead."""

from __future__ import annotations

import torch

from relsql.compile.passes._rewrite import redirect
from relsql.compile.plan import Plan


def identity_gather(plan: Plan) -> Plan:
    mapping: dict[int, int] = {}
    for op in plan.ops:
        if op.kind != "gather":
            continue
        index = plan.inputs.get(op.args[1])
        rows = plan.meta[op.args[0]].shape[0]
        if index is not None and index.numel() == rows and bool(torch.equal(index, torch.arange(rows))):
            mapping[op.out] = op.args[0]
    plan.ops = [op for op in plan.ops if op.out not in mapping]
    redirect(plan, mapping)
    plan.log.append(f"identity_gather: {len(mapping)} gathers of every row in order removed")
    return plan
