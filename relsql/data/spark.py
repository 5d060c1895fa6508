"""Apache Spark as the engine: the same grounding statements, run by a SparkSession.

`relsql.connect(spark)` (a `pyspark.sql.SparkSession`), `relsql.connect("spark://host:7077")`
(a cluster's master) or `relsql.connect("sc://host")` (Spark Connect) give a `SparkDatabase`.
Templates name the tables the session's catalog knows (Parquet, Hive, ... tables, and temp views).
The rest of relsql talks to it through the verbs of `relsql.data.engine.Engine` (run, arrow, scalar,
reader, register), which DuckDB implements beside it; what differs is here:

- SQL: the ASTs are written in Spark's dialect; relsql's temporary tables (DuckDB's `temp`
  catalog) become Parquet tables in a scratch database of its own, at a location of its own
  (`scratch=`: a folder every executor can read; default a local temporary folder), created
  fresh per statement (Spark has no CREATE OR REPLACE for them) and dropped with the handle.
- Results: large results (a rule's groundings for the grounding store) are written by the
  executors as Parquet into the scratch location and read back file by file in order; the
  driver never collects them. Small ones (counts, statistics, dictionaries) come as Arrow.
- Functions: DuckDB's (`epoch` with its fractions of a second, `dayofweek` from Sunday 0, base-10
  `log`, `list_value`, `isfinite`, ...) are written with DuckDB's meaning in Spark's terms
  (relsql/data/spark_sql.py). A DATE or a TIMESTAMP without time zone counts from midnight in
  the session's time zone: set `spark.sql.session.timeZone=UTC` for the values DuckDB computes
  (a warning says so, once per handle, the first time it matters).
- Errors: Spark's errors are raised as DuckDB's error classes (analysis errors as
  BinderException), the vocabulary the grounding code reports from.
- Key tables: the distinct heads are numbered (`_rid`, BIGINT) without a window over all rows,
  which Spark runs in one partition: they are sorted into key ranges, each row's place in its
  range stored once, and each range's offset added (`create_key_table`); dictionaries number
  their new values the same way (`add_codes`).
- Writing: a new table is written under a temporary name and renamed into place. Spark has no
  transactions over Parquet (`transactional` is False): a table relsql keeps up to date (a
  database-stored embedding) is replaced whole the same way, its state named in the table's
  comment, and a replacement cut short between the drop and the rename is finished when the
  table is next opened (`replace_table`, `recover_table`).
- Spark Connect (`sc://` URLs, or a Connect session): the same verbs over its client. This
  process is then Spark's client, not its driver: the Parquet results and the grounding store
  the executors write are read here, so `scratch` and `Model(store=...)` must be folders this
  machine and every executor see at the same path (on one machine, any local folder). An
  `sc://` URL that no server answers at is refused at once (the client alone retries for ~10
  minutes). One process holds either a classic SparkContext or Connect sessions (pyspark's rule).
"""

from __future__ import annotations

import contextlib
import contextvars
import itertools
import json
import logging
import os
import shutil
import socket
import sys
import tempfile
import uuid
import warnings
import weakref
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import sqlglot.expressions as exp

from relsql import sql as q
from relsql.data import spark_ship
from relsql.data.catalog import Catalog, Column, Table
from relsql.data.engine import TEMP_PREFIX, WRITTEN_BY, Database, Engine, first_line, ident, marked_kind, product_rows
from relsql.data.sources import Source
from relsql.data.spark_sql import is_utc, spark_function
from relsql.errors import SchemaError, SourceError

_results = itertools.count()
_SUMMARY = pa.schema([("part", pa.int64()), ("summary", pa.string())])  # what an executor sends back per part
_NEXT = f"{TEMP_PREFIX}next"  # suffix of a replacement being written
_PART, _MID = f"{TEMP_PREFIX}part", f"{TEMP_PREFIX}mid"  # a numbering's own columns, beside any key's name
_TYPES = {"bigint": "BIGINT", "int": "INTEGER", "smallint": "SMALLINT", "tinyint": "TINYINT", "double": "DOUBLE",
          "float": "FLOAT", "string": "VARCHAR", "boolean": "BOOLEAN", "timestamp": "TIMESTAMP WITH TIME ZONE",
          "timestamp_ntz": "TIMESTAMP", "date": "DATE", "binary": "BLOB"}


