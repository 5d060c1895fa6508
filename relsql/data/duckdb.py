"""A database handle: one DuckDB connection plus the little catalog knowledge relsql needs.

DuckDB is the engine for every source; other sources are attached or registered into it by
the connectors (`relsql/connectors/`: a DuckDB file, a folder of Parquet/CSV files, SQLite,
PostgreSQL, data frames). The attached source is made DuckDB's default catalog, so templates
name its tables without a prefix. relsql's own tables (key tables, groundings, dictionaries)
live in DuckDB's `temp` catalog under a `__relsql_` prefix, so the user's tables are never
touched, and `tables()`/`columns()` list only the user's tables of the source.
"""

from __future__ import annotations

import contextlib
import json
import re
from pathlib import Path

import duckdb
import pyarrow as pa
import sqlglot.expressions as exp

from relsql import cores
from relsql.data.catalog import Catalog, Column, Keys, Table, duckdb_keys, scoped_table
from relsql.data.engine import (
    MARK_KEY,
    TEMP_PREFIX,
    WRITTEN_BY,
    Database,
    Engine,
    first_line,
    handle_numbers,
    ident,
    marked_kind,
)
from relsql.data.sources import Source
from relsql.errors import SchemaError, SourceError
from relsql.sql import bound, integer, row_counts

# duckdb 2 reads a query's Arrow output through a relation (`con.sql`; through execute() it warns of an
# extra copy) and refuses other work on a connection whose execute() result is unread (see drop_result)
DUCKDB2 = int(duckdb.__version__.split(".")[0]) >= 2


# The tables and views of one (catalog, schema) (placeholders :catalog, :schema; relsql.sql.bound): what
# information_schema.tables holds, read from the two functions that view unions (DuckDB 1.5's
# definition); the view itself cost 78 ms CPU a query on Lahman's file against 3 ms for this, and
# relsql asks for the tables dozens of times in a Model's construction.
RELATIONS = ("SELECT table_name, CASE WHEN temporary THEN 'LOCAL TEMPORARY' ELSE 'BASE TABLE' END AS table_type "
             "FROM duckdb_tables() WHERE database_name = :catalog AND schema_name = :schema "
             "UNION ALL SELECT view_name, 'VIEW' FROM duckdb_views() WHERE database_name = :catalog AND schema_name = :schema")

ELSEWHERE = ("SELECT database_name, schema_name FROM duckdb_tables() WHERE NOT temporary AND lower(table_name) = lower(:name) "
             "UNION SELECT database_name, schema_name FROM duckdb_views() WHERE NOT internal AND NOT temporary "
             "AND lower(view_name) = lower(:name) ORDER BY 1, 2")


def qualified(name: str, scope: tuple[str, str] | None = None) -> exp.Table:
    """`"catalog"."schema"."name"` (or just `"name"`), quoted, for a table in a scope."""
    if scope is None:
        return exp.Table(this=ident(name))
    return exp.Table(this=ident(name), db=ident(scope[1]), catalog=ident(scope[0]))


def fetch_arrow(con: duckdb.DuckDBPyConnection, sql: str) -> pa.Table:
    """A query's rows as one Arrow table, without the extra copy duckdb 2 warns of on an execute() result."""
    if DUCKDB2:
        drop_result(con)
        return con.sql(sql).to_arrow_table()
    result = con.execute(sql)
    return result.to_arrow_table() if hasattr(result, "to_arrow_table") else result.fetch_arrow_table()


def arrow_reader(con: duckdb.DuckDBPyConnection, sql: str, chunk: int) -> pa.RecordBatchReader:
    """A query's rows streamed in Arrow record batches of about `chunk` rows (see fetch_arrow)."""
    if DUCKDB2:
        drop_result(con)
        return con.sql(sql).to_arrow_reader(chunk)
    return con.execute(sql).to_arrow_reader(chunk)


def drop_result(con: duckdb.DuckDBPyConnection) -> None:
    """Let go of the unread rest of a read query's execute() result (`execute(q).fetchone()` leaves
    one). duckdb 1.5 dropped it at the connection's next call; duckdb 2 refuses register(), sql()
    and the like until it is gone. relsql never reads such a result after another call, and
    statements (DDL, INSERT, CREATE ... AS) have run to their end at execute(): nothing is lost."""
    if DUCKDB2:
        con.abort()


