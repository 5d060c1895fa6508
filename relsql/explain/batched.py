"""The plain plan run at several points of the integration path in one pass.

Integrated gradients need the plan's output and gradients at many scalings alpha of its inputs.
One pass per alpha costs one Python walk of the plan per point (on a 1,000-row database that walk,
not the arithmetic, is most of a forward). Here every value that depends on an input is held as P
blocks stacked along its rows, block p being the plan's value at alphas[p]; values that depend on
no input (weights, index tensors, constants) are held once. An op whose kernel is row-wise (each
output row reads the same rows of its row-aligned arguments) runs once on the stacked blocks; an
op that reads rows by index (gather, segment, scatter, attention) runs once with its indices
offset block by block; any other op runs once per block (correct for every kernel, slower)."""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence

import torch

from relsql.compile import kernels
from relsql.compile.ops import is_random, kernel
from relsql.compile.plan import Plan
from relsql.explain.inputs import Input

# kind -> (positions of row-aligned arguments, positions that must hold one value for all blocks)
ROW_WISE: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {
    "linear": ((1,), (0,)), "affine": ((0, 1), (2,)), "act": ((0,), ()), "dropout": ((0,), ()),
    "columns": ((0,), ()), "layer_norm": ((0,), (1, 2)), "dense_reduce": ((0,), ()),
}
ALL_ROWS = ("binary", "sum", "combine")  # every argument row-aligned (torch broadcasting, or kernels.combine's)


class Runner:
    """Runs `plan` with float64 copies of a net's weights and head, its inputs scaled by several
    alphas at once (`outputs`)."""

    def __init__(self, plan: Plan, inputs: list[Input], weights: dict[str, torch.Tensor], head: torch.nn.Module,
                 output: str, external: dict[str, torch.Tensor] | None = None):
        self.plan, self.inputs, self.output = plan, inputs, output
        self.weights = {n: w.detach().to("cpu", torch.float64) for n, w in weights.items()}
        self.weights.update({n: w.detach().to("cpu", torch.float64) for n, w in (external or {}).items()})
        self.head = copy.deepcopy(head).to("cpu", torch.float64).eval()
        for parameter in self.head.parameters():
            parameter.requires_grad_(False)
        self.program = []
        for op in plan.ops:
            attrs = {**op.attrs, "training": lambda: False} if is_random(op.kind) else dict(op.attrs)
            attrs["inplace"] = False  # blocks are views of one tensor: never overwrite one
            self.program.append((op.out, op.kind, None if op.kind == "param" else kernel(op.kind, attrs), op.args, attrs))
        self.computed = {i.slot for i in inputs if i.computed}
        self.same = {op.out for op in plan.ops if op.kind == "gather" and _identity(plan, *op.args)}  # reads every row in order
        self.values: dict[int, torch.Tensor] = {  # each input's value at alpha = 1 (computed ones: at the first run)
            i.slot: plan.inputs[i.slot].to(torch.float64) for i in inputs if not i.computed}
        self.elements = sum(m.numel() for s, m in plan.meta.items() if m.is_floating_point())  # one point's values
        if self.computed:  # embedding and text vectors: their values are known once the plan has run
            self.outputs([1.0], grad=False)

    def outputs(self, alphas: Sequence[float], grad: bool) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """(every output row's outputs after the head at each alpha, (P, rows, units); the scaled
        inputs by slot, P blocks stacked along their rows (autograd leaves when `grad`))."""
        points = torch.as_tensor(list(alphas), dtype=torch.float64)
        count = len(points)
        slots = {s: t.to(torch.float64) if t.is_floating_point() else t for s, t in self.plan.inputs.items()}
        blocks: dict[int, torch.Size] = {}  # slot -> the shape of one block, for slots held per alpha
        leaves: dict[int, torch.Tensor] = {}

        def scaled(slot: int, value: torch.Tensor) -> torch.Tensor:
            if slot in blocks:
                raise RuntimeError(f"input slot {slot} depends on another input: it cannot be scaled on its own")
            value = self.values.setdefault(slot, value.detach())
            leaf = (points.reshape(count, *[1] * value.dim()) * value.unsqueeze(0)).reshape(-1, *value.shape[1:])
            leaf = leaf.detach().requires_grad_(grad)
            blocks[slot] = value.shape
            leaves[slot] = leaf
            return leaf

        for i in self.inputs:
            if not i.computed:
                slots[i.slot] = scaled(i.slot, slots[i.slot])
        with torch.set_grad_enabled(grad):
            for out, kind, run, args, attrs in self.program:
                if run is None:
                    slots[out] = self.weights[attrs["name"]]
                    continue
                values = [slots[a] for a in args]
                held = [a in blocks for a in args]
                if out in self.same:
                    slots[out] = values[0]
                    if held[0]:
                        blocks[out] = blocks[args[0]]
                elif not any(held):
                    slots[out] = run(*values)
                else:
                    slots[out], blocks[out] = _batched(kind, run, attrs, values, held, [blocks.get(a) for a in args],
                                                       count, self.plan.meta.get(out))
                if out in self.computed:
                    slots[out] = scaled(out, slots[out])
            slot = self.plan.outputs[self.output]
            value = slots[slot]
            if slot not in blocks:  # no input reaches the output: the same value at every alpha
                value, blocks[slot] = value.unsqueeze(0).expand(count, *value.shape).reshape(-1, *value.shape[1:]), value.shape
            rows = blocks[slot][0]
            return self.head(value.reshape(count * rows, -1)).reshape(count, rows, -1), leaves


