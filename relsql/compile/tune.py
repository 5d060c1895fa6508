"""Pick the fastest plan for a template and its data by measuring, not guessing.

The candidates differ in how far gathers are propagated (relsql/compile/passes/
propagate_gathers.py: PRESETS trade fewer ops against more rows computed and held) and,
optionally, in running the plan under torch.compile. Each is planned from the same grounding
(the database is asked once) and timed on a forward + backward step of the output relation.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch

from relsql.compile import costs
from relsql.compile.module import CompiledNet
from relsql.compile.passes import RULES, propagate_gathers
from relsql.compile.passes.propagate_gathers import PRESETS
from relsql.compile.planning import make_plan


def with_strength(strength: float, passes: tuple | None = None) -> tuple:
    """The pass tuple with gather propagation at `strength`."""
    def propagate(plan):
        return propagate_gathers(plan, strength)

    propagate.__name__ = "propagate_gathers"
    return tuple(propagate if rule is propagate_gathers else rule for rule in (RULES if passes is None else passes))


@dataclass
class Trial:
    strength: float
    torch_compile: bool
    step_ms: float
    ops: int


def _stepper(net: torch.nn.Module, output: str):
    trainable = [p for p in net.parameters() if p.requires_grad]

    def step():
        for p in trainable:
            p.grad = None
        value = net()[output]
        if value.requires_grad:
            value.sum().backward()

    return step


def _signature(net: CompiledNet) -> str:
    """Two candidates with the same ops are the same candidate."""
    return "\n".join(line for line in net.explain().splitlines() if not line.startswith("optimizer:"))


def fastest(template, grounding, dtype: torch.dtype, device, seed: int | None, output: str | None = None,
            strengths: tuple[float, ...] = PRESETS, try_torch_compile: bool = False, rounds: int = 7) -> CompiledNet:
    """The fastest of the candidate nets (its `tuning` attribute lists every trial).

    Candidates are timed in turn, round after round (so load on the machine hits all alike),
    and compared by their median step time; identical plans are timed once.
    """
    output = output or template.output
    candidates: dict[str, tuple[CompiledNet, list[float]]] = {}
    for strength in strengths:
        net = CompiledNet(make_plan(template, grounding, dtype, with_strength(strength), device=device), grounding,
                          dtype=dtype, seed=seed).to(device)
        candidates.setdefault(_signature(net), (net, []))[1].append(strength)
    runs = [(net, strengths, compiled) for net, strengths in candidates.values()
            for compiled in ((False, True) if try_torch_compile else (False,))]
    steps = [_stepper(torch.compile(net) if compiled else net, output) for net, _, compiled in runs]
    times: list[list[float]] = [[] for _ in runs]
    for step in steps:
        step()  # warm-up (and torch.compile's compilation)
    for _ in range(rounds):
        for step, record in zip(steps, times):
            costs.synchronize(device)
            start = time.perf_counter()
            step()
            costs.synchronize(device)
            record.append((time.perf_counter() - start) * 1000)
    trials = [Trial(s, compiled, statistics.median(t), len(net.plan.ops))
              for (net, strengths, compiled), t in zip(runs, times) for s in strengths]
    best = min(range(len(runs)), key=lambda i: statistics.median(times[i]))
    net, _, compiled = runs[best]
    net.tuning = trials
    net.plan.log.append("tuned: " + ", ".join(
        f"strength {t.strength:g}{' + torch.compile' if t.torch_compile else ''} {t.step_ms:.2f} ms" for t in trials))
    if compiled:
        net.forward = torch.compile(net.forward)
    return net
