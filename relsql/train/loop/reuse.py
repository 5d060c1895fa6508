"""The full-batch forward that validation ran, kept for the next epoch's training step.

In full-batch training the validation forward after epoch e's step runs the weights epoch e + 1's
step starts from: run with its autograd graph, it is that step's forward too, and an epoch runs
the net once instead of twice (issue #41), with the same numbers (the forward's kernels compute
alike with and without gradients; tests/test_reuse_forward.py compares whole fits bitwise).

It is reused only where nothing it read can have changed: a plan without random ops (dropout
draws in train mode, and validation runs in eval mode), a head of linear layers, and the same
net, plan, execution, head and weights: each weight's identity, storage, in-place version and
requires_grad. A weight written in place without a version bump (`p.data.copy_(...)`, a fused
optimizer's step) is caught only by its values: where a user's Callback runs between the
validation and the next step, the weights are compared with copies taken at validation.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from relsql.compile.ops import is_random
from relsql.train.learner.members import MemberMean

if TYPE_CHECKING:
    from relsql.train.learner.learner import Learner


class KeptForward:
    """Every output row's outputs with their autograd graph, and what they were computed from."""

    def __init__(self) -> None:
        self.outputs: torch.Tensor | None = None
        self.key: tuple | None = None
        self.copies: list[torch.Tensor] | None = None

    @staticmethod
    def allowed(learner: Learner) -> bool:
        """Whether this learner's full-batch forward may serve a later training step: its training
        loss reads `outputs()` (not a ranking learner's towers), its plan draws no random numbers,
        and its head is linear (no mode-dependent layer)."""
        return (learner.reuses_forward and not any(is_random(op.kind) for op in learner.net.plan.ops)
                and all(isinstance(m, (nn.Linear, nn.Identity, MemberMean)) for m in learner.head.modules()))

    def keep(self, learner: Learner, outputs: torch.Tensor, compare: bool) -> None:
        """Keep `outputs` (computed now, with gradients); `compare`: copy the weights too, for a
        caller whose code (a user's callback) may write them without a version bump."""
        self.outputs, self.key = outputs, _key(learner)
        self.copies = [p.detach().clone() for p in _weights(learner)] if compare else None

    def take(self, learner: Learner) -> torch.Tensor | None:
        """The kept outputs if the learner still computes exactly them, else None; either way they
        are no longer kept (a graph is used by one backward)."""
        outputs, key, copies = self.outputs, self.key, self.copies
        self.drop()
        if outputs is None or key != _key(learner):
            return None
        if copies is not None and not all(torch.equal(p, c) for p, c in zip(_weights(learner), copies)):
            return None
        return outputs

    def drop(self) -> None:
        """Let the graph go (end of fit, or a path that does not reuse it)."""
        self.outputs = self.key = self.copies = None


def _weights(learner: Learner) -> list[torch.Tensor]:
    return [*learner.net.parameters(), *learner.head.parameters()]


def _key(learner: Learner) -> tuple:
    """What the forward read, as identities and counters (cheap: no values read)."""
    net = learner.net
    weights = tuple((id(p), p.data_ptr(), p._version, p.requires_grad, p.dtype, p.device) for p in _weights(learner))
    inputs = tuple((id(b), b._version) for b in net.buffers())
    return id(net), id(net.plan), net.execution, id(learner.head), weights, inputs
