"""From groundings to a vectorized torch plan, and its execution."""

from __future__ import annotations

import torch

from relsql import arguments
from relsql.compile.module import CompiledNet
from relsql.compile.planning import make_plan
from relsql.compile.tune import fastest, with_strength
from relsql.data.engine import Database
from relsql.ground.execute import ground
from relsql.template.ir import Template


def compile(template: Template, db: Database, dtype: torch.dtype = torch.float32,
            device: str | torch.device = "cpu", seed: int | None = None,
            passes: tuple | None = None, gather_strength: float | None = None,
            outputs: list[str] | None = None, max_groundings: int | None = None) -> CompiledNet:
    """Ground `template` in `db` and compile it into a torch module on `device`.

    `passes` replaces the optimizer's pass tuple (`()` for the plain vectorized plan);
    `gather_strength` sets how far gathers are propagated (see `relsql.tune` to measure it);
    `outputs` limits what `net()` returns to those relations (default: every relation), which
    lets the optimizer drop or overwrite the others' intermediate values.
    A rule the database estimates at more than `max_groundings` groundings (default 10^8, see
    relsql.ground.execute.MAX_GROUNDINGS) is refused before it runs: usually a missing join condition.
    """
    dtype, device, seed, passes, outputs = _checked(template, db, dtype, device, seed, passes, outputs)
    if gather_strength is not None:
        gather_strength = arguments.number("gather_strength", gather_strength, minimum=0.0)
    _memory_embeddings_only(template)
    grounding = ground(template, db, max_groundings=max_groundings)
    if gather_strength is not None:
        passes = with_strength(gather_strength, passes)
    plan = make_plan(template, grounding, dtype, passes, outputs, device=device)
    return CompiledNet(plan, grounding, dtype=dtype, seed=seed).to(device)


def _checked(template, db, dtype, device, seed, passes, outputs) -> tuple:
    """The arguments of `compile`/`tune`, checked where they enter (RelsqlErrors naming them)."""
    from relsql.errors import RelsqlError

    if not isinstance(template, Template):
        raise RelsqlError(f"template must be a relsql.Template (Template.from_sql/from_file/...), got {type(template).__name__}")
    if not isinstance(db, Database):
        raise RelsqlError(f"db must be a relsql.Database (from relsql.connect(...)), got {type(db).__name__}")
    if seed is not None:
        seed = arguments.integer("seed", seed, minimum=0, maximum=2**63 - 1)
    if passes is not None:
        if isinstance(passes, str) or not isinstance(passes, tuple | list) or not all(callable(p) for p in passes):
            raise RelsqlError(f"passes must be a tuple of optimizer passes (functions plan -> plan, e.g. from "
                              f"relsql.compile.passes.RULES), or () for none; got {passes!r}")
        passes = tuple(passes)
    if outputs is not None:
        if isinstance(outputs, str) or not isinstance(outputs, tuple | list) or not all(isinstance(o, str) for o in outputs):
            raise RelsqlError(f"outputs must be a list of relation names, got {outputs!r}")
        outputs = list(outputs)
    return arguments.dtype(dtype), arguments.device(device), seed, passes, outputs


def _memory_embeddings_only(template: Template) -> None:
    from relsql.errors import TemplateError

    stored = [name for name, spec in template.weights.items() if spec.kind == "embed" and spec.storage == "database"]
    if stored:
        raise TemplateError(f"embeddings {stored} are kept in the database (storage='database'): they are read and "
                            "updated per mini-batch by relsql.Model(...).fit(batch_size=...), not by relsql.compile; "
                            "drop storage= to keep them in memory")


def tune(template: Template, db: Database, dtype: torch.dtype = torch.float32,
         device: str | torch.device = "cpu", seed: int | None = None, output: str | None = None,
         try_torch_compile: bool = False, max_groundings: int | None = None) -> CompiledNet:
    """Like `compile`, but plans the grounding with every gather-propagation preset (and, if asked,
    under torch.compile), times a training step of `output` on `device` and keeps the fastest;
    `net.tuning` lists the trials and `net.explain()` ends with them; `max_groundings` as in `compile`."""
    dtype, device, seed, _, _ = _checked(template, db, dtype, device, seed, None, None)
    if output is not None:
        arguments.text("output", output)
    _memory_embeddings_only(template)
    grounding = ground(template, db, max_groundings=max_groundings)
    return fastest(template, grounding, dtype, device, seed, output, try_torch_compile=try_torch_compile)


__all__ = ["compile", "tune", "CompiledNet"]