_LOST = ("server closed the connection", "unable to connect", "connection refused", "terminating connection",
         "could not connect", "no connection to the server", "connection to server", "ssl syscall error",
         "could not receive data from server", "could not send data to server")


def _without_secrets(text: str) -> str:
    """An error text without the password a connection string in it may hold."""
    text = re.sub(r"(://[^:/@\s]+):[^@\s]*@", r"\1:***@", text)
    return re.sub(r"(password\s*=\s*)\S+", r"\1***", text, flags=re.IGNORECASE)


def lost_connection(description: str, err: BaseException) -> SourceError | None:
    """A SourceError naming the source when `err` says its server cannot be reached (a PostgreSQL
    server stopped mid-training), else None: the caller re-raises what it has."""
    if not any(lost in str(err).lower() for lost in _LOST):
        return None
    return SourceError(f"{description} could not be reached: {_without_secrets(first_line(err))}. The server stopped or the "
                       "connection was lost: start the server (or check the network) and run again; a Model built with a "
                       "kept grounding store (store='folder') trains and predicts from it without the server")


def interrupted_query(err: BaseException) -> bool:
    """Whether `err` is DuckDB's answer to Ctrl-C: its Python client turns SIGINT during a query
    into RuntimeError('Query interrupted'), and `con.interrupt()` into an InterruptException."""
    return isinstance(err, duckdb.InterruptException) or (
        type(err) is RuntimeError and str(err).strip() == "Query interrupted")


# Plan operators whose output is bounded only by the product of their inputs' (joins without an
# equality condition, for which DuckDB's own estimate is absent or far too low).
_PRODUCT_JOINS = frozenset({"CROSS_PRODUCT", "NESTED_LOOP_JOIN", "BLOCKWISE_NL_JOIN", "PIECEWISE_MERGE_JOIN", "IE_JOIN"})


def duckdb_plan_rows(con: duckdb.DuckDBPyConnection, sql: str) -> int | None:
    """The largest row count of any operator in DuckDB's plan of `sql` (its EXPLAIN, well under a
    millisecond: nothing runs). A join without an equality condition counts as the product of its
    inputs (DuckDB gives none, or far too few for an inequality join). None: no estimate."""
    try:
        rows = con.execute("EXPLAIN (FORMAT JSON) " + sql).fetchall()  # `sql` is sqlglot's, never user text
        plans = json.loads(rows[0][1]) if rows else []
    except duckdb.Error as err:
        if interrupted_query(err):
            raise
        return None  # the query itself will fail with a message naming the rule
    except (ValueError, IndexError, TypeError):
        return None
    peaks = [_plan_rows(plan)[1] for plan in plans if isinstance(plan, dict)]
    known = [p for p in peaks if p is not None]
    return max(known) if known else None


def _plan_rows(node: dict) -> tuple[int | None, int | None]:
    """(estimated output rows, largest estimate in the subtree) of one plan operator."""
    children = [_plan_rows(c) for c in node.get("children", []) if isinstance(c, dict)]
    text = (str((node.get("extra_info") or {}).get("Estimated Cardinality", ""))
            if isinstance(node.get("extra_info"), dict) else "")
    digits = re.sub(r"[^0-9]", "", text)
    rows = int(digits) if digits else None
    if node.get("name") in _PRODUCT_JOINS and children and all(out is not None for out, _ in children):
        product = 1
        for out, _ in children:
            product *= out
        rows = max(rows or 0, product)
    elif rows is None and len(children) == 1:
        rows = children[0][0]  # a pass-through operator
    peaks = [p for p in (rows, *(peak for _, peak in children)) if p is not None]
    return rows, max(peaks) if peaks else None