def duckdb_type(spark_type: str) -> str:
    """A Spark type's DuckDB name (the names the rest of relsql compares), e.g. decimal(12,2) → DECIMAL(12,2)."""
    simple = spark_type.lower()
    if simple.startswith("decimal"):
        return simple.upper()
    if simple.startswith("array<"):
        return f"{duckdb_type(simple[6:-1])}[]"
    return _TYPES.get(simple, simple.upper())


def _errors(err: Exception) -> Exception:
    """Spark's error as the DuckDB error class relsql's grounding reports from."""
    from pyspark.errors import AnalysisException

    kind = duckdb.BinderException if isinstance(err, AnalysisException) else duckdb.Error
    return kind(first_line(err))


_MUTED = contextvars.ContextVar("relsql_spark_muted", default=False)
_QUERY_LOGGERS = ("SQLQueryContextLogger", "DataFrameQueryContextLogger")  # pyspark logs each failed query there


class _Mute(logging.Filter):
    """Drops pyspark's own log record of a failed query while relsql runs it: relsql raises that
    error itself, with the statement it came from, and some queries are expected to fail (a
    comparison of columns whose types do not compare); under Spark Connect each record is a
    JSON error with the server's stack trace on stderr."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not _MUTED.get()


_MUTE = _Mute()


@contextlib.contextmanager
def _spark_errors():
    """Spark's errors (classic or Connect) raised as DuckDB's error classes, unlogged by pyspark."""
    from pyspark.errors import PySparkException
    from pyspark.logger import PySparkLogger

    for name in _QUERY_LOGGERS:  # pyspark's class for them: a plain logger made first would break its calls
        PySparkLogger.getLogger(name).addFilter(_MUTE)  # once: a logger keeps one copy of a filter
    token = _MUTED.set(True)
    try:
        yield
    except PySparkException as err:
        raise _errors(err) from None
    finally:
        _MUTED.reset(token)


def _table(name: str, db: Database) -> exp.Table:
    """`database`.`name` in the session's current database (Spark takes at most two parts here)."""
    return exp.Table(this=ident(name), db=ident(db.scopes()[0][1]))


class SparkSource(Source):
    """A Spark session's catalog: no keys declared (give them with connect(keys=...) or let them be
    inferred), tables written whole and renamed into place, relsql's mark in the table's comment."""

    kind = "spark"

    def write_table(self, db: Database, name: str, data: pa.Table, replace: bool) -> None:
        """Written whole under a temporary name with relsql's mark as its comment, then renamed into
        place (with replace=True the old table, if relsql wrote it as `kind`, dropped just before):
        a failed write leaves no table behind."""
        self.refuse_read_only(name)
        kind = db._writing[1] if db._writing else "table"  # set by Database.write_table
        view = f"{db._prefix}write_{next(_results)}"
        db.register(view, data)
        try:
            db.create_table_as(name, exp.select(exp.Star()).from_(exp.Table(this=exp.to_identifier(view, quoted=True))),
                               replace, kind)
        except duckdb.Error as err:
            raise SourceError(f"could not write table `{name}` to {db.description}: {first_line(err)}") from None
        finally:
            db.unregister(view)

    def written_kind(self, db: Database, scope: tuple[str, str], name: str) -> str | None:
        """The table's comment (a temp view has none: not relsql's)."""
        try:
            return marked_kind(db.table_comment(name))
        except duckdb.Error:
            return None


