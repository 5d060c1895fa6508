"""Isomorphic compression: groundings that provably compute the same value are computed once.

Rows get structural classes: two rows of a column are alike when their values are equal, two
rows of a relation are alike when every rule grounds them with the same multiset of grounding
classes. A grounding's class is the tuple of its body rows' classes. Since equal classes mean
equal values for any weights, a rule evaluates one representative per grounding class and
aggregates with multiplicities (a CSR matrix of counts), like NeuraLogic's iso-value
compression but decided from structure, not from sampled values.

Classes are found with 1-D sorts only (multi-column rows are projected or hashed to one
number, then every class is checked against its representative, exactly; a collision falls back
to exact column-by-column sorts), because `torch.unique(dim=0)` takes seconds on a million rows.
"""

from __future__ import annotations

import torch

from relsql.compile import sparse

# odd 64-bit constants (splitmix64's), as signed int64
_C1 = -7046029254386353131  # 0x9E3779B97F4A7C15
_C2 = -4658895280553007687  # 0xBF58476D1CE4E5B9
_C3 = -7723592293110705685  # 0x94D049BB133111EB


def _mix(x: torch.Tensor) -> torch.Tensor:
    """A bijective scramble of int64 values (wrapping arithmetic), so sums of them rarely collide."""
    x = (x ^ (x >> 31)) * _C2
    x = (x ^ (x >> 29)) * _C3
    return x ^ (x >> 32)


def dense(values: torch.Tensor) -> torch.Tensor:
    """Class id per element of a 1-D tensor: equal values, equal ids (ids 0..k-1 in value order).
    Integers within a small range are renumbered by counting, not sorting."""
    if values.numel() and not values.is_floating_point():
        low, high = int(values.min()), int(values.max())
        if high - low < 4 * values.numel():
            present = torch.bincount(values - low, minlength=high - low + 1) > 0
            return (torch.cumsum(present, 0) - 1)[values - low]
    return torch.unique(values, return_inverse=True)[1]


def representatives(grounding_classes: torch.Tensor, classes: int) -> torch.Tensor:
    """The first grounding of each class."""
    positions = torch.arange(grounding_classes.shape[0])
    first = torch.full((classes,), grounding_classes.shape[0], dtype=torch.int64)
    return first.scatter_reduce(0, grounding_classes, positions, reduce="amin")


def class_count(classes: torch.Tensor) -> int:
    return int(classes.max()) + 1 if classes.numel() else 0


_PROJECT_BLOCK = 1 << 20  # float64 cells of the column-major block `_project` copies at a time (8 MB)


