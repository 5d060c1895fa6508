"""The grounding store: every grounding a mini-batch can need, computed once by the database.

Per batch, grounding in the database (relsql/ground/demand.py) makes DuckDB scan the tables it
semi-joins, so a batch costs in proportion to the database. The store grounds each relation the
output depends on once, in bulk, and keeps the result as plain arrays in a folder of its own:

    .relsql-store                  the mark relsql writes when it makes a folder (new or empty) a
                                   store; relsql keeps a store in no other folder and writes or
                                   deletes nothing in it but the mark, the manifest and build folders
    manifest.json                  format, fingerprint of the data, the build folder, per relation its
                                   rows and per rule its groundings, value columns (dtype, width) and
                                   files; per file its bytes, SHA-256, inode and change time; a seal
    build-<hex>/                   one build's files (a rebuild makes a new one, then removes the old):
      <relation>.<rule>.offsets    int64 (rows + 1,): CSR offsets, the groundings of row h are
                                   [offsets[h], offsets[h + 1])
      <part>.r<j>                  (groundings,): row ids into the j-th referenced relation
      <part>.c<k>                  (groundings, width) encoded values, or (groundings,) codes
                                   (r<j> and c<k> in the rule's "dtypes": row ids, codes and text
                                   tokens in the smallest of int16/int32/int64 that holds the
                                   relation's rows, the dictionary's codes or the bucket count;
                                   values float32 for a float32 net, else float64)
      <part>.heads                 int64 (heads, 2): (head row, its groundings), what the offsets
                                   are written from
      <weight>.keys.arrow          Arrow IPC: the raw keys of a database-stored embedding, by code

A rule's groundings are one part (`<part>` = `<relation>.<rule>`) when this process streams them
from DuckDB, or several (`<relation>.<rule>.p<i>`, in head order) when Spark's executors write
one per partition (relsql/ground/parts.py, torch-free); the driver then reads only their heads'
counts. Raw little-endian arrays and JSON, so another engine can write a store and several
processes can read one. Files are created exclusively (never through a link), a failed build's
folder is removed (a full disk is freed), and builds of one folder take turns (a lock on the mark).

Contents are checked, not trusted: opening a kept store checks the manifest's every field (types,
names, counts against the template and the data, a seal over the rest), each file's size, and each
file's checksum: a file whose inode, size and change time are those recorded when relsql wrote it
is unchanged since (the kernel moves the change time on any write, truncation, rename or chmod,
and only root can set it back), any other file is hashed in full. Per batch, the offsets, row ids
and codes it reads are range-checked. A batch's demand closure then runs over the CSR offsets in
numpy (like a neighbour sampler): it reads the offsets of its rows, the row ids and values of their
groundings, and nothing else, through memory maps whose pages are handed back after every batch
(resident memory stays bounded by the batch). Fan-out sampling happens there too, seeded by the
grounding's position, so a head's sample does not depend on the batch it is in.

What the checks do not detect (docs/grounding-store.md says the same): a forgery by someone who
can write the folder and recomputes the files' SHA-256 and the seal. The seal is a checksum, not
a signature (relsql holds no secret), so any change that stays in range passes: row ids of an
`r<j>` permuted or swapped for other valid rows, values in a `c<k>` changed, groundings moved
between heads with matching offsets. The model then reads other rows and predicts differently,
silently. Only grounding again from the database would find that, the cost the store avoids; a
store's folder is trusted like the database itself (delete its manifest.json to rebuild one from
elsewhere).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import mmap
import os
import re
import secrets
import shutil
import stat
import tempfile
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import sqlglot.expressions as exp
import torch

from relsql import errors
from relsql import sql as q
from relsql.db import TEMP_PREFIX
from relsql.errors import RelsqlError
from relsql.ground.demand import BatchGrounder, BatchGrounding, PreparedRule, grounding_error
from relsql.ground.execute import RelationGrounding, RuleGrounding, _progress, interruptible
from relsql.ground.narrow import FLOATS, INTEGERS, NarrowWriter, smallest_integer
from relsql.ground.parts import HashedFile, io_error, part_files
from relsql.template import ir
from relsql.textfile import read_text

log = logging.getLogger("relsql")
# 4: each file's numbers in their own type; 3: a marked folder, a build folder per build, checksums; 2: parts
FORMAT = "relsql-store-4"
MANIFEST = "manifest.json"
MARK = ".relsql-store"
_MARK_KIND = "relsql grounding store"
_BUILD = re.compile(r"build-[0-9a-f]{16}")
_BUILD_MARK = ".relsql-build"  # in each build folder: what a rebuild may remove
_NAME = re.compile(r"\w+(\.\w+)*", re.ASCII)  # a file name in a build folder: no separator, no "..", not absolute
_READ = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
CHUNK = 1 << 20  # rows per Arrow batch read from the database while writing the store
RESIDENT_BUDGET = 128 << 20  # bytes of a large store's pages a process keeps mapped in before handing them back
MAPPED_WHOLE = 512 << 20  # a store of at most this many bytes stays mapped whole, as a loader's graph stays in memory
WINDOW = 32 << 20  # bytes of a store file one read spans before the resident budget is checked again
FAULT_AROUND = 64 << 10  # bytes a page fault on a file mapping maps in (Linux's fault_around_bytes default)
TRIM_AFTER = 16 << 20  # bytes of groundings a batch reads, past which the C heap's free memory goes back to the system


@dataclass
class StoreMeta:
    """What reading a store needs besides its files: the grounder's template, order, encodings
    and fan-out, without its database (so another process can read the store: a training rank)."""

    template: ir.Template
    output: str
    order: list[str]
    fanout: dict[str, int] | int | None
    seed: int
    prepared: dict[str, list[PreparedRule]]
    stored: dict
    dictionary_tables: dict[str, pa.Table]
    feature_stats: dict
    sizes: dict[str, int]


@dataclass
class _Rule:
    """One rule's part of the store, opened as memory maps."""

    prepared: PreparedRule
    size: int
    offsets: np.ndarray
    refs: list[np.ndarray]
    columns: dict[int, np.ndarray]  # values (G, width) or codes (G,), in the types the manifest records
    coded: dict[int, str]  # ir.coded_columns of the rule, walked once (per batch it cost 0.1 ms at TPC-H)


