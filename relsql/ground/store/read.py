"""One batch read from an opened store, in O(batch).

A batch's demand closure runs over the CSR offsets in numpy (like a neighbour sampler): it reads
the offsets of its rows, the row ids and values of their groundings, and nothing else, through
memory maps whose pages are handed back after every batch (resident memory stays bounded by the
batch; relsql/ground/store/memory.py). The offsets, row ids and codes it reads are range-checked.
Fan-out sampling happens here too, seeded by the grounding's position, so a head's sample does
not depend on the batch it is in.
"""

from __future__ import annotations

import mmap
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch

from relsql.ground.demand import BatchGrounder, BatchGrounding, PreparedRule
from relsql.ground.execute import RelationGrounding, RuleGrounding
from relsql.ground.store.layout import READ, Damaged, StoreMeta, damaged
from relsql.ground.store.memory import RESIDENT_BUDGET, TRIM_AFTER, resident_file_bytes, trim_heap

WINDOW = 32 << 20  # bytes of a store file one read spans before the resident budget is checked again
FAULT_AROUND = 64 << 10  # bytes a page fault on a file mapping maps in (Linux's fault_around_bytes default)


@dataclass
class StoredRule:
    """One rule's part of the store, opened as memory maps."""

    prepared: PreparedRule
    size: int
    offsets: np.ndarray
    refs: list[np.ndarray]
    columns: dict[int, np.ndarray]  # values (G, width) or codes (G,), in the types the manifest records
    coded: dict[int, str]  # ir.coded_columns of the rule, walked once (per batch it cost 0.1 ms at TPC-H)