def _project(rows: torch.Tensor) -> torch.Tensor:
    """A random linear projection of each row, one column at a time: separate elementwise
    multiplies and adds round the same way for every row (a matmul may not: its kernels
    block rows differently), so equal rows always project to equal numbers."""
    weights = torch.randn(rows.shape[1], dtype=torch.float64, generator=torch.Generator().manual_seed(0)).tolist()
    # a block of rows at a time, copied column-major in float64, so that each column read below is
    # contiguous and the block stays in cache (the whole matrix transposed at once was a second
    # pass over memory: 115k x 153 twice as slow); every row's arithmetic is the same, in the same order
    block = max(4096, _PROJECT_BLOCK // max(rows.shape[1], 1))  # at least 4096 rows: per-call overhead
    total = torch.empty(rows.shape[0], dtype=torch.float64)
    columns = torch.empty((rows.shape[1], min(block, rows.shape[0])), dtype=torch.float64)
    product = torch.empty(columns.shape[1], dtype=torch.float64)
    for start in range(0, rows.shape[0], block):
        part = rows[start:start + block]
        size = part.shape[0]
        cols, term = columns[:, :size], product[:size]
        cols.copy_(part.t())
        sums = torch.mul(cols[0], weights[0], out=total[start:start + size])
        for j in range(1, rows.shape[1]):
            sums.add_(torch.mul(cols[j], weights[j], out=term))
    return total


PROBE_COLUMNS = 8  # columns of a wide row, spread over its width, projected alone: a cheap lower bound on its classes


def classes_of(values: torch.Tensor, limit: int | None = None) -> torch.Tensor | None:
    """Class id per row: equal rows (elementwise ==), equal ids.

    With `limit`: None as soon as the rows are known to fall into more than `limit` classes
    (callers that only use few classes stop there). PROBE_COLUMNS columns of a wide row, spread
    over its width, are projected first: rows that differ there differ, so more classes among them
    than `limit` ends the search before the whole width is read (a table's encoded features: 153
    columns of 115k rows, mostly distinct, took seconds to classify in full)."""
    if values.dim() == 1:
        return _within(dense(values), limit)
    flat = values.reshape(values.shape[0], -1)
    if flat.shape[0] and bool((flat == flat[0]).all()):  # one class (a fact table without values: all ones)
        return torch.zeros(flat.shape[0], dtype=torch.int64)
    if flat.shape[1] == 1:
        return _within(dense(flat[:, 0]), limit)
    if limit is not None and flat.shape[1] > 2 * PROBE_COLUMNS:
        spread = torch.linspace(0, flat.shape[1] - 1, PROBE_COLUMNS).round().to(torch.int64).unique()
        if class_count(dense(_project(flat.index_select(1, spread)))) > limit:
            return None
    candidate = dense(_project(flat))
    if limit is not None and class_count(candidate) > limit:  # equal rows project equally: at least this many classes
        return None
    rep = representatives(candidate, class_count(candidate))
    if torch.equal(flat, flat.index_select(0, rep.index_select(0, candidate))):
        return candidate
    return _within(combine([dense(flat[:, j]) for j in range(flat.shape[1])], flat.shape[0]), limit)  # a collision: exact


def _within(classes: torch.Tensor, limit: int | None) -> torch.Tensor | None:
    return None if limit is not None and class_count(classes) > limit else classes


def combine(columns: list[torch.Tensor], rows: int) -> torch.Tensor:
    """Class of each row of several class columns taken together (lexicographic order)."""
    if not columns:
        return torch.zeros(rows, dtype=torch.int64)
    result = columns[0]
    for column in columns[1:]:  # ids may be any ints >= -1: shift, pair, renumber (one sort per column)
        low, high = (int(column.min()), int(column.max())) if column.numel() else (0, 0)
        if high > low:  # a constant column splits no class
            result = dense(result) * (high - low + 1) + (column - low)
    return dense(result)


def pairs(segment_ids: torch.Tensor, grounding_classes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Distinct (segment, class) pairs sorted by segment then class, with their multiplicities."""
    k = max(class_count(grounding_classes), 1)
    keys, counts = torch.unique(segment_ids * k + grounding_classes, return_counts=True)
    return keys // k, keys % k, counts


def distinct_segments(segment_ids: torch.Tensor, grounding_classes: torch.Tensor, segments: int) -> torch.Tensor | None:
    """Class per segment when no two segments can be alike, else None. One hash per grounding,
    summed per segment, needs no sort: equal multisets always hash alike, so all-different sums
    prove all-different segments (a random graph's nodes) without `pairs`, a sort of every grounding."""
    per_class = _mix((torch.arange(class_count(grounding_classes)) + 1) * _C1)  # hashed once per class, not per grounding
    summed = torch.zeros(segments, dtype=torch.int64).index_add_(0, segment_ids, per_class[grounding_classes])
    lengths = torch.bincount(segment_ids, minlength=segments)
    candidate = dense(_mix(summed + lengths * _C3))
    return candidate if class_count(candidate) == segments else None


def segment_signatures(found: tuple[torch.Tensor, torch.Tensor, torch.Tensor], segments: int) -> torch.Tensor:
    """Class per segment: segments with the same multiset of grounding classes are alike.
    `found` is `pairs(segment ids, grounding classes)`."""
    seg, cls, counts = found
    element = ((cls + 1) * _C1) ^ (counts * _C2)  # collisions are caught by the exact check below
    lengths = torch.bincount(seg, minlength=segments)
    summed = torch.zeros(segments, dtype=torch.int64).index_add_(0, seg, element)
    candidate = dense(_mix(summed + lengths * _C3))
    rep = representatives(candidate, class_count(candidate))[candidate]  # each segment's representative
    if torch.equal(lengths, lengths[rep]):
        start = torch.cumsum(lengths, 0) - lengths
        other = start[rep[seg]] + (torch.arange(seg.shape[0]) - start[seg])  # same position in the rep
        if torch.equal(cls, cls[other]) and torch.equal(counts, counts[other]):
            return candidate
    return _exact_signatures(seg, cls, counts, segments)  # a hash collision


def _exact_signatures(seg: torch.Tensor, cls: torch.Tensor, counts: torch.Tensor, segments: int) -> torch.Tensor:
    signature: dict[int, list] = {}
    for s, c, n in zip(seg.tolist(), cls.tolist(), counts.tolist()):
        signature.setdefault(s, []).extend((c, n))
    ids: dict[tuple, int] = {}
    return torch.tensor([ids.setdefault(tuple(signature.get(s, ())), len(ids)) for s in range(segments)], dtype=torch.int64)


def multiplicity_matrix(found: tuple[torch.Tensor, torch.Tensor, torch.Tensor], counts: torch.Tensor,
                        classes: int, average: bool) -> torch.Tensor:
    """segments × classes CSR of how often each class occurs in each segment (÷ size for avg).
    `found` is `pairs(segment ids, grounding classes)`."""
    seg, cls, multiplicity = found
    values = multiplicity.to(torch.float64)
    if average:
        values = values / counts[seg].to(torch.float64)
    rows = torch.zeros(counts.shape[0] + 1, dtype=torch.int64)
    rows[1:] = torch.bincount(seg, minlength=counts.shape[0]).cumsum(0)
    return sparse.from_csr(rows, cls, values, (counts.shape[0], classes))