def resident_budget(store_bytes: int) -> int:
    """Bytes of store pages kept mapped between batches. A store of at most MAPPED_WHOLE bytes
    stays mapped whole (batches then read it without page faults, as PyG's loader reads a graph
    held in memory: TPC-H sf 1's 264 MiB store, 0.93x PyG's next(loader) instead of 1.11x); a
    larger one keeps RESIDENT_BUDGET bytes, so that memory follows the batch, not the database
    (at sf 10, a 512 MiB budget took the peak RSS from 1.2 to 1.5 times sf 1's)."""
    return store_bytes + RESIDENT_BUDGET if store_bytes <= MAPPED_WHOLE else RESIDENT_BUDGET


def fingerprint(grounder: BatchGrounder) -> str:
    """What the store's contents follow from: the template, the encodings, and every row of every
    table the template reads (count and an order-independent sum of row hashes, in the database)."""
    db = grounder.db
    digest = hashlib.sha256(FORMAT.encode())
    digest.update(grounder.template.source.encode())
    digest.update(grounder.output.encode())
    digest.update(json.dumps(grounder.feature_stats, sort_keys=True, default=str).encode())
    for weight in sorted(grounder.dictionary_tables):
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, grounder.dictionary_tables[weight].schema) as writer:
            writer.write_table(grounder.dictionary_tables[weight])
        digest.update(weight.encode() + sink.getvalue().to_pybytes())
    tables: dict[str, exp.Table] = {}
    for rules in grounder.prepared.values():
        for prepared in rules:
            for table in prepared.source.find_all(exp.Table):
                if table.name and not table.name.startswith(TEMP_PREFIX):
                    plain = exp.Table(this=table.this.copy(), db=table.args.get("db"), catalog=table.args.get("catalog"))
                    tables[plain.sql("duckdb")] = plain
    for name in sorted(tables):
        try:
            digest.update(f"{name}:{db.row_summary(tables[name])}".encode())
        except duckdb.Error:  # a table function or view the database cannot hash as rows: its name only
            digest.update(name.encode())
    return digest.hexdigest()


class _Damaged(Exception):
    """What is wrong with a store's manifest or files (becomes a RelsqlError naming the folder)."""