class SparkDatabase(Engine):
    """A SparkSession behind relsql's engine verbs; see the module's docstring."""

    transactional = False
    key_catalog = False
    watch_interrupts = False  # Ctrl-C is left to pyspark's client (a classic context's SIGINT handler cancels its jobs)

    def __init__(self, session, scratch: str | Path | None = None, description: str | None = None, read_only: bool = False):
        context = session.sparkContext if hasattr(session, "sparkContext") else None
        description = description or f"Spark session ({context.master if context is not None else 'Spark Connect'})"
        super().__init__(description, SparkSource(description, read_only=read_only))
        self.spark = session
        self._zone_checked = False
        self._owned_folder = scratch is None
        self.folder = Path(tempfile.mkdtemp(prefix="relsql-spark-")) if scratch is None else Path(scratch) / uuid.uuid4().hex
        self.scratch = f"relsql_scratch_{uuid.uuid4().hex[:12]}"
        self.execute(exp.Create(this=exp.Table(this=exp.to_identifier(self.scratch, quoted=True)), kind="DATABASE",
                                properties=exp.Properties(expressions=[exp.LocationProperty(
                                    this=exp.Literal.string(str(self.folder / "tables")))])))
        self._finalizer = weakref.finalize(self, _drop_scratch, session, self.scratch, str(self.folder))

    def close(self) -> None:
        self._finalizer()  # the user's session stays open: it is theirs

    # -- SQL ---------------------------------------------------------------------------------
    def sql(self, query: exp.Expression | str, copy: bool = True) -> str:
        if isinstance(query, str):
            return query  # already this engine's text (from `sql`)
        tree = query.copy() if copy else query
        return tree.transform(self._rewrite, copy=False).sql("spark")

    def _rewrite(self, node: exp.Expression) -> exp.Expression:
        if isinstance(node, exp.Table) and node.args.get("catalog") is not None and node.catalog == "temp":
            return exp.Table(this=node.this, db=exp.to_identifier(self.scratch, quoted=True), alias=node.args.get("alias"))
        written = spark_function(node, lambda arg: arg.transform(self._rewrite, copy=False), self._zoned)
        if written is not None:  # DuckDB's meaning in Spark's terms (relsql/data/spark_sql.py)
            return written
        if _is_temporary(node):
            node.set("properties", exp.Properties(expressions=[exp.FileFormatProperty(this=exp.Var(this="PARQUET"))]))
            node.set("replace", False)
        return node

    def _zoned(self) -> None:
        """Once per handle, when a statement first depends on the session's time zone (an epoch of
        a DATE or TIMESTAMP): a warning unless that zone is UTC, where DuckDB counts."""
        if self._zone_checked:
            return
        self._zone_checked = True
        with _spark_errors():
            zone = self.spark.conf.get("spark.sql.session.timeZone", None)
        if not is_utc(zone):
            warnings.warn(f"{self.description}: the session's time zone is {zone!r}, so epoch seconds of DATE and "
                          "TIMESTAMP columns (date features, calendar() years, ages) count from midnight there, not in "
                          "UTC as DuckDB counts: set spark.sql.session.timeZone=UTC for DuckDB's values", stacklevel=2)

    def _frame(self, query: exp.Expression | str, copy: bool = True):
        if _is_temporary(query):  # relsql's own table, replaced (Spark cannot CREATE OR REPLACE it); never a user's
            self._sql(exp.Drop(tables=[query.this.copy()], kind="TABLE", exists=True).transform(self._rewrite).sql("spark"))
        return self._sql(self.sql(query, copy))

    def _sql(self, text: str):
        with _spark_errors():
            return self.spark.sql(text)

    def execute(self, query: exp.Expression | str) -> None:
        self._frame(query)

    def run(self, statement: exp.Expression) -> pa.Table | int | None:
        if isinstance(statement, exp.Query):
            return self.arrow(statement)
        self._frame(statement, copy=False)
        return None

    def transaction(self, statements: list[exp.Expression]) -> None:
        raise SourceError("Spark has no transactions over Parquet tables: relsql writes whole new tables there instead")

    def arrow(self, query: exp.Expression | str) -> pa.Table:
        frame = self._frame(query)
        with _spark_errors():
            return frame.toArrow()

    def scalar(self, query: exp.Expression | str) -> tuple:
        # by position: Spark names unaliased expressions by their text, so equal ones share a name
        table = self.arrow(query)
        return tuple(column[0].as_py() for column in table.columns) if table.num_rows else None

    def reader(self, query: exp.Expression, chunk: int) -> pa.RecordBatchReader:
        """The executors write the ordered result as Parquet into the scratch location; it is read
        back file by file in partition order (Spark writes a sorted result's ranges in order)."""
        path = self.folder / "results" / f"r{next(_results)}"
        frame = self._frame(query)
        with _spark_errors():
            frame.write.parquet(str(path))
            files = sorted(p for p in path.glob("part-*.parquet"))
            schema = pq.read_schema(files[0]) if files else frame.limit(0).toArrow().schema

        def batches():
            try:
                for file in files:
                    yield from pq.ParquetFile(file).iter_batches(chunk)
            finally:
                shutil.rmtree(path, ignore_errors=True)

        return pa.RecordBatchReader.from_batches(schema, batches())

    def write_ordered(self, query: exp.Expression, write, chunk: int) -> list[dict]:
        """Each partition of the ordered result is written where it is computed, by its executor:
        `write` runs there (one part per partition, numbered in order) and only its summary comes
        back to the driver. A failure inside `write` comes back as its class name and message."""
        def run(batches):
            from pyspark import TaskContext

            index = TaskContext.get().partitionId()
            try:
                summary = write(index, batches)
            except Exception as err:  # reported to the driver, which raises it
                summary = {"error": [type(err).__name__, str(err)]}
            yield pa.RecordBatch.from_pydict({"part": [index], "summary": [json.dumps(summary)]}, schema=_SUMMARY)

        check_workers(self.spark, getattr(write, "__module__", None))  # the module `write` is pickled from
        frame = self._frame(query)
        with _spark_errors():
            rows = frame.mapInArrow(run, "part BIGINT, summary STRING").collect()
        return [json.loads(row["summary"]) for row in sorted(rows, key=lambda row: row["part"])]

    def add_codes(self, dictionary: exp.Table, source: exp.Expression, column: str) -> None:
        """The new values numbered like key tables (BIGINT, spread over the cluster, not one
        partition's window) and inserted shifted past the codes the dictionary has, counted in
        the same statement."""
        placed = _beside(dictionary, "new_placed")
        self._create_from(placed, self._placed(q.new_dictionary_values(dictionary, source, column), ["v"]))
        try:
            have = exp.Subquery(this=exp.select(exp.Count(this=exp.Star())).from_(dictionary.copy()))
            numbered = self._numbered(placed, ["v"], shift=have)
            self.run(exp.Insert(this=dictionary.copy(), expression=exp.select(q.col("v"), q.alias(q.col("_rid"), "code")).from_(
                q.alias(exp.Subquery(this=numbered), "n", table=True))))
        finally:
            self.execute(exp.Drop(tables=[placed], kind="TABLE", exists=True))

    def create_key_table(self, target: exp.Table, distinct: exp.Query, keys: list[str]) -> None:
        """Numbered without a window over all rows (one partition, INT row numbers): the keys are
        range-partitioned in key order and each row's place in its partition is recorded once and
        stored (Spark may run a plan twice, and these ids differ between runs); then each
        partition's offset (the rows of the partitions before it) is added: BIGINT `_rid`s."""
        placed = _beside(target, "placed")
        self._create_from(placed, self._placed(distinct, keys))
        try:
            self.execute(q.create_temp(target, self._numbered(placed, keys)))
        finally:
            self.execute(exp.Drop(tables=[placed], kind="TABLE", exists=True))

    def _placed(self, distinct: exp.Query, keys: list[str]):
        """`distinct` sorted by its keys (ascending, NULLs first, as DuckDB's key tables), with each
        row's partition (`_PART`) and an id (`_MID`) that counts up by one within a partition."""
        from pyspark.sql import functions as F

        plain = [f"_k{i}" for i in range(len(keys))]  # renamed by position: a key's name may hold dots
        frame = self._frame(distinct).toDF(*plain)
        return frame.sort(*[F.col(k).asc_nulls_first() for k in plain]).select(
            *plain, F.spark_partition_id().alias(_PART), F.monotonically_increasing_id().alias(_MID)).toDF(*keys, _PART, _MID)

    def _create_from(self, target: exp.Table, frame) -> None:
        """Temp table `target` holding `frame`, computed once."""
        view = f"{self._prefix}frame_{next(_results)}"
        with _spark_errors():
            frame.createOrReplaceTempView(view)
        try:
            self.execute(q.create_temp(target, exp.select(exp.Star()).from_(exp.Table(this=ident(view)))))
        finally:
            self.unregister(view)

    def _numbered(self, placed: exp.Table, keys: list[str], shift: exp.Expression | None = None) -> exp.Select:
        """`placed`'s keys and `_rid`: its id shifted by its partition's offset (and by `shift`).
        The offsets (one row per partition, so their window is small) are broadcast."""
        sizes = exp.select(q.col(_PART), q.alias(exp.Count(this=exp.Star()), "n"),
                           q.alias(exp.Min(this=q.col(_MID)), "low")).from_(placed.copy()).group_by(q.col(_PART))
        before = exp.Window(this=exp.Sum(this=q.col("n")), order=exp.Order(expressions=[exp.Ordered(this=q.col(_PART))]))
        delta = exp.Sub(this=exp.Sub(this=before, expression=q.col("n")), expression=q.col("low"))
        if shift is not None:
            delta = exp.Add(this=delta, expression=shift)
        offsets = exp.select(q.col(_PART), q.alias(delta, "_delta")).from_(q.alias(exp.Subquery(this=sizes), "s", table=True))
        numbered = exp.select(
            *[q.col(k, "p") for k in keys],
            q.alias(exp.Add(this=q.col(_MID, "p"), expression=q.col("_delta", "o")), "_rid"),
        ).from_(q.alias(placed.copy(), "p", table=True)).join(
            q.alias(exp.Subquery(this=offsets), "o", table=True),
            on=exp.EQ(this=q.col(_PART, "p"), expression=q.col(_PART, "o")))
        numbered.set("hint", exp.Hint(expressions=[exp.Anonymous(this="BROADCAST", expressions=[q.ident("o")])]))
        return numbered

    # -- new tables, and tables replaced whole ---------------------------------------------------
    def create_table_as(self, name: str, query: exp.Query, replace: bool, kind: str = "table") -> None:
        """Written whole under a temporary name, marked as relsql's `kind` in its comment, then
        renamed into place (with `replace`, an existing table relsql wrote as `kind` dropped just
        before; any other is refused): a failed write leaves no table behind."""
        existing = self.replaceable(name, replace, kind)
        partial = f"{name}{TEMP_PREFIX}writing_{uuid.uuid4().hex[:8]}"
        try:
            self.execute(exp.Create(this=_table(partial, self), kind="TABLE", expression=query, properties=exp.Properties(
                expressions=[exp.FileFormatProperty(this=exp.Var(this="PARQUET")),
                             exp.SchemaCommentProperty(this=exp.Literal.string(WRITTEN_BY + kind))])))
            if existing is not None:
                self.execute(exp.Drop(tables=[_table(existing, self)], kind="TABLE"))
            self.execute(exp.Alter(this=_table(partial, self), kind="TABLE", actions=[exp.AlterRename(this=_table(name, self))]))
        except duckdb.Error:
            with contextlib.suppress(duckdb.Error):
                self.execute(exp.Drop(tables=[_table(partial, self)], kind="TABLE", exists=True))
            raise

    def replace_table(self, name: str, query: exp.Query, comment: str) -> None:
        """`name` becomes `query`'s result, with `comment`: written whole under a temporary name,
        the old table dropped, the new one renamed into place. Cut short before the drop, the old
        table stands; after it, `recover_table` finishes the rename."""
        self.source.refuse_read_only(name)
        written = name + _NEXT
        self.execute(exp.Drop(tables=[_table(written, self)], kind="TABLE", exists=True))
        self.execute(exp.Create(this=_table(written, self), kind="TABLE", expression=query, properties=exp.Properties(
            expressions=[exp.FileFormatProperty(this=exp.Var(this="PARQUET")),
                         exp.SchemaCommentProperty(this=exp.Literal.string(comment))])))
        self.execute(exp.Drop(tables=[_table(name, self)], kind="TABLE", exists=True))
        self.execute(exp.Alter(this=_table(written, self), kind="TABLE", actions=[exp.AlterRename(this=_table(name, self))]))

    def recover_table(self, name: str) -> None:
        """Finish (or undo) a `replace_table` of `name` that was cut short."""
        written = name + _NEXT
        with _spark_errors():
            if not self.spark.catalog.tableExists(self._catalog_name(written)):
                return
            if self.spark.catalog.tableExists(self._catalog_name(name)):  # the old table stands: the new one may be partial
                self.execute(exp.Drop(tables=[_table(written, self)], kind="TABLE"))
            else:  # dropped, not yet renamed: the new one is complete
                self.execute(exp.Alter(this=_table(written, self), kind="TABLE",
                                       actions=[exp.AlterRename(this=_table(name, self))]))

    def table_comment(self, name: str) -> str | None:
        with _spark_errors():
            return self.spark.catalog.getTable(self._catalog_name(name)).description

    def _catalog_name(self, name: str) -> str:
        """A table of the current database as the catalog API takes it (relsql's own names only)."""
        return f"`{self.scopes()[0][1]}`.`{name}`"

    def register(self, name: str, data: pa.Table | pa.RecordBatchReader) -> None:
        if isinstance(data, pa.RecordBatchReader):
            data = data.read_all()  # createDataFrame takes a table; a temp view may be read more than once
        with _spark_errors():
            self.spark.createDataFrame(data).createOrReplaceTempView(name)

    def unregister(self, name: str) -> None:
        with _spark_errors():
            self.spark.catalog.dropTempView(name)

    def temp_exists(self, table: exp.Table) -> bool:
        """In the scratch database, where relsql's temp tables live (see `_rewrite`)."""
        with _spark_errors():
            return self.spark.catalog.tableExists(".".join(f"`{part.replace('`', '``')}`" for part in (self.scratch, table.name)))

    def database_file(self) -> str | None:
        return None  # a catalog of tables, each its own folder of files

    def estimate_rows(self, query: exp.Query) -> int | None:
        """Spark's optimizer gives no row estimate without table statistics: `product_rows`."""
        return product_rows(self, query)

    def interrupt(self) -> None:
        """Interrupts this session's running operations (pyspark 4: classic and Connect alike)."""
        with _spark_errors():
            self.spark.interruptAll()

    def row_summary(self, table: exp.Table) -> tuple:
        return self.scalar(exp.select(exp.Count(this=exp.Star()), exp.Sum(this=exp.cast(
            exp.Anonymous(this="xxhash64", expressions=[exp.Star()]), exp.DataType.build("DECIMAL(38, 0)")))).from_(table.copy()))

    def result_columns(self, query: exp.Expression) -> list[tuple[str, str]]:
        frame = self._frame(query)
        with _spark_errors():  # Spark Connect analyzes a query when asked for its schema
            return [(f.name, duckdb_type(f.dataType.simpleString())) for f in frame.schema.fields]

    # -- catalog -----------------------------------------------------------------------------
    def scopes(self) -> list[tuple[str, str]]:
        return [("spark_catalog", self.spark.catalog.currentDatabase())]

    def tables_in(self, scope: tuple[str, str]) -> list[str]:
        found = {t.name for t in self.spark.catalog.listTables(scope[1])}  # its tables and the session's temp views
        return sorted(name for name in found if not name.startswith(TEMP_PREFIX) and TEMP_PREFIX not in name)

    def read_schema(self):
        scopes, found = {}, {}
        scope = self.scopes()[0]
        for name in self.tables_in(scope):
            scopes[name] = scope
            found[name] = self._schema_of(name)
        return scopes, found

    def read_columns(self, table: str) -> list[tuple[str, str]]:
        if table not in self.table_scopes():
            raise SchemaError(f"table `{table}` does not exist in {self.description}; "
                              f"known tables: {', '.join(self.tables()) or 'none'}")
        return self._schema_of(table)

    def _schema_of(self, table: str) -> list[tuple[str, str]]:
        """A listed table's columns. Not through `table_scopes`: under `frozen_schema` that reads
        the whole schema, which is made of these (a cycle that ended in RecursionError)."""
        with _spark_errors():
            return [(f.name, duckdb_type(f.dataType.simpleString())) for f in self.spark.table(f"`{table}`").schema.fields]

    def read_catalog(self) -> Catalog:
        """Columns and row counts; no keys (Spark's catalog declares none: `key_catalog` is False) and
        every column nullable (Parquet's schema does not say what the data holds)."""
        catalog = Catalog(self.description, self.source.kind, keys_origin=self.source.keys_origin)
        scopes, columns = self.read_schema()
        for table in scopes:  # named as `_schema_of` does: a temp view is in no database
            rows = self.scalar(exp.select(exp.Count(this=exp.Star())).from_(exp.Table(this=ident(table))))
            catalog.tables[table] = Table(name=table, columns=tuple(Column(n, t, True) for n, t in columns[table]),
                                          rows=int(rows[0]))
        catalog.tables = dict(sorted(catalog.tables.items()))
        return catalog


