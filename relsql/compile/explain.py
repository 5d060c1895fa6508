"""`relsql explain`: the plan as readable pseudo-code with the size of every op's result."""

from __future__ import annotations

import torch

from relsql.compile.ops import describe
from relsql.compile.plan import Op, Plan


def _shape(op: Op, plan: Plan) -> str:
    if op.kind == "param" or op.out in plan.param_slots:  # a weight, or one computed from weights
        return f"[{' x '.join(map(str, op.shape)) or 'scalar'}]"
    return f"[{op.rows} x {' x '.join(map(str, op.shape)) or '1'}]"


def explain(plan: Plan) -> str:
    """One line per op, grouped under the relation/rule it belongs to."""
    names: dict[int, str] = {}
    for slot, tensor in plan.inputs.items():
        names[slot] = f"in{slot}{list(tensor.shape)}"
        if tensor.layout == torch.sparse_csr:
            names[slot] = f"sparse({names[slot]})"
    lines: list[str] = []
    current = None
    for op in plan.ops:
        if op.note != current:
            current = op.note
            lines.append(f"-- {current}")
        names[op.out] = f"t{op.out}"
        text = describe(op.kind, [names.get(x, f"t{x}") for x in op.args], op, plan)
        lines.append(f"  t{op.out} = {text:<60} {_shape(op, plan)}")
    outputs = ", ".join(f"{r}=t{s}" for r, s in plan.outputs.items())
    lines.append(f"outputs: {outputs}")
    if plan.log:
        lines.append("optimizer: " + "; ".join(plan.log))
    n_params = sum(1 for op in plan.ops if op.kind == "param")
    lines.append(f"{len(plan.ops)} ops, {n_params} weights, {len(plan.inputs)} index/column inputs")
    return "\n".join(lines)
