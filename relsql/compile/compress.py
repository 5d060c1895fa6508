"""Isomorphic compression: groundings that provably compute the same value are computed once.

Rows get structural classes: two rows of a column are alike when their values are equal, two
rows of a relation are alike when every rule grounds them with the same multiset of grounding
classes. A grounding's class is the tuple of its body rows' classes. Since equal classes mean
equal values for any weights, a rule evaluates one representative per grounding class and
aggregates with multiplicities (a CSR matrix of counts), like NeuraLogic's iso-value
compression but decided from structure, not from sampled values.
"""

from __future__ import annotations

import warnings

import torch


def classes_of(values: torch.Tensor) -> torch.Tensor:
    """Class id per row: equal rows, equal ids."""
    flat = values.reshape(values.shape[0], -1) if values.dim() > 1 else values.reshape(-1, 1)
    return torch.unique(flat, dim=0, return_inverse=True)[1]


def combine(columns: list[torch.Tensor], rows: int) -> torch.Tensor:
    """Class of each row of several class columns taken together."""
    if not columns:
        return torch.zeros(rows, dtype=torch.int64)
    return torch.unique(torch.stack(columns, dim=1), dim=0, return_inverse=True)[1]


def segment_signatures(segment_ids: torch.Tensor, grounding_classes: torch.Tensor, segments: int) -> torch.Tensor:
    """Class per segment: segments with the same multiset of grounding classes are alike."""
    pairs, counts = torch.unique(torch.stack([segment_ids, grounding_classes], dim=1), dim=0, return_counts=True)
    signature: dict[int, list] = {}
    for (segment, cls), count in zip(pairs.tolist(), counts.tolist()):
        signature.setdefault(segment, []).extend((cls, count))
    ids: dict[tuple, int] = {}
    return torch.tensor([ids.setdefault(tuple(signature.get(s, ())), len(ids)) for s in range(segments)], dtype=torch.int64)


def multiplicity_matrix(segment_ids: torch.Tensor, grounding_classes: torch.Tensor, counts: torch.Tensor,
                        classes: int, average: bool) -> torch.Tensor:
    """segments × classes CSR of how often each class occurs in each segment (÷ size for avg)."""
    pairs, multiplicity = torch.unique(torch.stack([segment_ids, grounding_classes], dim=1), dim=0, return_counts=True)
    values = multiplicity.to(torch.float64)
    if average:
        values = values / counts[pairs[:, 0]].to(torch.float64)
    rows = torch.zeros(counts.shape[0] + 1, dtype=torch.int64)
    rows[1:] = torch.bincount(pairs[:, 0], minlength=counts.shape[0]).cumsum(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.sparse_csr_tensor(rows, pairs[:, 1], values, (counts.shape[0], classes))


def representatives(grounding_classes: torch.Tensor, classes: int) -> torch.Tensor:
    """The first grounding of each class."""
    positions = torch.arange(grounding_classes.shape[0])
    first = torch.full((classes,), grounding_classes.shape[0], dtype=torch.int64)
    return first.scatter_reduce(0, grounding_classes, positions, reduce="amin")
