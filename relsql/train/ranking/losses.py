"""Ranking losses over the scores of positive pairs and sampled negatives; each a scalar mean.

"bce": each positive is a pair labelled 1, each negative one labelled 0; a positive's term is its
own log loss plus the mean of its negatives' (so the loss does not grow with their number).
"bpr": -log sigmoid(positive - negative), mean over the negatives (Bayesian personalised ranking).
"softmax": sampled softmax, the cross-entropy of the positive among [positive, negatives], each
negative's logit minus its log sampling probability when given (the logQ correction), re-centred
per row by log mean(1 / q): the negatives then weigh exp(logit) / q self-normalised, as if they had
been drawn uniformly, so a constant log_q (uniform sampling) is no correction at all, and the
positive, whose own probability is not known here, needs none.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from relsql.errors import RelsqlError, ShapeError

KINDS = ("bce", "bpr", "softmax")


def ranking_loss(kind: str, positive: Tensor, negative: Tensor, *, log_q: Tensor | None = None) -> Tensor:
    """The mean over the b positives ([b] scores) of the loss against their negatives ([b, s], or
    [s] shared by all positives). log_q ([s] or [b, s]) is used by "softmax" only."""
    if kind not in KINDS:
        raise RelsqlError(f"loss {kind!r} is not a ranking loss; use one of {', '.join(repr(k) for k in KINDS)}")
    negative = _negatives_per_positive(positive, negative)
    if kind == "bce":
        _no_log_q(kind, log_q)
        return (F.softplus(-positive) + F.softplus(negative).mean(1)).mean()
    if kind == "bpr":
        _no_log_q(kind, log_q)
        return F.softplus(negative - positive[:, None]).mean()
    if log_q is not None:
        negative = negative - _log_q_per_negative(log_q, negative)
    return (torch.logaddexp(positive, torch.logsumexp(negative, dim=1)) - positive).mean()  # no [b, 1 + s] copy


def in_batch_softmax(query: Tensor, item: Tensor) -> Tensor:
    """Softmax over the batch: row i's positive is item i, the other rows' items its negatives.

    The mean over rows of the cross-entropy of query @ item.T against the diagonal."""
    if query.dim() != 2 or query.shape != item.shape:
        raise ShapeError(f"in_batch_softmax: query and item must both be [batch, dimension], "
                         f"got {tuple(query.shape)} and {tuple(item.shape)}")
    logits = query @ item.T
    return F.cross_entropy(logits, torch.arange(query.shape[0], device=query.device))


def _negatives_per_positive(positive: Tensor, negative: Tensor) -> Tensor:
    """[b, s] negatives: a shared [s] vector is expanded to every positive."""
    if positive.dim() != 1:
        raise ShapeError(f"ranking_loss: positive must be 1-D [batch], got shape {tuple(positive.shape)}")
    if negative.dim() == 1:
        negative = negative[None, :].expand(positive.shape[0], -1)
    if negative.dim() != 2 or negative.shape[0] != positive.shape[0] or negative.shape[1] == 0:
        raise ShapeError(
            f"ranking_loss: negative must be [batch, samples] or [samples] with at least one sample, "
            f"got {tuple(negative.shape)} for {positive.shape[0]} positives"
        )
    return negative


def _log_q_per_negative(log_q: Tensor, negative: Tensor) -> Tensor:
    """log q_j + log mean_k(1 / q_k) per row: log_q's correction, zero when log_q is constant."""
    if log_q.dim() not in (1, 2) or log_q.shape[-1] != negative.shape[1] \
            or (log_q.dim() == 2 and log_q.shape[0] != negative.shape[0]):
        raise ShapeError(f"ranking_loss: log_q must be [samples] or [batch, samples] like the negatives "
                         f"{tuple(negative.shape)}, got {tuple(log_q.shape)}")
    log_q = log_q.to(negative.dtype)
    return log_q + torch.logsumexp(-log_q, dim=-1, keepdim=True) - math.log(log_q.shape[-1])


def _no_log_q(kind: str, log_q: Tensor | None) -> None:
    """The logQ correction belongs to the sampled softmax; elsewhere it would be silently wrong."""
    if log_q is not None:
        raise RelsqlError(f"ranking_loss: log_q corrects the sampled softmax only; loss {kind!r} takes none "
                          '(use "softmax", or drop log_q)')
