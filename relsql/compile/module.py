"""Executes a plan as a torch.nn.Module: parameters, index buffers, one kernel call per op."""

from __future__ import annotations

import math
import zlib
from typing import TYPE_CHECKING

import polars as pl
import torch
from torch import nn

from relsql.compile import kernels, sparse
from relsql.compile.plan import Plan

if TYPE_CHECKING:
    from relsql.ground.execute import Grounding


def run_op(kind: str, args: list[torch.Tensor], attrs: dict) -> torch.Tensor:
    """The one place that maps an op to its kernel (also used on meta tensors for shapes)."""
    if kind == "gather":
        return args[0].index_select(0, args[1])
    if kind == "slice":  # consecutive rows, a view
        return args[0].narrow(0, attrs["start"], attrs["rows"])
    if kind == "linear":
        return kernels.apply_weight(args[0], args[1])
    if kind == "affine":  # c + x W^T in one GEMM
        return torch.addmm(args[0], args[1], args[2].t())
    if kind == "binary":
        left, right = args
        if "reshape_right" in attrs:
            right = right.reshape(1, *attrs["reshape_right"])
        op = attrs["op"]
        return left + right if op == "+" else left - right if op == "-" else left * right
    if kind == "act":
        return kernels.activation(attrs["name"], args[0], attrs.get("inplace", False))
    if kind == "combine":
        return kernels.combine(attrs["kind"], list(args))
    if kind == "segment":
        return kernels.segment_reduce(attrs["kind"], args[0], args[1], args[2])
    if kind == "scatter":
        return kernels.scatter_rows(args[0], args[1], attrs["rows"])
    if kind == "broadcast":
        return kernels.broadcast_rows(args[0], attrs["rows"])
    if kind == "sum":
        out = args[0]
        for a in args[1:]:
            out = out + a
        return out
    if kind == "spmm":  # (matrix, dense) or (matrix, its transpose for the backward, dense)
        return sparse.matmul(args[0], args[-1], args[1] if len(args) == 3 else None)
    if kind == "addspmm":  # c + matrix @ dense: (c, matrix, [transpose,] dense)
        return sparse.matmul(args[1], args[-1], args[2] if len(args) == 4 else None, add=args[0])
    if kind == "dense_reduce":
        x = args[0]
        grouped = x.reshape(x.shape[0] // attrs["width"], attrs["width"], *x.shape[1:])
        reduce = {"sum": torch.sum, "avg": torch.mean, "max": torch.amax, "min": torch.amin}[attrs["kind"]]
        return reduce(grouped, dim=1)
    if kind == "cat":  # rows of several results stacked
        return torch.cat(args)
    if kind == "weight_rows":  # (m, 1) weights as the rows of one tensor, optionally times a column
        weights = args[:-1] if attrs.get("scaled") else args
        rows = torch.cat([w.reshape(1, -1) for w in weights])
        return rows * args[-1] if attrs.get("scaled") else rows
    if kind == "as_row":
        return args[0].reshape(1, -1) if args[0].dim() <= 1 else args[0].unsqueeze(0)
    raise ValueError(f"unknown op {kind}")


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
        self.weights = nn.ParameterDict()
        self.add_weights(plan)
        self._inputs: dict[int, str] = {}
        for slot, tensor in plan.inputs.items():
            key = f"i{slot}"
            self.register_buffer(key, tensor.to(dtype) if tensor.is_floating_point() else tensor, persistent=False)
            self._inputs[slot] = key

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

    def named_weights(self) -> dict[str, nn.Parameter]:
        """Every weight under its template name (named weights keep their names)."""
        return {name: self.weights[key] for name, key in self._param_keys.items()}

    def forward(self) -> dict[str, torch.Tensor]:
        return self._execute(self.plan, {s: getattr(self, k) for s, k in self._inputs.items()})

    def run(self, plan: Plan, external: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        """Execute another plan of the same template (a mini-batch's) with this module's weights.

        Its inputs move to this module's device and dtype; `external` supplies the values of
        weights that live outside the module (embeddings stored in the database), by name.
        """
        device = next(iter(self.weights.values())).device if len(self.weights) else torch.device("cpu")
        inputs = {slot: t.to(device, self.dtype) if t.is_floating_point() else t.to(device) for slot, t in plan.inputs.items()}
        return self._execute(plan, inputs, external or {})

    def _execute(self, plan: Plan, slots: dict[int, torch.Tensor], external: dict[str, torch.Tensor] | None = None
                 ) -> dict[str, torch.Tensor]:
        for op in plan.ops:
            if op.kind == "param":
                name = op.attrs["name"]
                slots[op.out] = external[name] if external and name in external else self.weights[self._param_keys[name]]
            else:
                slots[op.out] = run_op(op.kind, [slots[a] for a in op.args], op.attrs)
        return {name: slots[slot] for name, slot in plan.outputs.items()}

    def values(self, relation: str, outputs: dict[str, torch.Tensor] | None = None) -> pl.DataFrame:
        """A relation's key columns and its `value` (flattened to a list of floats) per row."""
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
        return keys.with_columns(pl.Series("value", flat.tolist(), dtype=pl.List(pl.Float64)))

    def dictionary(self, weight: str) -> pl.DataFrame:
        """The categorical values behind an embedding's rows: `value`, `code` (= row)."""
        from relsql.errors import RelsqlError

        if weight not in self.grounding.dictionaries:
            raise RelsqlError(f"`{weight}` is not an embedding; embeddings: {sorted(self.grounding.dictionaries)}")
        return pl.from_arrow(self.grounding.dictionaries[weight])

    def explain(self) -> str:
        from relsql.compile.explain import explain

        return explain(self.plan)
