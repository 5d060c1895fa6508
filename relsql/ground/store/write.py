"""Writing a store: every relation the output depends on grounded once, in bulk, into a new build
folder; the manifest last, moved into place atomically, so a store is either complete or rebuilt.

Files are created exclusively (never through a link) and a failed build's folder is removed (a
full disk is freed). The engine hands each rule's groundings, ordered by head, to a `NarrowWriter`
in parts (DuckDB one, streamed through this process; Spark one per partition, written by its
executors); this process then writes the CSR offsets from the parts' head counts.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
import time
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import sqlglot.expressions as exp
import torch

from relsql import errors
from relsql import sql as q
from relsql.errors import RelsqlError
from relsql.ground.demand import BatchGrounder, PreparedRule, grounding_error
from relsql.ground.execute import interruptible
from relsql.ground.narrow import NarrowWriter, smallest_integer
from relsql.ground.parts import HashedFile, io_error, part_files
from relsql.ground.store.layout import BUILD_MARK, FORMAT, MANIFEST, file_name, hash_file
from relsql.ground.store.manifest import seal
from relsql.progress import relations as progress_bar
from relsql.template import ir

log = logging.getLogger("relsql")
CHUNK = 1 << 20  # rows per Arrow batch read from the database while writing the store


def build_store(grounder: BatchGrounder, folder: Path, mark: str, progress: bool | None, floats: str = "float64") -> dict:
    """Ground every relation in bulk into a new build folder of `folder`; the manifest is written
    last and moved into place atomically, so a store is either complete or rebuilt. On any failure
    the build folder goes (a full disk is freed) and an OS error becomes a RelsqlError."""
    build = _new_build(folder)
    try:
        with interruptible(grounder.db, "grounding store build"):  # Ctrl-C stops DuckDB's query at once
            manifest = _write_store(grounder, build, mark, progress, floats)
        manifest["seal"] = seal(manifest)
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
        HashedFile(build / BUILD_MARK).close()
    except BaseException:
        shutil.rmtree(build, ignore_errors=True)
        raise
    return build


def _write_store(grounder: BatchGrounder, build: Path, mark: str, progress: bool | None, floats: str) -> dict:
    """Every relation's rules and the stored embeddings' keys into `build`; the manifest (unsealed)."""
    codes = _stored_dictionaries(grounder)
    relations, written = {}, {}
    bar = progress_bar(grounder.order, progress)
    for name in bar:
        bar.set_postfix_str(name)
        started = time.perf_counter()
        relation = grounder.template.relations[name]
        rows = int(grounder.sizes[name])
        rules, total = {}, 0
        for prepared in grounder.prepared[name]:
            stem = f"{file_name(name)}.{prepared.index}"
            dtypes = _dtypes(grounder, prepared, codes, floats)
            rules[str(prepared.index)] = _write_rule(grounder, relation, prepared, codes, build, stem, rows, written, dtypes)
            total += rules[str(prepared.index)]["bytes"]
        relations[name] = {"rows": rows, "rules": rules, "bytes": total, "seconds": round(time.perf_counter() - started, 3)}
        log.info("grounding store: %s, %d rows, %d groundings in %.1fs", name, rows,
                 sum(r["groundings"] for r in rules.values()), relations[name]["seconds"])
    for weight, table in codes.items():
        file = f"{file_name(weight)}.keys.arrow"
        _write_keys(grounder, table, build / file)
        written[file] = [(build / file).stat().st_size, hash_file(build / file)]
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
    written[f"{stem}.offsets"] = write_offsets(build, stem, rows, kept)
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


def float_type(dtype: torch.dtype | None) -> str:
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


def write_offsets(build: Path, stem: str, rows: int, parts: list[dict], block: int = CHUNK) -> list:
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
