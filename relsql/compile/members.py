"""Block-diagonal linears: independent members side by side in one network.

A seed ensemble of the network (K fits, outputs averaged) lowered its test error on the outside
corpus by ~3 % (docs/quality.md), but cost K fits. Members side by side in the feature axis cost
less (a median 2.3x one network's training for K = 4, where 4 fits cost 4x): a vector of K x width holds the K
members' vectors one after the other, gathers, aggregates, activations and dropout act per
feature, so they never mix them; only a linear map between two such vectors would, and a
`linear(x, n, 'name', blocks=K)` is block-diagonal: K blocks of (n / K, in / K) on the diagonal,
zero elsewhere (relsql/compile/module.py draws each block as a linear of its own size). The zeros
stay zero: they start at zero, their gradient is masked to zero here
(a hook on the parameter), and Adam(W)'s step, weight decay and gradient clipping leave a weight
with zero gradient and zero moments where it is.
"""

from __future__ import annotations

import torch
from torch import nn


def mask(shape: tuple[int, ...], blocks: int, dtype: torch.dtype, device: torch.device | str = "cpu") -> torch.Tensor:
    """1 on the `blocks` diagonal blocks of a (out, in) matrix, 0 elsewhere."""
    out, into = shape
    rows, cols = out // blocks, into // blocks
    return torch.block_diag(*[torch.ones(rows, cols, dtype=dtype, device=device)] * blocks)


def keep_blocks(parameter: nn.Parameter, blocks: int) -> None:
    """Zero the gradient off the diagonal blocks, every backward (the parameter keeps the hook)."""
    if blocks <= 1:
        return
    kept = [mask(tuple(parameter.shape), blocks, parameter.dtype, parameter.device)]

    def masked(grad: torch.Tensor) -> torch.Tensor:
        if kept[0].device != grad.device or kept[0].dtype != grad.dtype:  # the net moved: move the mask once
            kept[0] = kept[0].to(grad.device, grad.dtype)
        return grad * kept[0]

    parameter.register_hook(masked)


def rows(out: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """`out.index_select(0, index)`, and alike the members' own outputs a members' head put on `out`
    as `.members` (relsql/train/learner/members.py)."""
    chosen = out.index_select(0, index)
    parts = getattr(out, "members", None)
    if parts is not None:
        chosen.members = parts.index_select(0, index)
    return chosen
