"""Ops that read only constant inputs are computed once, at compile time.

The first layer of a GNN aggregates the node features, which no weight touches: A @ x is the
same in every step (SGC precomputes it by hand; PyG recomputes it every forward pass). Such an
op is run once here and its result becomes an input. Its result is as large as what every step
materializes anyway, except for a gather that expands distinct rows to every grounding: that
stays a gather (keeping the rows distinct is the point of deduplicating them).
"""

from __future__ import annotations

import torch

from relsql.compile.ops import is_random, run_op
from relsql.compile.plan import Op, Plan


def _size(tensor: torch.Tensor) -> int:
    return tensor.values().numel() if tensor.layout != torch.strided else tensor.numel()


def fold_constants(plan: Plan) -> Plan:
    folded = 0
    ops: list[Op] = []
    replaced: dict[int, int] = {}
    for op in plan.ops:
        args = [replaced.get(a, a) for a in op.args]
        if op.kind == "param" or is_random(op.kind) or not args or not all(a in plan.inputs for a in args):
            op.args = tuple(args)
            ops.append(op)
            continue
        values = [plan.inputs[a] for a in args]
        if op.kind == "gather" and op.rows * max(1, int(torch.Size(op.shape).numel())) > sum(_size(v) for v in values):
            op.args = tuple(args)
            ops.append(op)
            continue
        with torch.no_grad():
            result = run_op(op.kind, [v.to(torch.float64) if v.is_floating_point() else v for v in values], op.attrs)
        replaced[op.out] = plan.add_input(result.contiguous())
        folded += 1
    plan.ops = ops
    plan.outputs = {name: replaced.get(slot, slot) for name, slot in plan.outputs.items()}
    plan.log.append(f"fold_constants: {folded} ops on constants computed at compile time")
    return plan