def _native_tables() -> exp.Select:
    """(lower-cased name, tables and views of that name, whether it is one base table in DuckDB's
    own storage, not temporary) per name in every catalog; relsql's own temp tables included."""
    tables = exp.select(
        exp.alias_(exp.column("table_name", "t"), "name"),
        exp.alias_(exp.and_(exp.not_(exp.column("temporary", "t")),
                            exp.EQ(this=exp.column("type", "d"), expression=exp.Literal.string("duckdb"))), "native"),
    ).from_(_catalog_function("duckdb_tables", "t")).join(
        _catalog_function("duckdb_databases", "d"),
        on=exp.EQ(this=exp.column("database_name", "d"), expression=exp.column("database_name", "t")))
    views = exp.select(exp.alias_(exp.column("view_name"), "name"), exp.alias_(exp.false(), "native")).from_(
        exp.func("duckdb_views")).where(exp.not_(exp.column("internal")))
    both = exp.alias_(exp.Subquery(this=exp.union(tables, views, distinct=False)), "o", table=True)
    name = exp.Lower(this=exp.column("name"))
    return exp.select(name, exp.Count(this=exp.Star()), exp.func("bool_and", exp.column("native"))).from_(both).group_by(name)


def _catalog_function(name: str, alias: str) -> exp.Table:
    return exp.Table(this=exp.func(name), alias=exp.TableAlias(this=ident(alias)))


def free_name(name: str, taken: set[str]) -> str:
    """`name`, or `name_1`, `name_2`, ... if a column (compared case-insensitively) has it; marks it taken."""
    found, n = name, 0
    while found.casefold() in taken:
        n += 1
        found = f"{name}_{n}"
    taken.add(found.casefold())
    return found


def parquet_mark(path: Path) -> str | None:
    """The kind of relsql's mark in a Parquet file's footer; None for any other file (a CSV, a
    user's Parquet file, one that cannot be read)."""
    if Path(path).suffix.lower() != ".parquet":
        return None
    import pyarrow.parquet as pq

    try:
        metadata = pq.read_schema(path).metadata or {}
    except (OSError, pa.ArrowException):
        return None
    return marked_kind(metadata.get(MARK_KEY, b"").decode("utf-8", "replace"))


class DuckDBSource(Source):
    """What a kind of source adds to plain DuckDB: its keys, how it writes, how it closes.

    This class is a native DuckDB database (in memory, a file, or frames copied into DuckDB
    tables): keys come from `duckdb_constraints()`, writes run in a transaction. The connectors
    subclass it for what they attach to DuckDB.
    """

    kind = "duckdb"

    def keys(self, db: Database, scope: tuple[str, str]) -> dict[str, Keys]:
        return duckdb_keys(db.con, scope)

    def write_table(self, db: Database, name: str, data: pa.Table, replace: bool) -> None:
        """All of it or nothing, inside one transaction of the source's default catalog, which also
        checks what it replaces and marks the new table (`Database.writing`, set by `Database.write_table`)."""
        self.refuse_read_only(name)
        view = f"{db._prefix}write_{next(handle_numbers)}"
        db.register(view, data)
        try:
            with contextlib.ExitStack() as stack:
                existing = db._writing[3] if db._writing else stack.enter_context(db.writing(name, "table", replace))
                scope = db.scopes()[0]
                drop = [exp.Drop(tables=[qualified(existing, scope)], kind="TABLE")] if existing else []
                db.transaction([*drop, exp.Create(this=qualified(name, scope), kind="TABLE",
                                                  expression=exp.select(exp.Star()).from_(exp.Table(this=ident(view))))])
        except duckdb.Error as err:
            raise SourceError(f"could not write table `{name}` to {db.description} (nothing was written): "
                              f"{first_line(err)}") from None
        finally:
            db.unregister(view)

    def mark(self, db: Database, scope: tuple[str, str], name: str, kind: str) -> None:
        """Mark table `name` (just created, in the open transaction) as relsql's `kind`: a table
        comment, which DuckDB keeps with the table and drops with it."""
        db.execute(exp.Comment(this=qualified(name, scope), kind="TABLE", expression=exp.Literal.string(WRITTEN_BY + kind)))

    def written_kind(self, db: Database, scope: tuple[str, str], name: str) -> str | None:
        """The kind relsql marked table `name` with, or None: a table relsql did not write (or an
        older relsql, which set no mark)."""
        row = db.con.execute(bound("SELECT comment FROM duckdb_tables() WHERE database_name = :catalog "
                                   "AND schema_name = :schema AND table_name = :name",
                                   catalog=scope[0], schema=scope[1], name=name)).fetchone()
        return marked_kind(row[0] if row else None)

    def written_kinds(self, db: Database, scope: tuple[str, str]) -> dict[str, str | None] | None:
        """`written_kind` of every table of `scope` in one catalog query (key discovery asks for each
        table's), tables without a mark left out; None where a source reads its marks its own way."""
        if type(self).written_kind is not DuckDBSource.written_kind:
            return None
        rows = db.con.execute(bound("SELECT table_name, comment FROM duckdb_tables() WHERE database_name = :catalog "
                                    "AND schema_name = :schema", catalog=scope[0], schema=scope[1])).fetchall()
        return {name: kind for name, comment in rows if (kind := marked_kind(comment)) is not None}

    def after_rollback(self, db: Database) -> None:
        """Hook: drop catalog caches that a rolled-back transaction left stale."""

    def close(self, db: Database) -> None:
        """Hook: release what the source holds besides the DuckDB connection."""


