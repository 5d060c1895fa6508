"""The optimized plan of a grounded template: built, outputs chosen, passes run. Beneath both
`relsql.compile` (which wraps the plan in a module) and `tune` (which times plans)."""

from __future__ import annotations

import torch

from relsql.compile.passes import RULES, compress_groundings, optimize
from relsql.compile.plan import build_plan
from relsql.errors import RelsqlError
from relsql.template.ir import Template


def make_plan(template: Template, grounding, dtype: torch.dtype, passes: tuple | None = None,
              outputs: list[str] | None = None, device: str | torch.device = "cpu"):
    """The optimized plan: built (compressed when `compress_groundings` is among the passes), then
    passes; with `outputs`, only those relations stay outputs of the plan. The passes' costs and
    timings are those of `device`, where the plan will run."""
    compress = compress_groundings in (RULES if passes is None else passes)
    plan = build_plan(template, grounding, dtype, compress=compress)
    plan.device = torch.device(device).type
    if outputs is not None:
        unknown = [name for name in outputs if name not in plan.outputs]
        if unknown or not outputs:
            raise RelsqlError(f"outputs {unknown or outputs} are not relations of the template; it declares {list(plan.outputs)}")
        plan.outputs = {name: plan.outputs[name] for name in outputs}
    return optimize(plan, passes)