class GroundingStore:
    """Bulk groundings on disk, read per batch in O(batch). Use `GroundingStore.open`."""

    def __init__(self, grounder: BatchGrounder, folder: Path, manifest: dict, owned: bool,
                 verify: bool = False, created: bool = False):
        self.grounder, self.folder, self.manifest = grounder, folder, manifest
        self.template, self.output, self.order = grounder.template, grounder.output, grounder.order
        self.fanout, self.seed = grounder.fanout, grounder.seed
        self.created = created  # relsql made the folder (the damaged-store message may advise deleting it)
        self._maps: list[mmap.mmap] = []
        self.resident_budget = RESIDENT_BUDGET  # bytes of the store's pages kept mapped between batches (set below)
        self._resident = _resident_file_bytes() or 0  # file-backed resident bytes after the last release
        self.rules: dict[str, list[_Rule]] = {}
        if owned:  # a temporary store goes with the model that made it
            self._cleanup = weakref.finalize(self, shutil.rmtree, str(folder), True)
        try:
            self.data = folder / _check_manifest(manifest)
            _check_against(manifest, grounder)
            if verify:
                _verify_files(self.data, manifest["files"])
            for name in self.order:
                described = manifest["relations"][name]["rules"]
                self.rules[name] = [self._open_rule(prepared, described[str(prepared.index)])
                                    for prepared in grounder.prepared[name]]
            self.embedding_keys = {w: self._keys(f"{_file_name(w)}.keys.arrow") for w in grounder.stored}
            self.resident_budget = resident_budget(sum(v["bytes"] for v in self.sizes.values()))
        except _Damaged as err:
            raise self._damaged(str(err)) from None

    def _damaged(self, reason: str) -> RelsqlError:
        return _damaged(self.folder, reason, self.created)

    # -- opening -------------------------------------------------------------------------------
    def detach(self) -> tuple[str, dict, StoreMeta]:
        """(folder, manifest, meta): enough to open this store in another process with `attach`."""
        g = self.grounder
        meta = StoreMeta(g.template, g.output, list(g.order), g.fanout, g.seed, g.prepared, dict(g.stored),
                         dict(g.dictionary_tables), dict(g.feature_stats), dict(g.sizes))
        return str(self.folder), self.manifest, meta

    @classmethod
    def attach(cls, folder: str, manifest: dict, meta: StoreMeta) -> GroundingStore:
        """A store opened read-only by a process that has no database (its owner removes it)."""
        return cls(meta, Path(folder), manifest, owned=False, verify=True)

    @classmethod
    def open(cls, grounder: BatchGrounder, folder: str | Path | None = None, progress: bool | None = None,
             dtype: torch.dtype | None = None) -> GroundingStore:
        """The store of `grounder`'s template and data in `folder` (a temporary one when None):
        reused when its fingerprint matches the data and its contents check, else (re)built.
        Never used stale; a folder that is neither empty (or new) nor marked as a store is refused.
        `dtype`: the float type of the net that reads it; torch.float32 keeps values as float32
        (half the bytes, and what such a net rounds them to anyway); None or float64 keeps float64.
        Batches always hand out float64 values and int64 ids and codes, whatever the files hold."""
        floats = _floats(dtype)
        if folder is None:  # nothing to compare with: no fingerprint (it reads every table once more)
            path = Path(tempfile.mkdtemp(prefix="relsql-store-"))
            try:
                return cls(grounder, path, _build(grounder, path, "", progress, floats), owned=True)
            except BaseException:
                shutil.rmtree(path, ignore_errors=True)
                raise
        path = Path(folder)
        mark = fingerprint(grounder) + ("" if floats == "float64" else f"/{floats}")
        if _follower():  # a torchrun rank other than 0: rank 0 writes the shared store, this one waits for it
            return cls(grounder, path, _wait_for(path, mark), owned=False, verify=True)
        created = _claim(path)
        manifest = _read_manifest(path, created)
        if not _current(manifest, mark):
            with _locked(path):  # one build at a time; another process may have built it meanwhile
                manifest = _read_manifest(path, created)
                if not _current(manifest, mark):
                    if manifest is not None:
                        log.info("grounding store %s was built from other data or another template; rebuilding", path)
                    _clear(path)
                    manifest = _build(grounder, path, mark, progress, floats)
        return cls(grounder, path, manifest, owned=False, verify=True, created=created)

    def _map(self, file: str, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
        """A store file as a read-only array of `shape`: a regular file (not a link) of exactly
        the size the manifest implies."""
        if not shape[0]:
            return np.zeros(shape, dtype=dtype)
        path, expected = self.data / file, int(np.prod(shape)) * np.dtype(dtype).itemsize
        try:
            fd = os.open(path, _READ)
        except OSError as err:
            raise _Damaged(f"{file}: {err.strerror or err}") from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise _Damaged(f"{file} is not a regular file")
            if info.st_size != expected:
                raise _Damaged(f"{file} has {info.st_size:,} bytes where the manifest implies {expected:,}")
            mapped = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
        except OSError as err:
            raise _Damaged(f"{file}: {err.strerror or err}") from None
        finally:
            os.close(fd)
        mapped.madvise(mmap.MADV_RANDOM)  # a batch reads scattered ranges: no read-ahead around them
        self._maps.append(mapped)
        return np.frombuffer(mapped, dtype=dtype).reshape(shape)

    def _open_rule(self, prepared: PreparedRule, described: dict) -> _Rule:
        size, rows, parts = described["groundings"], described["rows"], described["parts"]
        offsets = self._map(f"{described['stem']}.offsets", np.int64, (rows + 1,))
        if int(offsets[0]) != 0 or int(offsets[-1]) != size:
            raise _Damaged(f"{described['stem']}.offsets does not run from 0 to the rule's {size:,} groundings")

        def column(suffix: str, dtype, width: int | None) -> np.ndarray | _Parts:
            arrays = [self._map(f"{part['stem']}.{suffix}", dtype, (part["groundings"],) if width is None
                                else (part["groundings"], width)) for part in parts]
            if len(arrays) == 1:
                return arrays[0]
            return _Parts(arrays) if arrays else np.zeros((0,) if width is None else (0, width), dtype)

        dtypes = described["dtypes"]
        refs = [column(f"r{j}", np.dtype(dtypes[f"r{j}"]), None) for j in range(len(prepared.rule.refs))]
        columns = {int(k): column(f"c{k}", np.dtype(dtypes[f"c{k}"]), None if kind == "code" else width)
                   for k, (kind, width) in described["columns"].items()}
        return _Rule(prepared, size, offsets, refs, columns, ir.coded_columns(prepared.rule))

    def _keys(self, file: str) -> pa.Array:
        """A database-stored embedding's raw keys, by code."""
        path = self.data / file
        try:
            if not stat.S_ISREG(os.lstat(path).st_mode):
                raise _Damaged(f"{file} is not a regular file")
            return pa.ipc.open_file(pa.memory_map(str(path))).read_all().column(0)
        except (OSError, pa.ArrowException, IndexError) as err:
            raise _Damaged(f"{file}: {str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__}") from None

    def release(self, force: bool = False) -> None:
        """Hand the pages read so far back to the page cache once they hold more than
        RESIDENT_BUDGET bytes (resident memory stays bounded; dropping them after every batch
        made small batches re-fault their pages, doubling a 512-row read at TPC-H sf 1)."""
        resident = _resident_file_bytes()
        if not force and resident is not None and resident - self._resident < self.resident_budget:
            return
        for mapped in self._maps:
            mapped.madvise(mmap.MADV_DONTNEED)
        self._resident = _resident_file_bytes() or 0

    @property
    def sizes(self) -> dict[str, dict]:
        """Per relation: rows, groundings and bytes on disk (for explain)."""
        result = {}
        for name in self.order:
            described = self.manifest["relations"][name]
            result[name] = {"rows": described["rows"], "groundings": sum(r["groundings"] for r in described["rules"].values()),
                            "bytes": described["bytes"]}
        return result

    def describe(self, batch_size: int, batches: int = 3, seed: int = 0) -> str:
        """The store's sizes per relation and the work of a batch of `batch_size` output rows
        (rows and groundings read, seconds), measured on `batches` random batches."""
        rng = np.random.default_rng(seed)
        total = self.grounder.sizes[self.output]
        read: dict[str, list[tuple[int, int]]] = {name: [] for name in self.order}
        seconds = []
        for _ in range(batches):
            rows = rng.choice(total, min(batch_size, total), replace=False)
            started = time.perf_counter()
            batch = self.ground(rows)
            seconds.append(time.perf_counter() - started)
            for name in self.order:
                relation = batch.relations.get(name)
                read[name].append((0, 0) if relation is None else (relation.size, sum(r.size for r in relation.rules)))
        lines = [f"-- grounding store {self.folder}: {sum(v['bytes'] for v in self.sizes.values()) / 2**20:,.1f} MiB",
                 f"  {'relation':<24} {'rows':>12} {'groundings':>12} {'MiB':>9} | {'batch rows':>11} {'batch groundings':>17}",
                 f"  {'':<60} | (per batch of {batch_size:,}, mean)"]
        for name, size in self.sizes.items():
            rows = np.mean([r for r, _ in read[name]])
            groundings = np.mean([g for _, g in read[name]])
            lines.append(f"  {name:<24} {size['rows']:>12,} {size['groundings']:>12,} {size['bytes'] / 2**20:>9,.1f} |"
                         f" {rows:>11,.0f} {groundings:>17,.0f}")
        lines.append(f"  a batch reads its groundings from the store in {np.median(seconds) * 1000:,.1f} ms "
                     f"(median of {batches}); {max(1, -(-total // batch_size)):,} batches per pass over {total:,} rows")
        return "\n".join(lines)

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
            wanted, inverse = _unique_inverse(np.concatenate([ids for ids, _, _ in parts]))
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

    def _pick(self, name: str, rule: _Rule, wanted: np.ndarray, sample: int) -> _Picked:
        """The groundings of heads `wanted` (ascending global ids), in store order: at most
        `fanout` per head of a grouped rule, a seeded choice by position."""
        if not rule.size:
            empty = np.zeros(0, np.int64)
            return _Picked(rule, np.zeros(len(wanted), np.int64), empty, [empty for _ in rule.refs])
        starts = self._take(rule.offsets, wanted)
        counts = self._take(rule.offsets, wanted + 1) - starts
        if len(counts) and (counts.min() < 0 or starts.min() < 0 or int((starts + counts).max()) > rule.size):
            raise self._damaged(f"the offsets of {name}'s rule {rule.prepared.index} are out of order or past its groundings")
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
                raise self._damaged(f"{name}'s rule {rule.prepared.index} has row ids outside `{ref}`'s "
                                    f"{self.grounder.sizes[ref]:,} rows")
        return _Picked(rule, counts, positions, refs)

    def _take(self, array: np.ndarray | _Parts, positions: np.ndarray) -> np.ndarray:
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

    def _codes(self, rule: _Rule, k: int, positions: np.ndarray) -> np.ndarray:
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
            raise self._damaged(f"codes of column {k} of rule {rule.prepared.index} are outside `{weight}`'s {limit:,} values")
        return taken

    def _localize(self, demand: dict[str, np.ndarray], picked: dict[str, list[_Picked]]) -> BatchGrounding:
        """Renumber to the batch's own rows (sorted global ids keep the store's order)."""
        codes: dict[str, list[np.ndarray]] = {}
        for parts in picked.values():
            for chosen in parts:
                for k, weight in chosen.rule.prepared.stored.items():
                    codes.setdefault(weight, []).append(self._codes(chosen.rule, k, chosen.positions))
        used = {w: _unique(np.concatenate(arrays)) for w, arrays in codes.items()}
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

    rule: _Rule
    counts: np.ndarray
    positions: np.ndarray
    refs: list[np.ndarray]
    local: list[np.ndarray | None] = field(init=False)  # refs as the batch's row numbers (set by ground)

    def __post_init__(self) -> None:
        self.local = [None] * len(self.refs)


def _follower() -> bool:
    """This process is a rank other than 0 of a torchrun group (relsql's own ranks attach instead)."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1 and os.environ.get("RANK", "0") != "0" and "RELSQL_RANK" not in os.environ


def _wait_for(folder: Path, mark: str, timeout: float = 3600.0) -> dict:
    """The manifest rank 0 writes for this data (`mark`), once it is there."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        manifest = _read_manifest(folder, False) if (folder / MARK).is_file() else None
        if _current(manifest, mark):
            return manifest
        time.sleep(0.5)
    raise RelsqlError(f"grounding store {folder}: rank 0 did not write it within {timeout:.0f}s; a kept store shared by "
                      "torchrun's ranks must be on storage every rank can read")


_STATM: list = [None, None]  # (process id, open descriptor of its /proc/<pid>/statm)


def _resident_file_bytes() -> int | None:
    """This process's resident file-backed memory (Linux: /proc/<pid>/statm), else None. Read
    several times per batch, so through a descriptor kept open per process (a pread costs 3 µs
    where open + read costs 23 µs; a forked child opens its own)."""
    pid = os.getpid()
    try:
        if _STATM[0] != pid:
            _STATM[:] = [pid, os.open(f"/proc/{pid}/statm", os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))]
        return int(os.pread(_STATM[1], 256, 0).split()[2]) * mmap.PAGESIZE
    except (OSError, ValueError, IndexError):
        return None