class DuckDBDatabase(Engine):
    """The DuckDB engine: one DuckDB connection, and the source attached to it; see `relsql.connect`."""

    transactional = True
    key_catalog = True
    watch_interrupts = True  # DuckDB's client looks for Ctrl-C only between the tasks the calling thread runs

    def __init__(self, con: duckdb.DuckDBPyConnection, description: str = "in-memory DuckDB", *,
                 source: DuckDBSource | None = None):
        super().__init__(description, source or DuckDBSource(description))
        self.con = con
        self._extra_scopes: list[tuple[str, str]] = []  # frames registered beside another source

    @classmethod
    def in_memory(cls) -> DuckDBDatabase:
        """A new in-memory DuckDB: `relsql.connect()`'s, for modules below the connection layer."""
        return cls(duckdb.connect(), "in-memory DuckDB", source=DuckDBSource("in-memory DuckDB", read_only=False))

    def close(self) -> None:
        try:
            self.source.close(self)
        finally:
            self.con.close()

    def sql(self, query: exp.Expression | str) -> str:
        """DuckDB's text of `query`, written without a defensive copy of the tree (as `run` does): the
        copy was a tenth of a small database's Model construction, and writing DuckDB's dialect leaves
        relsql's trees as they were (tests/test_duckdb_sql_text.py; the fast suite and 28 outside
        constructions wrote every statement alike with and without the copy)."""
        return query if isinstance(query, str) else query.sql("duckdb", copy=False)

    def execute(self, query: exp.Expression | str) -> None:
        self.con.execute(self.sql(query))

    def create_table_as(self, name: str, query: exp.Query, replace: bool, kind: str = "table") -> None:
        """A new table `name` (in the default scope) holding `query`'s rows, marked as relsql's
        `kind`, atomically; with `replace`, an existing one that relsql wrote as `kind` goes in the
        same step (any other existing table is refused)."""
        with self.writing(name, kind, replace) as existing:
            scope = self.scopes()[0]
            drop = [exp.Drop(tables=[qualified(existing, scope)], kind="TABLE")] if existing else []
            self.transaction([*drop, exp.Create(this=qualified(name, scope), kind="TABLE", expression=query)])


    def transaction(self, statements: list[exp.Expression]) -> None:
        """Run `statements` as one transaction: all of them or, on any error or interrupt, none.
        Inside `writing`, the table written is checked and marked in this same transaction."""
        writing = getattr(self, "_writing", None)
        self.con.execute("BEGIN TRANSACTION")
        try:
            if writing is not None:
                name, kind, replace, existing = writing
                if self.replaceable(name, replace, kind) != existing:
                    raise SchemaError(f"table `{name}` changed in {self.description} while relsql wrote it; nothing was written")
            for statement in statements:
                self.execute(statement)
            if writing is not None:
                self.source.mark(self, self.scopes()[0], name, kind)
            self.con.execute("COMMIT")
        except BaseException:
            self.con.execute("ROLLBACK")
            self.source.after_rollback(self)
            raise

    def arrow(self, query: exp.Expression | str) -> pa.Table:
        """Run a query and return its result as an Arrow table."""
        return fetch_arrow(self.con, self.sql(query))

    def run(self, statement: exp.Expression) -> pa.Table | int | None:
        """A query's rows as Arrow, else the count the engine reports (rows a CREATE ... AS wrote).
        `statement` is used up: SQL is generated from it in place (sqlglot's defensive copy was a
        fifth of grounding's time)."""
        sql = statement.sql("duckdb", copy=False)
        if isinstance(statement, exp.Query):
            return self.arrow(sql)
        rows = self.con.execute(sql).fetchall()  # all (one row at most): duckdb 2 holds an unread result open
        return rows[0][0] if rows else None

    def create_key_table(self, target: exp.Table, distinct: exp.Query, keys: list[str]) -> None:
        """Temp table `target`: the rows of `distinct` (distinct values of `keys`, at least one)
        and `_rid` (BIGINT) numbering them 0..n-1 in key order, ascending with NULLs first. A verb
        of its own because one window over all rows is fine here but one partition on a cluster."""
        from relsql import sql as q

        self.run(q.create_temp(target, q.numbered_keys(distinct, keys)))

    def scalar(self, query: exp.Expression) -> tuple:
        """Run a query and return its first row."""
        row = self.con.execute(self.sql(query)).fetchone()
        drop_result(self.con)
        return row

    def reader(self, query: exp.Expression, chunk: int) -> pa.RecordBatchReader:
        """Run a query and stream its result in Arrow record batches of about `chunk` rows, in order."""
        return arrow_reader(self.con, self.sql(query), chunk)

    def add_codes(self, dictionary: exp.Table, source: exp.Expression, column: str) -> None:
        """Append to `dictionary` (value, code) the values of `column` it lacks, with the next free
        codes in value order (NULLs first). A verb because it numbers rows (see create_key_table)."""
        from relsql import sql as q

        self.run(q.dictionary_insert(dictionary, source, column))

    def write_ordered(self, query: exp.Expression, write, chunk: int) -> list[dict]:
        """Hand `query`'s rows, in its order, to `write(part, record_batches) -> summary` in runs
        (parts) and return the summaries in order. Here: one part (None), streamed through this
        process; an engine with workers writes a part per worker, where they run."""
        return [write(None, iter(self.reader(query, chunk)))]

    def register(self, name: str, data: pa.Table | pa.RecordBatchReader) -> None:
        """Make `data` readable as table `name` (relsql's own, prefixed names) until `unregister`."""
        drop_result(self.con)
        self.con.register(name, data)

    def unregister(self, name: str) -> None:
        drop_result(self.con)
        self.con.unregister(name)

    def temp_exists(self, table: exp.Table) -> bool:
        found = self.scalar(exp.select(exp.Count(this=exp.Star())).from_(exp.func("duckdb_tables")).where(exp.and_(
            exp.column("temporary"), exp.EQ(this=exp.column("table_name"), expression=exp.Literal.string(table.name)))))
        return bool(found[0])

    def database_file(self) -> str | None:
        row = self.scalar(exp.select(exp.column("path")).from_(exp.func("duckdb_databases")).where(
            exp.EQ(this=exp.column("database_name"), expression=exp.func("current_database"))))
        return row[0] if row and row[0] else None

    def bytewise_text(self) -> bool:
        """DuckDB's text is compared by its bytes unless a default collation is set (`SET default_collation`)."""
        row = self.con.execute(exp.select(exp.Anonymous(this="current_setting", expressions=[
            exp.Literal.string("default_collation")])).sql("duckdb")).fetchone()
        drop_result(self.con)
        return not (row and row[0])

    def estimate_rows(self, query: exp.Query) -> int | None:
        """DuckDB's plan of `query` (its EXPLAIN: nothing runs), read by `duckdb_plan_rows`."""
        return duckdb_plan_rows(self.con, self.sql(query))

    def table_rows(self, names: list[str]) -> dict[str, int]:
        """Counts (COUNT(*), exact) of the `names` that are base tables in DuckDB's own storage and
        the only table or view of their name in any catalog (so an unqualified name can only mean
        them); views and other engines' tables (an attached PostgreSQL) are left out: counting them
        could run their query. Two statements: the catalog (once within `frozen_schema`), then every count at once
        (none for a table that the catalog read within the same `frozen_schema` block has counted)."""
        wanted = {name.lower() for name in names}
        cache = getattr(self, "_schema_cache", None)  # within `frozen_schema` the catalog is read once
        found = None if cache is None else cache.get("native")
        if found is None:
            found = self.con.execute(_native_tables().sql("duckdb")).fetchall()
            if cache is not None:
                cache["native"] = found
        countable = sorted(name for name, objects, native in found if name in wanted and objects == 1 and native)
        counted = {name.lower(): table.rows for name, table in cache["catalog"].tables.items()
                   if name.lower() in countable} if cache is not None and "catalog" in cache else {}
        rest = [name for name in countable if name not in counted]  # the catalog read in this block counted the others
        if rest:
            counted.update(zip(rest, self._count_rows([ident(name) for name in rest])))
        return counted

    def interrupt(self) -> None:
        self.con.interrupt()

    def row_summary(self, table: exp.Table) -> tuple:
        """(rows, an order-independent sum of row hashes) of a table: what a kept grounding store's
        fingerprint compares; the engine's own hash."""
        row = exp.Column(this=exp.to_identifier("t", quoted=True))
        return self.scalar(exp.select(exp.Count(this=exp.Star()), exp.Sum(this=exp.cast(
            exp.Anonymous(this="hash", expressions=[row]), exp.DataType.build("HUGEINT")))).from_(
            exp.alias_(table.copy(), exp.to_identifier("t", quoted=True), table=True)))

    def result_columns(self, query: exp.Expression) -> list[tuple[str, str]]:
        """(name, type) of a query's result columns, by the engine's type names (DuckDB's)."""
        description = self.con.execute(self.sql(query)).description
        drop_result(self.con)
        return [(d[0], str(d[1])) for d in description]


    def scopes(self) -> list[tuple[str, str]]:
        """(catalog, schema) pairs holding the user's tables: the default one first."""
        current = self.con.execute("SELECT current_database(), current_schema()").fetchone()
        return [(current[0], current[1]), *(s for s in self._extra_scopes if s != tuple(current))]

    def unread_scopes(self, name: str) -> list[tuple[str, str]]:
        """(catalog, schema) pairs outside `scopes()` holding a table or view named `name`: where a
        user's table is that relsql does not read (a schema other than the connection's)."""
        rows = self.con.execute(bound(ELSEWHERE, name=name)).fetchall()
        read = set(self.scopes())
        return [(r[0], r[1]) for r in rows if (r[0], r[1]) not in read]

    def tables_in(self, scope: tuple[str, str]) -> list[str]:
        try:
            rows = self.con.execute(bound(RELATIONS + " ORDER BY table_name", catalog=scope[0], schema=scope[1])).fetchall()
        except duckdb.Error as err:  # a server gone away, a file removed under an attached catalog
            raise lost_connection(self.description, err) or SourceError(
                f"cannot list the tables of {self.description}: {_without_secrets(first_line(err))}; "
                "check that the source is reachable and reconnect") from None
        return [r[0] for r in rows if not r[0].startswith(TEMP_PREFIX)]


    def read_schema(self) -> tuple[dict[str, tuple[str, str]], dict[str, list[tuple[str, str]]]]:
        """Every user table's scope and columns in one catalog query per scope (every table and
        view has a column, so the column list names them all)."""
        scopes: dict[str, tuple[str, str]] = {}
        found: dict[str, list[tuple[str, str]]] = {}
        for scope in self.scopes():
            rows = self.con.execute(bound(
                "SELECT table_name, column_name, data_type FROM information_schema.columns "
                "WHERE table_catalog = :catalog AND table_schema = :schema ORDER BY table_name, ordinal_position",
                catalog=scope[0], schema=scope[1])).fetchall()
            for table, column, kind in rows:
                if table.startswith(TEMP_PREFIX) or scopes.setdefault(table, scope) != scope:
                    continue  # the default scope wins a name clash
                found.setdefault(table, []).append((column, kind))
        return scopes, found

    def read_columns(self, table: str) -> list[tuple[str, str]]:
        scope = self.table_scopes().get(table)
        rows = [] if scope is None else self.con.execute(bound(
            "SELECT column_name, data_type FROM information_schema.columns "
            "WHERE table_catalog = :catalog AND table_schema = :schema AND table_name = :name ORDER BY ordinal_position",
            catalog=scope[0], schema=scope[1], name=table)).fetchall()
        if not rows:
            raise SchemaError(f"table `{table}` does not exist in {self.description}; "
                              f"known tables: {', '.join(self.tables()) or 'none'}")
        return [(r[0], r[1]) for r in rows]


    def read_catalog(self) -> Catalog:
        catalog = Catalog(self.description, self.source.kind, keys_origin=self.source.keys_origin)
        scopes = self.scopes()
        placement = self.table_scopes()
        for index, scope in enumerate(scopes):
            names = [n for n, s in placement.items() if s == scope]
            if not names:
                continue
            keys = self.source.keys(self, scope) if index == 0 else duckdb_keys(self.con, scope)
            kinds = dict(self.con.execute(bound(RELATIONS, catalog=scope[0], schema=scope[1])).fetchall())
            columns: dict[str, list[tuple[str, str, str]]] = {}
            for table, name, dtype, nullable in self.con.execute(bound(
                    "SELECT table_name, column_name, data_type, is_nullable FROM information_schema.columns "
                    "WHERE table_catalog = :catalog AND table_schema = :schema ORDER BY table_name, ordinal_position",
                    catalog=scope[0], schema=scope[1])).fetchall():
                columns.setdefault(table, []).append((name, dtype, nullable))
            counts = dict(zip(names, self._count_rows([scoped_table(name, scope) for name in names]), strict=True))
            for table in names:
                key = keys.get(table, Keys())
                not_null = set(key.not_null) | set(key.primary_key)
                rows = counts[table]
                catalog.tables[table] = Table(
                    name=table,
                    columns=tuple(Column(n, t, nullable == "YES" and n not in not_null)
                                  for n, t, nullable in columns.get(table, [])),
                    primary_key=key.primary_key,
                    foreign_keys=key.foreign_keys,
                    rows=int(rows),
                    kind="view" if "VIEW" in str(kinds.get(table, "")).upper() else "table",
                )
        catalog.tables = dict(sorted(catalog.tables.items()))
        return catalog

    def _count_rows(self, tables: list[exp.Expression]) -> list[int]:
        """COUNT(*) of each table, in one statement (a statement per table was a tenth of a small
        database's construction statements)."""
        if not tables:
            return []
        counts = dict(self.con.execute(row_counts(tables).sql("duckdb")).fetchall())
        return [int(counts[i]) for i in range(len(tables))]


