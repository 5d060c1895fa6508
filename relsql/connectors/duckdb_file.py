"""A DuckDB database file (`.duckdb` / `.ddb`, or any file with DuckDB's header).

Opened with DuckDB itself, read-only when asked (grounding still works then: relsql's tables
live in the in-memory temp catalog). Keys come from `duckdb_constraints()`. A file locked by
another process, or one that is not a DuckDB database, is a clear SourceError.
"""

from __future__ import annotations

import re
import struct
from pathlib import Path

import duckdb

from relsql.data.duckdb import DuckDBDatabase, DuckDBSource
from relsql.data.engine import Database
from relsql.errors import SourceError

__all__ = ["DuckDBFile", "open_duckdb_file"]


class DuckDBFile(DuckDBSource):
    kind = "duckdb-file"

    def __init__(self, path: Path, *, read_only: bool):
        super().__init__(f"DuckDB file {path}{' (read-only)' if read_only else ''}", read_only=read_only)
        self.path = path


def open_duckdb_file(path: Path, *, read_only: bool = False) -> Database:
    path = Path(path)
    if read_only and not path.exists():
        raise SourceError(f"DuckDB file {path} does not exist; check the path (read_only=True never creates a database)")
    try:
        con = duckdb.connect(str(path), read_only=read_only)
    except duckdb.Error as err:
        raise _explain(path, err, read_only) from None
    source = DuckDBFile(path, read_only=read_only)
    return DuckDBDatabase(con, source.description, source=source)


def written_by(path: Path) -> tuple[int, str] | None:
    """(storage version number, DuckDB library version) from a DuckDB file's main header, None if unreadable.

    The header: an 8-byte checksum, the magic `DUCK`, a little-endian uint64 storage version, four
    uint64 flags, then the writing library's version (e.g. `v2.0.1`) in a 32-byte NUL-padded field.
    """
    try:
        with open(path, "rb") as handle:
            head = handle.read(84)
    except OSError:
        return None
    if len(head) < 84 or head[8:12] != b"DUCK":
        return None
    (number,) = struct.unpack_from("<Q", head, 12)
    library = head[52:84].split(b"\0", 1)[0].decode("ascii", "replace")
    return number, library


def _other_version(path: Path, text: str) -> SourceError:
    """A file in a storage format this duckdb cannot read: say which DuckDB wrote it and the ways out."""
    header = written_by(path)
    detail = f" ({header[1]}, storage version {header[0]})" if header and header[1] else ""
    if "newer version" not in text:
        return SourceError(f"DuckDB file {path} was written by another DuckDB version{detail}, which duckdb "
                           f"{duckdb.__version__} cannot read: {text.splitlines()[0]}; open it once with the DuckDB that "
                           "wrote it and save a copy (EXPORT DATABASE, or COPY FROM DATABASE into a new file), "
                           "then connect the copy")
    upgrade = ("Upgrade with `pip install 'duckdb>=2,<3'` (relsql runs on both; only its PostgreSQL, SQLite and TPC sources "
               "need 1.5.5's extension wheels), or save" if duckdb.__version__.startswith("1.") else "Save")
    return SourceError(f"DuckDB file {path} was written by a newer DuckDB{detail}, which duckdb {duckdb.__version__} cannot "
                       f"read. {upgrade} a copy for this version from the newer DuckDB: ATTACH 'copy.duckdb' AS copy "
                       f"(STORAGE_VERSION 'v{duckdb.__version__}'); COPY FROM DATABASE <db> TO copy, or EXPORT DATABASE "
                       "'folder' (FORMAT parquet), and connect the copy")


def _explain(path: Path, err: duckdb.Error, read_only: bool) -> SourceError:
    text = str(err)
    if re.search(r"database file with (storage )?version number", text):
        return _other_version(path, text)
    if "Could not set lock" in text or "Conflicting lock" in text:
        holder = re.search(r"held in (.*?) \(PID (\d+)\)", text)
        who = f"process {holder.group(2)} ({holder.group(1)})" if holder else "another process"
        return SourceError(f"DuckDB file {path} is locked by {who}: DuckDB allows one writing process per file. "
                           "Close that process's connection, or open the file with read_only=True in every process, "
                           "or work on a copy of the file")
    if "not a valid DuckDB database file" in text or "Unknown file format" in text or "is not a DuckDB" in text:
        return SourceError(f"{path} is not a DuckDB database file; pass a .duckdb file, a .sqlite file, a folder of "
                           "Parquet/CSV files or a postgresql:// URL")
    if "different configuration" in text:
        return SourceError(f"DuckDB file {path} is already open in this process with read_only="
                           f"{not read_only}; close that connection first or connect with the same read_only")
    if "Permission denied" in text or "Read-only file system" in text:
        return SourceError(f"cannot open DuckDB file {path} for writing: {text.splitlines()[0]}; "
                           "connect with read_only=True or fix the file's permissions")
    return SourceError(f"cannot open DuckDB file {path}: {text.splitlines()[0]}")
