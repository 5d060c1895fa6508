"""Writing a grounding store's parts: what runs where the groundings are computed.

DuckDB streams a rule's ordered groundings through this process; Spark's executors write one part
each where their partition is computed. Executors of a data cluster rarely have torch, so this
module needs only pyarrow and numpy (and relsql's template IR and errors, which are torch-free):
`import relsql.ground.parts` never imports torch.

Every file is created exclusively (O_CREAT | O_EXCL, and O_NOFOLLOW: a symlink already at the
name is never written through) and hashed while it is written, so the manifest can record a
checksum per file without reading the store back. An OS error (disk full, a read-only mount, no
permission, a folder in the way) becomes a RelsqlError naming the file and the fix.
"""

from __future__ import annotations

import errno
import hashlib
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import sqlglot.expressions as exp

from relsql.errors import GroundingError, RelsqlError, SchemaError
from relsql.ground import encoders
from relsql.ground import text as hashing
from relsql.template import ir

_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
_FULL = {errno.ENOSPC, errno.EFBIG, getattr(errno, "EDQUOT", errno.ENOSPC)}
_DENIED = {errno.EROFS, errno.EACCES, errno.EPERM}


def io_error(err: OSError, path: str | os.PathLike, doing: str) -> RelsqlError:
    """A RelsqlError for an OS error on a store file: what happened, to which file, and the fix."""
    reason = err.strerror or str(err)
    if err.errno in _FULL:
        fix = ("the disk (or this process's file size limit) is full; the store's partial files were removed: "
               "free space or pass store= a folder on a larger disk (store=False grounds every batch in the database)")
    elif err.errno in _DENIED:
        fix = "the folder is read-only or not writable by this user: pass store= a folder you can write"
    elif err.errno in (errno.EISDIR, errno.EEXIST, errno.ENOTDIR, errno.ELOOP):
        fix = "something else (a folder, a file or a link) is in the way of the store's file: pass store= an empty or new folder"
    else:
        fix = "check the folder and the disk"
    return RelsqlError(f"grounding store: cannot {doing} {path}: {reason}; {fix}")