SQLITE_MAGIC = b"SQLite format 3\x00"


def set_threads(db: DuckDBDatabase, threads: int) -> None:
    """DuckDB's worker threads (a setting of the whole database instance, so only when asked).
    Recorded on the handle: a count the user gave is kept by `engine_threads`."""
    from relsql import arguments  # it imports torch; relsql.data.duckdb stays importable without (Spark's workers)

    count = arguments.integer("threads", threads, maximum=1024)
    _set_duckdb_threads(db.con, count)
    db.threads_given = count


def start_on_half_the_cores(db: DuckDBDatabase) -> None:
    """An instance relsql opened works on half the cores from the start (relsql/cores.py: torch takes
    the other half while relsql trains), so relsql's calls find the count they want and need not
    change it and put it back: on DuckDB 1.5 each change cost the next statement with an aggregate
    5-13 ms and RESET 2-5 ms, ~20 ms per Template.auto + Model of a small database, and the count put
    back charged the user's next query (docs/performance.md, "DuckDB's thread count set once")."""
    count = cores.half()
    if _duckdb_threads(db.con) != count:
        _set_duckdb_threads(db.con, count)


def _set_duckdb_threads(con: duckdb.DuckDBPyConnection, count: int | None) -> None:
    """SET threads = count, or RESET threads (DuckDB's default) for None."""
    if count is None:
        con.execute(exp.Command(this="RESET", expression=exp.Literal.string("threads")).sql("duckdb"))
    else:
        con.execute(exp.Set(expressions=[exp.SetItem(this=exp.EQ(this=exp.column("threads"),
                                                                 expression=integer(count)))]).sql("duckdb"))


