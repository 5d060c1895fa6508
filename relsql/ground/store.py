"""The grounding store: every grounding a mini-batch can need, computed once by the database.

Per batch, grounding in the database (relsql/ground/demand.py) makes DuckDB scan the tables it
semi-joins, so a batch costs in proportion to the database. The store grounds each relation the
output depends on once, in bulk, and keeps the result as plain arrays in a folder:

    manifest.json                  format, fingerprint of the data, per relation its rows and per
                                   rule its groundings, value columns (dtype, width) and files
    <relation>.<rule>.offsets      int64 (rows + 1,): CSR offsets, the groundings of row h are
                                   [offsets[h], offsets[h + 1])
    <part>.r<j>                    int64 (groundings,): row ids into the j-th referenced relation
    <part>.c<k>                    float64 (groundings, width) encoded values, or int64 codes
    <part>.heads                   int64 (heads, 2): (head row, its groundings), what the offsets
                                   are written from
    <weight>.keys.arrow            Arrow IPC: the raw keys of a database-stored embedding, by code

A rule's groundings are one part (`<part>` = `<relation>.<rule>`) when this process streams them
from DuckDB, or several (`<relation>.<rule>.p<i>`, in head order) when Spark's executors write
one per partition; the driver then reads only their heads' counts. Raw little-endian arrays and
JSON, so another engine can write a store and several processes can read one. A batch's demand closure then runs over the CSR offsets in numpy (like a neighbour
sampler): it reads the offsets of its rows, the row ids and values of their groundings, and
nothing else, through memory maps whose pages are handed back after every batch (resident memory
stays bounded by the batch). Fan-out sampling happens there too, seeded by the grounding's
position, so a head's sample does not depend on the batch it is in.
"""

from __future__ import annotations

import hashlib
import json
import logging
import mmap
import os
import re
import shutil
import tempfile
import time
import weakref
from dataclasses import dataclass
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import sqlglot.expressions as exp
import torch

from relsql import errors
from relsql.db import TEMP_PREFIX, first_line
from relsql.errors import RelsqlError
from relsql.ground import query as q
from relsql.ground.demand import BatchGrounder, BatchGrounding, _grounding_error, _PreparedRule
from relsql.ground.execute import RelationGrounding, RuleGrounding, _column_tensor, _progress, check_refs
from relsql.template import ir

log = logging.getLogger("relsql")
FORMAT = "relsql-store-2"  # 2: a rule's groundings in parts (Spark's executors write one each)
MANIFEST = "manifest.json"
_OWN_FILE = re.compile(r"\w+_[0-9a-f]{8}\.(\d+(\.p\d+)?\.(offsets|heads|r\d+|c\d+)|keys\.arrow)")
CHUNK = 1 << 20  # rows per Arrow batch read from the database while writing the store
RESIDENT_BUDGET = 128 << 20  # bytes of the store's pages a process keeps mapped in before handing them back


@dataclass
class StoreMeta:
    """What reading a store needs besides its files: the grounder's template, order, encodings
    and fan-out, without its database (so another process can read the store: a training rank)."""

    template: ir.Template
    output: str
    order: list[str]
    fanout: dict[str, int] | int | None
    seed: int
    prepared: dict[str, list[_PreparedRule]]
    stored: dict
    dictionary_tables: dict[str, pa.Table]
    feature_stats: dict
    sizes: dict[str, int]


@dataclass
class _Rule:
    """One rule's part of the store, opened as memory maps."""

    prepared: _PreparedRule
    size: int
    offsets: np.ndarray
    refs: list[np.ndarray]
    columns: dict[int, np.ndarray]  # float64 (G, width) or int64 (G,) codes


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


