"""The engine interface: what relsql asks of a database, whichever engine runs it.

`Engine` declares the verbs the pipeline calls (grounding, compilation, training, prediction,
key discovery): run a statement, read a result as Arrow (whole, a first row, a stream, or in
ordered parts where the engine's workers run), number keys, create, replace and mark tables,
list the user's tables and columns. Two engines implement it as siblings: DuckDB
(`relsql.data.duckdb.DuckDBDatabase`: DuckDB itself, and every source the connectors attach to it) and
Spark (`relsql.data.spark.SparkDatabase`). What both share (the checks and marks of relsql's writes,
the schema cache of `frozen_schema`, the catalog's cache, relsql's temp-table names) is here,
written against the abstract verbs only: nothing here knows an engine.

`relsql.Database`, the public name of a handle from `relsql.connect`, is this class: a
DuckDB database and a Spark session both are one.

Not declared here: `replace_table`, `recover_table` and `table_comment`, Spark's way to keep a
table up to date without transactions (a new table renamed into place, its state in its comment).
Their one caller, relsql/train/embeddings/swapped.py, runs only where `transactional` is False;
an engine with transactions updates the same table in place, atomically (`transaction`), so a
DuckDB version of them would have no caller.
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import itertools
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, ClassVar

import pyarrow as pa
import sqlglot.expressions as exp

from relsql.data.catalog import Catalog
from relsql.errors import SchemaError, SourceError
from relsql.sql import unjoined_tables

if TYPE_CHECKING:
    from relsql.data.sources import Source

TEMP_PREFIX = "__relsql_"
handle_numbers = itertools.count()

# relsql's mark on every table it writes into the user's database (a table comment, or what the
# engine has instead: see DuckDBSource.mark). Only a table bearing it, of the same kind, is ever replaced.
WRITTEN_BY = "written by relsql: "
MARK_KEY = b"relsql"  # the Parquet footer's key for the mark (see with_mark)
WRITTEN_KINDS = {"table": "a plain table (Database.write_table)", "predictions": "a table of predictions",
                 "task": "a task table", "gradients": "a table of gradients",
                 "recommendations": "a table of recommendations", "explanations": "a table of explanations"}


def ident(name: str) -> exp.Identifier:
    return exp.to_identifier(name, quoted=True)


def first_line(err: BaseException) -> str:
    return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__


def check_table_name(name: object) -> str:
    """A name relsql may give a new table: non-empty text the database can hold, not relsql's own."""
    if not isinstance(name, str) or not name.strip() or name.startswith(TEMP_PREFIX) or "\x00" in name:
        raise SchemaError(f"cannot write a table named {name!r}: give a non-empty name not starting with {TEMP_PREFIX}")
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise SchemaError(f"cannot write a table named {name!r}: it has a character UTF-8 cannot hold") from None
    return name


def marked_kind(comment: object) -> str | None:
    """The kind in a relsql mark (`written by relsql: predictions` -> predictions), else None."""
    if isinstance(comment, str) and comment.startswith(WRITTEN_BY):
        return comment[len(WRITTEN_BY):].strip() or None
    return None


def with_mark(data: pa.Table, kind: str) -> pa.Table:
    """`data` with relsql's mark in its schema metadata: a Parquet file written from it carries
    the mark in its footer (a folder of files has no table comments)."""
    return data.replace_schema_metadata({**(data.schema.metadata or {}), MARK_KEY: (WRITTEN_BY + kind).encode()})


