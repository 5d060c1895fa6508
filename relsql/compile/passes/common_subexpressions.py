"""The same op on the same inputs is computed once; equal input tensors are stored once.

Two statements that read the same column (a relation's own features in a self term and, via
the relation, in a neighbour term) get equal input tensors; once they share a slot, the ops
over them become common too (and later passes can merge the sums they feed).
"""

from __future__ import annotations

import torch

from relsql.compile.ops import is_random
from relsql.compile.passes._rewrite import redirect
from relsql.compile.plan import Plan


def _equal_inputs(plan: Plan) -> dict[int, int]:
    """slot -> an earlier slot holding an equal dense tensor."""
    mapping: dict[int, int] = {}
    first: dict[tuple, list[int]] = {}
    for slot, tensor in plan.inputs.items():
        if tensor.layout != torch.strided:
            continue
        key = (tuple(tensor.shape), tensor.dtype)
        for other in first.get(key, []):
            if torch.equal(plan.inputs[other], tensor):
                mapping[slot] = other
                break
        else:
            first.setdefault(key, []).append(slot)
    return mapping


def common_subexpressions(plan: Plan) -> Plan:
    mapping = _equal_inputs(plan)
    shared = len(mapping)
    seen: dict[tuple, int] = {}
    kept = []
    for op in plan.ops:
        args = tuple(mapping.get(a, a) for a in op.args)
        key = (op.kind, args, repr(sorted(op.attrs.items())))
        if key in seen and not is_random(op.kind):  # two dropouts of one value draw two masks
            mapping[op.out] = seen[key]
            continue
        seen[key] = op.out
        op.args = args
        kept.append(op)
    plan.ops = kept
    redirect(plan, mapping)
    plan.log.append(f"common_subexpressions: {shared} equal inputs shared, "
                    f"{len(mapping) - shared} repeated ops reuse an earlier result")
    return plan
