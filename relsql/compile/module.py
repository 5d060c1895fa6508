"""Executes a plan as a torch.nn.Module: parameters, index buffers, one kernel call per op, or
a small plan as one generated function with one autograd node (relsql/compile/fused.py)."""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable
from typing import TYPE_CHECKING

import polars as pl
import torch
from torch import nn

from relsql.compile import fused, members
from relsql.compile.explain import explain
from relsql.compile.ops import Kernel, is_random, kernel
from relsql.compile.plan import Plan

if TYPE_CHECKING:
    from relsql.ground.execute import Grounding


def _initial(spec, dtype: torch.dtype, generator: torch.Generator | None) -> torch.Tensor:
    """Sensible defaults: Glorot-like matrices, N(0,1) embeddings, zero biases, given values."""
    if spec.init is not None:
        return torch.as_tensor(spec.init, dtype=dtype).reshape(spec.shape).clone()
    if spec.kind == "bias":
        return torch.zeros(spec.shape, dtype=dtype)
    if spec.kind == "gain":  # layer_norm's scale starts as the identity
        return torch.ones(spec.shape, dtype=dtype)
    if spec.kind == "embed":
        return torch.randn(spec.shape, dtype=dtype, generator=generator)
    if spec.kind == "text":  # the last row is padding, never read
        table = torch.randn(spec.shape, dtype=dtype, generator=generator)
        table[-1] = 0.0
        return table
    if spec.kind == "datalog":
        return torch.rand(spec.shape, dtype=dtype, generator=generator) * 2 - 1
    blocks = getattr(spec, "blocks", 1)  # a block-diagonal linear: each block drawn as a linear of its own size
    fan_in = (spec.shape[-1] if spec.shape else 1) // blocks
    bound = 1.0 / math.sqrt(max(fan_in, 1))
    values = (torch.rand(spec.shape, dtype=dtype, generator=generator) * 2 - 1) * bound
    return values * members.mask(tuple(spec.shape), blocks, dtype) if blocks > 1 else values


def available_memory() -> int | None:
    """Bytes the OS could give this process now (Linux's MemAvailable), else the machine's memory."""
    try:
        with open("/proc/meminfo", encoding="ascii") as info:
            for line in info:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    from relsql.compile.shapes import memory_bytes

    return memory_bytes()


def check_weight_bytes(new: dict[str, tuple[int, ...]], dtype: torch.dtype, have: int = 0) -> None:
    """Refuse weights whose total size (`new` shapes by name, beside `have` bytes already made) is more
    than the memory this machine has free, before torch tries: each weight alone may be within its
    limits (ir.MAX_ELEMENTS, shapes.check_size) while together they are not."""
    element = torch.empty((), dtype=dtype).element_size()
    sizes = {name: math.prod(shape) * element for name, shape in new.items()}
    total = sum(sizes.values())
    free = available_memory()
    if free is None or total <= free:
        return
    largest = sorted(sizes, key=sizes.get, reverse=True)[:3]
    shown = ", ".join(f"'{n}' {' x '.join(map(str, new[n]))} ({sizes[n] / 2**30:.1f} GiB)" for n in largest)
    from relsql.errors import ShapeError

    raise ShapeError(f"the template's weights need {total / 2**30:.1f} GiB ({len(sizes)} weight(s), the largest {shown})"
                     f"{f' beside the {have / 2**30:.1f} GiB made already' if have else ''}, more than the "
                     f"{free / 2**30:.1f} GiB of memory this machine has free; use smaller widths (the d of linear(x, d), "
                     "embed(c, d) and text(c, d)), fewer buckets= or fewer categories (embed a column with fewer distinct "
                     f"values){', or dtype=torch.float32' if dtype == torch.float64 else ''}")


TRAINING_COPIES = 3  # what training adds per trained weight: its gradient and AdamW's two moments


def check_training_bytes(parameters: list[torch.Tensor], device: torch.device) -> None:
    """Refuse to train weights whose gradients and optimizer state cannot fit beside them on `device`,
    before the first step allocates them (torch's own error would name neither the weights nor the fix)."""
    need = TRAINING_COPIES * sum(p.numel() * p.element_size() for p in parameters)
    free = None
    if device.type == "cuda":
        try:
            free = torch.cuda.mem_get_info(device)[0]
        except (RuntimeError, AssertionError):
            free = None
    elif device.type == "cpu":
        free = available_memory()
    if free is None or need <= free:
        return
    from relsql.errors import ShapeError

    raise ShapeError(f"training needs about {need / 2**30:.1f} GiB beside the weights (a gradient and the optimizer's two "
                     f"moments per trained weight), more than the {free / 2**30:.1f} GiB free on {device}; use smaller "
                     "widths (the d of linear(x, d), embed(c, d) and text(c, d)) or fewer embedded categories")


