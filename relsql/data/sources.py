"""The registry of data sources that `relsql.connect` walks.

Each kind of source (a DuckDB database, a folder of files, SQLite, PostgreSQL, data frames,
Spark) is an `Opener`: a test that says whether it accepts what the user passed, and a function
that opens it as a `relsql.Database`. The connectors package registers relsql's own
(relsql/connectors/__init__.py); relsql.data.duckdb knows neither this registry nor any connector. A new kind of
source is one `register` call. It imports only relsql.errors (and relsql.data.duckdb's name for typing).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from relsql.errors import SourceError

if TYPE_CHECKING:
    from relsql.data.engine import Database


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
