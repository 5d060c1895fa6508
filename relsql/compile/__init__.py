"""From groundings to a vectorized torch plan, and its execution."""

from __future__ import annotations

import torch

from relsql.compile.module import CompiledNet
from relsql.compile.passes import optimize
from relsql.compile.plan import build_plan
from relsql.db import Database
from relsql.ground.execute import ground
from relsql.template.ir import Template


def compile(template: Template, db: Database, dtype: torch.dtype = torch.float32,
            device: str | torch.device = "cpu", seed: int | None = None,
            passes: tuple | None = None) -> CompiledNet:
    """Ground `template` in `db` and compile it into a torch module on `device`."""
    grounding = ground(template, db)
    return CompiledNet(make_plan(template, grounding, dtype, passes), grounding, dtype=dtype, seed=seed).to(device)


def make_plan(template: Template, grounding, dtype: torch.dtype, passes: tuple | None = None):
    """The optimized plan: built (compressed when `compress_groundings` is among the passes), then passes."""
    from relsql.compile.passes import RULES, compress_groundings

    compress = compress_groundings in (RULES if passes is None else passes)
    return optimize(build_plan(template, grounding, dtype, compress=compress), passes)


__all__ = ["compile", "CompiledNet"]
