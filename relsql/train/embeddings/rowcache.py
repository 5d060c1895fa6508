"""Embedding rows by key in memory-mapped arrays: a step reads and writes its batch's rows by
array indexing, whatever the size of the table they belong to.

A `RowCache` holds one embedding table's rows (values `e`, optimizer state `a`) at slots, a
key's slot found by a `KeyIndex` (an open-addressing hash table over 64-bit key codes, probed
for a whole batch at once with numpy). The arrays live in files deleted as soon as they are
mapped: the operating system may page them out under memory pressure, a killed process leaves
nothing behind, and nothing is ever read back from them by another process (the database table
stays the truth; relsql/train/embeddings/embeddings.py writes the changed rows back to it). The files hold
raw numbers only: nothing loaded executes code.
"""

from __future__ import annotations

import mmap
import os
import tempfile
import weakref

import numpy as np
import pyarrow as pa

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)  # Fibonacci hashing: the top bits of code * 2^64/phi spread any codes


class MappedArray:
    """A growable (rows, width) array in a file that is unlinked once created."""

    def __init__(self, directory: str, width: int, dtype: np.dtype):
        self.width, self.dtype = width, np.dtype(dtype)
        fd, path = tempfile.mkstemp(prefix=".relsql-rows-", dir=directory)
        os.unlink(path)  # the mapping keeps the pages; nothing is left behind, however the process ends
        self.fd = fd
        weakref.finalize(self, os.close, fd)
        self.capacity = 0
        self.array = np.zeros((0, width), self.dtype)

    def reserve(self, rows: int) -> None:
        """Room for at least `rows` rows (doubling: amortized O(1) a row); contents kept."""
        if rows <= self.capacity:
            return
        capacity = max(rows, 2 * self.capacity, 1024)
        size = capacity * max(self.width, 1) * self.dtype.itemsize
        os.ftruncate(self.fd, size)  # new pages read as zeros and take no disk until written
        self.array = np.frombuffer(mmap.mmap(self.fd, size), self.dtype).reshape(capacity, max(self.width, 1))[:, :self.width]
        self.capacity = capacity


def number_codes(keys: pa.Array) -> np.ndarray:
    """64-bit codes of numeric keys: integers as themselves, floats by their bits."""
    if pa.types.is_floating(keys.type):
        return (keys.cast(pa.float64()).to_numpy(zero_copy_only=False) + 0.0).view(np.int64)  # -0.0 and 0.0 are one key
    values = keys.to_numpy(zero_copy_only=False)
    return values.view(np.int64) if values.dtype == np.uint64 else values.astype(np.int64, copy=False)


class KeyIndex:
    """Distinct 64-bit codes -> slots 0, 1, 2, ... in order of insertion; a batch's lookup is a
    few vectorized probe rounds (load factor at most 1/2)."""

    def __init__(self, directory: str):
        self.directory = directory
        self.count = 0
        self.codes = MappedArray(directory, 1, np.int64)  # slot -> code
        self.table = MappedArray(directory, 1, np.int64)  # position -> slot + 1 (0: empty)
        self.bits = 0

    def _positions(self, codes: np.ndarray) -> np.ndarray:
        return ((codes.view(np.uint64) * _GOLDEN) >> np.uint64(64 - self.bits)).astype(np.int64)

    def _grow(self, rows: int) -> None:
        self.codes.reserve(rows)
        if 2 * rows <= (1 << self.bits):
            return
        self.bits = max(16, int(2 * rows - 1).bit_length())
        self.table = MappedArray(self.directory, 1, np.int64)
        self.table.reserve(1 << self.bits)
        self._probe(self.codes.array[:self.count, 0].copy(), insert=True, fresh=True)

    def slots(self, codes: np.ndarray, insert: bool) -> np.ndarray:
        """The slot of each distinct code (-1: absent and not `insert`); new codes get new slots
        in order of their first position in `codes`."""
        if insert:
            self._grow(self.count + len(codes))
        if not self.bits:
            return np.full(len(codes), -1, np.int64)
        return self._probe(codes, insert, fresh=False)

    def _probe(self, codes: np.ndarray, insert: bool, fresh: bool) -> np.ndarray:
        """Linear probing for every code at once. `fresh`: re-inserting the codes of slots
        0..n-1 (after growth) in that order."""
        table, stored, mask = self.table.array[:, 0], self.codes.array[:, 0], (1 << self.bits) - 1
        out = np.full(len(codes), -1, np.int64)
        position = self._positions(codes)
        pending = np.arange(len(codes))
        while len(pending):
            at = position[pending]
            held = table[at]
            empty = held == 0
            done = np.zeros(len(pending), bool)
            if not fresh:
                full = np.flatnonzero(~empty)
                match = full[stored[held[full] - 1] == codes[pending[full]]]
                out[pending[match]] = held[match] - 1
                done[match] = True
            free = np.flatnonzero(empty)
            if insert and len(free):
                _, first = np.unique(at[free], return_index=True)  # one claimant per free position this round
                won = free[np.sort(first)]
                slots = pending[won] if fresh else np.arange(self.count, self.count + len(won))
                table[at[won]] = slots + 1
                if not fresh:
                    stored[slots] = codes[pending[won]]
                    self.count += len(won)
                out[pending[won]] = slots
                done[won] = True
            elif len(free):
                done[free] = True  # absent
            pending = pending[~done]
            position[pending] = (position[pending] + 1) & mask  # occupied by another code (or just claimed)
        return out


