"""relsql's own kinds of source, registered with relsql.data.sources on import (relsql.data.connection,
where `relsql.connect` lives, imports this package): an in-memory DuckDB, an open DuckDB
connection, frames, Spark, PostgreSQL, and paths (a folder of files, SQLite, DuckDB)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import duckdb

from relsql.connectors import duckdb_connection, frames, paths, postgres
from relsql.data.engine import Database
from relsql.data.sources import Opener, Options, register
from relsql.errors import SourceError


def is_spark(source: object) -> bool:
    """A SparkSession, a spark:// master URL or an sc:// Spark Connect URL."""
    if isinstance(source, str):
        return source.startswith(("spark://", "sc://"))
    return type(source).__module__.startswith("pyspark.") and type(source).__name__ == "SparkSession"


def _open_spark(source: Any, options: Options) -> Database:
    from relsql.data.spark import open_spark  # Spark's layer, loaded only for a Spark source

    if options.tables or options.memory_limit is not None or options.threads is not None:
        raise SourceError("tables=, memory_limit= and threads= are DuckDB's settings; give Spark its own in the session")
    return open_spark(source, options.scratch, options.read_only)


def _is_path(source: object) -> bool:
    if isinstance(source, str):
        return not duckdb_connection.is_memory(source) and not is_spark(source) and not postgres.is_url(source)
    return isinstance(source, os.PathLike)


register(Opener("memory", duckdb_connection.is_memory, lambda source, options: duckdb_connection.open_memory()))
register(Opener("duckdb-connection", lambda source: isinstance(source, duckdb.DuckDBPyConnection),
                lambda source, options: duckdb_connection.open_connection(source)))
register(Opener("frames", lambda source: isinstance(source, Mapping), lambda source, options: frames.open_frames(source)))
register(Opener("spark", is_spark, _open_spark))
register(Opener("postgres", lambda source: isinstance(source, str) and postgres.is_url(source),
                lambda source, options: postgres.open_postgres(source, read_only=options.read_only)))
register(Opener("path", _is_path, lambda source, options: paths.open_path(Path(source), options.read_only)))
