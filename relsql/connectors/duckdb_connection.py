"""DuckDB without a file of relsql's choosing: a new in-memory database, or the user's own open
connection (used through a cursor of its own)."""

from __future__ import annotations

import duckdb
import sqlglot.expressions as exp

from relsql.data.duckdb import DuckDBDatabase
from relsql.data.engine import Database, first_line, ident
from relsql.errors import SourceError


def is_memory(source: object) -> bool:
    """None or ":memory:"."""
    return source is None or (isinstance(source, str) and source == ":memory:")


def open_memory() -> Database:
    return DuckDBDatabase.in_memory()


def open_connection(con: duckdb.DuckDBPyConnection) -> Database:
    """A user's connection, used through a cursor: a statement of relsql that fails (a grounding
    error, say) must not abort the user's transaction and lose their uncommitted rows."""
    try:
        cursor = con.cursor()
    except duckdb.ConnectionException as err:
        raise SourceError(f"the DuckDB connection cannot be used: {first_line(err)}; pass an open connection") from None
    follow_scope(con, cursor)
    return DuckDBDatabase(cursor, "DuckDB connection")


def follow_scope(con: duckdb.DuckDBPyConnection, cursor: duckdb.DuckDBPyConnection) -> None:
    """The cursor starts in the database's default catalog; the user's connection may have moved
    (`ATTACH ... ; USE src`): relsql's default scope is theirs. Read through a relation, which
    leaves the connection's pending result alone (fetchall: duckdb 2's relations have no fetchone);
    an aborted transaction of theirs, or an unread result that duckdb 2 guards, keeps the default."""
    try:
        current = con.sql("SELECT current_database(), current_schema()").fetchall()[0]
    except duckdb.Error as err:
        if "unfinished result" in str(err) and not _only_scope(cursor):  # duckdb 2: asking would cost their unread rows
            cursor.close()
            raise SourceError("the DuckDB connection has an unread result from execute(), and duckdb "
                              f"{duckdb.__version__} runs nothing else on it until that is read to its end or let go: "
                              "fetch the rest (fetchall()) or call con.abort() before relsql.connect(con), or open "
                              "another connection for the query") from None
        return
    try:
        cursor.execute(exp.Use(this=exp.Table(this=ident(current[1]), db=ident(current[0]))).sql("duckdb"))
    except duckdb.Error as err:
        cursor.close()
        raise SourceError(f"cannot use the connection's current schema {current[0]}.{current[1]}: {first_line(err)}") from None


def _only_scope(cursor: duckdb.DuckDBPyConnection) -> bool:
    """Whether the database has one user schema, so the connection's current scope can only be the
    cursor's (asked through the cursor, which leaves the user's connection alone)."""
    schemas = cursor.execute("SELECT database_name, schema_name FROM duckdb_schemas() WHERE database_name IN "
                             "(SELECT database_name FROM duckdb_databases() WHERE NOT internal) "
                             "AND schema_name NOT IN ('information_schema', 'pg_catalog')").fetchall()
    return len(schemas) == 1