class BatchReader:
    """The reading half of a GroundingStore: its files mapped read-only, and batches read from
    them. The store that opens them (relsql/ground/store/grounding_store.py) sets these attributes."""

    grounder: BatchGrounder | StoreMeta
    folder: Path
    data: Path  # the build folder
    created: bool
    output: str
    order: list[str]
    fanout: dict[str, int] | int | None
    seed: int
    rules: dict[str, list[StoredRule]]
    embedding_keys: dict[str, pa.Array]

    def __init__(self) -> None:
        self._maps: list[mmap.mmap] = []
        self.resident_budget = RESIDENT_BUDGET  # bytes of the store's pages kept mapped between batches (set by the store)
        self._resident = resident_file_bytes() or 0  # file-backed resident bytes after the last release

    def mapped(self, file: str, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
        """A store file as a read-only array of `shape`: a regular file (not a link) of exactly
        the size the manifest implies."""
        if not shape[0]:
            return np.zeros(shape, dtype=dtype)
        path, expected = self.data / file, int(np.prod(shape)) * np.dtype(dtype).itemsize
        try:
            fd = os.open(path, READ)
        except OSError as err:
            raise Damaged(f"{file}: {err.strerror or err}") from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise Damaged(f"{file} is not a regular file")
            if info.st_size != expected:
                raise Damaged(f"{file} has {info.st_size:,} bytes where the manifest implies {expected:,}")
            mapped = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
        except OSError as err:
            raise Damaged(f"{file}: {err.strerror or err}") from None
        finally:
            os.close(fd)
        mapped.madvise(mmap.MADV_RANDOM)  # a batch reads scattered ranges: no read-ahead around them
        self._maps.append(mapped)
        return np.frombuffer(mapped, dtype=dtype).reshape(shape)

    def release(self) -> None:
        """Hand the pages read so far back to the page cache once they hold more than
        RESIDENT_BUDGET bytes (resident memory stays bounded; dropping them after every batch
        made small batches re-fault their pages, doubling a 512-row read at TPC-H sf 1)."""
        resident = resident_file_bytes()
        if resident is not None and resident - self._resident < self.resident_budget:
            return
        for mapped in self._maps:
            mapped.madvise(mmap.MADV_DONTNEED)
        self._resident = resident_file_bytes() or 0

    # -- one batch -----------------------------------------------------------------------------
    def ground(self, rids: np.ndarray, sample: int = 0) -> BatchGrounding:
        """The grounding of the output rows with global ids `rids`, read from the store."""
        # per relation: the global ids asked for, each with the picked rule and reference they fill
        pending: dict[str, list[tuple[np.ndarray, _Picked | None, int]]] = {
            self.output: [(np.asarray(rids, dtype=np.int64), None, 0)]}
        demand: dict[str, np.ndarray] = {}
        picked: dict[str, list[_Picked]] = {}
        for name in reversed(self.order):  # every relation's demand is complete before it is read
            parts = pending.pop(name, None)
            if not parts:
                continue
            wanted, inverse = unique_inverse(np.concatenate([ids for ids, _, _ in parts]))
            demand[name] = wanted
            start = 0
            for ids, owner, k in parts:  # the batch's own row numbers of each reference, from the sort
                if owner is not None:
                    owner.local[k] = inverse[start:start + len(ids)]
                start += len(ids)
            picked[name] = []
            for rule in self.rules[name]:
                picked[name].append(self._pick(name, rule, wanted, sample))
                self.release()  # per rule: a large batch of random rows would otherwise map in most of the store
            for chosen in picked[name]:
                for k, (ref, ids) in enumerate(zip(chosen.rule.prepared.rule.refs, chosen.refs)):
                    pending.setdefault(ref, []).append((ids, chosen, k))
        try:
            grounding = self._localize(demand, picked)
        finally:
            self.release()
        if sum(p.positions.nbytes for chosen in picked.values() for p in chosen) * 4 > TRIM_AFTER:
            trim_heap()
        return grounding

    def _pick(self, name: str, rule: StoredRule, wanted: np.ndarray, sample: int) -> _Picked:
        """The groundings of heads `wanted` (ascending global ids), in store order: at most
        `fanout` per head of a grouped rule, a seeded choice by position."""
        if not rule.size:
            empty = np.zeros(0, np.int64)
            return _Picked(rule, np.zeros(len(wanted), np.int64), empty, [empty for _ in rule.refs])
        starts = self._take(rule.offsets, wanted)
        counts = self._take(rule.offsets, wanted + 1) - starts
        if len(counts) and (counts.min() < 0 or starts.min() < 0 or int((starts + counts).max()) > rule.size):
            raise damaged(self.folder, f"the offsets of {name}'s rule {rule.prepared.index} are out of order or past its "
                                       "groundings", self.created)
        ends = np.cumsum(counts)
        positions = np.arange(int(ends[-1]) if len(ends) else 0, dtype=np.int64) - np.repeat(ends - counts - starts, counts)
        limit = self.fanout.get(name) if isinstance(self.fanout, dict) else self.fanout
        if limit and rule.prepared.rule.grouped and len(counts) and counts.max() > limit:
            salt = _mix(np.array([self.seed * 100_003 + sample], dtype=np.int64))[0]
            heads = np.repeat(np.arange(len(wanted)), counts)
            order = np.lexsort((_mix(positions.view(np.uint64) ^ salt), heads))  # per head, positions by their hash
            keep = np.sort(order[np.arange(len(order)) - np.repeat(ends - counts, counts) < limit])
            positions, counts = positions[keep], np.minimum(counts, limit)
        refs = [self._take(column, positions).astype(np.int64, copy=False) for column in rule.refs]
        for ref, ids in zip(rule.prepared.rule.refs, refs):
            if len(ids) and (int(ids.min()) < 0 or int(ids.max()) >= self.grounder.sizes[ref]):
                raise damaged(self.folder, f"{name}'s rule {rule.prepared.index} has row ids outside `{ref}`'s "
                              f"{self.grounder.sizes[ref]:,} rows", self.created)
        return _Picked(rule, counts, positions, refs)

    def _take(self, array: np.ndarray | Parts, positions: np.ndarray) -> np.ndarray:
        """`array[positions]` (positions ascending, as a batch reads them), WINDOW bytes of the file
        at a time with the resident budget checked in between. A batch's rows scattered over a
        large file would otherwise map most of it in at once: each page fault maps the 64 KiB
        around it, whatever madvise says (TPC-H sf 10: 2 GB of the store resident, sf 1: 0.2 GB)."""
        if len(positions) * FAULT_AROUND <= self.resident_budget:
            return array[positions]  # maps in at most the budget: at once (a small batch's reads)
        row = array.dtype.itemsize * (array.shape[1] if len(array.shape) > 1 else 1)
        span = max(1, WINDOW // max(row, 1))
        if int(positions[-1]) - int(positions[0]) < span:
            return array[positions]
        cuts = np.searchsorted(positions, np.arange(int(positions[0]) + span, int(positions[-1]) + 1, span))
        cuts = np.maximum.accumulate(np.concatenate([[0], cuts, [len(positions)]]))  # any order still reads every position
        out = np.empty((len(positions), *array.shape[1:]), dtype=array.dtype)
        for start, stop in zip(cuts[:-1].tolist(), cuts[1:].tolist()):
            if stop > start:
                out[start:stop] = array[positions[start:stop]]
                self.release()
        return out

    def _codes(self, rule: StoredRule, k: int, positions: np.ndarray) -> np.ndarray:
        """Column `k`'s codes at `positions`, each a code of its weight's dictionary (or stored keys)."""
        taken = self._take(rule.columns[k], positions).astype(np.int64, copy=False)
        weight = rule.coded.get(k)
        if k in rule.prepared.stored:
            limit = len(self.embedding_keys[rule.prepared.stored[k]])
        elif weight in self.grounder.dictionary_tables:
            limit = self.grounder.dictionary_tables[weight].num_rows
        else:
            return taken
        if len(taken) and (int(taken.min()) < 0 or int(taken.max()) >= limit):
            raise damaged(self.folder, f"codes of column {k} of rule {rule.prepared.index} are outside `{weight}`'s "
                          f"{limit:,} values", self.created)
        return taken

    def _localize(self, demand: dict[str, np.ndarray], picked: dict[str, list[_Picked]]) -> BatchGrounding:
        """Renumber to the batch's own rows (sorted global ids keep the store's order)."""
        codes: dict[str, list[np.ndarray]] = {}
        for parts in picked.values():
            for chosen in parts:
                for k, weight in chosen.rule.prepared.stored.items():
                    codes.setdefault(weight, []).append(self._codes(chosen.rule, k, chosen.positions))
        used = {w: unique(np.concatenate(arrays)) for w, arrays in codes.items()}
        embedding_keys = {w: self.embedding_keys[w].take(pa.array(c)) for w, c in used.items()}
        dictionaries = dict(self.grounder.dictionary_tables)
        for weight, keys in embedding_keys.items():
            dictionaries[weight] = pa.table({"value": keys, "code": pa.array(np.arange(len(keys), dtype=np.int64))})
        relations: dict[str, RelationGrounding] = {}
        for name in self.order:
            if name not in picked:
                continue
            rows = demand[name]
            result = RelationGrounding(name, pa.table({"_rid": np.arange(len(rows), dtype=np.int64), "_global": rows}))
            for chosen in picked[name]:
                if not len(chosen.positions):
                    continue
                rule = chosen.rule
                grounded = np.flatnonzero(chosen.counts)
                head = torch.from_numpy(np.repeat(np.arange(len(rows), dtype=np.int64), chosen.counts))
                refs = [torch.from_numpy(local) for local in chosen.local]
                values = {}
                coded = rule.coded
                for k, column in rule.columns.items():
                    taken = (self._codes(rule, k, chosen.positions) if k in coded
                             else self._take(column, chosen.positions).astype(np.float64, copy=False))
                    if k in rule.prepared.stored:
                        taken = np.searchsorted(used[rule.prepared.stored[k]], taken)
                    values[k] = torch.from_numpy(taken)
                offsets = torch.from_numpy(np.concatenate([np.zeros(1, np.int64), np.cumsum(chosen.counts[grounded])]))
                result.rules.append(RuleGrounding(rule.prepared.rule, head, refs, values, torch.from_numpy(grounded), offsets))
                self.release()
            relations[name] = result
        return BatchGrounding(relations, dictionaries, self.grounder.feature_stats,
                              rows={n: torch.from_numpy(demand[n]) for n in relations}, embedding_keys=embedding_keys,
                              embedding_codes=used)


@dataclass
class _Picked:
    """A rule's groundings chosen for a batch: per demanded head its count, their store
    positions, and their referenced rows' global ids."""

    rule: StoredRule
    counts: np.ndarray
    positions: np.ndarray
    refs: list[np.ndarray]
    local: list[np.ndarray | None] = field(init=False)  # refs as the batch's row numbers (set by ground)

    def __post_init__(self) -> None:
        self.local = [None] * len(self.refs)


def unique(values: np.ndarray) -> np.ndarray:
    """The sorted distinct values of a 1-d array; by sorting, which takes a quarter of
    np.unique's time on a batch's row ids (numpy 2's np.unique hashes first, then sorts), and
    stably (numpy's timsort and radix sort beat its quicksort on row ids: 47 against 80 us for 4,000)."""
    ordered = np.sort(values, kind="stable")
    if len(ordered) < 2:
        return ordered
    keep = np.empty(len(ordered), dtype=bool)
    keep[0] = True
    np.not_equal(ordered[1:], ordered[:-1], out=keep[1:])
    return ordered[keep]


def unique_inverse(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the sorted distinct values, each value's index among them): one stable argsort, which
    numpy runs as a radix sort on integers; 70 against 205 us for a sort and a binary search of
    4,000 row ids (a TPC-H sf 1 batch's parts)."""
    order = np.argsort(values, kind="stable")
    ordered = values[order]
    keep = np.empty(len(ordered), dtype=bool)
    if len(ordered):
        keep[0] = True
        np.not_equal(ordered[1:], ordered[:-1], out=keep[1:])
    inverse = np.empty(len(values), dtype=np.int64)
    inverse[order] = np.cumsum(keep) - 1
    return ordered[keep], inverse


def _mix(values: np.ndarray) -> np.ndarray:
    """SplitMix64's finalizer: a well-spread 64-bit hash of each integer (wrapping arithmetic)."""
    z = values.view(np.uint64) if values.dtype == np.int64 else values.astype(np.uint64)
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


class Parts:
    """One column of a rule's groundings kept in several files (its parts, in order), read as one
    array by position."""

    def __init__(self, arrays: list[np.ndarray]):
        self.arrays = arrays
        self.starts = np.cumsum([0, *[len(a) for a in arrays]])
        self.shape = (int(self.starts[-1]), *arrays[0].shape[1:])
        self.dtype = arrays[0].dtype

    def __getitem__(self, positions: np.ndarray) -> np.ndarray:
        positions = np.asarray(positions, dtype=np.int64)
        which = np.searchsorted(self.starts, positions, side="right") - 1
        out = np.empty((len(positions), *self.shape[1:]), dtype=self.dtype)
        for part in np.unique(which):
            mask = which == part
            out[mask] = self.arrays[part][positions[mask] - self.starts[part]]
        return out