# -- the executors' Python ----------------------------------------------------------------------
WRITER_MODULES = ("relsql.ground.parts",)  # relsql's modules the executors' store writer imports (no torch)


def check_workers(session, writer_module: str | None = None) -> None:
    """Once per session, before the first job that runs relsql's code on the executors: the one
    probe job of relsql.data.spark_ship asks an executor's Python for what the store writer
    imports (spark_ship.STORE, WRITER_MODULES and `writer_module`, the module the writer is
    pickled from) and ships this relsql where it lacks it. A worker Python that cannot (PySpark's
    default is `python3` from PATH, not this venv) would otherwise fail deep in a job with "An
    exception was thrown from the Python worker" and the cause only in Spark's log: a SourceError
    names that Python and the fix. Modules this driver cannot import itself are not asked of the
    workers."""
    spark_ship.ensure(session, spark_ship.STORE, (*WRITER_MODULES, writer_module))


def _beside(table: exp.Table, suffix: str) -> exp.Table:
    """relsql's own table `<table>_<suffix>`, in the same place as `table`."""
    return exp.Table(this=ident(f"{table.name}_{suffix}"), db=table.args.get("db"), catalog=table.args.get("catalog"))


def _is_temporary(node: object) -> bool:
    """A CREATE TEMP TABLE: one of relsql's own tables (DuckDB's temp catalog, the scratch database here)."""
    properties = node.args.get("properties") if isinstance(node, exp.Create) else None
    return properties is not None and any(isinstance(p, exp.TemporaryProperty) for p in properties.expressions)