class RowCache:
    """One embedding table's rows by key: `e` (values) and `a` (optimizer state) at slots, which
    rows changed since the table last had them (`dirty`) and which it holds (`stored`)."""

    def __init__(self, width: int, key_type: pa.DataType, directory: str):
        self.width, self.key_type = width, key_type
        self.strings: dict[str, int] | None = None if pa.types.is_integer(key_type) or pa.types.is_floating(key_type) else {}
        self.names: list[str] = []  # string keys by their code
        self.index = KeyIndex(directory)
        self.rows = MappedArray(directory, 2 * width, np.float64)  # e0.., a0.. per slot
        self.flags = MappedArray(directory, 2, np.bool_)  # dirty, stored
        self.dirty_count = 0

    def _codes(self, keys: pa.Array) -> np.ndarray:
        """Numeric keys' own codes; a string gets the next number on first sight."""
        if self.strings is None:
            return number_codes(keys)
        strings, names = self.strings, self.names
        codes = np.empty(len(keys), np.int64)
        for i, value in enumerate(keys.to_pylist()):
            code = strings.get(value)
            if code is None:
                code = strings[value] = len(names)
                names.append(value)
            codes[i] = code
        return codes

    def assign(self, keys: pa.Array) -> np.ndarray:
        """Every key's slot, keys never seen given one (their rows are for the caller to write)."""
        return self._slots(keys)[0]

    def _slots(self, keys: pa.Array) -> tuple[np.ndarray, np.ndarray]:
        """(slots, new): every key's slot, and the positions of one of each key never seen before
        (which are given slots now)."""
        before = self.index.count
        distinct, first, inverse = np.unique(self._codes(keys), return_index=True, return_inverse=True)
        found = self.index.slots(distinct, insert=True)
        self.rows.reserve(self.index.count)
        self.flags.reserve(self.index.count)
        return found[inverse.reshape(-1)], first[found >= before]

    def load(self, batch: pa.RecordBatch) -> None:
        """Rows of the table (key, e.., a..): they are the rows' values, already stored."""
        slots, _ = self._slots(batch.column(0))
        for i in range(2 * self.width):
            self.rows.array[slots, i] = batch.column(i + 1).to_numpy(zero_copy_only=False)
        self.flags.array[slots, 1] = True

    def read(self, keys: pa.Array, initial) -> tuple[np.ndarray, np.ndarray]:
        """(slots, rows (n, 2 * width)) of distinct `keys`; keys never seen get `initial(keys)`
        values and zero optimizer state (not dirty: the table need not hold an untrained row)."""
        slots, new = self._slots(keys)
        if len(new):
            fresh = np.zeros((len(new), 2 * self.width))
            fresh[:, :self.width] = initial(keys.take(pa.array(new)))
            self.rows.array[slots[new]] = fresh
        return slots, self.rows.array[slots]

    def peek(self, keys: pa.Array, initial) -> tuple[np.ndarray, np.ndarray]:
        """(slots, rows) of `keys` like `read`, without giving keys never seen a slot (slot -1,
        initial rows): evaluating on many keys does not grow the arrays."""
        codes = self._codes(keys)
        slots = self.index.slots(codes, insert=False)
        rows = np.zeros((len(keys), 2 * self.width))
        found = slots >= 0
        rows[found] = self.rows.array[slots[found]]
        absent = np.flatnonzero(~found)
        if len(absent):
            rows[absent, :self.width] = initial(keys.take(pa.array(absent)))
        return slots, rows

    def write(self, slots: np.ndarray, rows: np.ndarray) -> None:
        self.rows.array[slots] = rows
        flags = self.flags.array
        self.dirty_count += int(np.count_nonzero(~flags[slots, 0]))
        flags[slots, 0] = True

    def changed(self) -> tuple[np.ndarray, pa.Table]:
        """(slots, rows key, e.., a..) of the rows changed since `clean`."""
        slots = self.changed_slots()
        return slots, self.table(slots)

    def changed_slots(self) -> np.ndarray:
        return np.flatnonzero(self.flags.array[:self.index.count, 0])

    def stream(self, slots: np.ndarray, chunk: int = 1 << 17) -> pa.RecordBatchReader:
        """The rows at `slots` (key, e.., a..), `chunk` at a time: a write-back of millions of
        rows never holds a copy of them all."""
        schema = self.table(slots[:0]).schema
        batches = (self.table(slots[i:i + chunk]).to_batches()[0] for i in range(0, len(slots), chunk))
        return pa.RecordBatchReader.from_batches(schema, batches)

    def table(self, slots: np.ndarray) -> pa.Table:
        codes = self.index.codes.array[slots, 0]
        if self.strings is not None:
            keys = pa.array([self.names[c] for c in codes], self.key_type)
        elif pa.types.is_floating(self.key_type):
            keys = pa.array(codes.view(np.float64)).cast(self.key_type)
        elif self.key_type == pa.uint64():
            keys = pa.array(codes.view(np.uint64))
        else:
            keys = pa.array(codes).cast(self.key_type)
        values = self.rows.array[slots]
        columns = [f"{p}{i}" for p in ("e", "a") for i in range(self.width)]
        return pa.table({"key": keys, **{c: values[:, i] for i, c in enumerate(columns)}})

    def clean(self, slots: np.ndarray) -> None:
        """The table now holds the rows at `slots` as they are here."""
        self.flags.array[slots, 0] = False
        self.flags.array[slots, 1] = True
        self.dirty_count = 0

    def stored(self, slots: np.ndarray) -> np.ndarray:
        """Whether the table holds a row (maybe older) of each slot's key."""
        return self.flags.array[slots, 1].copy()