def _program(plan: Plan, training: Callable[[], bool]) -> list[tuple[int, Kernel | None, tuple]]:
    """(output slot, kernel, argument slots) per op; a weight has no kernel and its name as argument.
    Random ops (dropout) read the module's train()/eval() mode through `training` at every call."""
    return [(op.out, None, (op.attrs["name"],)) if op.kind == "param" else
            (op.out, kernel(op.kind, {**op.attrs, "training": training} if is_random(op.kind) else op.attrs), op.args)
            for op in plan.ops]


class CompiledNet(nn.Module):
    """A grounded template: `net()` returns {relation: values in row-id order}. It starts in eval
    mode (dropout is the identity); a training loop calls `train()` around its steps.

    `execution` says how `net()` runs the plan: "auto" (the default) fuses a plan whose ops all
    have a fused rule and whose values hold at most `fused.OP_ELEMENTS` elements an op on average
    into one generated function with one autograd node, and runs others op by op; "ops" always
    runs op by op; "fused" fuses whatever size the values (where every op has a rule).
    `fused_reason` says why the last call did not fuse (None when it did)."""

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
        self.execution = "auto"
        self.fused_reason: str | None = None
        self._fused: dict[tuple, fused.Fused | str] = {}  # (plan, weights needing gradients) -> code or why not
        self._shapes: tuple | None = None  # (plan, its slots' shapes), recorded on the first fused try
        self._last_fused: tuple | None = None  # (plan, execution, code, weight keys, their requires_grad): `_remember`
        self.weights = nn.ParameterDict()
        self.add_weights(plan)
        self._inputs: dict[int, str] = {}
        for slot, tensor in plan.inputs.items():
            key = f"i{slot}"
            self.register_buffer(key, tensor.to(dtype) if tensor.is_floating_point() else tensor, persistent=False)
            self._inputs[slot] = key
        self.train(False)  # eval mode until a training loop says otherwise: dropout off, outputs deterministic

    def _training(self) -> bool:
        """The module's mode (train() or eval()), read by dropout at each call."""
        return self.training

    def __getstate__(self) -> dict:
        # closures and generated code: rebuilt on the next call
        return {**self.__dict__, "_program": None, "_fused": {}, "_shapes": None, "_last_fused": None}

    def add_weights(self, plan: Plan) -> list[nn.Parameter]:
        """Create the weights of `plan` this module does not have yet; returns the new ones.

        Each weight's initial value depends only on the seed and its name, so a weight gets the
        same start whichever plan (full grounding or a mini-batch's) creates it first.
        """
        created = []
        fresh = {name: tuple(spec.shape) for name, spec in plan.params.items()
                 if not spec.external and name not in self._param_keys}
        if fresh:
            check_weight_bytes(fresh, self.dtype, sum(p.numel() * p.element_size() for p in self.weights.values()))
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
            members.keep_blocks(parameter, spec.blocks)
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
                spec = self.plan.params.get(name)
                members.keep_blocks(self.weights[key], spec.blocks if spec is not None else 1)
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

    def input(self, slot: int) -> torch.Tensor:
        """The tensor the module holds for plan input `slot` (on its device, in its dtype)."""
        return self._buffers[self._inputs[slot]]

    def substitute(self, weights: dict[str, nn.Parameter], inputs: dict[int, torch.Tensor]) -> tuple[dict, dict]:
        """Put `weights` (by template name) and `inputs` (by plan slot) in place of the module's own,
        each in its place among the parameters and buffers; returns the replaced ones, to put back
        the same way (relsql/compile/compact.py trains a text table on the rows its plan reads so).
        Generated code and recorded shapes are dropped: they were made for the replaced tensors."""
        old_weights = {name: self.weights[self._param_keys[name]] for name in weights}
        old_inputs = {slot: self._buffers[self._inputs[slot]] for slot in inputs}
        for name, weight in weights.items():
            self.weights[self._param_keys[name]] = weight
        for slot, tensor in inputs.items():
            self._buffers[self._inputs[slot]] = tensor
        self._fused, self._shapes, self._last_fused = {}, None, None
        return old_weights, old_inputs

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
        last = getattr(self, "_last_fused", None)
        if last is not None and last[0] is self.plan and last[1] == self.execution:  # the last call's code, if it still fits
            code, weights = last[2], [self.weights._parameters[k] for k in last[3]]
            if all(w.requires_grad == flag for w, flag in zip(weights, last[4])):
                buffers, inputs = self._buffers, self._inputs
                return fused.run(code, weights, [buffers[inputs[s]] for s in code.inputs])
        if self._program is None:
            self._program = _program(self.plan, self._training)
        slots = {s: self._buffers[k] for s, k in self._inputs.items()}
        if self.execution != "ops":
            code = self._fused_code(slots)
            if isinstance(code, fused.Fused):
                self.fused_reason = None
                weights, keys = self.weights._parameters, self._param_keys
                chosen = [weights[keys[n]] for n in code.names]
                self._remember(code)
                return fused.run(code, chosen, [slots[s] for s in code.inputs])
            self.fused_reason = code
        return self._execute(self.plan, self._program, slots)

    def fused_code(self) -> fused.Fused | str:
        """The generated code `forward()` runs for the weights that now need gradients, or why the
        plan runs op by op (relsql/compile/step.py calls the code directly, a whole step at once)."""
        if self.execution == "ops":
            return "execution is 'ops'"
        if self._program is None:
            self._program = _program(self.plan, self._training)
        return self._fused_code({s: self._buffers[k] for s, k in self._inputs.items()})

    def _remember(self, code: fused.Fused) -> None:
        """The fused code just run, its weights' keys and which of them needed gradients: the
        next call reruns it after checking only those (the code depends on no other weight's
        flag: `fused._needing` reads the plan's own weights), 10-20 us less per call than
        rebuilding the set of trainable weights and the slots (bench.neuralogic's small datasets)."""
        weights, keys = self.weights._parameters, self._param_keys
        names = [keys[n] for n in code.names]
        self._last_fused = (self.plan, self.execution, code, names, [weights[k].requires_grad for k in names])

    def _fused_code(self, slots: dict[int, torch.Tensor]) -> fused.Fused | str:
        """This plan's generated code for the weights that now need gradients (made once per
        such set), or why the plan runs op by op."""
        weights, keys = self.weights._parameters, self._param_keys
        trainable = frozenset(n for n, k in keys.items() if weights[k].requires_grad)
        key = (id(self.plan), self.execution, trainable)
        if key not in self._fused:
            self._fused[key] = self._generate(slots, trainable)
        return self._fused[key]

    def _generate(self, slots: dict[int, torch.Tensor], trainable: frozenset[str]) -> fused.Fused | str:
        if any(spec.external for spec in self.plan.params.values()):
            return "weights supplied per call"
        why = fused.precheck(self.plan, fused.OP_ELEMENTS if self.execution == "auto" else None)
        if why is not None:  # decided from the plan alone: a large plan is not run once more to see
            return why
        if self._shapes is None or self._shapes[0] is not self.plan:
            weights, keys = self.weights._parameters, self._param_keys
            self._shapes = (self.plan, fused.record_shapes(self._program, dict(slots), lambda n: weights[keys[n]]))
        shapes = self._shapes[1]
        why = fused.too_large(fused.per_op(self.plan, shapes), fused.OP_ELEMENTS) if self.execution == "auto" else None
        if why is not None:
            return why
        try:
            return fused.generate(self.plan, shapes, set(trainable))
        except fused.NotFusable as why:
            return str(why)

    def run(self, plan: Plan, external: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        """Execute another plan of the same template (a mini-batch's) with this module's weights.

        Its inputs move to this module's device and dtype; `external` supplies the values of
        weights that live outside the module (embeddings stored in the database), by name.
        """
        device = next(iter(self.weights.values())).device if len(self.weights) else torch.device("cpu")
        inputs = {slot: t.to(device, self.dtype) if t.is_floating_point() else t.to(device) for slot, t in plan.inputs.items()}
        return self._execute(plan, _program(plan, self._training), inputs, external or {})

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
        from relsql.data.duckdb import free_name
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
        return explain(self.plan)