def _drop_scratch(session, scratch: str, folder: str) -> None:
    """The scratch database and its files; the session may be gone already (then only the files)."""
    with contextlib.suppress(Exception), _spark_errors():
        if _server_answers(session):
            session.sql(exp.Drop(tables=[exp.Table(this=exp.to_identifier(scratch, quoted=True))], kind="DATABASE", exists=True,
                                 cascade=True).sql("spark"))
    shutil.rmtree(folder, ignore_errors=True)


def _server_answers(session) -> bool:
    """False for a Spark Connect session whose server accepts no connection now: its client would
    retry the drop for ~10 minutes, and this runs at the latest when the interpreter exits."""
    client = getattr(session, "client", None) if type(session).__module__.startswith("pyspark.sql.connect") else None
    endpoint = getattr(getattr(client, "_builder", None), "endpoint", None)
    return not isinstance(endpoint, str) or _unreachable(endpoint, timeout=2.0) is None


def open_spark(source, scratch: str | Path | None = None, read_only: bool = False) -> SparkDatabase:
    """A SparkDatabase from a SparkSession, a master URL (spark://, local[...]) or a Spark Connect URL (sc://)."""
    if not isinstance(source, str):
        return SparkDatabase(source, scratch, read_only=read_only)
    try:
        from pyspark.errors import PySparkException
        from pyspark.sql import SparkSession
    except ImportError:
        raise SourceError(f"{source}: Spark needs pyspark: pip install 'relsql[spark]' (and Java 17)") from None
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    try:
        if source.startswith("sc://"):
            _reachable(source)
            builder = SparkSession.builder.remote(source)
        else:
            builder = SparkSession.builder.master(source)
        session = builder.getOrCreate()
    except ImportError as err:  # Spark Connect's client: grpcio, protobuf, zstandard, ...
        raise SourceError(f"{source}: Spark Connect's client needs {first_line(err)}: pip install 'relsql[spark]'") from None
    except PySparkException as err:  # e.g. a classic SparkContext already runs in this process
        raise SourceError(f"could not open {source}: {first_line(err)}") from None
    return SparkDatabase(session, scratch, description=f"Spark at {source}", read_only=read_only)


def _reachable(url: str) -> None:
    """Refuses an sc:// URL no server answers at: Spark Connect's client would retry for ~10 minutes."""
    from pyspark.sql.connect.client import DefaultChannelBuilder

    endpoint = DefaultChannelBuilder(url).endpoint
    if (problem := _unreachable(endpoint, timeout=10.0)) is not None:
        raise SourceError(f"no Spark Connect server answers at {url} ({endpoint}: {problem})")


def _unreachable(endpoint: str, timeout: float) -> str | None:
    """Why no TCP connection to `host:port` opens, or None when one does."""
    host, _, port = endpoint.rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except (OSError, ValueError) as err:
        return getattr(err, "strerror", None) or str(err)
    return None


__all__ = ["SparkDatabase", "open_spark"]
