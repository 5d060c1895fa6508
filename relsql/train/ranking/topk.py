"""Exact top-k of dot-product scores over all candidates, in chunks, never an n x m matrix.

Each block of query rows x candidate columns is scored with one matmul into a reused buffer. Its
best k per row come from the k groups of 32 columns with the highest maxima (a max-reduction, then
a selection over a 32nd of the block), and the blocks' best are merged into each row's best k.
Ties go to the lower candidate index, so the answer is deterministic and equals a stable full sort.
bench/topk.py times it (100k x 100k, dimension 32, k=10) against torch.topk of the full matrix.
"""

from __future__ import annotations

import numbers

import torch
from torch import Tensor

from relsql.errors import RelsqlError, ShapeError

# Measured with bench/topk.py --sweep (100k candidates, d=32, k=10, float32, CPU seconds per 10^10
# scores on one thread of a shared 2-core machine): 256 x 2048 (2 MB) 44, 1024 x 8192 (32 MB) 28,
# 2048 x 8192 (64 MB) 29, 512 x 32768 (64 MB) 26, 256 x 65536 (64 MB) 22, 128 x 100000 (51 MB) 18.5,
# 512 x 65536 (128 MB) 26: the per-row cost of each block's selections dominates after the matmul,
# so the fewer blocks per row the better: blocks are as wide as COLUMN_CHUNK allows and as tall as
# BLOCK_BYTES of scores allows.
BLOCK_BYTES = 64 * 2**20
COLUMN_CHUNK = 2**17
MERGE_EVERY = 16  # blocks whose best k are merged at once (one wide sort instead of many narrow ones)
GROUP = 32  # columns per max-reduction group in _block_best (32 floats reduced fastest of 8..128)
# narrower blocks are selected whole: the groups' extra passes cost more than they prune below ~2,000
# columns (2,200 rows, k=10, one thread: 1,024 columns 10.2 ms grouped vs 7.4 ms whole, 2,048 11.5 vs
# 11.0, 3,072 13.1 vs 14.0; a validation split of ~1,000 candidates is ranked several times an epoch)
GROUPED_FROM = 2048


