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
    plan = optimize(build_plan(template, grounding, dtype), passes)
    return CompiledNet(plan, grounding, dtype=dtype, seed=seed).to(device)


__all__ = ["compile", "CompiledNet"]