class Engine(abc.ABC):
    """A database handle relsql runs on (see the module's docstring): the verbs below are the
    engine's; the rest is engine-independent and written against them."""

    transactional: ClassVar[bool]  # `transaction` runs statements atomically (Spark's Parquet tables cannot)
    key_catalog: ClassVar[bool]  # catalog() reads the keys the engine declares (Spark's catalog keeps none)
    watch_interrupts: ClassVar[bool]  # Ctrl-C reaches a running query only through `interrupt` from a watcher thread

    def __init__(self, description: str, source: Source):
        self.description = description
        self.source = source
        self._prefix = f"{TEMP_PREFIX}{next(handle_numbers)}_"
        self._writing: tuple[str, str, bool, str | None] | None = None  # see `writing`
        self._schema_cache: dict | None = None  # see `frozen_schema`
        self.given_keys = None  # keys from connect(keys=...): relsql.data.keyfile.GivenKeys
        self.time_columns: dict[str, str] = {}  # {table: time column} a source declared (a RelBench dataset)
        self.relbench_tasks: dict = {}  # {task table: relsql.relbench.RelbenchTask} of a RelBench dataset
        self.threads_given: int | None = None  # DuckDB threads from connect(threads=): see relsql.data.duckdb.engine_threads

    # -- what each engine implements ---------------------------------------------------------
    @abc.abstractmethod
    def close(self) -> None:
        """Release what the handle holds (a connection, scratch tables); a session the user gave stays theirs."""

    @abc.abstractmethod
    def sql(self, query: exp.Expression | str) -> str:
        """The engine's SQL text for `query` (an AST in DuckDB's terms); text is returned as given."""

    @abc.abstractmethod
    def execute(self, query: exp.Expression | str) -> None:
        """Run a statement to its end; its result, if any, is dropped."""

    @abc.abstractmethod
    def run(self, statement: exp.Expression) -> pa.Table | int | None:
        """A query's rows as Arrow, else the row count the engine reports (or None); `statement` may be used up."""

    @abc.abstractmethod
    def transaction(self, statements: list[exp.Expression]) -> None:
        """All of `statements` or none (inside `writing`, checked and marked in the same step); refused unless `transactional`."""

    @abc.abstractmethod
    def arrow(self, query: exp.Expression | str) -> pa.Table:
        """A query's whole result as one Arrow table."""

    @abc.abstractmethod
    def scalar(self, query: exp.Expression) -> tuple | None:
        """A query's first row as a tuple, None when it has none."""

    @abc.abstractmethod
    def reader(self, query: exp.Expression, chunk: int) -> pa.RecordBatchReader:
        """A query's rows streamed in Arrow batches of about `chunk` rows, in the query's order."""

    @abc.abstractmethod
    def write_ordered(self, query: exp.Expression, write: Callable[[int | None, Iterator[pa.RecordBatch]], dict],
                      chunk: int) -> list[dict]:
        """`write(part, batches) -> summary` over the rows in order, in parts where the engine runs; the summaries in order."""

    @abc.abstractmethod
    def create_key_table(self, target: exp.Table, distinct: exp.Query, keys: list[str]) -> None:
        """Temp table `target`: `distinct`'s rows and `_rid` (BIGINT) numbering them 0..n-1 in key order, NULLs first."""

    @abc.abstractmethod
    def add_codes(self, dictionary: exp.Table, source: exp.Expression, column: str) -> None:
        """Append to `dictionary` (value, code) the values of `column` it lacks, with the next codes in value order."""

    @abc.abstractmethod
    def create_table_as(self, name: str, query: exp.Query, replace: bool, kind: str = "table") -> None:
        """A new user table `name` of `query`'s rows marked as relsql's `kind`; a failed write leaves no table behind."""

    @abc.abstractmethod
    def register(self, name: str, data: pa.Table | pa.RecordBatchReader) -> None:
        """`data` readable as table `name` (relsql's own prefixed names) until `unregister`; a
        reader is read once, by the first statement that reads the table."""

    @abc.abstractmethod
    def unregister(self, name: str) -> None:
        """Forget a table `register` made readable."""

    @abc.abstractmethod
    def temp_exists(self, table: exp.Table) -> bool:
        """Whether relsql's own table `table` (made by `temp_table`) exists now."""

    @abc.abstractmethod
    def database_file(self) -> str | None:
        """The file holding the default database (where relsql writes), None where there is no
        one such file (an in-memory DuckDB, a Spark catalog)."""

    def table_rows(self, names: list[str]) -> dict[str, int]:
        """The row counts of those of the user's tables `names` (unqualified) that the engine can
        count cheaply and exactly, keyed by lower-cased name; the others are left out (here: all)."""
        return {}

    def bytewise_text(self) -> bool:
        """Whether text compares equal and sorts as its bytes do (as Arrow's do), so that Python may
        number a column's values as the engine's ORDER BY and IS NOT DISTINCT FROM would (here: not known)."""
        return False

    @abc.abstractmethod
    def estimate_rows(self, query: exp.Query) -> int | None:
        """The engine's cheap estimate of the most rows any step of `query` produces (its largest
        join), without running it; None where the engine cannot tell."""

    @abc.abstractmethod
    def interrupt(self) -> None:
        """Stop what this handle runs now, from another thread (a Ctrl-C watcher): the running call
        raises (DuckDB: what `relsql.data.duckdb.interrupted_query` recognizes)."""

    @abc.abstractmethod
    def row_summary(self, table: exp.Table) -> tuple:
        """(rows, an order-independent sum of row hashes) of a table: equal for equal contents on this engine."""

    @abc.abstractmethod
    def result_columns(self, query: exp.Expression) -> list[tuple[str, str]]:
        """(name, type) of a query's result columns, types by DuckDB's names."""

    @abc.abstractmethod
    def scopes(self) -> list[tuple[str, str]]:
        """(catalog, schema) pairs holding the user's tables, the default one (where relsql writes) first."""

    def unread_scopes(self, name: str) -> list[tuple[str, str]]:
        """(catalog, schema) pairs outside `scopes()` holding a table named `name`, where the engine
        can tell (for an error message); none by default."""
        return []

    @abc.abstractmethod
    def tables_in(self, scope: tuple[str, str]) -> list[str]:
        """The user's tables and views of one scope, sorted, relsql's own (TEMP_PREFIX) left out."""

    @abc.abstractmethod
    def read_schema(self) -> tuple[dict[str, tuple[str, str]], dict[str, list[tuple[str, str]]]]:
        """({table: scope}, {table: [(column, type)]}) of every user table, the default scope winning a clash."""

    @abc.abstractmethod
    def read_columns(self, table: str) -> list[tuple[str, str]]:
        """(name, type) of a user table's columns in order, types by DuckDB's names; a SchemaError if it is missing."""

    @abc.abstractmethod
    def read_catalog(self) -> Catalog:
        """Every user table's columns (nullable or not), the keys the engine declares, and row counts."""

    # -- engine-independent, written against the verbs above ------------------------------------
    def __repr__(self) -> str:
        return f"relsql.Database({self.description})"

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def read_only(self) -> bool:
        return self.source.read_only

    @contextlib.contextmanager
    def writing(self, name: str, kind: str, replace: bool, how: str = "replace=True"):
        """Within this block, the next `transaction` writes table `name` as relsql's `kind`: it
        checks again, inside the transaction, that what it may drop is relsql's (`replaceable`),
        and marks the new table before committing. Yields the existing table to drop, or None."""
        existing = self.replaceable(name, replace, kind, how)
        self._writing = (name, kind, replace, existing)
        try:
            yield existing
        finally:
            self._writing = None

    def replaceable(self, name: str, replace: bool, kind: str, how: str = "replace=True",
                    other: str = "another name") -> str | None:
        """The existing table that writing `name` as relsql's `kind` replaces (None if there is
        none). Names are compared as the engine resolves them (case-insensitively: `PRODUCT` is
        `product`). Refused: any existing table without `replace`, and with it any table that
        does not bear relsql's mark of the same kind (a user's table, or one an older relsql
        wrote, which set no mark). `how` and `other` word the fixes (the CLI's flags)."""
        if kind not in WRITTEN_KINDS:
            raise ValueError(f"unknown kind of table {kind!r}")
        self.source.refuse_read_only(name)  # a source relsql never writes refuses before any work (the CLI's checks)
        scope = self.scopes()[0]
        clash = sorted((t for t in self.tables_in(scope) if t.casefold() == name.casefold()), key=lambda t: t != name)
        if not clash:
            return None
        existing = clash[0]
        same = "" if existing == name else (f" (the engine takes `{name}` for `{existing}`: "
                                            "names differing only in case are one table)")
        if not replace:
            raise SchemaError(f"table `{existing}` already exists in {self.description}{same}; choose {other}, or pass "
                              f"{how} to replace it if it is {WRITTEN_KINDS[kind]} that relsql wrote")
        found = None if len(clash) > 1 else self.source.written_kind(self, scope, existing)
        if found != kind:
            what = (f"it is {WRITTEN_KINDS.get(found, found)}, not {WRITTEN_KINDS[kind]}" if found else
                    f"it is not {WRITTEN_KINDS[kind]} that relsql wrote (it bears no relsql mark: a table of yours, "
                    "or one written by a relsql older than these marks, which is not replaced either)")
            raise SchemaError(f"cannot replace table `{existing}` in {self.description}{same}: {what}; relsql replaces "
                              f"only {WRITTEN_KINDS[kind]} that it wrote itself. Choose {other} (nothing was written)")
        return existing

    def temp_table(self, kind: str, name: str) -> exp.Table:
        """A table in DuckDB's temp catalog, unique to this handle, for relsql's own data."""
        return exp.Table(
            this=exp.to_identifier(f"{self._prefix}{kind}_{name}", quoted=True),
            db=exp.to_identifier("main", quoted=True),
            catalog=exp.to_identifier("temp", quoted=True),
        )

    @contextlib.contextmanager
    def frozen_schema(self):
        """Within this block the user's tables and columns are read once and remembered:
        grounding asks for them per body literal, and each catalog query is a round trip. Inside
        an outer block, the outer block's reading holds."""
        if getattr(self, "_schema_cache", None) is not None:
            yield self
            return
        self._schema_cache = {}
        try:
            yield self
        finally:
            self._schema_cache = None

    def written_kind(self, table: str) -> str | None:
        """The kind relsql marked a user table with when it wrote it (predictions, task, ...), or None."""
        scope = self.table_scopes().get(table)
        return None if scope is None else self.source.written_kind(self, scope, table)

    def written_kinds(self) -> dict[str, str]:
        """{table: kind} of the user tables relsql marked (`written_kind` of each, unmarked ones left
        out): one catalog query per scope where the source can, read once within `frozen_schema`."""
        cache = getattr(self, "_schema_cache", None)
        if cache is not None and "written" in cache:
            return dict(cache["written"])
        placement = self.table_scopes()
        found: dict[str, str] = {}
        for scope in dict.fromkeys(placement.values()):
            kinds = self.source.written_kinds(self, scope)
            names = [name for name, s in placement.items() if s == scope]
            for name in names:
                kind = self.source.written_kind(self, scope, name) if kinds is None else kinds.get(name)
                if kind is not None:
                    found[name] = kind
        if cache is not None:
            cache["written"] = dict(found)
        return found

    def table_scopes(self) -> dict[str, tuple[str, str]]:
        """Each user table's (catalog, schema); the default scope wins a name clash."""
        cache = getattr(self, "_schema_cache", None)
        if cache is not None:
            if "scopes" not in cache:
                cache["scopes"], cache["columns"] = self.read_schema()
            return cache["scopes"]
        return self._table_scopes()

    def _table_scopes(self) -> dict[str, tuple[str, str]]:
        found: dict[str, tuple[str, str]] = {}
        for scope in self.scopes():
            for name in self.tables_in(scope):
                found.setdefault(name, scope)
        return found

    def tables(self) -> list[str]:
        """The user's tables (and views) of the source, sorted; never relsql's temp tables."""
        return sorted(self.table_scopes())

    def columns(self, table: str) -> list[tuple[str, str]]:
        """(name, type) of a user table's columns in order; a SchemaError if it is missing."""
        cache = getattr(self, "_schema_cache", None)
        if cache is not None:
            if "columns" not in cache:
                cache["scopes"], cache["columns"] = self.read_schema()
            if table not in cache["columns"]:
                cache["columns"][table] = self.read_columns(table)  # raises the SchemaError
            return cache["columns"][table]
        return self.read_columns(table)

    def has_table(self, table: str) -> bool:
        return table in self.table_scopes()

    def write_table(self, name: str, data: pa.Table, *, replace: bool = False, kind: str = "table") -> None:
        """Write `data` as a new user table, atomically: all of it or nothing, marked as relsql's
        `kind` (predictions, task, gradients, ...; see WRITTEN_KINDS).

        An existing table of that name is refused unless `replace`, and even then unless relsql
        wrote it as the same `kind` (its mark: a table comment, or on SQLite an index; see
        `DuckDBSource.mark`): a user's table is never replaced. DuckDB, SQLite and PostgreSQL write
        inside one transaction; a folder of files writes `<name>.parquet` to a temporary file and
        renames it into place.
        """
        check_table_name(name)
        data = with_mark(to_arrow(data, name), kind)
        with self.writing(name, kind, replace):
            self.source.write_table(self, name, data, replace)

    def catalog(self) -> Catalog:
        """Tables, columns (name, type, nullable), primary and foreign keys, row counts: columns and
        types as DuckDB's `information_schema` shows them to the grounder, keys from each source's
        own catalog (`Source.keys`). Within `frozen_schema`, read once (key discovery and the
        target's checks each ask for it; a row count per table is a scan of each)."""
        cache = getattr(self, "_schema_cache", None)
        if cache is not None and "catalog" in cache:
            catalog = cache["catalog"]
        else:
            catalog = self.read_catalog()
            if cache is not None:
                cache["catalog"] = catalog
        return dataclasses.replace(catalog, tables=dict(catalog.tables))  # the tables are frozen; the dict is the caller's


