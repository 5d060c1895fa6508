"""Executes a plan as a torch.nn.Module: parameters, index buffers, one kernel call per op."""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable
from typing import TYPE_CHECKING

import polars as pl
import torch
from torch import nn

from relsql.compile import kernels, sparse
from relsql.compile.plan import Plan

if TYPE_CHECKING:
    from relsql.ground.execute import Grounding


Kernel = Callable[..., torch.Tensor]


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


def kernel(kind: str, attrs: dict) -> Kernel:
    """The one place that maps an op to its kernel: a function of the op's argument tensors,
    with the attributes bound once (the module builds these before the first call)."""
    if kind == "gather":
        return _gather
    if kind == "slice":  # consecutive rows, a view
        return lambda x: x.narrow(0, attrs["start"], attrs["rows"])
    if kind == "linear":
        return kernels.apply_weight
    if kind == "affine":  # c + x W^T in one GEMM
        return lambda c, x, w: torch.addmm(c, x, w.t())
    if kind == "binary":
        return _binary(attrs)
    if kind == "act":
        name, inplace, slope, heads = attrs["name"], attrs.get("inplace", False), attrs.get("slope", 0.01), attrs.get("heads", 1)
        return lambda x: kernels.activation(name, x, inplace, slope, heads)
    if kind == "combine":
        return lambda *values: kernels.combine(attrs["kind"], list(values))
    if kind == "segment":
        return lambda x, ids, counts: kernels.segment_reduce(attrs["kind"], x, ids, counts)
    if kind == "typed_linear":
        in_order = attrs.get("sorted", False)
        return lambda w, x, order, counts: kernels.typed_linear(w, x, order, counts, in_order)
    if kind == "attention":
        return lambda score, value, ids, counts: kernels.attention(score, value, ids, counts, attrs["mode"])
    if kind == "sparse_attention":  # (score, source, rows_of, crow, cols, crow_t, rows_t, order_t)
        return lambda *a: kernels.sparse_attention(*a, mode=attrs["mode"])
    if kind == "scatter":
        return lambda x, heads: kernels.scatter_rows(x, heads, attrs["rows"])
    if kind == "broadcast":
        return lambda x: kernels.broadcast_rows(x, attrs["rows"])
    if kind == "sum":
        return _sum
    if kind == "spmm":  # (matrix, dense) or (matrix, its transpose for the backward, dense)
        return lambda *a: sparse.matmul(a[0], a[-1], a[1] if len(a) == 3 else None)
    if kind == "addspmm":  # c + matrix @ dense: (c, matrix, [transpose,] dense)
        return lambda *a: sparse.matmul(a[1], a[-1], a[2] if len(a) == 4 else None, add=a[0])
    if kind == "dense_reduce":
        return _dense_reduce(attrs)
    if kind == "cat":  # rows of several results stacked
        return lambda *a: torch.cat(a)
    if kind == "matmul":  # a weight computed from two (stack_narrow_linears: A W, then read (A W) x)
        return torch.matmul
    if kind == "columns":  # consecutive columns, a view (one product's outputs read apart)
        return lambda x: x.narrow(1, attrs["start"], attrs["width"])
    if kind == "weight_rows":  # (m, 1) weights as the rows of one tensor, optionally times a column
        return _weight_rows(attrs)
    if kind == "as_row":
        return lambda x: x.reshape(1, -1) if x.dim() <= 1 else x.unsqueeze(0)
    raise ValueError(f"unknown op {kind}")


def run_op(kind: str, args: list[torch.Tensor], attrs: dict) -> torch.Tensor:
    """One op on its arguments (constant folding, shapes on meta tensors)."""
    return kernel(kind, attrs)(*args)


def _initial(spec, dtype: torch.dtype, generator: torch.Generator | None) -> torch.Tensor:
    """Sensible defaults: Glorot-like matrices, N(0,1) embeddings, zero biases, given values."""
    if spec.init is not None:
        return torch.as_tensor(spec.init, dtype=dtype).reshape(spec.shape).clone()
    if spec.kind == "bias":
        return torch.zeros(spec.shape, dtype=dtype)
    if spec.kind == "embed":
        return torch.randn(spec.shape, dtype=dtype, generator=generator)
    if spec.kind == "datalog":
        return torch.rand(spec.shape, dtype=dtype, generator=generator) * 2 - 1
    fan_in = spec.shape[-1] if spec.shape else 1
    bound = 1.0 / math.sqrt(max(fan_in, 1))
    return (torch.rand(spec.shape, dtype=dtype, generator=generator) * 2 - 1) * bound


