"""One transaction around a dataset loader's table creation (NeuraLogic files, TU graphs): all tables or none."""

from __future__ import annotations

import contextlib

import duckdb

from relsql.errors import SourceError


@contextlib.contextmanager
def atomic(con: duckdb.DuckDBPyConnection, current: list[str]):
    """Commit on success, roll back on any failure; inside a caller's open transaction the
    caller decides. DuckDB errors become SourceErrors naming `current[0]`, the table in progress."""
    try:
        con.begin()
        own = True
    except duckdb.TransactionException:
        own = False  # inside the caller's transaction: the caller rolls back
    try:
        yield
        if own:
            con.commit()
    except BaseException as err:
        if own:
            con.rollback()
        if isinstance(err, duckdb.Error):
            raise SourceError(f"could not create table {current[0]!r}: {err}") from err
        raise
