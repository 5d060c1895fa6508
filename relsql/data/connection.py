"""`relsql.connect`: the top of the data layer. It imports the connectors package (which
registers relsql's kinds of source in relsql.data.sources) and walks that registry; nothing below
it imports a connector."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import duckdb

import relsql.connectors  # noqa: F401  (its import registers relsql's kinds of source)
from relsql.connectors import frames
from relsql.data.duckdb import DuckDBDatabase, set_flush_threshold, set_memory_limit, set_threads, start_on_half_the_cores
from relsql.data.engine import Database
from relsql.data.keyfile import attach
from relsql.data.sources import Options, opener_for

__all__ = ["connect"]


def connect(source: str | Path | duckdb.DuckDBPyConnection | Mapping[str, Any] | None = None, *,
            read_only: bool = False, tables: Mapping[str, Any] | None = None,
            memory_limit: str | None = None, keys: Any = None, threads: int | None = None,
            scratch: str | Path | None = None) -> Database:
    """Open a data source as a `Database` whose engine is DuckDB, or Spark for a SparkSession.

    `source`: None or ":memory:" (in-memory DuckDB), an open `duckdb.DuckDBPyConnection` (relsql
    works in a connection of its own to that database, `con.cursor()`: it sees what is committed,
    never joins or aborts your open transaction, and closing relsql's handle leaves yours open), a
    `.duckdb`/`.ddb` path (created if missing unless read_only), a folder of `*.parquet` /
    `*.csv` files (one table per file, named after its stem), a `.sqlite`/`.sqlite3`/`.db` file,
    a `postgresql://` URL, or a dict of table name -> polars/pandas/pyarrow frame. A
    `pyspark.sql.SparkSession`, a `spark://` master URL or an `sc://` Spark Connect URL makes Spark
    the engine (relsql/data/spark.py; `scratch`: a folder every executor can read for relsql's own
    tables and results, default a local temporary folder).
    `read_only`: open the source so that nothing can write to it (grounding still works: its
    temporary tables live in DuckDB's in-memory temp catalog). `tables`: extra frames registered
    as tables beside the source (kept in memory, never written into the source).
    `threads` sets DuckDB's worker threads (default: half the cores for a DuckDB instance relsql
    opens, as relsql's training keeps torch to the other half, see relsql/train/learner/threads.py;
    an open connection you pass keeps its own count, which relsql changes to half the cores only
    inside its calls and puts back). `memory_limit` (e.g. "1GB") caps
    DuckDB's memory; beyond it DuckDB spills to disk, so a database larger than memory trained in
    mini-batches keeps a bounded footprint.
    `keys`: primary and foreign keys stated outside the database (a keys file's path,
    its text, or a list of tuples; see relsql/data/keyfile.py), added to the declared ones (a given
    key over a declared key's columns replaces it) and used instead of inferred ones for the tables
    they name; only read, checked against the tables
    now, and never executed against the database.
    """
    options = Options(read_only=read_only, tables=tables, memory_limit=memory_limit, threads=threads, scratch=scratch)
    db = opener_for(source).open(source, options)
    if isinstance(db, DuckDBDatabase) and not isinstance(source, duckdb.DuckDBPyConnection):
        set_flush_threshold(db)  # a database instance relsql opened: its settings are relsql's to choose
        if threads is None:
            start_on_half_the_cores(db)
    if tables:
        frames.add_frames(db, tables)
    if memory_limit is not None:
        set_memory_limit(db, memory_limit)
    if threads is not None:
        set_threads(db, threads)
    if keys is not None:
        attach(db, keys)
    return db
