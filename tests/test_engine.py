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
            "close", "tables_in", "read_schema", "read_columns", "read_catalog"} == set(Engine.__abstractmethods__)
    with pytest.raises(TypeError):
        Engine("nothing", None)  # abstract: cannot be made


@pytest.mark.parametrize("engine_class", [DuckDBDatabase, "spark"])
def test_each_engine_implements_every_verb_itself(engine_class):
    """Every abstract verb is defined in the engine's own class body (not inherited from the other
    engine), and both say whether they are transactional and read keys."""
    cls = spark_class() if engine_class == "spark" else engine_class
    assert not cls.__abstractmethods__
    assert [k for k in cls.__mro__ if k not in (cls, Engine, object) and k.__module__ != "abc"] == []
    for name in Engine.__abstractmethods__:
        assert name in vars(cls), f"{cls.__name__} inherits {name} instead of implementing it"
    assert isinstance(vars(cls)["transactional"], bool) and isinstance(vars(cls)["key_catalog"], bool)


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