class HashedFile:
    """A new file (created exclusively) that counts and hashes (SHA-256) what is written to it."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        try:
            self._fd = os.open(self.path, _CREATE, 0o666)
        except OSError as err:
            raise io_error(err, self.path, "create") from None
        self.bytes, self._hash = 0, hashlib.sha256()

    def write(self, data: bytes | memoryview) -> None:
        view = memoryview(data).cast("B")
        self._hash.update(view)
        self.bytes += view.nbytes
        while view:
            try:
                done = os.write(self._fd, view)
            except OSError as err:
                raise io_error(err, self.path, "write") from None
            view = view[done:]

    def close(self) -> list:
        """Close it; (bytes, sha256 hex) for the manifest."""
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            try:
                os.close(fd)
            except OSError as err:  # a network file system may report a full disk only here
                raise io_error(err, self.path, "write") from None
        return [self.bytes, self._hash.hexdigest()]

    def __enter__(self) -> HashedFile:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def check_refs(relation: ir.Relation, rule: ir.Rule, rows: pa.Table | pa.RecordBatch) -> None:
    """Every grounding must reference a row of each relation its body reads (NULL: an outer join)."""
    for j, ref in enumerate(rule.refs):
        if rows.column(f"_r{j}").null_count:
            raise GroundingError(
                f"{relation.name}, {rule.origin}: some groundings have no row of `{ref}` (an outer join?); "
                f"join `{ref}` with an inner JOIN so every grounding has its value")


def column_label(rule: ir.Rule, k: int) -> str:
    """The SQL a grounding column came from, for error messages."""
    if isinstance(rule.query, exp.Select):
        for item in rule.query.expressions:
            if item.alias_or_name == f"_c{k}":
                return (item.unalias() if isinstance(item, exp.Alias) else item).sql("duckdb")
    return f"value column {k}"


def column_values(column: pa.ChunkedArray | pa.Array, rule: ir.Rule, k: int, embedded: bool,
                  edges: list[float] | None = None) -> np.ndarray:
    """A grounding column as a (G, d) float64 array (or (G,) int64 codes); lists become vectors.

    `edges`: the column is a `ple(...)` column read as its number (one DOUBLE per grounding, NULL
    kept) and encoded here over these edges (relsql/ground/encoders.py `ple_values`, equal to the
    database's `ple_sql`). Without them a ple column arrives encoded, as a list (the default)."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if edges is not None:
        return _ple(column, rule, k, edges)
    if embedded:  # a NULL code (a category the dictionary lacks) becomes -1, which range checks refuse
        if column.null_count:
            column = pc.fill_null(column, -1)
        return np.asarray(column.to_numpy(zero_copy_only=False)).astype(np.int64, copy=False)
    kind = column.type
    text = next((e for e in ir.walk(rule.expr) if isinstance(e, ir.Text) and e.column == k), None)
    if text is not None and text.kind == "codes":
        if not (hashing.is_list(kind) or pa.types.is_null(kind)):
            raise SchemaError(f"{rule.head}, {rule.origin}: bag({column_label(rule, k)}) needs a list column, got {kind}")
        return hashing.hashed(column.to_pylist(), text.buckets, text.tokens, hashing.element_tokens)
    if text is not None:
        if not (hashing.is_text(kind) or pa.types.is_null(kind)):
            raise SchemaError(f"{rule.head}, {rule.origin}: text({column_label(rule, k)}) needs a text column, got {kind}; "
                              "use features(...) for numbers or embed(...) for codes")
        return hashing.hashed(column.to_pylist(), text.buckets, text.tokens)
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        return _vectors(column, rule, k)
    if pa.types.is_boolean(kind) or pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_decimal(kind):
        if column.null_count:
            column = pc.fill_null(column, 0)
        return _floats(pc.cast(column, pa.float64())).reshape(-1, 1)
    raise SchemaError(
        f"{rule.head}, {rule.origin}: {column_label(rule, k)} is used as a neural value but has type {kind}; "
        "use numeric or list-of-number columns, or embed(...) for categorical ones")


def _ple(column: pa.Array, rule: ir.Rule, k: int, edges: list[float]) -> np.ndarray:
    """A ple column's numbers (DOUBLE, NULLs kept) encoded over `edges`."""
    kind = column.type
    if not (pa.types.is_floating(kind) or pa.types.is_integer(kind) or pa.types.is_decimal(kind) or pa.types.is_null(kind)):
        raise SchemaError(f"{rule.head}, {rule.origin}: ple({column_label(rule, k)}) was read as {kind}, not as its "
                          "number; a grounding read with bin edges must select the column's number")
    if pa.types.is_null(kind):
        return encoders.ple_values(np.zeros(len(column)), np.ones(len(column), dtype=bool), edges)
    if not pa.types.is_float64(kind):
        column = pc.cast(column, pa.float64())
    nulls = None
    if column.null_count:
        nulls = column.is_null().to_numpy(zero_copy_only=False)
        column = pc.fill_null(column, 0.0)
    return encoders.ple_values(column.to_numpy(zero_copy_only=False), nulls, edges)


def _vectors(array: pa.Array, rule: ir.Rule, k: int) -> np.ndarray:
    """A list column of equal-length numeric lists as a (G, d) float64 array."""
    kind = array.type
    label = f"{rule.head}, {rule.origin}: the list column {column_label(rule, k)}"
    element = kind.value_type
    if not (pa.types.is_integer(element) or pa.types.is_floating(element) or pa.types.is_decimal(element)
            or pa.types.is_boolean(element) or pa.types.is_null(element)):
        raise SchemaError(f"{label} holds {element} values; a vector must be a list of numbers (not nested lists)")
    lengths = pc.list_value_length(array).to_numpy(zero_copy_only=False)
    if array.null_count or (len(lengths) and (lengths.min() != lengths.max())):
        raise SchemaError(f"{label} must hold vectors of one length without NULLs")
    if len(lengths) == 0:  # no groundings: the width is known only for fixed-size lists
        return np.zeros((0, kind.list_size if pa.types.is_fixed_size_list(kind) else 0), dtype=np.float64)
    if lengths[0] == 0:
        raise SchemaError(f"{label} holds empty lists; a vector needs at least one number")
    flat = pc.list_flatten(array)
    if flat.null_count:
        raise SchemaError(f"{label} has NULL inside its vectors; fill them (e.g. list_transform(v, x -> coalesce(x, 0)))")
    return _floats(pc.cast(flat, pa.float64())).reshape(-1, int(lengths[0]))


def _floats(array: pa.Array | pa.ChunkedArray) -> np.ndarray:
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    return np.asarray(array.to_numpy(zero_copy_only=False), dtype=np.float64)


def part_files(stem: str, refs: int, columns: int) -> list[str]:
    """The files of one part: its (head, groundings) pairs, row ids per reference, values per column."""
    return [f"{stem}.heads", *[f"{stem}.r{j}" for j in range(refs)], *[f"{stem}.c{k}" for k in range(columns)]]


class PartWriter:
    """Writes one run of a rule's ordered groundings (a part) into files `<stem>[.p<i>].r<j>`
    (row ids), `.c<k>` (encoded values or codes) and `.heads` ((head, groundings) pairs) of a
    build folder, and returns what the manifest needs (per file its bytes and SHA-256). Runs
    wherever the engine runs it: pickled to Spark's executors, it holds plain data only.
    `edges`: per ple column read as its number, the bin edges it is encoded over here (see
    `column_values`)."""

    def __init__(self, relation: ir.Relation, rule: ir.Rule, folder: str, stem: str,
                 edges: dict[int, list[float]] | None = None):
        self.relation, self.rule, self.folder, self.stem = relation, rule, folder, stem
        self.embeds = set(ir.coded_columns(rule))
        self.edges = {int(k): [float(e) for e in v] for k, v in (edges or {}).items()}

    def __call__(self, index: int | None, chunks) -> dict:
        """Write `chunks` (Arrow record batches) as part `index` (None: the rule's only part)."""
        stem = self.stem if index is None else f"{self.stem}.p{index}"
        names = part_files(stem, len(self.rule.refs), self.rule.n_columns)
        opened: list[HashedFile] = []
        try:
            for name in names:
                opened.append(HashedFile(self._fresh(name)))
            kinds, written = self._write(chunks, opened[0], opened[1:1 + len(self.rule.refs)], opened[1 + len(self.rule.refs):])
            files = {}
            for name, handle in zip(names, opened):
                files[name] = handle.close()
        finally:
            for handle in opened:
                try:
                    handle.close()
                except RelsqlError:
                    pass  # already failing: the first error is the one reported
        return {"stem": stem, "groundings": written, "columns": kinds, "files": files}

    def _fresh(self, name: str) -> Path:
        """A part file's path, free for an exclusive create: a file a failed earlier attempt of this
        same part left in this build's own folder is removed (unlinked, never followed)."""
        path = Path(self.folder) / name
        try:
            if path.is_symlink() or path.is_file():
                path.unlink()
        except OSError as err:
            raise io_error(err, path, "replace") from None
        return path

    def _write(self, chunks, heads_file: HashedFile, ref_files: list[HashedFile],
               column_files: list[HashedFile]) -> tuple[dict[str, list], int]:
        rule = self.rule
        kinds: dict[str, list] = {}
        written, last, count = 0, None, 0
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
            for j, handle in enumerate(ref_files):
                handle.write(chunk.column(f"_r{j}").to_numpy().astype(np.int64).tobytes())
            for k, handle in enumerate(column_files):
                code = k in self.embeds
                values = column_values(chunk.column(f"_c{k}"), rule, k, embedded=code, edges=self.edges.get(k))
                kinds.setdefault(str(k), ["code", 0] if code else ["value", int(values.shape[1])])
                handle.write(np.ascontiguousarray(values).tobytes())
            written += chunk.num_rows
        if last is not None:
            heads_file.write(np.array([last, count], dtype=np.int64).tobytes())
        return kinds, written


__all__ = ["HashedFile", "PartWriter", "check_refs", "column_values", "io_error", "part_files"]
