"""Data frames as tables: a dict of name -> polars / pandas / pyarrow frame.

`relsql.connect({"node": df, "edge": edges})` copies every frame into a real table of an
in-memory DuckDB (so row counts and later keys work, and the frame may change afterwards);
`relsql.connect(source, tables={...})` puts frames beside another source, in a separate
in-memory catalog on DuckDB's search path, never into the source itself.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any

import duckdb
import sqlglot.expressions as exp

from relsql.data.duckdb import DuckDBDatabase, DuckDBSource, qualified
from relsql.data.engine import TEMP_PREFIX, Database, first_line, ident, to_arrow
from relsql.errors import SchemaError, SourceError

__all__ = ["FRAMES_SCOPE", "Frames", "add_frames", "open_frames"]

FRAMES_SCOPE = ("temp", "main")
_counter = itertools.count()


class Frames(DuckDBSource):
    kind = "frames"


def _copy_in(db: Database, frames: Mapping[str, Any], scope: tuple[str, str] | None, temporary: bool = False) -> None:
    for name, frame in frames.items():
        if not isinstance(name, str) or not name or name.startswith(TEMP_PREFIX):
            raise SchemaError(f"table name {name!r} is not usable: give a non-empty string not starting with {TEMP_PREFIX}")
        data = to_arrow(frame, name)
        view = f"{db._prefix}frame_{next(_counter)}"
        db.register(view, data)  # the Database's verb: duckdb 2 needs an unread result dropped first
        try:
            db.execute(exp.Create(this=qualified(name, scope), kind="TABLE",
                                  properties=exp.Properties(expressions=[exp.TemporaryProperty()]) if temporary else None,
                                  expression=exp.select(exp.Star()).from_(exp.Table(this=ident(view)))))
        except duckdb.Error as err:
            raise SourceError(f"cannot register the data for table `{name}`: {first_line(err)}") from None
        finally:
            db.unregister(view)


def open_frames(frames: Mapping[str, Any]) -> Database:
    source = Frames(f"in-memory DuckDB with {len(frames)} data frame{'s' if len(frames) != 1 else ''}")
    db = DuckDBDatabase(duckdb.connect(), source.description, source=source)
    try:
        _copy_in(db, frames, None)
    except BaseException:
        db.con.close()
        raise
    return db


def add_frames(db: Database, frames: Mapping[str, Any]) -> None:
    """Register frames beside `db`'s source: in its catalog if that is an in-memory DuckDB, else as
    temporary tables of this connection (DuckDB's in-memory `temp` catalog, always on the search
    path, writable even when the source is read-only), never in the source itself."""
    if isinstance(db.source, Frames) or db.source.kind == "duckdb" and db.scopes()[0][0] == "memory":
        _copy_in(db, frames, None)
        return
    clashes = sorted(set(frames) & set(db.tables()))
    if clashes:
        raise SchemaError(f"frames {', '.join(clashes)} have the names of tables of {db.description}; rename them")
    if FRAMES_SCOPE not in db._extra_scopes:
        db._extra_scopes.append(FRAMES_SCOPE)
    _copy_in(db, frames, FRAMES_SCOPE, temporary=True)
    db.description += f" + {len(frames)} data frame{'s' if len(frames) != 1 else ''}"
