"""Negative candidates for ranking losses, drawn with a seeded generator, with log probabilities.

"uniform" draws every candidate alike; "popularity" draws in proportion to count ** 0.75 (the
word2vec smoothing: frequent items often, rare ones still), a candidate never seen counting as
seen once so that every candidate can be drawn. The log probability of each draw is returned so
that a sampled softmax can subtract it (the logQ correction) and stay unbiased towards popular
items. "in-batch" negatives are not drawn: they are the other rows' positives of a batch (see
losses.in_batch_softmax).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from relsql.errors import RelsqlError

KINDS = ("uniform", "popularity", "in-batch")
POPULARITY_POWER = 0.75


def sample_negatives(
    kind: str, count: int, candidates: int, generator: torch.Generator, *, popularity: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """`count` candidate indices in [0, candidates) drawn with replacement, and the log probability
    of each draw (default float dtype). The same generator state gives the same draws."""
    _check(kind, count, candidates)
    if kind == "uniform":
        drawn = torch.randint(0, candidates, (count,), generator=generator, device=generator.device)
        return drawn, torch.full((count,), -math.log(candidates), dtype=torch.get_default_dtype(), device=drawn.device)
    if kind == "popularity":
        return _by_popularity(count, candidates, generator, popularity)
    raise RelsqlError('sample_negatives: "in-batch" negatives are not drawn from the candidate table; '
                      "they are the batch's other positives: use losses.in_batch_softmax")


def _check(kind: str, count: int, candidates: int) -> None:
    """A known kind, a count >= 0 and a non-empty candidate table."""
    if kind not in KINDS:
        raise RelsqlError(f"negatives {kind!r} is not a kind of negative sampling; "
                          f"use one of {', '.join(repr(k) for k in KINDS)}")
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise RelsqlError(f"sample_negatives: count must be a whole number >= 0, got {count!r}")
    if isinstance(candidates, bool) or not isinstance(candidates, int) or candidates <= 0:
        raise RelsqlError(f"sample_negatives: there are {candidates!r} candidates, so there is nothing to draw; "
                          "fill the referenced table")


def popularity_log_probabilities(popularity: Tensor, candidates: int) -> Tensor:
    """log P(candidate) proportional to max(count, 1) ** 0.75, in float64."""
    if not isinstance(popularity, Tensor) or popularity.shape != (candidates,):
        shape = tuple(popularity.shape) if isinstance(popularity, Tensor) else type(popularity).__name__
        raise RelsqlError(f'sample_negatives("popularity"): popularity must be a tensor of {candidates} counts, '
                          f"one per candidate, got {shape}")
    counts = popularity.detach().to(torch.float64)
    if not bool(torch.isfinite(counts).all()) or bool((counts < 0).any()):
        raise RelsqlError('sample_negatives("popularity"): popularity counts must be finite and >= 0')
    weights = POPULARITY_POWER * counts.clamp(min=1.0).log()
    return weights - torch.logsumexp(weights, 0)


def _by_popularity(count: int, candidates: int, generator: torch.Generator, popularity: Tensor | None) -> tuple[Tensor, Tensor]:
    """Inverse-CDF draws (no limit on the number of candidates, unlike torch.multinomial's 2**24)."""
    if popularity is None:
        raise RelsqlError('sample_negatives("popularity") needs popularity=, a tensor of counts per candidate '
                          "(for example how often each item was bought)")
    log_p = popularity_log_probabilities(popularity, candidates).to(generator.device)
    cdf = torch.cumsum(log_p.exp(), 0)
    uniform = torch.rand((count,), generator=generator, dtype=torch.float64, device=generator.device) * cdf[-1]
    drawn = torch.searchsorted(cdf, uniform, right=True).clamp(max=candidates - 1)
    return drawn, log_p[drawn].to(torch.get_default_dtype())
