"""The engine interface (relsql/data/engine.py): DuckDB and Spark implement it as siblings.

Spark used to subclass DuckDB's class and override 21 of its methods, so that a verb Spark forgot
ran DuckDB's code on a `con` of None. Now each engine implements every abstract verb itself, and
the shared part is written against those verbs alone.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest
import sqlglot
import sqlglot.expressions as exp

import relsql
from relsql.data import engine
from relsql.data.duckdb import DuckDBDatabase
from relsql.data.engine import Engine

ENGINE_FILE = Path(engine.__file__)


def spark_class():
    pytest.importorskip("pyspark", reason="pyspark is not installed")
    from relsql.data.spark import SparkDatabase

    return SparkDatabase


def test_the_interface_declares_the_pipelines_verbs():
    """The abstract verbs are the ones the pipeline calls (a lost one would let an engine skip it)."""
    assert {"run", "arrow", "scalar", "reader", "write_ordered", "create_key_table", "add_codes", "create_table_as",
            "transaction", "register", "unregister", "row_summary", "result_columns", "scopes", "sql", "execute",
            "close", "tables_in", "read_schema", "read_columns", "read_catalog", "temp_exists", "database_file",
            "estimate_rows", "interrupt"} == set(Engine.__abstractmethods__)
    with pytest.raises(TypeError):
        Engine("nothing", None)  # abstract: cannot be made


@pytest.mark.parametrize("engine_class", [DuckDBDatabase, "spark"])
def test_each_engine_implements_every_verb_itself(engine_class):
    """Every abstract verb is defined in the engine's own class body (not inherited from the other
    engine), and both say whether they are transactional, read keys and need a Ctrl-C watcher."""
    cls = spark_class() if engine_class == "spark" else engine_class
    assert not cls.__abstractmethods__
    assert [k for k in cls.__mro__ if k not in (cls, Engine, object) and k.__module__ != "abc"] == []
    for name in Engine.__abstractmethods__:
        assert name in vars(cls), f"{cls.__name__} inherits {name} instead of implementing it"
    assert all(isinstance(vars(cls)[flag], bool) for flag in ("transactional", "key_catalog", "watch_interrupts"))


def test_spark_is_no_duckdb_database():
    """The two engines are siblings: neither is in the other's MRO, and both are relsql.Database."""
    spark = spark_class()
    assert DuckDBDatabase not in spark.__mro__ and spark not in DuckDBDatabase.__mro__
    assert issubclass(spark, relsql.Database) and issubclass(DuckDBDatabase, relsql.Database)
    assert relsql.Database is Engine


def _attributes_used(tree: ast.AST) -> set[str]:
    return {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}