def _duckdb_threads(con: duckdb.DuckDBPyConnection) -> int:
    row = con.execute(exp.select(exp.Anonymous(this="current_setting", expressions=[exp.Literal.string("threads")]))
                      .sql("duckdb")).fetchone()
    drop_result(con)
    return int(row[0])


_DEFAULT_THREADS: list[int] = []  # DuckDB's default worker threads in this process (read once)


def duckdb_default_threads() -> int:
    """The threads a new DuckDB instance starts with here (one per core DuckDB sees)."""
    if not _DEFAULT_THREADS:
        probe = duckdb.connect()
        try:
            _DEFAULT_THREADS.append(_duckdb_threads(probe))
        finally:
            probe.close()
    return _DEFAULT_THREADS[0]


@contextlib.contextmanager
def engine_threads(db: Database | None, count: int):
    """Inside the block the engine works on `count` threads, where that is relsql's to choose: a
    DuckDB instance still on DuckDB's default (one thread per core; the user's own connection, since
    an instance relsql opens starts on half the cores: `start_on_half_the_cores`), whose setting is
    put back (RESET) on leaving. A count the user set (relsql.connect(threads=), or any SET threads on the
    connection) is kept, and engines without the setting (Spark: its executors' cores are the
    session's) are left alone. Why: grounding, like planning, runs while nothing else of relsql's
    does, and on a 2-core machine busy with other jobs DuckDB's two threads cost Lahman's grounding
    a third more wall and CPU time than one (docs/performance.md)."""
    con = db.con if isinstance(db, DuckDBDatabase) else None
    if con is None or db.threads_given is not None or count < 1:
        yield
        return
    try:
        current = _duckdb_threads(con)
    except duckdb.Error:  # an engine reached through DuckDB that refuses settings: leave it
        current = None
    if current is None or current != duckdb_default_threads() or current == count:
        yield
        return
    _set_duckdb_threads(con, count)
    try:
        yield
    finally:
        if _duckdb_threads(con) == count:  # not changed by someone else in the meantime
            _set_duckdb_threads(con, None)


