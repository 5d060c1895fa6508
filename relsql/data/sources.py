"""Kinds of data source: `Source`, what one adds to its engine, and the registry `relsql.connect` walks.

`Source` is the engine-neutral base: each engine's sources subclass it (DuckDB's,
`relsql.data.duckdb.DuckDBSource`, which every connector that attaches to DuckDB extends; Spark's,
`relsql.data.spark.SparkSource`). Each kind of source (a DuckDB database, a folder of files, SQLite,
PostgreSQL, data frames, Spark) is also an `Opener`: a test that says whether it accepts what the
user passed, and a function that opens it as a `relsql.Database`. The connectors package registers
relsql's own (relsql/connectors/__init__.py); relsql.data.duckdb knows neither this registry nor any
connector. A new kind of source is one `register` call. It imports only relsql.errors and
relsql.data.catalog (and relsql.data.engine's name for typing).
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from relsql.data.catalog import Keys
from relsql.errors import SourceError

if TYPE_CHECKING:
    import pyarrow as pa

    from relsql.data.engine import Database


class Source(abc.ABC):
    """What a kind of source adds to its engine: the keys it declares, how relsql writes and marks
    a table there (`Database.write_table`, `Database.replaceable`), whether it is read-only."""

    kind = ""  # the catalog's name for the kind of source ("duckdb", "sqlite", "spark", ...)
    keys_origin = ""  # where keys the source declares come from, when not its own catalog ("schema.sql")

    def __init__(self, description: str, *, read_only: bool = False):
        self.description = description
        self.read_only = read_only

    def keys(self, db: Database, scope: tuple[str, str]) -> dict[str, Keys]:
        """{table: Keys} the source declares in `scope`; none unless a subclass reads them."""
        return {}

    def refuse_read_only(self, name: str) -> None:
        if self.read_only:
            raise SourceError(f"cannot write table `{name}`: {self.description} was opened read-only; "
                              "reconnect with relsql.connect(..., read_only=False) to write to it")

    @abc.abstractmethod
    def write_table(self, db: Database, name: str, data: pa.Table, replace: bool) -> None:
        """Write `data` as user table `name`, all of it or nothing, marked as relsql's (called by
        `Database.write_table` inside `Database.writing`, which checked what it replaces)."""

    @abc.abstractmethod
    def written_kind(self, db: Database, scope: tuple[str, str], name: str) -> str | None:
        """The kind relsql marked table `name` with, or None: a table relsql did not write (or an
        older relsql, which set no mark)."""

    def written_kinds(self, db: Database, scope: tuple[str, str]) -> dict[str, str | None] | None:
        """`written_kind` of every table of `scope` at once, tables without a mark left out; None
        (the default) where the marks are read table by table."""
        return None


@dataclass(frozen=True)
class Options:
    """What `relsql.connect` was given besides the source itself."""

    read_only: bool = False
    tables: Mapping[str, Any] | None = None
    memory_limit: str | None = None
    threads: int | None = None
    scratch: str | Path | None = None


@dataclass(frozen=True)
class Opener:
    """One kind of source. `accepts(source)` must be False for what another kind accepts (the
    registry refuses a source two kinds claim)."""

    name: str
    accepts: Callable[[object], bool]
    open: Callable[[Any, Options], Database]


KINDS = ("an in-memory DuckDB (None), a .duckdb file, a folder of Parquet/CSV files, a .sqlite file, "
         "a postgresql:// URL or a dict of data frames")
_OPENERS: dict[str, Opener] = {}


def register(opener: Opener) -> None:
    """Add a kind of source (or replace the one of the same name)."""
    _OPENERS[opener.name] = opener


def opener_for(source: object) -> Opener:
    """The one kind of source that accepts `source`; a SourceError naming what can be passed."""
    found = [o for o in _OPENERS.values() if o.accepts(source)]
    if len(found) > 1:
        raise SourceError(f"a {type(source).__name__} is claimed by several kinds of source "
                          f"({', '.join(o.name for o in found)}); pass one unambiguously: {KINDS}")
    if not found:
        raise SourceError(f"cannot connect to a {type(source).__name__}: pass {KINDS}")
    return found[0]