def test_the_shared_part_knows_no_engine():
    """engine.py imports neither duckdb nor pyspark, and its methods never touch `con` or `spark`:
    they reach the data only through the abstract verbs."""
    tree = ast.parse(ENGINE_FILE.read_text(encoding="utf-8"))
    imported = {alias.name.partition(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {(node.module or "").partition(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert not imported & {"duckdb", "pyspark"}
    methods = [node for node in ast.walk(tree) if isinstance(node, ast.ClassDef) and node.name == "Engine"][0]
    assert not _attributes_used(methods) & {"con", "spark"}
    assert "tables_in" in _attributes_used(methods)  # the reader sees the verbs it calls


class _Listing(DuckDBDatabase):
    """DuckDB whose table listing is counted: the shared schema cache must spare the engine's verbs."""

    listed = 0

    def read_schema(self):
        type(self).listed += 1
        return super().read_schema()


def test_the_shared_schema_cache_reads_once_through_the_verbs():
    """Within frozen_schema, tables() and columns() ask the engine's `read_schema` once; outside, each
    call asks again. The columns equal what DuckDB's own DESCRIBE reports (the oracle)."""
    con = duckdb.connect()
    con.execute("CREATE TABLE a (x INTEGER, y VARCHAR); CREATE TABLE b (z DOUBLE)")
    db = _Listing(con)
    described = [(row[0], row[1]) for row in con.execute("DESCRIBE a").fetchall()]
    with db.frozen_schema():
        assert db.tables() == ["a", "b"]
        assert db.columns("a") == described
        assert db.columns("b") == [("z", "DOUBLE")]
    assert _Listing.listed == 1
    assert db.columns("a") == described  # outside the block: read again (through read_columns, not read_schema)


def test_write_table_goes_through_the_engines_verbs():
    """The shared write_table refuses a user's table and replaces only relsql's own of the same kind."""
    db = DuckDBDatabase.in_memory()
    db.execute("CREATE TABLE mine (x INTEGER)")
    with pytest.raises(relsql.SchemaError, match="already exists"):
        db.write_table("mine", pa.table({"x": [1]}))
    with pytest.raises(relsql.SchemaError, match="bears no relsql mark"):
        db.write_table("mine", pa.table({"x": [1]}), replace=True)
    db.write_table("ours", pa.table({"x": [1, 2]}), kind="predictions")
    db.write_table("ours", pa.table({"x": [3]}), kind="predictions", replace=True)
    assert db.arrow("SELECT x FROM ours").column("x").to_pylist() == [3]
    assert db.written_kinds() == {"ours": "predictions"}
    assert inspect.getmodule(type(db).write_table) is engine  # the shared one, not an engine's copy


# -- the verbs callers used to reach DuckDB's `con` for ------------------------------------------------
RELSQL = Path(relsql.__file__).parent
# DuckDB's own modules: the engine itself and what attaches to it (the connectors, the dataset loaders)
DUCKDB_OWN = ("data/duckdb.py", "connectors/", "datasets/")


def test_only_duckdbs_own_modules_read_its_connection():
    """Outside DuckDB's engine module, its connectors and the dataset loaders, no module reads a
    handle's `.con`: the pipeline asks the engine's verbs, which Spark implements too (it has no
    `con`). The one other DuckDB connection, the hasher of initial embedding rows, is its own."""
    readers = []
    for path in sorted(RELSQL.rglob("*.py")):
        relative = path.relative_to(RELSQL).as_posix()
        if relative.startswith(DUCKDB_OWN):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and node.attr == "con"
                    and not (isinstance(node.value, ast.Name) and node.value.id == "_hasher")):
                readers.append(f"{relative}:{node.lineno}")
    assert readers == []
    assert "con" not in vars(spark_class()) and "con" not in Engine.__annotations__


def test_sources_share_a_neutral_base():
    """Spark's source is no DuckDB source: both derive from relsql.data.sources.Source, which is
    abstract (how a table is written and how its mark is read are each kind's own)."""
    from relsql.data.duckdb import DuckDBSource
    from relsql.data.sources import Source

    spark_source = __import__("relsql.data.spark", fromlist=["SparkSource"]).SparkSource
    assert issubclass(spark_source, Source) and issubclass(DuckDBSource, Source)
    assert DuckDBSource not in spark_source.__mro__
    assert {"write_table", "written_kind"} == set(Source.__abstractmethods__)
    with pytest.raises(TypeError):
        Source("nothing")


def test_temp_exists_follows_relsqls_own_tables():
    """`temp_exists` is True exactly while the temp table exists: checked by reading the table
    (the oracle: a read fails once it is gone), and a user's table of the same name is not one."""
    db = DuckDBDatabase.in_memory()
    table = db.temp_table("probe", "t")
    assert not db.temp_exists(table)
    db.execute(f'CREATE TABLE "{table.name}" (x INTEGER)')  # the user's, in the default catalog
    assert not db.temp_exists(table)
    db.execute(exp.Create(this=table.copy(), kind="TABLE", properties=exp.Properties(expressions=[exp.TemporaryProperty()]),
                          expression=exp.select(exp.alias_(exp.Literal.number(1), "x"))))
    assert db.temp_exists(table)
    assert db.scalar(exp.select(exp.Count(this=exp.Star())).from_(table.copy())) == (1,)
    db.execute(exp.Drop(tables=[table.copy()], kind="TABLE"))
    assert not db.temp_exists(table)
    with pytest.raises(duckdb.CatalogException):
        db.scalar(exp.select(exp.Count(this=exp.Star())).from_(table.copy()))


def test_database_file_is_the_file_connected_to(tmp_path):
    """The file relsql.connect opened (None for an in-memory database)."""
    path = tmp_path / "some.duckdb"
    with relsql.connect(path) as db:
        assert Path(db.database_file()).resolve() == path.resolve()
    with relsql.connect() as db:
        assert db.database_file() is None


def test_estimate_rows_sees_a_cross_join_and_an_equi_join(tmp_path):
    """DuckDB's plan estimate: a cross join is the product of its inputs (the naive count, run), and
    an equality join on a key is estimated near its true size, far below the product."""
    db = DuckDBDatabase.in_memory()
    db.execute("CREATE TABLE a AS SELECT range AS id FROM range(300)")
    db.execute("CREATE TABLE b AS SELECT range AS id, range % 300 AS a_id FROM range(200)")
    cross = exp.select("*").from_("a").join("b")
    assert db.estimate_rows(cross) == db.scalar(exp.select(exp.Count(this=exp.Star())).from_(exp.Subquery(this=cross)))[0]
    joined = exp.select("*").from_("a").join("b", on="a.id = b.a_id")
    estimate = db.estimate_rows(joined)
    assert estimate is not None and estimate < 300 * 200 // 10


def test_interrupt_stops_a_running_query_from_another_thread():
    """A query that would run for hours is stopped by `interrupt` from a watcher thread, and the
    error is the one grounding takes for Ctrl-C (`interrupted_query`). The watcher interrupts until
    the query has returned, so no timing decides the outcome."""
    import threading

    from relsql.data.duckdb import interrupted_query

    db = DuckDBDatabase.in_memory()
    done = threading.Event()

    def watch():
        while not done.wait(0.05):
            db.interrupt()

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        with pytest.raises((duckdb.Error, RuntimeError)) as caught:
            db.scalar(sqlglot.parse_one("SELECT sum(hash(x.range, y.range)) FROM range(1000000) AS x, range(1000000) AS y",
                                        read="duckdb"))
    finally:
        done.set()
        watcher.join()
    assert interrupted_query(caught.value)
    assert db.scalar(exp.select(exp.Literal.number(1))) == (1,)  # the handle still works


def test_register_takes_a_stream_read_once():
    """A RecordBatchReader registered is read by the statement that reads it: the rows arrive whole."""
    db = DuckDBDatabase.in_memory()
    data = pa.table({"k": list(range(1000)), "v": [float(i) / 3 for i in range(1000)]})
    db.register("relsql_stream", pa.RecordBatchReader.from_batches(data.schema, data.to_batches(max_chunksize=64)))
    try:
        read = db.arrow(exp.select("k", "v").from_("relsql_stream").order_by("k"))
    finally:
        db.unregister("relsql_stream")
    assert read.equals(data)


@pytest.mark.spark
def test_the_new_verbs_on_spark(spark):
    """Spark's `temp_exists` (its scratch database), `database_file` (none), `estimate_rows` (the
    product rule: a cross join's naive count) and `register` of a stream, and key inference, which
    used to read DuckDB's `con`, now runs there: a view's unique, never-NULL id is its key."""
    import shutil

    if shutil.which("java") is None:
        pytest.skip("Spark needs Java 17")
    from relsql.data.keys import schema

    spark.range(30).selectExpr("id", "id % 3 AS g").createOrReplaceTempView("engine_a")
    spark.range(20).selectExpr("id AS b_id", "id % 30 AS a_id").createOrReplaceTempView("engine_b")
    with relsql.connect(spark) as db:
        table = db.temp_table("probe", "t")
        assert not db.temp_exists(table)
        db.execute(exp.Create(this=table.copy(), kind="TABLE", properties=exp.Properties(
            expressions=[exp.TemporaryProperty()]), expression=exp.select(exp.alias_(exp.Literal.number(1), "x"))))
        assert db.temp_exists(table)
        assert db.database_file() is None
        cross = exp.select("*").from_("engine_a").join("engine_b")
        naive = db.scalar(exp.select(exp.Count(this=exp.Star())).from_(exp.Subquery(this=cross, alias="c")))[0]
        assert db.estimate_rows(cross) == naive == 600
        data = pa.table({"k": [3, 1, 2]})
        db.register("relsql_stream", pa.RecordBatchReader.from_batches(data.schema, data.to_batches()))
        try:
            assert db.arrow(exp.select("k").from_("relsql_stream").order_by("k")).column("k").to_pylist() == [1, 2, 3]
        finally:
            db.unregister("relsql_stream")
        keys = schema(db, db.catalog(), infer=True)
        assert keys.primary_keys.get("engine_a") == ("id",)
