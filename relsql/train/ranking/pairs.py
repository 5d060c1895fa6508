"""Pair features: a template relation keyed by (target row, candidate) adds its value to a pair's score.

A relation keyed by the output's key columns and the referenced table's key (for example how often
the customer bought from the candidate's category before, a join over pairs that the database
computes) is the PAIR relation: score(row, item) = dot(query, candidate) + its value where the pair
has a row, else + 0. The pairs that exist are the shortlist: ranking takes the exact top-k of the
dot products with those pairs left out, then merges in the pairs' full scores, so the result is the
exact top-k of the sum and no n x m matrix is ever held.

In SQL templates the count is `linear(count(*), 1)` (the frontend refuses `features(count(*))`:
features() takes database columns, an aggregate is a neural value), for example
`CREATE TABLE pair_h AS SELECT t.task_id, i.item_id, linear(count(*), 1) AS h FROM task_rec t JOIN
purchase p ON p.customer_id = t.customer_id AND p.day < t.snapshot JOIN item q ON q.item_id =
p.item_id JOIN item i ON i.category = q.category GROUP BY t.task_id, i.item_id`. The output must
stay the template's last statement (or be named with output=).
"""

from __future__ import annotations

import numpy as np
import polars as pl
import torch
from torch import Tensor

from relsql.data.references import Reference
from relsql.errors import SchemaError
from relsql.template.ir import Template
from relsql.train.ranking.rows import key_rows
from relsql.train.ranking.topk import top_k

SHORTLIST_CHUNK = 1 << 22  # pair entries merged at once while ranking (bounds the merge's memory)


def pair_keys(template: Template, output: str, reference: Reference) -> list[str]:
    """The key columns a pair relation has: the output's keys and the referenced key, casefolded."""
    return sorted([k.casefold() for k in template.relations[output].keys] + [reference.key.casefold()])


def pair_relation(template: Template, output: str, candidates: str, reference: Reference, named: str | None) -> str | None:
    """The template's pair relation: `named`, else the last relation keyed by the output's keys and
    the referenced key (any order), else None (scores are the towers' dot product alone)."""
    wanted = pair_keys(template, output, reference)
    if reference.key.casefold() in {k.casefold() for k in template.relations[output].keys}:
        wanted = []  # the output is itself keyed by the referenced key: no pair relation can be told apart
    if named is None:
        found = [name for name, relation in template.relations.items() if name not in (output, candidates)
                 and sorted(k.casefold() for k in relation.keys) == wanted]
        return found[-1] if found else None
    if named not in template.relations or named in (output, candidates):
        raise SchemaError(f"pairs=`{named}` is not a relation of the template other than the output `{output}` and the "
                          f"candidates `{candidates}`; it declares {list(template.relations)}")
    keys = template.relations[named].keys
    if not wanted or sorted(k.casefold() for k in keys) != wanted:
        need = [*template.relations[output].keys, reference.key]
        raise SchemaError(f"the pair relation `{named}` is keyed by {keys}; a pair relation is keyed by the output's keys "
                          f"and the referenced key, {need} (one row per target row and candidate, e.g. `SELECT "
                          f"t.{need[0]}, i.{reference.key}, linear(count(*), 1) AS h ... GROUP BY t.{need[0]}, "
                          f"i.{reference.key}`)")
    return named


