"""A path given to `relsql.connect`: a RelBench dataset folder, a folder of Parquet/CSV files, a SQLite file or a DuckDB file
(created when the path is new and ends in .duckdb)."""

from __future__ import annotations

from pathlib import Path

from relsql.connectors import duckdb_file, files, relbench, sqlite
from relsql.data.duckdb import SQLITE_MAGIC
from relsql.data.engine import Database
from relsql.data.sources import KINDS
from relsql.errors import SourceError

DUCKDB_SUFFIXES = (".duckdb", ".ddb")
SQLITE_SUFFIXES = (".sqlite", ".sqlite3", ".db")


def sniff(path: Path) -> str | None:
    """"sqlite" or "duckdb" from a file's first bytes, else None."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(16)
    except OSError as err:
        raise SourceError(f"cannot read {path}: {err.strerror}; check the path and its permissions") from None
    if head.startswith(SQLITE_MAGIC):
        return "sqlite"
    if head[8:12] == b"DUCK":
        return "duckdb"
    return None


def open_path(path: Path, read_only: bool) -> Database:
    """A folder of files, a SQLite or DuckDB file (told apart by their first bytes, else the suffix),
    or a new DuckDB file for a path ending in .duckdb."""
    suffix = path.suffix.lower()
    if path.is_dir():
        if relbench.is_relbench_folder(path):  # a RelBench dataset: keys and tasks from its manifests
            return relbench.open_relbench_folder(path, read_only=read_only)
        return files.open_folder(path, read_only=read_only)
    if path.exists():
        if not path.is_file():
            raise SourceError(f"{path} is neither a file nor a folder; pass {KINDS}")
        kind = sniff(path) or ("duckdb" if suffix in DUCKDB_SUFFIXES else "sqlite" if suffix in SQLITE_SUFFIXES else None)
        if kind == "sqlite":
            return sqlite.open_sqlite(path, read_only=read_only)
        if kind == "duckdb":
            return duckdb_file.open_duckdb_file(path, read_only=read_only)
        if suffix in (".parquet", ".csv"):
            raise SourceError(f"{path} is a single {suffix[1:]} file; connect to its folder ({path.parent}) to use every "
                              "Parquet/CSV file in it as a table")
        raise SourceError(f"{path} is not a database relsql can open (neither DuckDB nor SQLite); pass {KINDS}")
    if suffix in DUCKDB_SUFFIXES and not read_only:
        if not path.parent.is_dir():
            raise SourceError(f"cannot create DuckDB file {path}: folder {path.parent} does not exist; create it first")
        return duckdb_file.open_duckdb_file(path, read_only=False)
    raise SourceError(f"{path} does not exist; check the path (a new DuckDB database is created only for a "
                      f"path ending in .duckdb opened with read_only=False)")
