"""A database handle: one DuckDB connection plus the little catalog knowledge relsql needs.

DuckDB is the engine for every source; other sources are attached or registered into it by
the connectors. relsql's own tables (key tables, groundings, dictionaries) live in DuckDB's
`temp` catalog under a `__relsql_` prefix, so the user's tables are never touched.
"""

from __future__ import annotations

import itertools
import warnings
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import sqlglot.expressions as exp
import torch

from relsql.errors import SchemaError, SourceError

TEMP_PREFIX = "__relsql_"
_session = itertools.count()


class Database:
    """Wraps a DuckDB connection; see `relsql.connect`."""

    def __init__(self, con: duckdb.DuckDBPyConnection, description: str = "in-memory DuckDB"):
        self.con = con
        self.description = description
        self._prefix = f"{TEMP_PREFIX}{next(_session)}_"

    def __repr__(self) -> str:
        return f"relsql.Database({self.description})"

    def sql(self, query: exp.Expression | str) -> str:
        return query if isinstance(query, str) else query.sql("duckdb")

    def execute(self, query: exp.Expression | str) -> None:
        self.con.execute(self.sql(query))

    def arrow(self, query: exp.Expression | str) -> pa.Table:
        """Run a query and return its result as an Arrow table."""
        result = self.con.execute(self.sql(query))
        return result.to_arrow_table() if hasattr(result, "to_arrow_table") else result.fetch_arrow_table()

    def temp_table(self, kind: str, name: str) -> exp.Table:
        """A table in DuckDB's temp catalog, unique to this handle, for relsql's own data."""
        return exp.Table(
            this=exp.to_identifier(f"{self._prefix}{kind}_{name}", quoted=True),
            db=exp.to_identifier("main", quoted=True),
            catalog=exp.to_identifier("temp", quoted=True),
        )

    def tables(self) -> list[str]:
        rows = self.con.execute(
            "SELECT table_name FROM information_schema.tables "
            "WHERE table_catalog <> 'temp' AND table_catalog NOT LIKE 'system%' ORDER BY table_name"
        ).fetchall()
        return [r[0] for r in rows]

    def columns(self, table: str) -> list[tuple[str, str]]:
        """(name, type) of a user table's columns in order; a SchemaError if it is missing."""
        rows = self.con.execute(
            "SELECT column_name, data_type FROM information_schema.columns "
            "WHERE table_name = ? AND table_catalog <> 'temp' ORDER BY ordinal_position",
            [table],
        ).fetchall()
        if not rows:
            raise SchemaError(f"table `{table}` does not exist in {self.description}; known tables: {', '.join(self.tables()) or 'none'}")
        return [(r[0], r[1]) for r in rows]

    def has_table(self, table: str) -> bool:
        return table in self.tables()

    def write_table(self, name: str, data: pa.Table, *, replace: bool = False) -> None:
        """Write `data` as a new user table, atomically: all of it or nothing.

        An existing table of that name is refused unless `replace`. Sources other than DuckDB
        override this (a folder of files writes a Parquet file by rename, attached databases
        write inside a transaction).
        """
        if not replace and self.has_table(name):
            raise SchemaError(f"table `{name}` already exists in {self.description}; choose another name or pass replace=True")
        view = f"{self._prefix}write_{next(_session)}"
        self.con.register(view, data)
        try:
            self.con.execute("BEGIN TRANSACTION")
            try:
                self.execute(exp.Create(
                    this=exp.Table(this=exp.to_identifier(name, quoted=True)), kind="TABLE", replace=replace,
                    expression=exp.select(exp.Star()).from_(exp.Table(this=exp.to_identifier(view, quoted=True)))))
                self.con.execute("COMMIT")
            except BaseException:
                self.con.execute("ROLLBACK")
                raise
        except duckdb.Error as err:
            raise SourceError(f"could not write table `{name}` to {self.description}: {err}") from None
        finally:
            self.con.unregister(view)


def connect(source: str | Path | duckdb.DuckDBPyConnection | None = None, *, read_only: bool = False) -> Database:
    """Open a database: in-memory DuckDB by default, a `.duckdb` file, or an existing connection."""
    if source is None or source == ":memory:":
        return Database(duckdb.connect(), "in-memory DuckDB")
    if isinstance(source, duckdb.DuckDBPyConnection):
        return Database(source, "DuckDB connection")
    path = Path(source)
    try:
        return Database(duckdb.connect(str(path), read_only=read_only), f"DuckDB file {path}")
    except duckdb.Error as err:
        raise SourceError(f"cannot open DuckDB file {path}: {err}") from None


def to_tensor(column: pa.ChunkedArray | pa.Array, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Arrow column → torch tensor, zero-copy for single-chunk numeric columns without NULLs."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    array = column.to_numpy(zero_copy_only=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # read-only numpy buffers: never written to
        tensor = torch.from_numpy(np.asarray(array))
    return tensor if dtype is None else tensor.to(dtype)
