"""The table of op kinds: what each op of a plan computes (its kernel), how many rows it yields
(its row rule), which arguments are not plain data (for shape inference on stand-ins) and how
`relsql explain` writes it. The module, shape inference and explain all look an op up here, so a
new op kind is one entry in OPS. This module only knows kernels: it imports no plan, module or
template (it sits below all three).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from relsql.compile import kernels, sparse

Kernel = Callable[..., torch.Tensor]
LAYER_NORM_EPS = 1e-5  # layer_norm's variance floor, torch.nn.LayerNorm's default
Rows = Callable[[list[torch.Tensor], dict], int]
Describe = Callable[[list[str], Any, Any], str]  # (argument names, op, plan) -> text


@dataclass(frozen=True)
class OpKind:
    """One op kind. `kernel(attrs)` binds the attributes once and returns a function of the
    op's argument tensors. `rows` gives the output's row count from the arguments (None: the
    common row count of the data arguments). `counts`/`offsets`/`matrices`: argument positions
    that hold per-segment counts, CSR offsets and constant sparse matrices (shape inference
    stands them in with small valid ones). `describe` writes the op for `explain` (None: the
    kind's name applied to the arguments)."""

    kernel: Callable[[dict], Kernel]
    rows: Rows | None = None
    describe: Describe | None = None
    counts: frozenset[int] = field(default_factory=frozenset)
    offsets: frozenset[int] = field(default_factory=frozenset)
    matrices: frozenset[int] = field(default_factory=frozenset)
    random: bool = False  # draws random numbers while training: never folded, shared or moved by passes


def _binary(attrs: dict) -> Kernel:
    shape = attrs.get("reshape_right")
    add, sub = attrs["op"] == "+", attrs["op"] == "-"

    def run(left: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
        if shape is not None:
            right = right.reshape(1, *shape)
        return left + right if add else left - right if sub else left * right
    return run


def _sum(*args: torch.Tensor) -> torch.Tensor:
    out = args[0]
    for a in args[1:]:
        out = out + a
    return out


def _gather(x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Rows of x; a one-column x as a vector (torch's index kernels run ~1.7x faster, forward and
    backward, on (n,) than on (n, 1): attention scores are such columns)."""
    if x.dim() == 2 and x.shape[1] == 1:
        return x.reshape(-1).index_select(0, rows).reshape(-1, 1)
    return x.index_select(0, rows)


def _dense_reduce(attrs: dict) -> Kernel:
    width = attrs["width"]
    if attrs["kind"] == "concat":  # NeuraLogic's concat aggregation: a head's groundings side by side
        return lambda x: x.reshape(x.shape[0] // width, -1)
    reduce = {"sum": torch.sum, "avg": torch.mean, "max": torch.amax, "min": torch.amin}[attrs["kind"]]

    def run(x: torch.Tensor) -> torch.Tensor:
        return reduce(x.reshape(x.shape[0] // width, width, *x.shape[1:]), dim=1)
    return run


def _weight_rows(attrs: dict) -> Kernel:
    scaled = attrs.get("scaled", False)

    def run(*args: torch.Tensor) -> torch.Tensor:  # one stack: two autograd nodes, not one per weight
        weights = args[:-1] if scaled else args  # equal (m, 1) columns: stack_weights makes no other
        rows = torch.stack(weights).reshape(len(weights), -1)
        return rows * args[-1] if scaled else rows
    return run


def _stacked_linear(attrs: dict) -> Kernel:
    flags = attrs["transposed"]

    def run(x: torch.Tensor, *weights: torch.Tensor) -> torch.Tensor:  # constants side by side @ weights stacked
        return torch.mm(x, torch.cat([w.t() if t else w for w, t in zip(weights, flags)]))
    return run


def _describe_stacked_linear(a: list[str], op, plan) -> str:
    parts = ", ".join(f"{name}ᵀ" if t else name for name, t in zip(a[1:], op.attrs["transposed"]))
    return f"{a[0]} @ [{parts}]"


def _act(attrs: dict) -> Kernel:
    name, inplace, slope, heads = attrs["name"], attrs.get("inplace", False), attrs.get("slope", 0.01), attrs.get("heads", 1)
    return lambda x: kernels.activation(name, x, inplace, slope, heads)


def _spmm_rows(args: list[torch.Tensor], matrix: torch.Tensor) -> int:
    if matrix.shape[1] != args[-1].shape[0]:  # a sparse kernel would read out of bounds, not fail
        raise ValueError(f"a {tuple(matrix.shape)} matrix cannot multiply {args[-1].shape[0]} rows")
    return matrix.shape[0]


def _dense_reduce_rows(args: list[torch.Tensor], attrs: dict) -> int:
    if args[0].shape[0] % attrs["width"]:
        raise ValueError(f"{args[0].shape[0]} rows do not split into groups of {attrs['width']}")
    return args[0].shape[0] // attrs["width"]


def _describe_typed_linear(a: list[str], op, plan) -> str:
    counts = plan.inputs.get(op.args[3])
    per_type = "" if counts is None or not counts.numel() else \
        f"; {int((counts > 0).sum())} of {counts.numel()} types present, {int(counts.min())}-{int(counts.max())} rows each"
    grouped = "rows already in type order" if op.attrs.get("sorted") else "rows grouped by type"
    return f"{a[0]}[type of row] @ {a[1]}  (one matrix per type, {grouped}{per_type})"


def _describe_act(a: list[str], op, plan) -> str:
    extra = (f", slope={op.attrs['slope']:g}" if "slope" in op.attrs
             else f", heads={op.attrs['heads']}" if "heads" in op.attrs else "")
    return f"{op.attrs['name']}{'_' if op.attrs.get('inplace') else ''}({a[0]}{extra})"


def _describe_sparse_attention(a: list[str], op, plan) -> str:
    added = f" + {a[8]}" if len(a) > 8 else ""
    return f"attention(softmax({a[0]}) * {a[1]}[cols={a[4]}], rows={a[3]}, heads {op.attrs['mode']}){added}"


def _by_attribute(args: list[torch.Tensor], attrs: dict) -> int:
    return attrs["rows"]


def _second(args: list[torch.Tensor], attrs: dict) -> int:
    return args[1].shape[0]


def _last(args: list[torch.Tensor], attrs: dict) -> int:
    return args[-1].shape[0]


def _layer_norm(attrs: dict) -> Kernel:
    eps = attrs.get("eps", LAYER_NORM_EPS)

    def run(x: torch.Tensor, gain: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.layer_norm(x, x.shape[1:], gain.reshape(x.shape[1:]), bias.reshape(x.shape[1:]), eps)
    return run


def _dropout(attrs: dict) -> Kernel:
    """Inverted dropout while `attrs["training"]()` says the net trains (the module binds its own
    mode there); the identity otherwise, and wherever no mode is bound (shapes, constant folding)."""
    p, training = attrs["p"], attrs.get("training")

    def run(x: torch.Tensor) -> torch.Tensor:
        if training is None or not training() or p == 0.0:
            return x
        return torch.nn.functional.dropout(x, p, training=True)
    return run


def _bag(attrs: dict) -> Kernel:
    """The mean of a row's bucket vectors, padding (id `pad`, the table's last row) left out: a row
    of only padding is a zero vector."""
    pad = attrs["pad"]

    def run(weight: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        return kernels.bag_mean(weight, ids, pad)
    return run


def is_random(kind: str) -> bool:
    """Whether ops of this kind draw random numbers (passes leave them where they are)."""
    found = OPS.get(kind)
    return found is not None and found.random


def _no_kernel(attrs: dict) -> Kernel:
    raise ValueError("a weight has no kernel: the module reads it by name")


OPS: dict[str, OpKind] = {
    "param": OpKind(_no_kernel, describe=lambda a, op, plan: f"weight '{op.attrs['name']}'"),
    "gather": OpKind(lambda attrs: _gather, rows=_second,
                     describe=lambda a, op, plan: f"gather({a[0]}, rows={a[1]})"),
    "slice": OpKind(lambda attrs: lambda x: x.narrow(0, attrs["start"], attrs["rows"]), rows=_by_attribute,  # a view
                    describe=lambda a, op, plan: f"{a[0]}[{op.attrs['start']}:{op.attrs['start'] + op.rows}]"),
    "linear": OpKind(lambda attrs: kernels.apply_weight, rows=_second, describe=lambda a, op, plan: f"{a[0]} @ {a[1]}"),
    "stacked_linear": OpKind(_stacked_linear, describe=_describe_stacked_linear),  # passes/stack_products.py
    "affine": OpKind(lambda attrs: lambda c, x, w: torch.addmm(c, x, kernels.transposed(w)),  # c + x W^T in one GEMM
                     describe=lambda a, op, plan: f"{a[0]} + {a[2]} @ {a[1]}"),
    "binary": OpKind(_binary, describe=lambda a, op, plan: f"{a[0]} {op.attrs['op']} {a[1]}"),
    "act": OpKind(_act, describe=_describe_act),
    "combine": OpKind(lambda attrs: lambda *values: kernels.combine(attrs["kind"], list(values)),
                      describe=lambda a, op, plan: f"combine_{op.attrs['kind']}({', '.join(a)})"),
    "segment": OpKind(lambda attrs: lambda x, ids, counts: kernels.segment_reduce(attrs["kind"], x, ids, counts),
                      rows=_last, counts=frozenset({2}),
                      describe=lambda a, op, plan: f"segment_{op.attrs['kind']}({a[0]}, by={a[1]})"),
    "typed_linear": OpKind(lambda attrs: lambda w, x, order, counts: kernels.typed_linear(w, x, order, counts,
                                                                                          attrs.get("sorted", False)),
                           rows=_second, counts=frozenset({3}), describe=_describe_typed_linear),
    "attention": OpKind(lambda attrs: lambda score, value, ids, counts: kernels.attention(score, value, ids, counts,
                                                                                          attrs["mode"]),
                        rows=_last, counts=frozenset({3}),
                        describe=lambda a, op, plan: f"attention(softmax({a[0]}) * {a[1]}, by={a[2]}, heads {op.attrs['mode']})"),
    # (score, source, rows_of, crow, cols, crow_t, rows_t, order_t); rows: the CSR pattern's
    "sparse_attention": OpKind(lambda attrs: lambda *a: kernels.sparse_attention(*a, mode=attrs["mode"]),
                               rows=lambda args, attrs: args[3].shape[0] - 1, offsets=frozenset({3, 5}),
                               describe=_describe_sparse_attention),
    "scatter": OpKind(lambda attrs: lambda x, heads: kernels.scatter_rows(x, heads, attrs["rows"]), rows=_by_attribute,
                      describe=lambda a, op, plan: f"scatter({a[0]}, into={a[1]}, rows={op.attrs['rows']})"),
    "broadcast": OpKind(lambda attrs: lambda x: kernels.broadcast_rows(x, attrs["rows"]), rows=_by_attribute,
                        describe=lambda a, op, plan: f"broadcast({a[0]}, rows={op.attrs['rows']})"),
    "sum": OpKind(lambda attrs: _sum, describe=lambda a, op, plan: " + ".join(a)),
    # (matrix, dense) or (matrix, its transpose for the backward, dense)
    "spmm": OpKind(lambda attrs: lambda *a: sparse.matmul(a[0], a[-1], a[1] if len(a) == 3 else None),
                   rows=lambda args, attrs: _spmm_rows(args, args[0]), matrices=frozenset({0}),
                   describe=lambda a, op, plan: f"{a[0]} @ {a[-1]}"),
    # c + matrix @ dense: (c, matrix, [transpose,] dense)
    "addspmm": OpKind(lambda attrs: lambda *a: sparse.matmul(a[1], a[-1], a[2] if len(a) == 4 else None, add=a[0]),
                      rows=lambda args, attrs: _spmm_rows(args, args[1]), matrices=frozenset({1}),
                      describe=lambda a, op, plan: f"{a[0]} + {a[1]} @ {a[-1]}"),
    "dense_reduce": OpKind(_dense_reduce, rows=_dense_reduce_rows,
                           describe=lambda a, op, plan: f"{op.attrs['kind']}({a[0]} as [rows/{op.attrs['width']} x "
                                                        f"{op.attrs['width']}], dim=1)"),
    "cat": OpKind(lambda attrs: lambda *a: torch.cat(a)),  # rows of several results stacked
    # a weight computed from two (stack_narrow_linears: A W, then read (A W) x)
    "matmul": OpKind(lambda attrs: torch.matmul, describe=lambda a, op, plan: f"{a[0]} · {a[1]}"),
    # consecutive columns, a view (one product's outputs read apart)
    "columns": OpKind(lambda attrs: lambda x: x.narrow(1, attrs["start"], attrs["width"]),
                      describe=lambda a, op, plan: f"{a[0]}[:, {op.attrs['start']}:{op.attrs['start'] + op.attrs['width']}]"),
    # (m, 1) weights as the rows of one tensor, optionally times a column
    "weight_rows": OpKind(_weight_rows),
    # (x, gain, bias): each row normalized over its elements, then gain * x + bias
    "layer_norm": OpKind(_layer_norm, describe=lambda a, op, plan: f"layer_norm({a[0]}) * {a[1]} + {a[2]}"),
    # (table, ids): the mean of each row's vectors, padding left out (text(...))
    "bag": OpKind(_bag, rows=_second, describe=lambda a, op, plan: f"mean({a[0]}[{a[1]} != {op.attrs['pad']}])"),
    "dropout": OpKind(_dropout, random=True, describe=lambda a, op, plan: f"dropout({a[0]}, p={op.attrs['p']:g})"),
    "as_row": OpKind(lambda attrs: lambda x: x.reshape(1, -1) if x.dim() <= 1 else x.unsqueeze(0),
                     rows=lambda args, attrs: 1, describe=lambda a, op, plan: a[0]),
}


def op_kind(kind: str) -> OpKind:
    """The table's entry; ValueError for a kind it does not hold."""
    found = OPS.get(kind)
    if found is None:
        raise ValueError(f"unknown op {kind}")
    return found


def kernel(kind: str, attrs: dict) -> Kernel:
    """The op's kernel with its attributes bound (the module builds these before the first call)."""
    return op_kind(kind).kernel(attrs)


def run_op(kind: str, args: list[torch.Tensor], attrs: dict) -> torch.Tensor:
    """One op on its arguments (constant folding, shapes on stand-ins)."""
    return kernel(kind, attrs)(*args)


def describe(kind: str, names: list[str], op, plan) -> str:
    """How `explain` writes the op, its arguments given by `names`."""
    found = OPS.get(kind)
    if found is None or found.describe is None:
        return f"{kind}({', '.join(names)})"
    return found.describe(names, op, plan)