_LIBC: list = []  # [the C library's malloc_trim, or None where there is none (not glibc)]


def trim_heap() -> None:
    """Hand the C heap's free memory back to the system. A large batch's arrays (numpy's and
    torch's, in this thread and the trainer's) are freed into glibc's heaps, which keep freed
    chunks of up to 32 MiB and fragment: over an epoch anonymous memory grew with the number of
    batches, i.e. with the database (TPC-H sf 10, batches of 16,384 customers: +0.9 GB in one
    epoch). Costs 10-30 ms, so only after batches past TRIM_AFTER."""
    if not _LIBC:
        import ctypes
        import ctypes.util

        try:  # glibc's own name first: find_library runs ldconfig in a subprocess
            _LIBC.append(ctypes.CDLL("libc.so.6").malloc_trim)
        except (OSError, AttributeError):
            try:
                _LIBC.append(ctypes.CDLL(ctypes.util.find_library("c")).malloc_trim)
            except (OSError, AttributeError, TypeError):
                _LIBC.append(None)
    if _LIBC[0] is not None:
        _LIBC[0](0)


def _unique(values: np.ndarray) -> np.ndarray:
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


def _unique_inverse(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
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


def _file_name(name: str) -> str:
    """A relation's or weight's name as a file name: letters, digits, underscores, and a short hash
    so that names differing only in other characters (or case) never share a file."""
    return f"{ir.table_suffix(name)}_{hashlib.sha256(name.encode()).hexdigest()[:8]}"


# -- the folder ------------------------------------------------------------------------------------
def _claim(folder: Path) -> bool:
    """Make `folder` a store (it is new or empty: relsql writes its mark there) or confirm it is one
    (it has the mark); refuse any other folder. True when relsql made the folder."""
    created = False
    if not os.path.lexists(folder):
        try:
            folder.mkdir(parents=True)
            created = True
        except FileExistsError:
            pass
        except OSError as err:
            raise io_error(err, folder, "create the folder") from None
    if not folder.is_dir():
        raise RelsqlError(f"store {str(folder)!r} is a file; give a folder for the grounding store (made if missing)")
    marked = _read_mark(folder)
    if marked is not None:
        return marked
    try:
        entries = sorted(os.listdir(folder))
    except OSError as err:
        raise io_error(err, folder, "list the folder") from None
    if entries:
        shown = ", ".join(entries[:3]) + (f" and {len(entries) - 3:,} more" if len(entries) > 3 else "")
        raise RelsqlError(f"store folder {folder} is not empty ({shown}) and is not a grounding store relsql made; "
                          "relsql keeps a store only in a folder of its own: pass store= an empty or new folder")
    try:
        fd = os.open(folder / MARK, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o666)
    except FileExistsError:  # another process claimed it at the same time
        return bool(_read_mark(folder))
    except OSError as err:
        raise io_error(err, folder / MARK, "create") from None
    try:
        os.write(fd, json.dumps({"kind": _MARK_KIND, "created": created}).encode())
    except OSError as err:
        raise io_error(err, folder / MARK, "write") from None
    finally:
        os.close(fd)
    return created


def _read_mark(folder: Path) -> bool | None:
    """None without a mark; else whether relsql made the folder. A mark that is not relsql's is refused."""
    path = folder / MARK
    for _ in range(50):
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            return None
        except OSError as err:
            raise io_error(err, path, "read") from None
        if not stat.S_ISREG(info.st_mode):
            break
        text = read_text(path, "grounding store mark", limit=4096)
        if text:
            try:
                mark = json.loads(text)
            except (ValueError, RecursionError):
                break
            if isinstance(mark, dict) and mark.get("kind") == _MARK_KIND and isinstance(mark.get("created"), bool):
                return mark["created"]
            break
        time.sleep(0.01)  # an empty mark: another process is writing it
    raise RelsqlError(f"store folder {folder} has a {MARK} that is not the mark relsql writes; relsql keeps a store "
                      "only in a folder of its own: pass store= an empty or new folder")


@contextlib.contextmanager
def _locked(folder: Path):
    """Builds of one store take turns: an exclusive lock on its mark, released when the process ends."""
    try:
        import fcntl
    except ImportError:  # no advisory locks here: concurrent builds write separate build folders
        yield
        return
    try:
        fd = os.open(folder / MARK, os.O_RDWR | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as err:
        raise io_error(err, folder / MARK, "lock") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _clear(folder: Path) -> None:
    """Remove the store's old manifest and every build folder (under the lock: none is being written)."""
    try:
        if os.path.lexists(folder / MANIFEST):
            os.unlink(folder / MANIFEST)
        for entry in os.scandir(folder):
            if (_BUILD.fullmatch(entry.name) and entry.is_dir(follow_symlinks=False)
                    and os.path.isfile(os.path.join(entry.path, _BUILD_MARK))):
                shutil.rmtree(entry.path)
    except OSError as err:
        raise io_error(err, err.filename or folder, "remove the old store's") from None


def _damaged(folder: Path, reason: str, created: bool) -> RelsqlError:
    fix = f"delete {folder / MANIFEST} and relsql rebuilds the store"
    if created:
        fix += f" (or delete the folder {folder}: relsql made it)"
    return RelsqlError(f"grounding store {folder} is damaged ({reason}); {fix}")


# -- the manifest ----------------------------------------------------------------------------------
def _current(manifest: dict | None, mark: str) -> bool:
    return manifest is not None and manifest.get("format") == FORMAT and manifest.get("fingerprint") == mark


def _read_manifest(folder: Path, created: bool) -> dict | None:
    """The store's manifest (None when there is none); one of another format (to be rebuilt) as it
    is; one of this format checked field by field, or a RelsqlError."""
    path = folder / MANIFEST
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as err:
        raise io_error(err, path, "read") from None
    try:
        if not stat.S_ISREG(info.st_mode):
            raise _Damaged(f"{MANIFEST} is not a regular file")
        try:
            manifest = json.loads(read_text(path, "grounding store manifest"))
        except RelsqlError as err:
            raise _Damaged(f"{MANIFEST} cannot be read: {err}") from None
        except (ValueError, RecursionError) as err:
            raise _Damaged(f"{MANIFEST} cannot be read: not JSON ({str(err)[:80]})") from None
        if not isinstance(manifest, dict):
            raise _Damaged(f"{MANIFEST} is not a JSON object")
        if manifest.get("format") == FORMAT:
            _check_manifest(manifest)
        return manifest
    except _Damaged as err:
        raise _damaged(folder, str(err), created) from None


def _seal(manifest: dict) -> str:
    """SHA-256 of the manifest without its seal: an edited field is found, whatever its place."""
    rest = {k: v for k, v in manifest.items() if k != "seal"}
    return hashlib.sha256(json.dumps(rest, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _need(ok: bool, what: str) -> None:
    if not ok:
        raise _Damaged(what)


def _count(value: object, what: str) -> int:
    _need(type(value) is int and value >= 0, f"{what} is not a count")
    return value


def _mapping(value: object, what: str) -> dict:
    _need(isinstance(value, dict), f"{what} is not a JSON object")
    return value


def _check_manifest(manifest: dict) -> str:
    """Every field has its type and form (names are plain file names), and the seal matches; the
    build folder's name."""
    _need(manifest.get("format") == FORMAT, "format: not this relsql's")
    for key in ("fingerprint", "output", "build", "seal"):
        _need(isinstance(manifest.get(key), str), f"{key} is not a string")
    _need(bool(_BUILD.fullmatch(manifest["build"])), "build is not a build folder's name")
    for name, relation in _mapping(manifest.get("relations"), "relations").items():
        relation = _mapping(relation, f"relation {name}")
        _count(relation.get("rows"), f"{name}: rows")
        _count(relation.get("bytes"), f"{name}: bytes")
        for index, rule in _mapping(relation.get("rules"), f"{name}: rules").items():
            _check_rule(_mapping(rule, f"{name}: rule {index}"), f"{name}: rule {index}")
    for file, record in _mapping(manifest.get("files"), "files").items():
        _need(bool(_NAME.fullmatch(file)), f"files: {file!r} is not a plain file name")
        record = _mapping(record, f"files: {file}")
        for key in ("bytes", "inode", "ctime_ns"):
            _count(record.get(key), f"files: {file}: {key}")
        _need(isinstance(record.get("sha256"), str) and bool(re.fullmatch(r"[0-9a-f]{64}", record["sha256"])),
              f"files: {file}: sha256 is not a SHA-256")
    _need(manifest["seal"] == _seal(manifest), "its seal does not match its contents: it was edited")
    return manifest["build"]


def _check_rule(rule: dict, what: str) -> None:
    _need(isinstance(rule.get("stem"), str) and bool(_NAME.fullmatch(rule["stem"])), f"{what}: stem is not a plain file name")
    for key in ("rows", "groundings", "bytes"):
        _count(rule.get(key), f"{what}: {key}")
    for k, kind in _mapping(rule.get("columns"), f"{what}: columns").items():
        _need(k.isdigit() and isinstance(kind, list) and len(kind) == 2 and kind[0] in ("code", "value"),
              f"{what}: column {k} is not [kind, width]")
        _count(kind[1], f"{what}: column {k}'s width")
    dtypes = _mapping(rule.get("dtypes"), f"{what}: dtypes")
    for file, dtype in dtypes.items():
        _need(bool(re.fullmatch(r"[rc]\d+", file)) and dtype in (*INTEGERS, *FLOATS), f"{what}: {file} has no known dtype")
    parts = rule.get("parts")
    _need(isinstance(parts, list), f"{what}: parts is not a list")
    for part in parts:
        part = _mapping(part, f"{what}: a part")
        _need(isinstance(part.get("stem"), str) and bool(_NAME.fullmatch(part["stem"])),
              f"{what}: a part's stem is not a plain file name")
        _count(part.get("groundings"), f"{what}: a part's groundings")


def _check_against(manifest: dict, grounder: BatchGrounder | StoreMeta) -> None:
    """The manifest describes this template's relations, rules and columns, the data's row counts,
    and exactly the files they need."""
    _need(manifest["output"] == grounder.output, f"its output is {manifest['output']!r}, not {grounder.output!r}")
    files: set[str] = {f"{_file_name(w)}.keys.arrow" for w in grounder.stored}
    for name in grounder.order:
        relation = manifest["relations"].get(name)
        _need(relation is not None, f"relation {name} is missing")
        _need(relation["rows"] == grounder.sizes[name],
              f"{name}: {relation['rows']:,} rows, the data has {grounder.sizes[name]:,}")
        _need(set(relation["rules"]) == {str(p.index) for p in grounder.prepared[name]}, f"{name}: other rules")
        for prepared in grounder.prepared[name]:
            files.update(_check_rule_against(relation["rules"][str(prepared.index)], prepared, name, relation["rows"]))
    _need(set(manifest["files"]) == files, "its files are not the ones its relations need")


def _check_rule_against(rule: dict, prepared: PreparedRule, name: str, rows: int) -> list[str]:
    """One rule's description agrees with the template; the files it needs."""
    what, stem = f"{name}: rule {prepared.index}", f"{_file_name(name)}.{prepared.index}"
    _need(rule["stem"] == stem and rule["rows"] == rows, f"{what}: another rule's stem or rows")
    coded = set(ir.coded_columns(prepared.rule))
    _need(set(rule["columns"]) == {str(k) for k in range(prepared.rule.n_columns)}, f"{what}: other columns")
    for k, (kind, _width) in rule["columns"].items():
        _need((kind == "code") == (int(k) in coded), f"{what}: column {k} is not {'codes' if int(k) in coded else 'values'}")
    dtypes = rule["dtypes"]
    _need(set(dtypes) == {f"r{j}" for j in range(len(prepared.rule.refs))} | {f"c{k}" for k in range(prepared.rule.n_columns)},
          f"{what}: dtypes of other files")
    texts = {e.column for e in ir.walk(prepared.rule.expr) if isinstance(e, ir.Text)}
    for file, dtype in dtypes.items():
        whole = file[0] == "r" or int(file[1:]) in coded or int(file[1:]) in texts  # ids, codes and tokens are integers
        _need((dtype in INTEGERS) == whole, f"{what}: {file} kept as {dtype}")
    stems = [part["stem"] for part in rule["parts"]]
    _need(len(set(stems)) == len(stems) and all(s == stem or re.fullmatch(re.escape(stem) + r"\.p\d+", s) for s in stems),
          f"{what}: parts of another rule")
    _need(all(part["groundings"] > 0 for part in rule["parts"]), f"{what}: an empty part")
    _need(sum(part["groundings"] for part in rule["parts"]) == rule["groundings"], f"{what}: parts do not add up")
    return [f"{stem}.offsets", *[f for s in stems for f in part_files(s, len(prepared.rule.refs), prepared.rule.n_columns)]]


def _verify_files(data: Path, files: dict) -> None:
    """Each file is the one relsql wrote: unchanged since (same inode, size and change time), or
    of the recorded SHA-256 (hashed in full: a copied store, or one changed behind relsql's back)."""
    for name, record in files.items():
        path = data / name
        try:
            info = os.lstat(path)
        except OSError as err:
            raise _Damaged(f"{name}: {err.strerror or err}") from None
        _need(stat.S_ISREG(info.st_mode), f"{name} is not a regular file")
        _need(info.st_size == record["bytes"], f"{name} has {info.st_size:,} bytes, not the {record['bytes']:,} written")
        if (info.st_ino, info.st_ctime_ns) != (record["inode"], record["ctime_ns"]):
            _need(_hash_file(path) == record["sha256"], f"{name} is not the file relsql wrote (its checksum differs)")


def _hash_file(path: Path) -> str:
    """SHA-256 of a file (read without following a link)."""
    digest = hashlib.sha256()
    try:
        fd = os.open(path, _READ)
        try:
            while chunk := os.read(fd, 1 << 22):
                digest.update(chunk)
        finally:
            os.close(fd)
    except OSError as err:
        raise _Damaged(f"{path.name}: {err.strerror or err}") from None
    return digest.hexdigest()


# -- writing ---------------------------------------------------------------------------------------
def _build(grounder: BatchGrounder, folder: Path, mark: str, progress: bool | None, floats: str = "float64") -> dict:
    """Ground every relation in bulk into a new build folder of `folder`; the manifest is written
    last and moved into place atomically, so a store is either complete or rebuilt. On any failure
    the build folder goes (a full disk is freed) and an OS error becomes a RelsqlError."""
    build = _new_build(folder)
    try:
        with interruptible(grounder.db, "grounding store build"):  # Ctrl-C stops DuckDB's query at once
            manifest = _write_store(grounder, build, mark, progress, floats)
        manifest["seal"] = _seal(manifest)
        staged = HashedFile(build / MANIFEST)
        staged.write(json.dumps(manifest, indent=1).encode())
        staged.close()
        os.replace(build / MANIFEST, folder / MANIFEST)
        return manifest
    except BaseException as err:
        shutil.rmtree(build, ignore_errors=True)
        if isinstance(err, OSError):
            raise io_error(err, err.filename or build, "write") from None
        raise


def _new_build(folder: Path) -> Path:
    """A new build folder (a fresh random name, created here) with its mark."""
    while True:
        build = folder / f"build-{secrets.token_hex(8)}"
        try:
            build.mkdir()
            break
        except FileExistsError:
            continue
        except OSError as err:
            raise io_error(err, build, "create the folder") from None
    try:
        HashedFile(build / _BUILD_MARK).close()
    except BaseException:
        shutil.rmtree(build, ignore_errors=True)
        raise
    return build


def _write_store(grounder: BatchGrounder, build: Path, mark: str, progress: bool | None, floats: str) -> dict:
    """Every relation's rules and the stored embeddings' keys into `build`; the manifest (unsealed)."""
    codes = _stored_dictionaries(grounder)
    relations, written = {}, {}
    bar = _progress(grounder.order, progress)
    for name in bar:
        if hasattr(bar, "set_postfix_str"):
            bar.set_postfix_str(name)
        started = time.perf_counter()
        relation = grounder.template.relations[name]
        rows = int(grounder.sizes[name])
        rules, total = {}, 0
        for prepared in grounder.prepared[name]:
            stem = f"{_file_name(name)}.{prepared.index}"
            dtypes = _dtypes(grounder, prepared, codes, floats)
            rules[str(prepared.index)] = _write_rule(grounder, relation, prepared, codes, build, stem, rows, written, dtypes)
            total += rules[str(prepared.index)]["bytes"]
        relations[name] = {"rows": rows, "rules": rules, "bytes": total, "seconds": round(time.perf_counter() - started, 3)}
        log.info("grounding store: %s, %d rows, %d groundings in %.1fs", name, rows,
                 sum(r["groundings"] for r in rules.values()), relations[name]["seconds"])
    for weight, table in codes.items():
        file = f"{_file_name(weight)}.keys.arrow"
        _write_keys(grounder, table, build / file)
        written[file] = [(build / file).stat().st_size, _hash_file(build / file)]
    return {"format": FORMAT, "fingerprint": mark, "output": grounder.output, "build": build.name,
            "relations": relations, "files": _records(build, written)}


def _write_keys(grounder: BatchGrounder, table: exp.Table, path: Path) -> None:
    """A database-stored embedding's raw keys by code, streamed (10M keys never at once)."""
    select = exp.select(q.col("value")).from_(table.copy()).order_by(q.col("code"))
    reader = grounder.db.reader(select, CHUNK)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o666)
    with open(fd, "wb") as raw, pa.ipc.new_file(pa.PythonFile(raw, mode="w"), reader.schema) as writer:
        for chunk in reader:
            writer.write_batch(chunk)


def _records(build: Path, written: dict[str, list]) -> dict[str, dict]:
    """Per file: bytes and SHA-256 as written, inode and change time as it is now (unchanged since,
    when they still match)."""
    records = {}
    for name, (size, digest) in written.items():
        info = os.lstat(build / name)
        if info.st_size != size:
            raise RelsqlError(f"grounding store: {build / name} has {info.st_size:,} bytes, not the {size:,} its writer "
                              "wrote; did two builds write one folder? build it again")
        records[name] = {"bytes": size, "sha256": digest, "inode": info.st_ino, "ctime_ns": info.st_ctime_ns}
    return records


def _stored_dictionaries(grounder: BatchGrounder) -> dict[str, exp.Table]:
    """Each database-stored embedding's raw keys numbered in the database (codes for the store),
    kept apart from the in-memory embeddings' dictionaries."""
    tables: dict[str, exp.Table] = {}
    for rules in grounder.prepared.values():
        for prepared in rules:
            for k, weight in prepared.stored.items():
                grounder.dictionary(weight, prepared.source, f"_c{k}", prepared.rule, tables)
    return tables


def _write_rule(grounder: BatchGrounder, relation: ir.Relation, prepared: PreparedRule, codes: dict[str, exp.Table],
                build: Path, stem: str, rows: int, written: dict[str, list], dtypes: dict[str, str]) -> dict:
    """One rule's groundings (ordered by head) into the build folder's files. The engine hands the
    ordered rows to `PartWriter` in runs (parts): DuckDB one, streamed through this process;
    Spark one per partition, written by its executors. This process then writes the offsets from
    the parts' head counts: it never reads a grounding. `written` gains each file's (bytes, SHA-256)."""
    rule = prepared.rule
    columns = list(prepared.columns)
    for k, weight in prepared.stored.items():  # raw keys become the store's codes
        lookup = exp.select(q.col("code", "d")).from_(q.alias(codes[weight].copy(), "d", table=True)).where(
            exp.NullSafeEQ(this=q.col("value", "d"), expression=q.col(f"_c{k}", "g")))
        columns[k] = exp.Subquery(this=lookup)
    select = q.rule_index_query(prepared.source, grounder.key_tables[relation.name], relation.keys, len(rule.refs), columns)
    writer = NarrowWriter(relation, rule, str(build), stem, dtypes)
    try:
        parts = grounder.db.write_ordered(select, writer, CHUNK)
    except duckdb.Error as err:
        raise grounding_error(relation, rule, err, grounder.db.description) from None
    for part in parts:
        if "error" in part:  # raised where the part was written (an executor): its class and message
            raise getattr(errors, part["error"][0], RelsqlError)(part["error"][1])
    kept = [part for part in parts if part["groundings"]]
    for part in parts:
        if not part["groundings"]:
            for name in part_files(part["stem"], len(rule.refs), rule.n_columns):
                (build / name).unlink(missing_ok=True)
        else:
            written.update(part["files"])
    written[f"{stem}.offsets"] = _write_offsets(build, stem, rows, kept)
    kinds: dict[str, list] = {}
    for part in kept:
        kinds.update({k: v for k, v in part["columns"].items() if k not in kinds})
    embeds = set(ir.coded_columns(rule))
    for k in range(rule.n_columns):
        kinds.setdefault(str(k), ["code", 0] if k in embeds else ["value", 0])
    size = written[f"{stem}.offsets"][0] + sum(
        written[name][0] for part in kept for name in part_files(part["stem"], len(rule.refs), rule.n_columns))
    return {"stem": stem, "rows": rows, "groundings": sum(p["groundings"] for p in kept), "bytes": size, "columns": kinds,
            "dtypes": dtypes, "parts": [{"stem": p["stem"], "groundings": p["groundings"]} for p in kept]}


def _floats(dtype: torch.dtype | None) -> str:
    """The type a store keeps values in for a net of `dtype`: float32 for float32 (or narrower),
    else float64 (exact for a float64 net)."""
    if dtype is None or not dtype.is_floating_point or torch.finfo(dtype).bits > 32:
        return "float64"
    return "float32"


def _dtypes(grounder: BatchGrounder, prepared: PreparedRule, codes: dict[str, exp.Table], floats: str) -> dict[str, str]:
    """Per file of a rule (`r<j>`, `c<k>`), the type its numbers are kept in: row ids in the smallest
    integer that holds the referenced relation's rows; codes, the dictionary's codes (and -1, a
    NULL); text tokens, the bucket count (the padding token); other values `floats`."""
    rule = prepared.rule
    dtypes = {f"r{j}": smallest_integer(max(int(grounder.sizes[ref]) - 1, 0), 0) for j, ref in enumerate(rule.refs)}
    coded = ir.coded_columns(rule)
    texts = {e.column: e.buckets for e in ir.walk(rule.expr) if isinstance(e, ir.Text)}
    for k in range(rule.n_columns):
        if k in prepared.stored:
            dtypes[f"c{k}"] = smallest_integer(_largest_code(grounder, codes[prepared.stored[k]]))
        elif k in coded:
            weight = coded[k]
            known = grounder.dictionary_tables.get(weight)
            dtypes[f"c{k}"] = "int64" if known is None else smallest_integer(max(known.num_rows - 1, 0))
        elif k in texts:
            dtypes[f"c{k}"] = smallest_integer(texts[k], 0)
        else:
            dtypes[f"c{k}"] = floats
    return dtypes


def _largest_code(grounder: BatchGrounder, table: exp.Table) -> int:
    """The largest code of a database-stored embedding's dictionary (0 when it is empty)."""
    largest = grounder.db.scalar(exp.select(exp.Max(this=q.col("code"))).from_(table.copy()))[0]
    return 0 if largest is None else int(largest)


def _write_offsets(build: Path, stem: str, rows: int, parts: list[dict], block: int = CHUNK) -> list:
    """`<stem>.offsets` (rows + 1) from the parts' (head, groundings) pairs, parts in head order;
    its (bytes, SHA-256). Streamed `block` pairs at a time: a whole heads file at once held 16
    bytes per head and five temporaries as long (3.4 GB of peak RSS at TPC-H sf 10)."""
    written, next_head = 0, 0  # groundings before the pairs still to read; the first head whose offset is unwritten
    with HashedFile(build / f"{stem}.offsets") as offsets:
        for part in parts:
            for pairs in _pairs(build / f"{part['stem']}.heads", block):
                heads, counts = pairs[:, 0], pairs[:, 1]
                ends = written + np.cumsum(counts)
                # offsets[h] for h in (the previous head, head] is the head's start (a head continued
                # from the previous part repeats 0 times)
                _write_runs(offsets, ends - counts, np.diff(heads, prepend=next_head - 1), block)
                written, next_head = int(ends[-1]), int(heads[-1]) + 1
        _write_runs(offsets, np.array([written], dtype=np.int64), np.array([rows + 1 - next_head]), block)
    return offsets.close()


def _pairs(path: Path, block: int):
    """A heads file's (head, groundings) pairs, `block` at a time."""
    with open(path, "rb") as file:
        while len(pairs := np.fromfile(file, dtype=np.int64, count=2 * block)):
            yield pairs.reshape(-1, 2)


def _write_runs(file: HashedFile, values: np.ndarray, repeats: np.ndarray, block: int) -> None:
    """Each of `values` repeated as often as `repeats` says, written at most `block` numbers at a
    time (a sparse rule's run of headless rows can span the whole relation)."""
    ends, start, before = np.cumsum(repeats), 0, 0
    while start < len(values):
        stop = int(np.searchsorted(ends, before + block, side="right"))
        if stop <= start:  # values[start] alone fills more than a block
            left = int(repeats[start])
            while left:
                file.write(np.full(min(left, block), values[start], dtype=np.int64).tobytes())
                left -= min(left, block)
            stop = start + 1
        else:
            file.write(np.repeat(values[start:stop], repeats[start:stop]).astype(np.int64, copy=False).tobytes())
        before, start = int(ends[stop - 1]), stop


class _Parts:
    """One column of a rule's groundings kept in several files (its parts, in order), read as one
    array by position."""

    def __init__(self, arrays: list[np.ndarray]):
        self.arrays = arrays
        self.starts = np.cumsum([0, *[len(a) for a in arrays]])
        self.shape = (int(self.starts[-1]), *arrays[0].shape[1:])
        self.dtype = arrays[0].dtype

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, positions: np.ndarray) -> np.ndarray:
        positions = np.asarray(positions, dtype=np.int64)
        which = np.searchsorted(self.starts, positions, side="right") - 1
        out = np.empty((len(positions), *self.shape[1:]), dtype=self.dtype)
        for part in np.unique(which):
            mask = which == part
            out[mask] = self.arrays[part][positions[mask] - self.starts[part]]
        return out


__all__ = ["GroundingStore", "StoreMeta", "fingerprint"]
