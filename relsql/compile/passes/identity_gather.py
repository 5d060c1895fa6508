"""A gather of every row in order is the source itself; a gather of consecutive rows is a slice.

The first is removed (its readers read the source); the second becomes a view of the source's
rows (`narrow`), which copies nothing in the forward pass.
"""

from __future__ import annotations

import torch

from relsql.compile.passes._rewrite import redirect
from relsql.compile.plan import Op, Plan


def _consecutive(index: torch.Tensor) -> int | None:
    """The first row if `index` is first, first + 1, ..., else None."""
    if index.dim() != 1 or index.numel() == 0:
        return None
    # compared in torch before the first row is read out: a batch plan replayed per shape
    # (relsql/compile/reuse.py) then depends on whether the rows are consecutive, not on where they start
    if not torch.equal(index - index[0], torch.arange(index.numel(), dtype=index.dtype)):
        return None
    return int(index[0])


def identity_gather(plan: Plan) -> Plan:
    mapping: dict[int, int] = {}
    sliced = 0
    ops: list[Op] = []
    for op in plan.ops:
        index = plan.inputs.get(op.args[1]) if op.kind == "gather" and op.args[0] not in plan.param_slots else None
        start = _consecutive(index) if index is not None else None
        if start is None:
            ops.append(op)
        elif start == 0 and index.numel() == plan.meta[op.args[0]].shape[0]:
            mapping[op.out] = op.args[0]
        else:
            ops.append(Op("slice", op.out, (op.args[0],), {"start": start, "rows": op.rows}, op.rows, op.shape, op.note))
            sliced += 1
    plan.ops = ops
    redirect(plan, mapping)
    plan.log.append(f"identity_gather: {len(mapping)} gathers of every row in order removed, "
                    f"{sliced} consecutive gathers made slices")
    return plan
