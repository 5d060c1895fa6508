"""x · 1 = x: constant factors that are exactly one are dropped from products.

NeuraLogic facts have the value 1 unless the data says otherwise, so a rule body such as
`atom_embed(A), bond(A,B,X), bond_embed(X), ...` multiplies every grounding by the bond facts'
column of ones: two kernels forwards and two backwards per such factor, for nothing. Exact in
floating point (x · 1.0 == x), so values and gradients stay bit for bit the same.
"""

from __future__ import annotations

import torch

from relsql.compile.passes._rewrite import producers
from relsql.compile.plan import Plan


def _is_one(plan: Plan, slot: int, made_by) -> bool:
    """A constant of ones, or rows gathered from one."""
    op = made_by.get(slot)
    if op is not None and op.kind == "gather":
        slot = op.args[0]
    value = plan.inputs.get(slot)
    return value is not None and value.layout == torch.strided and value.is_floating_point() \
        and value.numel() > 0 and bool((value == 1).all())


def unit_factors(plan: Plan) -> Plan:
    dropped, made_by = 0, producers(plan)
    for op in plan.ops:
        if op.kind != "combine" or op.attrs["kind"] not in ("elementproduct", "product"):
            continue
        kept = [a for a in op.args if not (_is_one(plan, a, made_by) and tuple(plan.meta[a].shape[1:]) == (1,))]
        # what is left must still carry the op's shape: some factor with all of its rows and columns
        if len(kept) == len(op.args) or not any(tuple(plan.meta[a].shape) == (op.rows, *op.shape) for a in kept):
            continue
        dropped += len(op.args) - len(kept)
        op.args = tuple(kept)
    plan.log.append(f"unit_factors: {dropped} constant factors of one dropped from products")
    return plan
