"""Helpers for the plan tests (tests/test_passes.py and a test file per pass): values and
gradients of a template's plan with some passes, compared with the plain plan's."""

from __future__ import annotations

import functools
import math
import warnings
from pathlib import Path

import torch

import relsql
from relsql.compile import CompiledNet, make_plan

ROOT = Path(__file__).resolve().parent.parent


def run(template, db, passes, grounding=None, device="cpu"):
    """Values and gradients of the plan with `passes`: `relsql.compile` grounds the template in `db`;
    with `grounding` (what `ground(template, db)` returned), the plan is built from it, as
    `relsql.compile` does after grounding (and `relsql.tune` for each of its candidates), with the
    costs of `device` (it runs here, on CPU)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if grounding is None:
            net = relsql.compile(template, db, dtype=torch.float64, seed=11, passes=passes)
        else:
            net = CompiledNet(make_plan(template, grounding, torch.float64, passes, device=device), grounding,
                              dtype=torch.float64, seed=11)
    out = net()
    loss = sum((value.sin() * loss_weights(value.shape, value.dtype)).sum() for value in out.values())
    loss.backward()
    grads = {name: (p.grad.clone() if p.grad is not None else torch.zeros_like(p)) for name, p in net.weights_by_name().items()}
    return {k: v.detach() for k, v in out.items()}, grads, net


@functools.cache
def loss_weights(shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
    """1, 2, 3, 1, 2, 3, ... in `shape`: every entry's gradient depends on where it is."""
    return 1 + torch.arange(math.prod(shape), dtype=dtype).reshape(shape) % 3


def assert_same(reference, candidate, label):
    (out_a, grad_a, _), (out_b, grad_b, _) = reference, candidate
    assert out_a.keys() == out_b.keys()
    for name in out_a:
        assert torch.allclose(out_a[name], out_b[name], rtol=1e-9, atol=1e-11), f"{label}: values of {name}"
    for name in grad_a:
        assert torch.allclose(grad_a[name], grad_b[name], rtol=1e-9, atol=1e-11), f"{label}: gradient of {name}"


def fired_counts(net) -> dict[str, int]:
    """pass name -> the sum of the numbers its log line reports (how much it changed)."""
    counts = {}
    for line in net.plan.log:
        name, _, rest = line.partition(": ")
        counts[name] = counts.get(name, 0) + sum(int(w) for w in rest.split() if w.isdigit())
    return counts


def matrices(net) -> list[torch.Tensor]:
    """The constant matrix of every sparse-matmul op in the module's plan."""
    at = {"spmm": 0, "addspmm": 1}
    return [net.plan.inputs[op.args[at[op.kind]]] for op in net.plan.ops if op.kind in at]
