"""`relsql explain`: the plan as readable pseudo-code with the size of every op's result."""

from __future__ import annotations

import torch

from relsql.compile.plan import Op, Plan


def _shape(op: Op, plan: Plan) -> str:
    if op.kind == "param" or op.out in plan.param_slots:  # a weight, or one computed from weights
        return f"[{' x '.join(map(str, op.shape)) or 'scalar'}]"
    return f"[{op.rows} x {' x '.join(map(str, op.shape)) or '1'}]"


def _describe(op: Op, names: dict[int, str], plan: Plan) -> str:
    a = [names.get(x, f"t{x}") for x in op.args]
    k = op.kind
    if k == "param":
        return f"weight '{op.attrs['name']}'"
    if k == "gather":
        return f"gather({a[0]}, rows={a[1]})"
    if k == "slice":
        return f"{a[0]}[{op.attrs['start']}:{op.attrs['start'] + op.rows}]"
    if k == "linear":
        return f"{a[0]} @ {a[1]}"
    if k == "matmul":
        return f"{a[0]} · {a[1]}"
    if k == "columns":
        return f"{a[0]}[:, {op.attrs['start']}:{op.attrs['start'] + op.attrs['width']}]"
    if k == "typed_linear":
        counts = plan.inputs.get(op.args[3])
        per_type = "" if counts is None or not counts.numel() else \
            f"; {int((counts > 0).sum())} of {counts.numel()} types present, {int(counts.min())}-{int(counts.max())} rows each"
        grouped = "rows already in type order" if op.attrs.get("sorted") else "rows grouped by type"
        return f"{a[0]}[type of row] @ {a[1]}  (one matrix per type, {grouped}{per_type})"
    if k == "binary":
        return f"{a[0]} {op.attrs['op']} {a[1]}"
    if k == "act":
        extra = f", slope={op.attrs['slope']:g}" if "slope" in op.attrs else f", heads={op.attrs['heads']}" if "heads" in op.attrs else ""
        return f"{op.attrs['name']}{'_' if op.attrs.get('inplace') else ''}({a[0]}{extra})"
    if k == "attention":
        return f"attention(softmax({a[0]}) * {a[1]}, by={a[2]}, heads {op.attrs['mode']})"
    if k == "sparse_attention":
        added = f" + {a[8]}" if len(a) > 8 else ""
        return f"attention(softmax({a[0]}) * {a[1]}[cols={a[4]}], rows={a[3]}, heads {op.attrs['mode']}){added}"
    if k == "combine":
        return f"combine_{op.attrs['kind']}({', '.join(a)})"
    if k == "segment":
        return f"segment_{op.attrs['kind']}({a[0]}, by={a[1]})"
    if k == "scatter":
        return f"scatter({a[0]}, into={a[1]}, rows={op.attrs['rows']})"
    if k == "broadcast":
        return f"broadcast({a[0]}, rows={op.attrs['rows']})"
    if k == "sum":
        return " + ".join(a)
    if k == "spmm":
        return f"{a[0]} @ {a[-1]}"
    if k == "addspmm":
        return f"{a[0]} + {a[1]} @ {a[-1]}"
    if k == "affine":
        return f"{a[0]} + {a[2]} @ {a[1]}"
    if k == "dense_reduce":
        return f"{op.attrs['kind']}({a[0]} as [rows/{op.attrs['width']} x {op.attrs['width']}], dim=1)"
    if k == "as_row":
        return a[0]
    return f"{k}({', '.join(a)})"


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
        lines.append(f"  t{op.out} = {_describe(op, names, plan):<60} {_shape(op, plan)}")
    outputs = ", ".join(f"{r}=t{s}" for r, s in plan.outputs.items())
    lines.append(f"outputs: {outputs}")
    if plan.log:
        lines.append("optimizer: " + "; ".join(plan.log))
    n_params = sum(1 for op in plan.ops if op.kind == "param")
    lines.append(f"{len(plan.ops)} ops, {n_params} weights, {len(plan.inputs)} index/column inputs")
    return "\n".join(lines)