def _identity(plan: Plan, x: int, rows: int) -> bool:
    """Whether a gather's row index is a plan input reading each of x's rows once, in order (the
    plain plan reads a relation's rows so where a rule's groundings are the relation's rows)."""
    index = plan.inputs.get(rows)
    meta = plan.meta.get(x)
    return (index is not None and meta is not None and meta.dim() >= 1 and index.dim() == 1
            and len(index) == meta.shape[0] and bool(torch.equal(index, torch.arange(len(index), dtype=index.dtype))))


def _batched(kind: str, run: Callable, attrs: dict, values: list[torch.Tensor], held: list[bool],
             shapes: list[torch.Size | None], count: int, meta: torch.Tensor | None) -> tuple[torch.Tensor, torch.Size]:
    """One op on stacked blocks: (the result's blocks stacked, one block's shape). A result of one
    call must have the shape the plan gives one block (`meta`) times the blocks, else (a kernel
    that does not keep rows apart) each block runs alone."""
    out = _at_once(kind, run, attrs, values, held, shapes, count)
    if out is not None and meta is not None and meta.dim() >= 1 and \
            tuple(out.shape) == (count * meta.shape[0], *meta.shape[1:]):
        return out, meta.shape
    parts = [run(*[v.reshape(count, *s)[p] if h else v for v, h, s in zip(values, held, shapes)]) for p in range(count)]
    shape = parts[0].shape
    return (torch.cat(parts) if len(shape) else torch.stack(parts)), shape


def _offset(index: torch.Tensor, rows: int, count: int) -> torch.Tensor:
    """`index` (into one block of `rows` rows) for every block, in block order."""
    steps = torch.arange(count, dtype=index.dtype).reshape(count, *[1] * index.dim()) * rows
    return (index.unsqueeze(0) + steps).reshape(-1, *index.shape[1:])


def _aligned(values: list[torch.Tensor], held: list[bool], shapes: list, rows_at: Sequence[int], count: int) -> list | None:
    """The row-aligned arguments at `rows_at` made all-block: a value held once is repeated over
    the blocks where it has the blocks' rows (a single row or a 0-d value broadcasts as it is);
    None where that cannot be decided (then each block runs alone)."""
    ref = next((shapes[k] for k in rows_at if held[k]), None)
    if ref is None or len(ref) == 0:
        return None
    out = list(values)
    for k in rows_at:
        v = values[k]
        if held[k]:
            if len(shapes[k]) != len(ref) or shapes[k][0] != ref[0]:
                return None
        elif v.dim() == 0 or (v.dim() == len(ref) and v.shape[0] == 1):
            continue
        elif v.dim() == len(ref) and v.shape[0] == ref[0]:
            out[k] = v.unsqueeze(0).expand(count, *v.shape).reshape(-1, *v.shape[1:])
        else:
            return None
    return out


def _at_once(kind: str, run: Callable, attrs: dict, values: list[torch.Tensor], held: list[bool], shapes: list,
             count: int) -> torch.Tensor | None:
    """The op over all blocks in one call, or None where it has no such rule here."""
    if kind in ROW_WISE or kind in ALL_ROWS:
        rows_at, single = ROW_WISE.get(kind, (tuple(range(len(values))), ()))
        if kind == "binary" and attrs.get("reshape_right") is not None:
            rows_at, single = (0,), (1,)
        if any(held[k] for k in single) or any(held[k] for k in range(len(values)) if k not in rows_at and k not in single):
            return None
        if kind == "dense_reduce" and shapes[0][0] % attrs["width"]:
            return None
        aligned = _aligned(values, held, shapes, rows_at, count)
        return None if aligned is None else run(*aligned)
    if kind == "gather" and held == [True, False] and len(shapes[0]):
        return run(values[0], _offset(values[1], shapes[0][0], count))
    if kind == "segment" and held == [True, False, False] and len(shapes[0]):
        x, ids, counts = values
        return kernels.segment_reduce(attrs["kind"], x, _offset(ids, counts.shape[0], count), counts.repeat(count))
    if kind == "scatter" and held == [True, False] and len(shapes[0]):
        return kernels.scatter_rows(values[0], _offset(values[1], attrs["rows"], count), attrs["rows"] * count)
    if kind == "attention" and not any(held[2:]):
        aligned = _aligned(values, held, shapes, (0, 1), count)
        if aligned is None:
            return None
        ids, counts = values[2], values[3]
        return kernels.attention(aligned[0], aligned[1], _offset(ids, counts.shape[0], count), counts.repeat(count),
                                 attrs["mode"])
    return None