def product_rows(db: Engine, query: exp.Query) -> int | None:
    """An estimate for an engine without a planner's (Spark): a query whose tables fall into groups
    that no equality connects is a cross product of the groups, estimated as the product of each
    group's largest table (the rows an equi-joined group keeps, as along foreign keys); one count
    per table, only for such a query. None for a query whose joins all have an equality."""
    groups = unjoined_tables(query) if isinstance(query, exp.Select) else None
    if groups is None or len(groups) < 2:
        return None
    product = 1
    for tables in groups:
        product *= max(int(db.scalar(exp.select(exp.Count(this=exp.Star())).from_(t.copy()))[0]) for t in tables)
    return product


def to_arrow(frame: Any, name: str) -> pa.Table:
    """A polars DataFrame/LazyFrame, pandas DataFrame or pyarrow Table/RecordBatch/reader as Arrow."""
    try:
        if isinstance(frame, pa.Table):
            return frame
        if isinstance(frame, pa.RecordBatch):
            return pa.Table.from_batches([frame])
        if isinstance(frame, pa.RecordBatchReader):
            return frame.read_all()
        module = type(frame).__module__.split(".")[0]
        if module == "polars":
            if hasattr(frame, "collect"):
                frame = frame.collect()
            return frame.to_arrow()
        if module == "pandas":
            return pa.Table.from_pandas(frame, preserve_index=False)
        if hasattr(frame, "__arrow_c_stream__"):
            return pa.table(frame)
    except (pa.ArrowException, TypeError, ValueError) as err:
        raise SourceError(f"cannot convert the data for table `{name}` to Arrow: {err}") from None
    raise SourceError(f"the data for table `{name}` is a {type(frame).__name__}; pass a polars or pandas DataFrame "
                      "or a pyarrow Table")


Database = Engine  # the public name (relsql.Database): a handle of either engine