FLUSH_THRESHOLD = "32MB"  # DuckDB's default is 128 MiB


def set_flush_threshold(db: DuckDBDatabase, threshold: str = FLUSH_THRESHOLD) -> None:
    """How much freed memory DuckDB's allocator keeps cached after each task. relsql queries the
    database through setup and every batch, and DuckDB's 128 MiB default stayed in a training's
    peak RSS (45-56 MiB more at TPC-H sf 0.1, bench.time_to_accuracy). Only for a database
    instance relsql opened itself: it is a setting of the whole instance."""
    db.execute(exp.Set(expressions=[exp.SetItem(this=exp.EQ(
        this=exp.column("allocator_flush_threshold"), expression=exp.Literal.string(threshold)))]))


_JEMALLOC: list = []  # [DuckDB's jemalloc mallctl, or None where its library has none]


def release_freed_memory() -> bool:
    """Hand the memory DuckDB's allocator keeps after freeing it (jemalloc, on Linux: its arenas
    give freed pages back only after a decay of seconds) back to the system now; False where
    this DuckDB has no such allocator. Before training forks its batch process: pages the
    parent frees after the fork stay mapped in the child (TPC-H sf 0.1: 57 MiB of them)."""
    if not _JEMALLOC:
        import ctypes
        import importlib.util

        try:
            origin = importlib.util.find_spec("_duckdb").origin
            mallctl = ctypes.CDLL(origin).duckdb_je_mallctl
            mallctl.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
            mallctl.restype = ctypes.c_int
            _JEMALLOC.append(mallctl)
        except (ImportError, AttributeError, OSError, TypeError, ValueError):
            _JEMALLOC.append(None)
    if _JEMALLOC[0] is None:
        return False
    return _JEMALLOC[0](b"arena.4096.purge", None, None, None, 0) == 0  # 4096: every arena (MALLCTL_ARENAS_ALL)


def set_memory_limit(db: DuckDBDatabase, limit: str) -> None:
    if not isinstance(limit, str) or not re.fullmatch(r"\s*\d+(\.\d+)?\s*(B|KB|MB|GB|TB|KiB|MiB|GiB|TiB)\s*", limit):
        raise SourceError(f"memory_limit must look like '512MB' or '2GB', got {limit!r}")
    setting = exp.Set(expressions=[exp.SetItem(this=exp.EQ(this=exp.column("memory_limit"),
                                                           expression=exp.Literal.string(limit.strip())))])
    db.execute(setting)
