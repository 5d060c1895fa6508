"""A small plan run as one generated straight-line function with one autograd node.

On tiny tensors (NeuraLogic's XOR, Family, Trains: a few rows of one value each) an op's cost is
not its arithmetic but torch's fixed price per call: the interpreter loop, the kernel's shape
branches, one autograd node recorded per torch call (reshapes included) and walked again by the
backward engine. Here the plan becomes Python source: the forward is one function of the
weights and inputs run under no_grad with each op's shape case decided once, at generation
(a width-1 average is no op at all), and the backward is a second generated function of
hand-written vector-Jacobian products (torch's own backward kernels where aten has one:
tanh_backward, sigmoid_backward, threshold_backward). One torch.autograd.Function joins them,
so autograd records one node for the whole plan.

Only ops whose VJP is written here are fused; a plan with any other op (or a random one:
dropout) keeps the interpreter (`fusable` says why not). Values are those of the same torch
kernels; gradients equal autograd's to rounding (tests/test_small_plans.py, float64 1e-12).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from relsql.compile import kernels, sparse
from relsql.compile.ops import is_random
from relsql.compile.plan import Op, Plan

# Measured on chains of tanh(w * h) over (n, 1) values, fwd + bwd, one thread (bench.neuralogic
# chain_net): fused / op by op 0.70 at n = 512, 0.80 at 2048, 0.93 at 8192, 1.02 at 16384, 1.06
# at 32768 and 131072 (its non-in-place activations allocate more); summing (1,) weights'
# gradients as one (n, k) product pays up to ~1k rows (331 against 360 us at 512, 1050
# against 829 at 4096: a column-wise sum over a wide product is slow).
# Those chains lose a few % from 16k elements, but on Template.auto's plans of the outside corpus
# (2026-12-03, fwd + bwd, one thread, docs/performance.md) what decides is the elements an op's value
# holds on average, not the largest value: 5-335 ops of up to 45k elements each (hostile, PluRel,
# Lahman; values up to 1.4M elements) ran fused in 0.47-1.11x the time op by op (median 0.77);
# bench/relgen's at scale 4 (80k-140k elements an op) 0.82-1.21x.
OP_ELEMENTS = 1 << 16  # the most elements an op's value holds on average in a fused plan
COLUMN_ROWS = 1024  # (1,) weights read by values of at most this many rows get their gradients in one product
# index_add_ of (139, w) rows into 8 (Mutagenesis' gathers' gradients), 2 threads: 6.9 us against
# index_put_(accumulate=True)'s 11.9 at w = 4, 9.8 / 11.1 at 8, 80.7 / 8.3 at 16, 95 / 12 at 32
# (index_add_ takes a slow path from 16 elements a row); 1000 rows into 500: 25.7 / 20.2 at 8.
ACCUMULATE_WIDTH = 8
_ACT_BACKWARD = {  # activation -> VJP from (grad, output y, input x)
    "identity": None,
    "tanh": "_tanh_backward({g}, {y})",  # aten's kernels: autograd's own formulas
    "sigmoid": "_sigmoid_backward({g}, {y})",
    "relu": "_threshold_backward({g}, {y}, 0)",
    "exp": "{g} * {y}",
}
_ACT_FORWARD = {"identity": "{x}", "tanh": "_tanh({x})", "sigmoid": "torch.sigmoid({x})",
                "relu": "torch.relu({x})", "exp": "torch.exp({x})"}


class NotFusable(Exception):
    """An op this module has no VJP for (the plan then runs op by op)."""


@dataclass
class _Rule:
    """One op's generated code: `forward` lines writing v<out>; `back` maps an argument's
    position to an expression of its gradient contribution (in g, the output's gradient)."""

    forward: list[str]
    back: dict[int, str | None] = field(default_factory=dict)
    alias: bool = False  # v<out> is v<arg0> itself: its gradient is passed on unchanged
    column: int | None = None  # a (1,) weight times this (n, 1) value slot: its gradient, sum(g * x),
    # is taken for all such weights of n rows at once (one cat, product and sum, not two calls each)
    before: str | None = None  # a backward value b<out> computed once (in g) that the `back` expressions read as {b}


def _v(slot: int) -> str:
    return f"v{slot}"


def _shape(shapes: dict[int, tuple], slot: int) -> tuple:
    return shapes[slot][0]


def _linear(op: Op, shapes: dict) -> _Rule:
    """kernels.apply_weight's cases, each as the one torch call it makes."""
    w, x = op.args
    ws, xs = _shape(shapes, w), _shape(shapes, x)
    out, vw, vx = _v(op.out), _v(w), _v(x)
    if len(xs) != 2:
        raise NotFusable("linear of a matrix-valued atom")
    if len(ws) == 0 or ws == (1,):  # a scalar weight scales the value (broadcast: no reshaped view)
        column = ws == (1,) and xs[1] == 1 and xs[0] <= COLUMN_ROWS
        grad_w = f"({{g}} * {vx}).sum(0)" if column else f"({{g}} * {vx}).sum().reshape({ws})"
        return _Rule([f"{out} = {vx} * {vw}"], {0: grad_w, 1: f"{{g}} * {vw}"}, column=x if column else None)
    if len(ws) == 1 and xs[1] == 1:  # (m,) weight times a scalar value
        return _Rule([f"{out} = {vx} * {vw}.unsqueeze(0)"],
                     {0: f"({{g}} * {vx}).sum(0)", 1: f"({{g}} * {vw}.unsqueeze(0)).sum(1, keepdim=True)"})
    if len(ws) == 1 and xs[1] == ws[0]:  # elementwise
        return _Rule([f"{out} = {vx} * {vw}.reshape(1, {ws[0]})"],
                     {0: f"({{g}} * {vx}).sum(0)", 1: f"{{g}} * {vw}.reshape(1, {ws[0]})"})
    if len(ws) == 2 and xs[1] == ws[1]:
        return _Rule([f"{out} = torch.nn.functional.linear({vx}, {vw})"],
                     {0: _matrix_gradient(ws, vx), 1: f"{{g}}.mm({vw})"})
    raise NotFusable(f"linear of a {ws} weight on {xs} values")


def _matrix_gradient(ws: tuple, vx: str) -> str:
    """The gradient of a matrix W (out, in) in x Wᵀ: gᵀx, or for a narrow W (kernels.transposed: the
    interpreter multiplies by a contiguous Wᵀ) (xᵀg)ᵀ, the product the interpreter's backward makes
    (2490 rows, W 16 x 8: 19 against 76 us; MKL's speed depends on which side is the longer)."""
    if kernels.narrow_shape(tuple(ws)):
        return f"{vx}.t().mm({{g}}).t()"
    return f"{{g}}.t().mm({vx})"


def _act(op: Op, shapes: dict) -> _Rule:
    name = op.attrs["name"]
    if name not in _ACT_FORWARD or op.attrs.get("heads", 1) != 1:
        raise NotFusable(f"activation {name}")
    x, out = _v(op.args[0]), _v(op.out)
    if name == "identity":
        return _Rule([f"{out} = {x}"], alias=True)
    back = _ACT_BACKWARD[name].format(g="{g}", y=out)
    return _Rule([f"{out} = " + _ACT_FORWARD[name].format(x=x)], {0: back})


def _dense_reduce(op: Op, shapes: dict) -> _Rule:
    kind, width = op.attrs["kind"], op.attrs["width"]
    x, out = op.args[0], _v(op.out)
    xs = _shape(shapes, x)
    if kind not in ("sum", "avg"):
        raise NotFusable(f"dense {kind}")
    if width == 1:  # a sum or mean of one element is that element, exactly
        return _Rule([f"{out} = {_v(x)}"], alias=True)
    grouped = (xs[0] // width, width, *xs[1:])
    reduce = "sum" if kind == "sum" else "mean"
    back = f"{{g}}.unsqueeze(1).expand({grouped}).reshape({xs})"
    return _Rule([f"{out} = {_v(x)}.reshape({grouped}).{reduce}(dim=1)"],
                 {0: back if kind == "sum" else f"({back} / {width})"})


def _sum_like(op: Op, shapes: dict, kind: str) -> _Rule:
    """combine sum/avg/elementproduct and sum: the chain of binary ops kernels.combine runs, in its
    order, a (n, 1) column broadcast against (n, m) values as torch broadcasts it; each value's
    gradient summed back to its shape (autograd's sum_to_size). A one-row value (a constant)
    broadcasts over the rows as kernels.broadcast_rows expands it."""
    if kind not in ("sum", "avg", "elementproduct"):
        raise NotFusable(f"combine {kind}")
    arg_shapes = [tuple(_shape(shapes, a)) for a in op.args]
    out_shape = tuple(_shape(shapes, op.out))
    if len(out_shape) != 2 or any(len(a) != 2 or a[0] not in (1, out_shape[0]) or a[1] not in (1, out_shape[1])
                                  for a in arg_shapes):
        raise NotFusable(f"combine {kind} of values of shapes {arg_shapes}")
    out = _v(op.out)
    symbol = " * " if kind == "elementproduct" else " + "
    lines = [f"{out} = {_v(op.args[0])}"] + [f"{out} = {out}{symbol}{_v(a)}" for a in op.args[1:]]
    if len(op.args) == 1:
        return _Rule(lines, alias=True) if kind != "avg" else _Rule(lines + [f"{out} = {out} / 1"], {0: "{g}"})
    if kind == "avg":
        lines.append(f"{out} = {out} / {len(op.args)}")
    back = {}
    for i, shape in enumerate(arg_shapes):
        if kind == "elementproduct":
            expr = "{g} * " + " * ".join(_v(a) for j, a in enumerate(op.args) if j != i)
        else:
            expr = "{g}" if kind == "sum" else f"({{g}} / {len(op.args)})"
        back[i] = expr if shape == out_shape else f"({expr}).sum_to_size({shape})"
    return _Rule(lines, back)


def _add_rows(zeros: str, rows: str, values: str, shape: tuple) -> str:
    """zeros with `values`' rows added at `rows`: index_add_, or for rows of ACCUMULATE_WIDTH or
    more elements index_put_(accumulate=True) (the same sums in the same order on the CPU)."""
    if math.prod(shape[1:]) >= ACCUMULATE_WIDTH:
        return f"{zeros}.index_put_(({rows},), {values}, accumulate=True)"
    return f"{zeros}.index_add_(0, {rows}, {values})"


def _gather(op: Op, shapes: dict) -> _Rule:
    x, rows = op.args
    xs = _shape(shapes, x)
    return _Rule([f"{_v(op.out)} = _gather({_v(x)}, {_v(rows)})"],
                 {0: _add_rows(f"{{g}}.new_zeros({xs})", _v(rows), "{g}", xs)})


def _scatter(op: Op, shapes: dict) -> _Rule:
    x, heads = op.args
    xs = _shape(shapes, x)
    zeros = f"{_v(x)}.new_zeros(({op.attrs['rows']}, *{xs[1:]}))"
    return _Rule([f"{_v(op.out)} = {_add_rows(zeros, _v(heads), _v(x), xs)}"],
                 {0: f"{{g}}.index_select(0, {_v(heads)})"})


def _cat(op: Op, shapes: dict) -> _Rule:
    back, start = {}, 0
    for i, a in enumerate(op.args):
        rows = _shape(shapes, a)[0]
        back[i] = f"{{g}}.narrow(0, {start}, {rows})"
        start += rows
    return _Rule([f"{_v(op.out)} = torch.cat(({', '.join(_v(a) for a in op.args)},))"], back)


def _spmm(op: Op, shapes: dict) -> _Rule:
    """add + A @ x for a constant A (a CSR matrix with its stored transpose, or a dense one)."""
    add = op.kind == "addspmm"
    args = op.args[1:] if add else op.args
    matrix, dense = args[0], args[-1]
    transposed = args[1] if len(args) == 3 else None
    layout, ds = shapes[matrix][1], _shape(shapes, dense)
    if len(ds) != 2:
        raise NotFusable("sparse product of matrix-valued rows")
    call = f"_matmul({_v(matrix)}, {_v(dense)}, {'None' if transposed is None else _v(transposed)}, " \
           f"{_v(op.args[0]) if add else 'None'})"
    if layout != torch.strided and transposed is None:
        raise NotFusable("CSR product without its stored transpose")
    through = f"sparse_product({_v(transposed)}, {{g}}.contiguous(), None)" if layout != torch.strided \
        else f"{_v(matrix)}.t().mm({{g}})"
    back = {len(op.args) - 1: through}
    if add:
        back[0] = _summed_back(shapes, op.args[0], op.out)
    return _Rule([f"{_v(op.out)} = {call}"], back)


def _summed_back(shapes: dict, added: int, out: int) -> str:
    """The gradient of a value added to an op's result: the result's, summed back to the value's
    shape only where the value was broadcast (a call less per op where it was not)."""
    shape = _shape(shapes, added)
    return "{g}" if tuple(shape) == tuple(_shape(shapes, out)) else f"{{g}}.sum_to_size({shape})"


def _affine(op: Op, shapes: dict) -> _Rule:
    c, x, w = op.args
    if len(_shape(shapes, x)) != 2 or len(_shape(shapes, w)) != 2:
        raise NotFusable("affine of matrix-valued atoms")
    return _Rule([f"{_v(op.out)} = torch.addmm({_v(c)}, {_v(x)}, {_v(w)}.t())"],
                 {0: _summed_back(shapes, c, op.out), 1: f"{{g}}.mm({_v(w)})",
                  2: _matrix_gradient(_shape(shapes, w), _v(x))})


def _stacked_linear(op: Op, shapes: dict) -> _Rule:
    """Constants side by side times weights stacked (passes/stack_products.py): each weight's
    gradient is its columns of the constants against the output's gradient."""
    x, *weights = op.args
    flags = op.attrs["transposed"]
    stacked = ", ".join(f"{_v(w)}.t()" if t else _v(w) for w, t in zip(weights, flags))
    back, start = {}, 0
    for i, (w, t) in enumerate(zip(weights, flags), start=1):
        ws = _shape(shapes, w)
        width = ws[1] if t else ws[0]
        rows = f"{{b}}.narrow(0, {start}, {width})"
        back[i] = f"{rows}.t()" if t else rows
        start += width
    # the stacked matrix's gradient as one product, each weight its rows (as autograd's mm and cat): a
    # product per weight over its narrow columns of x was 4.6x slower ((2490, 39) constants, 3 weights)
    return _Rule([f"{_v(op.out)} = {_v(x)}.mm(torch.cat(({stacked},)))"], back, before=f"{_v(x)}.t().mm({{g}})")


def _narrow(op: Op, shapes: dict, dim: int, start: int, length: int) -> _Rule:
    xs = _shape(shapes, op.args[0])
    return _Rule([f"{_v(op.out)} = {_v(op.args[0])}.narrow({dim}, {start}, {length})"],
                 {0: f"_widen({{g}}, {xs}, {dim}, {start})"})


def _binary(op: Op, shapes: dict) -> _Rule:
    """left + - * right, the right side optionally reshaped to (1, *shape) (ops._binary): each
    side's gradient summed back to its own shape where it was broadcast (autograd's sum_to_size)."""
    left, right = op.args
    ls, rs, os_ = _shape(shapes, left), _shape(shapes, right), _shape(shapes, op.out)
    reshaped = op.attrs.get("reshape_right")
    r = f"{_v(right)}.reshape({(1, *reshaped)})" if reshaped is not None else _v(right)
    rs_used = (1, *reshaped) if reshaped is not None else rs
    symbol = op.attrs["op"]
    if symbol not in ("+", "-", "*"):
        raise NotFusable(f"binary {symbol}")

    def back(expr: str, used: tuple, own: tuple) -> str:
        if tuple(used) != tuple(os_):
            expr = f"({expr}).sum_to_size({tuple(used)})"
        return expr if tuple(used) == tuple(own) else f"({expr}).reshape({tuple(own)})"
    if symbol == "*":
        grads = {0: back(f"{{g}} * {r}", ls, ls), 1: back(f"{{g}} * {_v(left)}", rs_used, rs)}
    else:
        grads = {0: back("{g}", ls, ls), 1: back("{g}" if symbol == "+" else "-{g}", rs_used, rs)}
    return _Rule([f"{_v(op.out)} = {_v(left)} {symbol} {r}"], grads)


def _as_row(op: Op, shapes: dict) -> _Rule:
    """A weight as one row (ops' as_row): a view; its gradient is the row reshaped back."""
    x = op.args[0]
    xs = _shape(shapes, x)
    view = f"{_v(x)}.reshape(1, -1)" if len(xs) <= 1 else f"{_v(x)}.unsqueeze(0)"
    return _Rule([f"{_v(op.out)} = {view}"], {0: f"{{g}}.reshape({tuple(xs)})"})


def _weight_rows(op: Op, shapes: dict) -> _Rule:
    """Equal (m, 1) weight columns stacked as rows, optionally times a constant column (ops'
    weight_rows): weight i's gradient is row i (times its constant), reshaped back."""
    scaled = op.attrs.get("scaled", False)
    weights = op.args[:-1] if scaled else op.args
    k = len(weights)
    rows = f"torch.stack(({''.join(_v(w) + ', ' for w in weights)})).reshape({k}, -1)"
    if not scaled:
        return _Rule([f"{_v(op.out)} = {rows}"],
                     {i: f"{{g}}[{i}].reshape({tuple(_shape(shapes, w))})" for i, w in enumerate(weights)})
    scale = _v(op.args[-1])
    return _Rule([f"{_v(op.out)} = {rows} * {scale}"],
                 {i: f"({{g}}[{i}] * {scale}[{i}]).reshape({tuple(_shape(shapes, w))})" for i, w in enumerate(weights)})


def _segment(op: Op, shapes: dict) -> _Rule:
    """kernels.segment_reduce of sorted groundings into their segments (run without gradients, as
    the interpreter runs it there); the groundings' gradient: each reads its segment's (sum), over
    the count (avg), or shared by the rows equal to the extreme (max, min). A count reads no value."""
    kind = op.attrs["kind"]
    x, ids, counts = (_v(a) for a in op.args)
    forward = [f"{_v(op.out)} = _segment_reduce({kind!r}, {x}, {ids}, {counts})"]
    if kind == "count":
        return _Rule(forward, {0: None})
    if kind == "sum":
        return _Rule(forward, {0: f"{{g}}.index_select(0, {ids})"})
    if kind == "avg":
        return _Rule(forward, {0: f"_mean_gradient({{g}}, {ids}, {counts})"})
    if kind in ("max", "min"):
        return _Rule(forward, {0: f"_extreme_gradient({{g}}, {x}, {ids}, {_v(op.out)})"})
    raise NotFusable(f"segment {kind}")


def _bag(op: Op, shapes: dict) -> _Rule:
    """kernels.bag_mean: the mean of each row's bucket vectors; the weight's gradient is _BagMean's."""
    w, ids = op.args
    pad, rows = op.attrs["pad"], _shape(shapes, w)[0]
    return _Rule([f"{_v(op.out)} = _bag_mean({_v(w)}, {_v(ids)}, {pad})"],
                 {0: f"_bag_gradient({{g}}, {_v(ids)}, {pad}, {rows})"})


RULES: dict[str, Callable[[Op, dict], _Rule]] = {
    "linear": _linear,
    "act": _act,
    "dense_reduce": _dense_reduce,
    "combine": lambda op, shapes: _sum_like(op, shapes, op.attrs["kind"]),
    "sum": lambda op, shapes: _sum_like(op, shapes, "sum"),
    "gather": _gather,
    "scatter": _scatter,
    "cat": _cat,
    "spmm": _spmm,
    "addspmm": _spmm,
    "affine": _affine,
    "stacked_linear": _stacked_linear,
    "broadcast": lambda op, shapes: _Rule([f"{_v(op.out)} = {_v(op.args[0])}.expand({op.attrs['rows']}, "
                                           f"*{_shape(shapes, op.args[0])[1:]})"],
                                          {0: f"{{g}}.sum_to_size({_shape(shapes, op.args[0])})"}),
    "slice": lambda op, shapes: _narrow(op, shapes, 0, op.attrs["start"], op.attrs["rows"]),
    "columns": lambda op, shapes: _narrow(op, shapes, 1, op.attrs["start"], op.attrs["width"]),
    "binary": _binary,
    "segment": _segment,
    "bag": _bag,
    "as_row": _as_row,
    "weight_rows": _weight_rows,
}
VIEWS = ("slice", "columns", "as_row", "broadcast")  # ops whose value is a view of their argument's memory


def _widen(g: torch.Tensor, shape: tuple, dim: int, start: int) -> torch.Tensor:
    """The gradient of a narrow: g in its place, zeros elsewhere."""
    full = g.new_zeros(shape)
    full.narrow(dim, start, g.shape[dim]).copy_(g)
    return full


def _gather_rows(x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """ops._gather's rows of x (the same index kernel, a (n, 1) column read as a vector)."""
    if x.dim() == 2 and x.shape[1] == 1:
        return x.reshape(-1).index_select(0, rows).reshape(-1, 1)
    return x.index_select(0, rows)


def _aten(overload) -> Callable:
    """The op's C++ binding where torch exposes it (0.3 us a call less than the overload's __call__)."""
    return getattr(overload, "_op", overload)


_GLOBALS = {"torch": torch, "_tanh": kernels.tanh_values, "_tanh_backward": _aten(torch.ops.aten.tanh_backward.default),
            "_sigmoid_backward": _aten(torch.ops.aten.sigmoid_backward.default),
            "_threshold_backward": _aten(torch.ops.aten.threshold_backward.default), "_gather": _gather_rows,
            "_matmul": sparse.matmul, "sparse_product": sparse.sparse_product,
            "_widen": _widen, "_segment_reduce": kernels.segment_reduce, "_mean_gradient": kernels.mean_gradient,
            "_extreme_gradient": kernels.extreme_gradient,
            "_bag_mean": kernels.bag_mean, "_bag_gradient": kernels.bag_gradient}


@dataclass
class Fused:
    """The generated pair for one plan and one set of weights needing gradients."""

    names: list[str]  # the weights, in the order the functions take them
    inputs: list[int]  # the plan's input slots, in order after the weights
    outputs: list[str]  # relation names, in the order the forward returns them
    forward: Callable
    backward: Callable
    source: str


def _rules(plan: Plan, shapes: dict) -> dict[int, _Rule]:
    rules = {}
    for op in plan.ops:
        if op.kind == "param":
            continue
        if is_random(op.kind) or op.kind not in RULES:
            raise NotFusable(f"op {op.kind}")
        rules[op.out] = RULES[op.kind](op, shapes)
    return rules


def _needing(plan: Plan, trainable: set[str]) -> set[int]:
    """Slots whose value depends on a weight that needs a gradient."""
    need = set()
    for op in plan.ops:
        if op.kind == "param":
            if op.attrs["name"] in trainable:
                need.add(op.out)
        elif any(a in need for a in op.args):
            need.add(op.out)
    return need


def generate(plan: Plan, shapes: dict[int, tuple], trainable: set[str]) -> Fused:
    """Source for the forward (weights, inputs -> outputs, saved values) and the backward (saved
    values, output gradients -> weight gradients); NotFusable if an op has no rule here."""
    rules = _rules(plan, shapes)
    params = [op for op in plan.ops if op.kind == "param"]
    names = list(dict.fromkeys(op.attrs["name"] for op in params))
    inputs = sorted(plan.inputs)
    need = _needing(plan, trainable)
    forward = [f"def forward({', '.join([f'w{i}' for i in range(len(names))] + [_v(s) for s in inputs])}):"]
    for op in plan.ops:
        if op.kind == "param":
            forward.append(f"    {_v(op.out)} = w{names.index(op.attrs['name'])}")
        else:
            forward += ["    " + line for line in rules[op.out].forward]
    backward, grads, reads = [], set(), set()
    columns: dict[int, list[tuple[int, str, int]]] = {}  # rows -> (weight slot, gradient, value slot)
    out_slots = list(dict.fromkeys(plan.outputs.values()))
    for op in reversed(plan.ops):
        if op.kind == "param" or op.out not in need:
            continue
        if op.out in out_slots:  # its gradient from the loss, plus what later ops sent back
            term = f"d{out_slots.index(op.out)}"
            backward.append(f"    g{op.out} = g{op.out} + {term}" if op.out in grads else f"    g{op.out} = {term}")
            grads.add(op.out)
        if op.out not in grads:
            continue
        rule = rules[op.out]
        if rule.before is not None and any(arg in need for arg in op.args):
            expr = rule.before.format(g=f"g{op.out}")
            reads.update(int(t[1:]) for t in _names(expr) if t[0] == "v")
            backward.append(f"    b{op.out} = {expr}")
        for position, arg in enumerate(op.args):
            if arg not in need:
                continue
            if position == 0 and rule.column is not None:
                columns.setdefault(shapes[rule.column][0][0], []).append((arg, f"g{op.out}", rule.column))
                reads.add(rule.column)
                continue
            if rule.alias:
                expr = f"g{op.out}"
            elif rule.back.get(position) is None:  # an argument whose value the op does not read (a count)
                continue
            else:
                expr = rule.back[position].format(g=f"g{op.out}", b=f"b{op.out}")
                reads.update(int(t[1:]) for t in _names(expr) if t[0] == "v")
            backward.append(f"    g{arg} = g{arg} + {expr}" if arg in grads else f"    g{arg} = {expr}")
            grads.add(arg)
    backward += _column_sums(columns, grads)
    for op in params:  # a weight read by an output directly: its gradient is the loss's
        if op.out in out_slots and op.out in need:
            term = f"d{out_slots.index(op.out)}"
            backward.append(f"    g{op.out} = g{op.out} + {term}" if op.out in grads else f"    g{op.out} = {term}")
            grads.add(op.out)
    rebuilt = _rebuilt_views(plan, rules, reads)
    root, storage = _roots(plan, rules)
    outputs_at = {storage(s) for s in out_slots}
    held = [s for s in sorted(reads) if storage(s) in plan.param_slots or storage(s) in outputs_at]
    kept = [s for s in sorted(reads) if s not in held]
    copied = _copied_outputs(plan, out_slots, root)
    forward.append(f"    return ({''.join(_v(s) + ('.clone(), ' if s in copied else ', ') for s in out_slots)}), "
                   f"({''.join(_v(s) + ', ' for s in held)}), "
                   f"({''.join(_v(s) + ', ' for s in kept)})")
    slot_of = {}
    for op in params:
        slot_of.setdefault(op.attrs["name"], []).append(op.out)
    result = ["None" if not any(s in grads for s in slot_of[n]) else
              " + ".join(f"g{s}" for s in slot_of[n] if s in grads) for n in names]
    head = f"def backward(held, kept, grads):\n    ({''.join(_v(s) + ', ' for s in held)}) = held\n" \
           f"    ({''.join(_v(s) + ', ' for s in kept)}) = kept\n" \
           f"    ({''.join(f'd{i}, ' for i in range(len(out_slots)))}) = grads\n" + \
           "".join(f"    {line}\n" for line in rebuilt)
    source = "\n".join(forward) + "\n\n" + head + "\n".join(backward) + f"\n    return ({''.join(r + ', ' for r in result)})\n"
    scope = dict(_GLOBALS)
    exec(compile(source, "<relsql fused plan>", "exec"), scope)  # our own generated source, never user text
    by_slot = {s: i for i, s in enumerate(out_slots)}
    return Fused(names, inputs, [(name, by_slot[s]) for name, s in plan.outputs.items()],
                 scope["forward"], scope["backward"], source)


def _rebuilt_views(plan: Plan, rules: dict[int, _Rule], reads: set[int]) -> list[str]:
    """Views (slice, columns) the backward reads are made again from their base there, not
    saved: a saved view holds its base, and the base may be an output whose grad_fn holds what
    is saved (a reference cycle). Updates `reads` to the bases; returns the lines, in plan order."""
    views = [op for op in plan.ops if op.kind in VIEWS]
    lines = []
    for op in reversed(views):  # a view of a view: its base is read, then rebuilt first
        if op.out in reads:
            reads.discard(op.out)
            reads.add(op.args[0])
            lines.extend(reversed(rules[op.out].forward))
    return lines[::-1]


def _copied_outputs(plan: Plan, out_slots: list[int], root: Callable[[int], int]) -> set[int]:
    """Outputs returned as copies: a weight or input itself (through aliases), a view (slice,
    columns), which could be one of a weight's or an input's, or a tensor another output already
    is (the caller may write into what the plan returns; autograd must not take a weight for a
    new tensor of the plan's, nor one tensor for two outputs)."""
    views = {op.out for op in plan.ops if op.kind in VIEWS}
    sources = set(plan.param_slots) | set(plan.inputs) | views
    copied, seen = set(), set()
    for s in out_slots:
        if root(s) in sources or root(s) in seen:
            copied.add(s)
        seen.add(root(s))
    return copied


def _roots(plan: Plan, rules: dict[int, _Rule]) -> tuple[Callable[[int], int], Callable[[int], int]]:
    """Each slot's origin through aliases (a width-1 mean is its input itself), and the tensor
    whose memory it shares through aliases and views (slice, columns): a value the backward
    keeps on ctx must not hold an output (a reference cycle through the output's grad_fn)."""
    origin: dict[int, int] = {}
    memory: dict[int, int] = {}
    for op in plan.ops:
        if op.kind != "param" and rules[op.out].alias:
            origin[op.out] = origin.get(op.args[0], op.args[0])
        if op.kind in VIEWS or (op.kind != "param" and rules[op.out].alias):
            memory[op.out] = memory.get(op.args[0], op.args[0])
    return (lambda slot: origin.get(slot, slot)), (lambda slot: memory.get(slot, slot))


def _column_sums(columns: dict[int, list[tuple[int, str, int]]], grads: set[int]) -> list[str]:
    """Lines adding sum(g * x) to each (1,) weight's gradient: one product per row count, its
    columns split by weight (a weight read by several products sums its columns)."""
    lines = []
    for group in columns.values():
        group = sorted(group)
        slots = list(dict.fromkeys(slot for slot, _, _ in group))
        counts = [sum(1 for s, _, _ in group if s == slot) for slot in slots]
        if len(group) == 1:
            parts = [f"({group[0][1]} * {_v(group[0][2])}).sum(0)"]
        else:
            lines.append(f"    _s = (torch.cat(({', '.join(g for _, g, _ in group)},), 1) * "
                         f"torch.cat(({', '.join(_v(x) for _, _, x in group)},), 1)).sum(0)"
                         + (f".reshape({len(group)}, 1).unbind(0)" if len(slots) == len(group) else f".split({counts})"))
            parts = [f"_s[{i}]" if n == 1 else f"_s[{i}].sum(0, keepdim=True)" for i, n in enumerate(counts)]
        for slot, expr in zip(slots, parts):
            lines.append(f"    g{slot} = g{slot} + {expr}" if slot in grads else f"    g{slot} = {expr}")
            grads.add(slot)
    return lines


def _names(expr: str) -> list[str]:
    return re.findall(r"\bv\d+\b", expr)


class _Plan(torch.autograd.Function):
    """The whole plan as one autograd node: forward and backward are the generated functions.
    The plan's inputs come as one list (constants: autograd need not look at each); values the
    backward reads are saved for it (weights and outputs, with autograd's in-place checks) or
    kept on ctx (intermediates made under no_grad, which nothing else can reach)."""

    @staticmethod
    def forward(ctx, fused: Fused, inputs: list[torch.Tensor], *weights: torch.Tensor):
        outputs, held, kept = fused.forward(*weights, *inputs)
        ctx.fused, ctx.kept = fused, kept
        ctx.save_for_backward(*held)
        return outputs

    @staticmethod
    def backward(ctx, *grads: torch.Tensor):
        return (None, None, *ctx.fused.backward(ctx.saved_tensors, ctx.kept, grads))


def precheck(plan: Plan, limit: int | None) -> str | None:
    """Why the plan cannot or should not fuse, from its ops alone (no run): an op without a
    rule, or (with `limit`) ops whose values hold more than `limit` elements on average, as
    planned; None if it may."""
    for op in plan.ops:
        if op.kind != "param" and (is_random(op.kind) or op.kind not in RULES):
            return f"op {op.kind}"
    if limit is not None:
        return too_large(_average(op.rows * math.prod(op.shape) for op in plan.ops if op.kind != "param"), limit)
    return None


def too_large(average: float, limit: int) -> str | None:
    """Why a plan whose ops' values hold `average` elements each is not fused (None: it is)."""
    return f"its ops' values hold {average:.0f} elements on average (fused up to {limit})" if average > limit else None


def per_op(plan: Plan, shapes: dict[int, tuple]) -> float:
    """The elements an op's value holds on average, weights not counted (a sparse matrix counts its
    stored entries)."""
    return _average(shapes[op.out][2] for op in plan.ops if op.kind != "param")


def _average(sizes) -> float:
    sizes = list(sizes)
    return sum(sizes) / max(len(sizes), 1)


def record_shapes(program: list, slots: dict[int, torch.Tensor], weight: Callable[[str], torch.Tensor]) -> dict[int, tuple]:
    """Run the interpreter's program once without gradients and note each slot's (row shape,
    layout, elements): the generated code is specialized to them."""
    found = {s: _describe(t) for s, t in slots.items()}
    with torch.no_grad():
        for out, run, args in program:
            slots[out] = weight(args[0]) if run is None else run(*[slots[a] for a in args])
            found[out] = _describe(slots[out])
    return found


def _describe(t: torch.Tensor) -> tuple:
    if t.layout == torch.strided:
        return tuple(t.shape), t.layout, t.numel()
    return tuple(t.shape), t.layout, int(t._nnz())


def run(fused: Fused, weights: list[torch.Tensor], inputs: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """The plan's outputs by relation, through the one autograd node (or plainly without grad)."""
    if torch.is_grad_enabled() and any(w.requires_grad for w in weights):
        values = _Plan.apply(fused, inputs, *weights)
    else:
        with torch.no_grad():
            values = fused.forward(*weights, *inputs)[0]
    return {name: values[i] for name, i in fused.outputs}