def top_k(
    query: Tensor,
    candidates: Tensor,
    k: int,
    *,
    allowed: Tensor | None = None,
    exclude: tuple[Tensor, Tensor] | None = None,
    row_chunk: int | None = None,
    column_chunk: int | None = None,
) -> tuple[Tensor, Tensor]:
    """The k best candidates of each query row by dot product: (scores [n, k'], indices [n, k']).

    k' = min(k, number of allowed candidates). `allowed` ([m] bool) limits the candidates that may
    be ranked at all; `exclude` = (query rows, candidate indices) lists pairs never returned (items
    a customer already bought). A row left with fewer than k' candidates is padded with index -1
    and score -inf. Rows are sorted best first; equal scores put the lower candidate index first.
    """
    _check_inputs(query, candidates, k, allowed, exclude, row_chunk, column_chunk)
    k = int(k)
    with torch.no_grad():
        query, candidates = _common_dtype(query.detach(), candidates.detach())
        original = candidates.shape[0]
        positions = _allowed_positions(original, allowed, query.device)
        if positions is not None:
            candidates = candidates.index_select(0, positions)
        m = candidates.shape[0]
        kept = min(k, m)
        pairs = _excluded_keys(exclude, positions, original, m, query.device)
        columns = min(column_chunk or COLUMN_CHUNK, m)
        rows = row_chunk or max(1, BLOCK_BYTES // (columns * query.element_size()))
        scores, indices = _chunked(query, candidates, kept, pairs, rows, columns)
        if positions is not None:
            indices = torch.where(indices >= 0, positions[indices.clamp(min=0)], indices)
        return scores, indices


def _check_inputs(
    query: Tensor,
    candidates: Tensor,
    k: int,
    allowed: Tensor | None,
    exclude: tuple[Tensor, Tensor] | None,
    row_chunk: int | None,
    column_chunk: int | None,
) -> None:
    """Bad arguments fail here with the fix, before any block is scored."""
    if isinstance(k, bool) or not isinstance(k, numbers.Integral) or k <= 0:
        raise RelsqlError(f"top_k: k must be a positive whole number of candidates per row, got {k!r}; "
                          "ask for k >= 1 (for example k=10)")
    for name, tensor in (("query", query), ("candidates", candidates)):
        if not isinstance(tensor, Tensor) or tensor.dim() != 2 or not tensor.is_floating_point():
            raise ShapeError(f"top_k: {name} must be a 2-D floating-point tensor [rows, dimension], got {_describe(tensor)}")
    if query.shape[1] != candidates.shape[1]:
        raise ShapeError(
            f"top_k: query rows have dimension {query.shape[1]} but candidates have {candidates.shape[1]}; "
            "the two towers must end in representations of the same width"
        )
    if candidates.shape[0] == 0:
        raise RelsqlError("top_k: the candidate table is empty, so there is nothing to rank; "
                          "fill the referenced table (or pick another with candidates=...)")
    if allowed is not None:
        if not isinstance(allowed, Tensor) or allowed.dtype != torch.bool or allowed.shape != (candidates.shape[0],):
            raise ShapeError(f"top_k: allowed must be a bool tensor with one entry per candidate ({candidates.shape[0]}), "
                             f"got {_describe(allowed)}")
        if not bool(allowed.any()):
            raise RelsqlError("top_k: no candidate is allowed, so there is nothing to rank; allow at least one candidate")
    if exclude is not None:
        _check_exclude(exclude, query.shape[0], candidates.shape[0])
    for name, value in (("row_chunk", row_chunk), ("column_chunk", column_chunk)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
            raise RelsqlError(f"top_k: {name} must be a positive whole number, got {value!r}; "
                              "leave it out for the measured default")
    if not bool(torch.isfinite(query).all()) or not bool(torch.isfinite(candidates).all()):
        raise RelsqlError("top_k: the representations contain NaN or infinity, so scores cannot be ranked; "
                          "training diverged: lower the learning rate")


def _check_exclude(exclude: tuple[Tensor, Tensor], n: int, m: int) -> None:
    """`exclude` is two equally long integer vectors of in-range (row, candidate) pairs."""
    if not isinstance(exclude, tuple) or len(exclude) != 2:
        raise ShapeError("top_k: exclude must be a pair (query rows, candidate indices) of 1-D integer tensors")
    rows, columns = exclude
    for name, tensor, bound in (("rows", rows, n), ("candidate indices", columns, m)):
        if not isinstance(tensor, Tensor) or tensor.dim() != 1 or tensor.is_floating_point() or tensor.dtype == torch.bool:
            raise ShapeError(f"top_k: exclude's {name} must be a 1-D integer tensor, got {_describe(tensor)}")
        if tensor.numel() and (int(tensor.min()) < 0 or int(tensor.max()) >= bound):
            raise ShapeError(f"top_k: exclude's {name} must lie in [0, {bound}); drop the pairs outside it")
    if rows.shape != columns.shape:
        raise ShapeError(f"top_k: exclude's rows ({rows.numel()}) and candidate indices ({columns.numel()}) must be equally long")


def _describe(value: object) -> str:
    """A short account of a bad argument for an error message."""
    if isinstance(value, Tensor):
        return f"a {value.dtype} tensor of shape {tuple(value.shape)}"
    return f"{type(value).__name__}"


def _common_dtype(query: Tensor, candidates: Tensor) -> tuple[Tensor, Tensor]:
    """Both sides in one dtype, so the matmul is legal (float32 with float64 gives float64)."""
    dtype = torch.promote_types(query.dtype, candidates.dtype)
    return query.to(dtype), candidates.to(dtype)


def _allowed_positions(m: int, allowed: Tensor | None, device: torch.device) -> Tensor | None:
    """Ascending original indices of the allowed candidates (None: all are allowed).

    Ascending order keeps the tie rule: a lower position in the subset is a lower original index."""
    if allowed is None or bool(allowed.all()):
        return None
    return allowed.to(device).nonzero().flatten()


def _excluded_keys(
    exclude: tuple[Tensor, Tensor] | None, positions: Tensor | None, original: int, m: int, device: torch.device
) -> Tensor | None:
    """Excluded pairs as sorted keys row * m + column in the (allowed) candidate numbering."""
    if exclude is None or exclude[0].numel() == 0:
        return None
    rows, columns = (t.to(device=device, dtype=torch.long) for t in exclude)
    if positions is not None:  # renumber into the subset; pairs on disallowed candidates drop out
        renumber = torch.full((original,), -1, dtype=torch.long, device=device)
        renumber[positions] = torch.arange(positions.numel(), device=device)
        columns = renumber[columns]
        rows, columns = rows[columns >= 0], columns[columns >= 0]
    return torch.unique(rows * m + columns)  # sorted


def _chunked(query: Tensor, candidates: Tensor, k: int, pairs: Tensor | None, rows: int, columns: int) -> tuple[Tensor, Tensor]:
    """Scan blocks of rows x columns; the score buffer is the only block-sized allocation."""
    n, m = query.shape[0], candidates.shape[0]
    scores = torch.empty((n, k), dtype=query.dtype, device=query.device)
    indices = torch.empty((n, k), dtype=torch.long, device=query.device)
    buffer = torch.empty((min(rows, n) * min(columns, m),), dtype=query.dtype, device=query.device)
    for r0 in range(0, n, rows):
        r1 = min(n, r0 + rows)
        row_pairs = _pairs_in_rows(pairs, r0, r1, m)
        pending: list[tuple[Tensor, Tensor]] = []  # blocks' best k, merged MERGE_EVERY at a time
        for c0, c1 in _column_ranges(m, columns):
            block = buffer[: (r1 - r0) * (c1 - c0)].view(r1 - r0, c1 - c0)
            torch.mm(query[r0:r1], candidates[c0:c1].T, out=block)
            _mask_pairs(block, row_pairs, r0, c0, c1, m)
            pending.append(_block_best(block, k, c0))
            if len(pending) == MERGE_EVERY:
                pending = [_merge(pending, k)]
        scores[r0:r1], indices[r0:r1] = _merge(pending, k)
    indices[torch.isneginf(scores)] = -1  # excluded pairs that filled a short row
    return scores, indices


def _column_ranges(m: int, columns: int) -> list[tuple[int, int]]:
    """Blocks of candidate columns, each a whole number of GROUPs wide (so _block_best can prune it)
    but for a last tail of fewer than GROUP columns, which is ranked in full."""
    if columns >= GROUP:
        columns -= columns % GROUP
    ranges = [(c0, min(m, c0 + columns)) for c0 in range(0, m, columns)]
    c0, c1 = ranges[-1]
    if c1 - c0 > GROUP and (c1 - c0) % GROUP:
        ranges[-1:] = [(c0, c1 - (c1 - c0) % GROUP), (c1 - (c1 - c0) % GROUP, c1)]
    return ranges


def _pairs_in_rows(pairs: Tensor | None, r0: int, r1: int, m: int) -> Tensor | None:
    """The excluded keys of query rows [r0, r1) (a slice of the sorted keys)."""
    if pairs is None:
        return None
    bounds = torch.tensor([r0 * m, r1 * m], dtype=torch.long, device=pairs.device)
    lo, hi = torch.searchsorted(pairs, bounds).tolist()
    return pairs[lo:hi] if hi > lo else None


def _mask_pairs(block: Tensor, keys: Tensor | None, r0: int, c0: int, c1: int, m: int) -> None:
    """Set the excluded pairs that fall in this block to -inf, so they lose to every real score."""
    if keys is None:
        return
    columns = keys % m
    inside = (columns >= c0) & (columns < c1)
    if bool(inside.any()):
        block[keys[inside] // m - r0, columns[inside] - c0] = float("-inf")


def _block_best(block: Tensor, k: int, c0: int) -> tuple[Tensor, Tensor]:
    """The block's best k per row (scores, candidate indices), ties to the lower index.

    Where the block splits into more than k groups of GROUP columns, only the k groups with the
    highest maxima can hold the best k (no other element exceeds the k-th group maximum, which is
    at most the k-th best): a max-reduction and a selection over a GROUP-th of the columns
    replace most of the full selection. Where group maxima tie at the k-th, the lower groups win:
    each holds an element equal to that maximum at a lower index than any in a later group, so the
    lowest-index elements tied at the k-th best are still among the chosen groups."""
    width = block.shape[1]
    if width % GROUP or width // GROUP <= k or width < GROUPED_FROM:
        values, order = _exact_best(block, k)
        return values, order + c0
    group_max = torch.amax(block.view(block.shape[0], width // GROUP, GROUP), dim=2)
    _, chosen = _exact_best(group_max, k)  # ties among group maxima go to the lower group
    chosen = chosen.sort(dim=1).values  # ascending groups keep the candidate order
    rows, groups = block.shape[0], width // GROUP
    flat = (torch.arange(rows, device=block.device)[:, None] * groups + chosen).flatten()
    kept = block.view(rows * groups, GROUP).index_select(0, flat).view(rows, k * GROUP)  # whole groups: 40x faster than gather
    values, order = _exact_best(kept, k)
    return values, chosen.gather(1, order // GROUP) * GROUP + order % GROUP + c0


def _exact_best(block: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """Best min(k, width) per row, with columns in candidate order: topk(k+1) shows whether the
    k-th value ties with the next; only such rows pay for a stable sort of their row."""
    width = block.shape[1]
    if width <= k:
        return torch.sort(block, dim=1, descending=True, stable=True)
    values, order = torch.topk(block, k + 1, dim=1, sorted=True)
    tied = (values[:, k - 1] == values[:, k]) & ~torch.isneginf(values[:, k - 1])
    values, order = values[:, :k], order[:, :k]
    if bool(tied.any()):
        rows = tied.nonzero().flatten()
        exact_values, exact_order = torch.sort(block[rows], dim=1, descending=True, stable=True)
        values[rows], order[rows] = exact_values[:, :k], exact_order[:, :k]
    return values, order


def _merge(lists: list[tuple[Tensor, Tensor]], k: int) -> tuple[Tensor, Tensor]:
    """The best k of several lists per row, ordered by score descending, then candidate index ascending."""
    values = torch.cat([values for values, _ in lists], dim=1)
    indices = torch.cat([indices for _, indices in lists], dim=1)
    by_index = torch.argsort(indices, dim=1, stable=True)
    values, indices = values.gather(1, by_index), indices.gather(1, by_index)
    by_score = torch.argsort(values, dim=1, descending=True, stable=True)[:, :k]
    return values.gather(1, by_score), indices.gather(1, by_score)