def _program(plan: Plan) -> list[tuple[int, Kernel | None, tuple]]:
    """(output slot, kernel, argument slots) per op; a weight has no kernel and its name as argument."""
    return [(op.out, None, (op.attrs["name"],)) if op.kind == "param" else (op.out, kernel(op.kind, op.attrs), op.args)
            for op in plan.ops]


class CompiledNet(nn.Module):
    """A grounded template: `net()` returns {relation: values in row-id order}."""

    def __init__(self, plan: Plan, grounding: Grounding, dtype: torch.dtype = torch.float32,
                 seed: int | None = None):
        super().__init__()
        self.plan = plan
        self.grounding = grounding
        self.dtype = dtype
        self.seed = seed
        self._param_keys: dict[str, str] = {}
        self._typed: set[str] = set()  # typed linears' weights: one matrix per value of a type column
        self._program: list | None = None  # the plan's bound kernels, made on the first call
        self.weights = nn.ParameterDict()
        self.add_weights(plan)
        self._inputs: dict[int, str] = {}
        for slot, tensor in plan.inputs.items():
            key = f"i{slot}"
            self.register_buffer(key, tensor.to(dtype) if tensor.is_floating_point() else tensor, persistent=False)
            self._inputs[slot] = key

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_program": None}  # kernels are closures; rebuilt on the next call

    def add_weights(self, plan: Plan) -> list[nn.Parameter]:
        """Create the weights of `plan` this module does not have yet; returns the new ones.

        Each weight's initial value depends only on the seed and its name, so a weight gets the
        same start whichever plan (full grounding or a mini-batch's) creates it first.
        """
        created = []
        for name, spec in plan.params.items():
            if spec.external:  # supplied per call (relsql.Model reads it from the database)
                continue
            if name in self._param_keys:
                have = self.weights[self._param_keys[name]]
                if tuple(have.shape) != tuple(spec.shape):
                    from relsql.errors import ShapeError

                    raise ShapeError(f"weight '{name}' has shape {tuple(have.shape)} but this batch needs {tuple(spec.shape)}")
                continue
            generator = None
            if self.seed is not None:
                generator = torch.Generator().manual_seed((self.seed * 1_000_003 + zlib.crc32(name.encode())) % 2**62)
            key = f"w{len(self._param_keys)}"
            self._param_keys[name] = key
            parameter = nn.Parameter(_initial(spec, self.dtype, generator), requires_grad=not spec.fixed)
            if len(self.weights):
                parameter.data = parameter.data.to(next(iter(self.weights.values())).device)
            self.weights[key] = parameter
            if spec.kind == "typed":
                self._typed.add(name)
            created.append(parameter)
        return created

    def set_named_weights(self, values: dict[str, torch.Tensor], fixed: set[str] = frozenset()) -> list[nn.Parameter]:
        """Set weights by template name, creating those this module does not have yet (a model
        trained in mini-batches may have met weights its first batch did not); returns new ones."""
        created = []
        for name, value in values.items():
            if name not in self._param_keys:
                key = f"w{len(self._param_keys)}"
                self._param_keys[name] = key
                device = next(iter(self.weights.values())).device if len(self.weights) else value.device
                self.weights[key] = nn.Parameter(value.detach().to(device, self.dtype).clone(), requires_grad=name not in fixed)
                created.append(self.weights[key])
            else:
                parameter = self.weights[self._param_keys[name]]
                if tuple(parameter.shape) != tuple(value.shape):  # an embedding that met new values: they start at zero
                    grown = torch.zeros_like(parameter)
                    grown[: value.shape[0]] = value
                    value = grown
                with torch.no_grad():
                    parameter.copy_(value)
        return created

    def named_weights(self) -> dict[str, torch.Tensor]:
        """Every weight under its template name (named weights keep their names); a typed linear's
        matrices one per type, `name[<value>]` (the value as str(), NULL for a NULL type), as views
        of its (types, out, in) parameter: copying into one under torch.no_grad() sets that type's
        matrix. Views hold no .grad: gradients are on `weights_by_name()`'s whole parameters."""
        found: dict[str, torch.Tensor] = {}
        for name, weight in self.weights_by_name().items():
            if name not in self._typed or name not in self.grounding.dictionaries:
                found[name] = weight
                continue
            dictionary = self.grounding.dictionaries[name]
            for value, code in zip(dictionary.column("value").to_pylist(), dictionary.column("code").to_pylist()):
                if code < weight.shape[0]:
                    found[f"{name}[{'NULL' if value is None else value}]"] = weight[code]
        return found

    def weights_by_name(self) -> dict[str, nn.Parameter]:
        """Every weight as one parameter under its template name (what optimizers, checkpoints
        and saved models hold)."""
        return {name: self.weights[key] for name, key in self._param_keys.items()}

    def forward(self) -> dict[str, torch.Tensor]:
        if self._program is None:
            self._program = _program(self.plan)
        return self._execute(self.plan, self._program, {s: self._buffers[k] for s, k in self._inputs.items()})

    def run(self, plan: Plan, external: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        """Execute another plan of the same template (a mini-batch's) with this module's weights.

        Its inputs move to this module's device and dtype; `external` supplies the values of
        weights that live outside the module (embeddings stored in the database), by name.
        """
        device = next(iter(self.weights.values())).device if len(self.weights) else torch.device("cpu")
        inputs = {slot: t.to(device, self.dtype) if t.is_floating_point() else t.to(device) for slot, t in plan.inputs.items()}
        return self._execute(plan, _program(plan), inputs, external or {})

    def _execute(self, plan: Plan, program: list[tuple[int, Kernel | None, tuple]], slots: dict[int, torch.Tensor],
                 external: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        weights, keys = self.weights._parameters, self._param_keys  # plain dicts: no Module lookups per op
        for out, run, args in program:
            if run is None:  # a weight, by name
                name = args[0]
                slots[out] = external[name] if external and name in external else weights[keys[name]]
            else:
                slots[out] = run(*[slots[a] for a in args])
        return {name: slots[slot] for name, slot in plan.outputs.items()}

    def values(self, relation: str, outputs: dict[str, torch.Tensor] | None = None) -> pl.DataFrame:
        """A relation's key columns and its `value` (flattened to a list of floats) per row; a key
        named `value` keeps its name and the vector gets the first free one (`value_1`, ...)."""
        from relsql.db import free_name
        from relsql.errors import RelsqlError

        if relation not in self.grounding.relations:
            raise RelsqlError(f"no relation `{relation}`; the template declares {list(self.grounding.relations)}")
        if relation not in self.plan.outputs:
            raise RelsqlError(f"relation `{relation}` was compiled away: this net computes only {list(self.plan.outputs)} "
                              "(relsql.compile(..., outputs=...)); compile without `outputs` to read every relation")
        outputs = outputs if outputs is not None else self.forward()
        with torch.no_grad():
            value = outputs[relation].detach().to("cpu", torch.float64)
        keys = pl.from_arrow(self.grounding.relations[relation].keys).drop("_rid")
        flat = value.reshape(value.shape[0], -1).numpy()
        name = free_name("value", {k.casefold() for k in keys.columns})
        return keys.with_columns(pl.Series(name, flat.tolist(), dtype=pl.List(pl.Float64)))

    def dictionary(self, weight: str) -> pl.DataFrame:
        """The categorical values behind an embedding's rows: `value`, `code` (= row)."""
        from relsql.errors import RelsqlError

        if weight not in self.grounding.dictionaries:
            raise RelsqlError(f"`{weight}` is not an embedding; embeddings: {sorted(self.grounding.dictionaries)}")
        return pl.from_arrow(self.grounding.dictionaries[weight])

    def explain(self) -> str:
        from relsql.compile.explain import explain

        return explain(self.plan)
