"""The learning rate over training: a linear warm-up then cosine decay over the epoch budget, or
halving on a plateau of the monitored score, or constant.

The rate is set on the dense optimizer's parameter groups before every step from a closed form of
the step count (not a torch LRScheduler): groups a mini-batch adds mid-training get the same rate,
and a checkpoint holds two numbers, so a resumed run takes the steps an uninterrupted one takes.
"""

from __future__ import annotations

import math

from relsql.errors import RelsqlError

SCHEDULES = ("cosine", "plateau", None)


def cosine_factor(step: int, total: int, warmup: int) -> float:
    """The share of the base rate at step `step` (0-based) of `total`: (step + 1) / warmup during the
    warm-up, then 0.5 (1 + cos(pi p)) with p the share of the decay steps already taken."""
    if step < warmup:
        return (step + 1) / warmup
    p = min(1.0, (step - warmup) / max(1, total - warmup))
    return 0.5 * (1.0 + math.cos(math.pi * p))


class LearningRate:
    """The rate each step gets. `kind`: "cosine", "plateau" or None (constant); `warmup`: the share
    of all steps spent warming up (cosine only); `patience`: epochs without a better score before
    "plateau" halves the rate."""

    def __init__(self, lr: float, kind: str | None, *, warmup: float = 0.05, patience: int = 5, factor: float = 0.5):
        if kind not in SCHEDULES:
            raise RelsqlError(f"schedule must be one of 'cosine', 'plateau' or None, got {kind!r}")
        self.lr, self.kind, self.warmup, self.patience, self.factor = lr, kind, warmup, patience, factor
        self.total = self.warm = 1
        self.step = 0  # steps taken so far
        self.scale, self.bad = 1.0, 0  # plateau: the rate's share now, epochs without improvement

    def plan(self, steps: int) -> None:
        """The number of steps of the whole budget (epochs x batches per epoch)."""
        self.total = max(1, steps)
        self.warm = max(1, round(self.warmup * self.total)) if self.warmup > 0 else 0

    def now(self) -> float:
        """The rate of the next step."""
        if self.kind == "cosine":
            return self.lr * cosine_factor(self.step, self.total, self.warm)
        return self.lr * self.scale

    def apply(self, optimizer) -> float:
        """Set the rate of the next step on every group of `optimizer`; count the step."""
        rate = self.now()
        for group in optimizer.param_groups:
            group["lr"] = rate
        self.step += 1
        return rate

    def epoch_end(self, improved: bool) -> None:
        """After an epoch's validation: "plateau" halves the rate after `patience` epochs without improvement."""
        if self.kind != "plateau":
            return
        self.bad = 0 if improved else self.bad + 1
        if self.bad > self.patience:
            self.scale, self.bad = self.scale * self.factor, 0

    def state_dict(self) -> dict:
        return {"kind": self.kind, "step": self.step, "total": self.total, "warm": self.warm, "scale": self.scale,
                "bad": self.bad}

    def load_state_dict(self, state: dict) -> None:
        """A checkpoint's schedule (absent in one written before schedules: the step count restarts)."""
        if not state:
            return
        self.step, self.total, self.warm = int(state["step"]), int(state["total"]), int(state["warm"])
        self.scale, self.bad = float(state["scale"]), int(state["bad"])