class GroundingStore:
    """Bulk groundings on disk, read per batch in O(batch). Use `GroundingStore.open`."""

    def __init__(self, grounder: BatchGrounder, folder: Path, manifest: dict, owned: bool):
        self.grounder, self.folder, self.manifest = grounder, folder, manifest
        self.template, self.output, self.order = grounder.template, grounder.output, grounder.order
        self.fanout, self.seed = grounder.fanout, grounder.seed
        self._maps: list[mmap.mmap] = []
        self._resident = _resident_file_bytes() or 0  # file-backed resident bytes after the last release
        self.rules: dict[str, list[_Rule]] = {}
        for name in self.order:
            described = manifest["relations"][name]["rules"]
            self.rules[name] = [self._open_rule(prepared, described[str(prepared.index)])
                                for prepared in grounder.prepared[name]]
        self.embedding_keys = {w: pa.ipc.open_file(pa.memory_map(str(folder / f"{_file_name(w)}.keys.arrow"))).read_all().column(0)
                               for w in grounder.stored}
        if owned:  # a temporary store goes with the model that made it
            self._cleanup = weakref.finalize(self, shutil.rmtree, str(folder), True)

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
        return cls(meta, Path(folder), manifest, owned=False)

    @classmethod
    def open(cls, grounder: BatchGrounder, folder: str | Path | None = None, progress: bool | None = None) -> GroundingStore:
        """The store of `grounder`'s template and data in `folder` (a temporary one when None):
        reused when its fingerprint matches the data, else (re)built. Never used stale."""
        owned = folder is None
        if owned:  # nothing to compare with: no fingerprint (it reads every table once more)
            path = Path(tempfile.mkdtemp(prefix="relsql-store-"))
            try:
                return cls(grounder, path, _build(grounder, path, "", progress), owned)
            except BaseException:
                shutil.rmtree(path, ignore_errors=True)
                raise
        path = Path(folder)
        mark = fingerprint(grounder)
        if _follower():  # a torchrun rank other than 0: rank 0 writes the shared store, this one waits for it
            return cls(grounder, path, _wait_for(path, mark), owned)
        manifest = _read_manifest(path)
        if manifest is not None and manifest.get("format") == FORMAT and manifest.get("fingerprint") == mark:
            try:
                return cls(grounder, path, manifest, owned)
            except (KeyError, TypeError, ValueError, OSError) as err:
                raise RelsqlError(f"grounding store {path} is damaged ({first_line(err)}); delete the folder to rebuild it") from None
        if manifest is not None:
            log.info("grounding store %s was built from other data or another template; rebuilding", path)
        return cls(grounder, path, _build(grounder, path, mark, progress), owned)

    def _map(self, file: str, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
        if not shape[0]:
            return np.zeros(shape, dtype=dtype)
        with open(self.folder / file, "rb") as handle:
            mapped = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
        mapped.madvise(mmap.MADV_RANDOM)  # a batch reads scattered ranges: no read-ahead around them
        self._maps.append(mapped)
        return np.frombuffer(mapped, dtype=dtype).reshape(shape)

    def _open_rule(self, prepared: _PreparedRule, described: dict) -> _Rule:
        size, rows, parts = described["groundings"], described["rows"], described["parts"]
        offsets = self._map(f"{described['stem']}.offsets", np.int64, (rows + 1,))

        def column(suffix: str, dtype, width: int | None) -> np.ndarray | _Parts:
            arrays = [self._map(f"{part['stem']}.{suffix}", dtype, (part["groundings"],) if width is None
                                else (part["groundings"], width)) for part in parts]
            if len(arrays) == 1:
                return arrays[0]
            return _Parts(arrays) if arrays else np.zeros((0,) if width is None else (0, width), dtype)

        refs = [column(f"r{j}", np.int64, None) for j in range(len(prepared.rule.refs))]
        columns = {int(k): column(f"c{k}", np.int64 if kind == "code" else np.float64, None if kind == "code" else width)
                   for k, (kind, width) in described["columns"].items()}
        return _Rule(prepared, size, offsets, refs, columns)

    def release(self, force: bool = False) -> None:
        """Hand the pages read so far back to the page cache once they hold more than
        RESIDENT_BUDGET bytes (resident memory stays bounded; dropping them after every batch
        made small batches re-fault their pages, doubling a 512-row read at TPC-H sf 1)."""
        resident = _resident_file_bytes()
        if not force and resident is not None and resident - self._resident < RESIDENT_BUDGET:
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
        pending: dict[str, list[np.ndarray]] = {self.output: [np.asarray(rids, dtype=np.int64)]}
        demand: dict[str, np.ndarray] = {}
        picked: dict[str, list[_Picked]] = {}
        for name in reversed(self.order):  # every relation's demand is complete before it is read
            parts = pending.pop(name, None)
            if not parts:
                continue
            wanted = demand[name] = np.unique(np.concatenate(parts))
            picked[name] = []
            for rule in self.rules[name]:
                picked[name].append(self._pick(name, rule, wanted, sample))
                self.release()  # per rule: a large batch of random rows would otherwise map in most of the store
            for chosen in picked[name]:
                for ref, ids in zip(chosen.rule.prepared.rule.refs, chosen.refs):
                    pending.setdefault(ref, []).append(ids)
        try:
            return self._localize(demand, picked)
        finally:
            self.release()

    def _pick(self, name: str, rule: _Rule, wanted: np.ndarray, sample: int) -> _Picked:
        """The groundings of heads `wanted` (ascending global ids), in store order: at most
        `fanout` per head of a grouped rule, a seeded choice by position."""
        if not rule.size:
            empty = np.zeros(0, np.int64)
            return _Picked(rule, np.zeros(len(wanted), np.int64), empty, [empty for _ in rule.refs])
        starts = rule.offsets[wanted]
        counts = rule.offsets[wanted + 1] - starts
        ends = np.cumsum(counts)
        positions = np.arange(int(ends[-1]) if len(ends) else 0, dtype=np.int64) - np.repeat(ends - counts - starts, counts)
        limit = self.fanout.get(name) if isinstance(self.fanout, dict) else self.fanout
        if limit and rule.prepared.rule.grouped and len(counts) and counts.max() > limit:
            salt = _mix(np.array([self.seed * 100_003 + sample], dtype=np.int64))[0]
            heads = np.repeat(np.arange(len(wanted)), counts)
            order = np.lexsort((_mix(positions.view(np.uint64) ^ salt), heads))  # per head, positions by their hash
            keep = np.sort(order[np.arange(len(order)) - np.repeat(ends - counts, counts) < limit])
            positions, counts = positions[keep], np.minimum(counts, limit)
        return _Picked(rule, counts, positions, [column[positions] for column in rule.refs])

    def _localize(self, demand: dict[str, np.ndarray], picked: dict[str, list[_Picked]]) -> BatchGrounding:
        """Renumber to the batch's own rows (sorted global ids keep the store's order)."""
        codes: dict[str, list[np.ndarray]] = {}
        for parts in picked.values():
            for chosen in parts:
                for k, weight in chosen.rule.prepared.stored.items():
                    codes.setdefault(weight, []).append(chosen.rule.columns[k][chosen.positions])
        used = {w: np.unique(np.concatenate(arrays)) for w, arrays in codes.items()}
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
                refs = [torch.from_numpy(np.searchsorted(demand[ref], ids)) for ref, ids in zip(rule.prepared.rule.refs, chosen.refs)]
                values = {}
                for k, column in rule.columns.items():
                    taken = column[chosen.positions]
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


def _follower() -> bool:
    """This process is a rank other than 0 of a torchrun group (relsql's own ranks attach instead)."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1 and os.environ.get("RANK", "0") != "0" and "RELSQL_RANK" not in os.environ


def _wait_for(folder: Path, mark: str, timeout: float = 3600.0) -> dict:
    """The manifest rank 0 writes for this data (`mark`), once it is there."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        manifest = _read_manifest(folder)
        if manifest is not None and manifest.get("format") == FORMAT and manifest.get("fingerprint") == mark:
            return manifest
        time.sleep(0.5)
    raise RelsqlError(f"grounding store {folder}: rank 0 did not write it within {timeout:.0f}s; a kept store shared by "
                      "torchrun's ranks must be on storage every rank can read")


def _resident_file_bytes() -> int | None:
    """This process's resident file-backed memory (Linux: /proc/self/statm), else None."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[2]) * mmap.PAGESIZE
    except (OSError, ValueError, IndexError):
        return None


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


def _read_manifest(folder: Path) -> dict | None:
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:
        raise RelsqlError(f"grounding store {folder}: {MANIFEST} cannot be read ({err}); delete the folder to rebuild it") from None
    return manifest if isinstance(manifest, dict) else None


# -- writing ---------------------------------------------------------------------------------------
def _build(grounder: BatchGrounder, folder: Path, mark: str, progress: bool | None) -> dict:
    """Ground every relation in bulk into `folder` (its old contents removed); the manifest is
    written last, atomically, so a store is either complete or rebuilt."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / MANIFEST).unlink(missing_ok=True)
    for old in folder.iterdir():  # only files of the store's own naming
        if old.is_file() and _OWN_FILE.fullmatch(old.name):
            old.unlink()
    codes = _stored_dictionaries(grounder)
    relations = {}
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
            rules[str(prepared.index)] = _write_rule(grounder, relation, prepared, codes, folder, stem, rows)
            total += rules[str(prepared.index)]["bytes"]
        relations[name] = {"rows": rows, "rules": rules, "bytes": total, "seconds": round(time.perf_counter() - started, 3)}
        log.info("grounding store: %s, %d rows, %d groundings in %.1fs", name, rows,
                                         sum(r["groundings"] for r in rules.values()), relations[name]["seconds"])
    for weight, table in codes.items():
        select = exp.select(q.col("value")).from_(table.copy()).order_by(q.col("code"))
        reader = grounder.db.reader(select, CHUNK)  # streamed: 10M keys never at once
        with pa.OSFile(str(folder / f"{_file_name(weight)}.keys.arrow"), "wb") as sink, \
                pa.ipc.new_file(sink, reader.schema) as writer:
            for chunk in reader:
                writer.write_batch(chunk)
    manifest = {"format": FORMAT, "fingerprint": mark, "output": grounder.output, "relations": relations}
    partial = folder / (MANIFEST + ".tmp")
    partial.write_text(json.dumps(manifest, indent=1))
    os.replace(partial, folder / MANIFEST)
    return manifest


def _stored_dictionaries(grounder: BatchGrounder) -> dict[str, exp.Table]:
    """Each database-stored embedding's raw keys numbered in the database (codes for the store),
    kept apart from the in-memory embeddings' dictionaries."""
    tables: dict[str, exp.Table] = {}
    for rules in grounder.prepared.values():
        for prepared in rules:
            for k, weight in prepared.stored.items():
                grounder.dictionary(weight, prepared.source, f"_c{k}", prepared.rule, tables)
    return tables


def _write_rule(grounder: BatchGrounder, relation: ir.Relation, prepared: _PreparedRule, codes: dict[str, exp.Table],
                folder: Path, stem: str, rows: int) -> dict:
    """One rule's groundings (ordered by head) into the store's files. The engine hands the
    ordered rows to `_PartWriter` in runs (parts): DuckDB one, streamed through this process;
    Spark one per partition, written by its executors. This process then writes the offsets from
    the parts' head counts: it never reads a grounding."""
    rule = prepared.rule
    columns = list(prepared.columns)
    for k, weight in prepared.stored.items():  # raw keys become the store's codes
        lookup = exp.select(q.col("code", "d")).from_(q.alias(codes[weight].copy(), "d", table=True)).where(
            exp.NullSafeEQ(this=q.col("value", "d"), expression=q.col(f"_c{k}", "g")))
        columns[k] = exp.Subquery(this=lookup)
    select = q.rule_index_query(prepared.source, grounder.key_tables[relation.name], relation.keys, len(rule.refs), columns)
    writer = _PartWriter(relation, rule, str(folder), stem)
    try:
        parts = grounder.db.write_ordered(select, writer, CHUNK)
    except duckdb.Error as err:
        raise _grounding_error(relation, rule, err) from None
    for part in parts:
        if "error" in part:  # raised where the part was written (an executor): its class and message
            raise getattr(errors, part["error"][0], RelsqlError)(part["error"][1])
    kept = [part for part in parts if part["groundings"]]
    for part in parts:
        if not part["groundings"]:
            for name in _part_files(part, len(rule.refs), rule.n_columns):
                (folder / name).unlink(missing_ok=True)
    _write_offsets(folder, stem, rows, kept)
    kinds: dict[str, list] = {}
    for part in kept:
        kinds.update({k: v for k, v in part["columns"].items() if k not in kinds})
    embeds = set(ir.coded_columns(rule))
    for k in range(rule.n_columns):
        kinds.setdefault(str(k), ["code", 0] if k in embeds else ["value", 0])
    size = (folder / f"{stem}.offsets").stat().st_size + sum(
        (folder / name).stat().st_size for part in kept for name in _part_files(part, len(rule.refs), rule.n_columns))
    return {"stem": stem, "rows": rows, "groundings": sum(p["groundings"] for p in kept), "bytes": size, "columns": kinds,
            "parts": [{"stem": p["stem"], "groundings": p["groundings"]} for p in kept]}


def _part_files(part: dict, refs: int, columns: int) -> list[str]:
    return [f"{part['stem']}.heads", *[f"{part['stem']}.r{j}" for j in range(refs)],
            *[f"{part['stem']}.c{k}" for k in range(columns)]]


def _write_offsets(folder: Path, stem: str, rows: int, parts: list[dict]) -> None:
    """`<stem>.offsets` (rows + 1) from the parts' (head, groundings) pairs, parts in head order."""
    written, next_head = 0, 0
    with open(folder / f"{stem}.offsets", "wb") as offsets:
        for part in parts:
            pairs = np.fromfile(folder / f"{part['stem']}.heads", dtype=np.int64).reshape(-1, 2)
            heads, ends = pairs[:, 0], written + np.cumsum(pairs[:, 1])
            starts = np.concatenate([[written], ends[:-1]])
            stop = int(heads[-1]) + 1
            # offsets[h] for h in [next_head, stop): the groundings before h's, i.e. the start of the first head >= h
            offsets.write(np.append(starts, ends[-1])[np.searchsorted(heads, np.arange(next_head, stop))].astype(np.int64).tobytes())
            written, next_head = int(ends[-1]), stop
        offsets.write(np.full(rows + 1 - next_head, written, dtype=np.int64).tobytes())


class _PartWriter:
    """Writes one run of a rule's ordered groundings (a part) into files `<stem>[.p<i>].r<j>`
    (row ids), `.c<k>` (encoded values or codes) and `.heads` ((head, groundings) pairs), and
    returns what the manifest needs. Runs wherever the engine runs it: pickled to Spark's
    executors, it must hold plain data only."""

    def __init__(self, relation: ir.Relation, rule: ir.Rule, folder: str, stem: str):
        self.relation, self.rule, self.folder, self.stem = relation, rule, folder, stem
        self.embeds = set(ir.coded_columns(rule))

    def __call__(self, index: int | None, chunks) -> dict:
        """Write `chunks` (Arrow record batches) as part `index` (None: the rule's only part)."""
        stem = self.stem if index is None else f"{self.stem}.p{index}"
        folder, rule = Path(self.folder), self.rule
        files = {"r": [open(folder / f"{stem}.r{j}", "wb") for j in range(len(rule.refs))],
                 "c": {k: open(folder / f"{stem}.c{k}", "wb") for k in range(rule.n_columns)}}
        kinds: dict[str, list] = {}
        written, last, count = 0, None, 0
        try:
            with open(folder / f"{stem}.heads", "wb") as heads_file:
                for chunk in chunks:
                    if not chunk.num_rows:
                        continue
                    heads = chunk.column("_head").to_numpy().astype(np.int64)
                    firsts = np.flatnonzero(np.diff(heads, prepend=heads[0] - 1))  # where a new head starts in the chunk
                    counts = np.diff(np.append(firsts, len(heads)))
                    distinct = heads[firsts]
                    if last is not None and distinct[0] == last:  # a head continued from the previous chunk
                        count += int(counts[0])
                        distinct, counts = distinct[1:], counts[1:]
                    if len(distinct):
                        if last is not None:
                            heads_file.write(np.array([last, count], dtype=np.int64).tobytes())
                        heads_file.write(np.stack([distinct[:-1], counts[:-1]], axis=1).astype(np.int64).tobytes())
                        last, count = int(distinct[-1]), int(counts[-1])
                    check_refs(self.relation, rule, chunk)
                    for j in range(len(rule.refs)):
                        files["r"][j].write(chunk.column(f"_r{j}").to_numpy().astype(np.int64).tobytes())
                    for k in range(rule.n_columns):
                        code = k in self.embeds
                        values = _column_tensor(chunk.column(f"_c{k}"), rule, k, embedded=code).numpy()
                        kinds.setdefault(str(k), ["code", 0] if code else ["value", int(values.shape[1])])
                        files["c"][k].write(np.ascontiguousarray(values).tobytes())
                    written += chunk.num_rows
                if last is not None:
                    heads_file.write(np.array([last, count], dtype=np.int64).tobytes())
        finally:
            for handle in [*files["r"], *files["c"].values()]:
                handle.close()
        return {"stem": stem, "groundings": written, "columns": kinds}


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