class PairIndex:
    """Where each (output row, candidate row) pair's value sits in the pair relation, by sorted key
    output_rid * m + candidate_rid; `offsets` slices one output row's pairs (CSR)."""

    def __init__(self, output_rids: np.ndarray, candidate_rids: np.ndarray, pair_rids: np.ndarray, n: int, m: int):
        self.m = m
        keys = output_rids.astype(np.int64) * m + candidate_rids.astype(np.int64)
        order = np.argsort(keys, kind="stable")
        self.keys = torch.as_tensor(keys[order])
        self.rows = torch.as_tensor(pair_rids.astype(np.int64)[order])
        self.offsets = np.searchsorted(keys[order], np.arange(n + 1, dtype=np.int64) * m)

    @classmethod
    def of(cls, grounding, pair: str, output: str, candidates: str, reference: Reference) -> PairIndex:
        """The index of relation `pair`'s rows; rows whose target row or candidate has no row in the
        output or candidate relation can never be scored and are left out."""
        out_keys = pl.from_arrow(grounding.relations[output].keys)
        cand_keys = pl.from_arrow(grounding.relations[candidates].keys)
        frame = pl.from_arrow(grounding.relations[pair].keys)
        names = {c.casefold(): c for c in frame.columns}
        out_names = [c for c in out_keys.columns if c != "_rid"]
        ref = next(c for c in cand_keys.columns if c != "_rid")
        frame = frame.select([pl.col(names[c.casefold()]).alias(c) for c in out_names]
                             + [pl.col(names[reference.key.casefold()]).alias(ref), pl.col("_rid").alias("_pair")])
        joined = key_rows(frame, out_keys, cand_keys, ref, keep_unmatched=False,
                          mismatch=f"the pair relation `{pair}`'s keys do not have the types of `{output}`'s and "
                                   f"`{candidates}`'s keys; select the same columns")
        return cls(joined["_out"].to_numpy(), joined["_cand"].to_numpy(), joined["_pair"].to_numpy(),
                   out_keys.height, cand_keys.height)

    def lookup(self, rows: Tensor, items: Tensor) -> Tensor:
        """The pair relation row of each (rows, items) pair (broadcast), -1 where there is none."""
        if not self.keys.numel():
            return torch.full(torch.broadcast_shapes(rows.shape, items.shape), -1, dtype=torch.long, device=rows.device)
        keys, stored = self.keys.to(rows.device), self.rows.to(rows.device)
        wanted = rows.long() * self.m + items.long()
        at = torch.searchsorted(keys, wanted.reshape(-1)).clamp(max=keys.numel() - 1).reshape(wanted.shape)
        return torch.where(keys[at] == wanted, stored[at], torch.full_like(wanted, -1))

    def term(self, values: Tensor, rows: Tensor, items: Tensor) -> Tensor:
        """Each pair's value (0 where the pair has no row), differentiable in `values` ([P] or [P, 1])."""
        values = values.reshape(-1)
        found = self.lookup(rows, items)
        picked = values.index_select(0, found.clamp(min=0).reshape(-1)).reshape(found.shape)
        return torch.where(found >= 0, picked, torch.zeros((), dtype=values.dtype, device=values.device))

    def matrix(self, values: Tensor, rows: Tensor, drawn: Tensor) -> Tensor:
        """The [len(rows), len(drawn)] pair values of every row against every drawn candidate (0 without
        a pair), from the pairs of `rows` alone: those whose candidate was drawn are scattered into a
        matrix of the distinct rows, then spread to every row; no lookup per cell."""
        values = values.reshape(-1)
        distinct, inverse = torch.unique(rows, return_inverse=True)
        position, items, stored = (torch.as_tensor(a, device=rows.device) for a in self.entries(distinct.cpu().numpy()))
        hit = torch.zeros(self.m, dtype=torch.bool, device=rows.device)
        hit[drawn] = True
        keep = hit[items]
        position, items, stored = position[keep], items[keep], stored[keep]
        ordered, order = torch.sort(drawn, stable=True)  # a candidate drawn twice fills both columns
        lo = torch.searchsorted(ordered, items)
        counts = torch.searchsorted(ordered, items, right=True) - lo
        at = torch.repeat_interleave(lo - torch.cumsum(counts, 0) + counts, counts) + torch.arange(int(counts.sum()),
                                                                                                   device=rows.device)
        grid = torch.zeros((len(distinct), len(drawn)), dtype=values.dtype, device=values.device)
        grid = grid.index_put((torch.repeat_interleave(position, counts), order[at]),
                              values.index_select(0, torch.repeat_interleave(stored, counts)))
        return grid.index_select(0, inverse)

    def entries(self, rids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(position in `rids`, candidate row, pair relation row) of every pair of output rows `rids`."""
        starts, ends = self.offsets[rids], self.offsets[rids + 1]
        counts = ends - starts
        total = int(counts.sum())
        index = np.repeat(starts - np.concatenate([[0], np.cumsum(counts)[:-1]]), counts) + np.arange(total)
        keys, stored = self.keys.numpy()[index], self.rows.numpy()[index]
        return np.repeat(np.arange(len(rids)), counts), keys % self.m, stored


def rank_with_pairs(query: Tensor, candidate: Tensor, values: Tensor, index: PairIndex, rids: np.ndarray,
                    k: int) -> tuple[Tensor, Tensor]:
    """Exact top-k of dot(query, candidate) + pair value for output rows `rids`: (scores, candidate rows),
    best first, equal scores to the lower candidate row, as top_k orders them."""
    counts = index.offsets[rids + 1] - index.offsets[rids]
    bounds, start, total = [0], 0, 0
    for i, c in enumerate(counts.tolist()):  # row chunks of at most SHORTLIST_CHUNK pair entries (one row at least)
        if total + c > SHORTLIST_CHUNK and i > start:
            bounds.append(i)
            start, total = i, 0
        total += c
    bounds.append(len(rids))
    parts = [_rank_chunk(query, candidate, values, index, rids[a:b], k) for a, b in zip(bounds, bounds[1:], strict=False)
             if b > a]
    if not parts:
        kept = min(k, candidate.shape[0])
        return torch.empty((0, kept), dtype=query.dtype), torch.empty((0, kept), dtype=torch.long)
    return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])


def _rank_chunk(query: Tensor, candidate: Tensor, values: Tensor, index: PairIndex, rids: np.ndarray,
                k: int) -> tuple[Tensor, Tensor]:
    """One chunk of rows: the dense top-k, its pair candidates replaced by the pairs' full scores.

    Every candidate outside the dense top-k comes after its last entry (score, then index), so a
    row whose merged k-th entry comes no later than that last entry is exact. The other rows (a
    pair candidate fell out of the dense list and a negative pair value let others catch up) are
    ranked again with their pairs left out of the dense top-k, which is exact for them too."""
    device = query.device
    rows = query.index_select(0, torch.as_tensor(rids, device=device))
    position, items, stored = (torch.as_tensor(a, device=device) for a in index.entries(rids))
    dense, dense_items = top_k(rows, candidate, k)
    dtype = dense.dtype
    pair_scores = ((rows.index_select(0, position).to(dtype) * candidate.index_select(0, items).to(dtype)).sum(1)
                   + values.reshape(-1).index_select(0, stored).to(dtype))
    paired = index.lookup(torch.as_tensor(rids, device=device)[:, None].expand_as(dense_items), dense_items) >= 0
    scores, best = _merge(len(rids), min(k, candidate.shape[0]), (dense, dense_items, ~paired),
                          (position, items, pair_scores))
    last_score, last_item = dense[:, -1], dense_items[:, -1]
    exact = (scores[:, -1] > last_score) | ((scores[:, -1] == last_score) & (best[:, -1] <= last_item)) | ~paired.any(1)
    redo = (~exact).nonzero().flatten()
    if len(redo):
        scores[redo], best[redo] = _ranked_apart(rows[redo], candidate, k, position, items, pair_scores, redo)
    return scores, best


def _ranked_apart(rows: Tensor, candidate: Tensor, k: int, position: Tensor, items: Tensor, pair_scores: Tensor,
                  chosen: Tensor) -> tuple[Tensor, Tensor]:
    """Rows `chosen` (positions in the chunk): the dense top-k without their pairs, merged with the pairs."""
    size = max(int(position.max()) if len(position) else 0, int(chosen.max())) + 1
    renumber = torch.full((size,), -1, dtype=torch.long, device=rows.device)
    renumber[chosen] = torch.arange(len(chosen), device=rows.device)
    mine = renumber[position] >= 0 if len(position) else torch.zeros(0, dtype=torch.bool, device=rows.device)
    position, items, pair_scores = renumber[position[mine]], items[mine], pair_scores[mine]
    dense, dense_items = top_k(rows, candidate, k, exclude=(position, items) if len(position) else None)
    return _merge(len(chosen), min(k, candidate.shape[0]), (dense, dense_items, dense_items >= 0),
                  (position, items, pair_scores))


def _merge(n: int, kept: int, dense: tuple[Tensor, Tensor, Tensor],
           pairs: tuple[Tensor, Tensor, Tensor]) -> tuple[Tensor, Tensor]:
    """The best `kept` per row of the dense entries (scores [n, k], candidates [n, k], kept [n, k] bool)
    and the pair entries (row, candidate, score), by score descending, then candidate ascending."""
    scores, items, keep = dense
    row_of = torch.arange(n, device=scores.device)[:, None].expand_as(items)
    position, pair_items, pair_scores = pairs
    all_rows = torch.cat([row_of[keep], position])
    all_items = torch.cat([items[keep], pair_items])
    all_scores = torch.cat([scores[keep], pair_scores])
    for key, descending in ((1, False), (2, True), (0, False)):  # by row, then score descending, then item
        order = torch.argsort((all_rows, all_items, all_scores)[key], descending=descending, stable=True)
        all_rows, all_items, all_scores = all_rows[order], all_items[order], all_scores[order]
    starts = torch.searchsorted(all_rows, torch.arange(n, device=scores.device))
    take = (starts[:, None] + torch.arange(kept, device=scores.device)).reshape(-1).clamp(max=max(len(all_rows) - 1, 0))
    found = torch.arange(kept, device=scores.device)[None, :] < (torch.bincount(all_rows, minlength=n)[:, None])
    best_scores = torch.where(found, all_scores[take].reshape(n, kept), torch.full((), float("-inf"), dtype=scores.dtype))
    best_items = torch.where(found, all_items[take].reshape(n, kept), torch.full((), -1, dtype=torch.long))
    return best_scores, best_items
