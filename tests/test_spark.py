"""Spark as the engine (relsql/data/spark.py): a real local[2] SparkSession, checked against DuckDB
grounding the same tables (the oracle), and 2 gloo ranks training on what Spark grounded."""

from __future__ import annotations

import shutil
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pytest
import sqlglot.expressions as exp
import torch

import relsql
from relsql import sql as q
from relsql.data.references import Reference, referenced
from relsql.data.spark import _PART, SparkDatabase
from relsql.ground.demand import BatchGrounder
from relsql.ground.store import GroundingStore

ROOT = Path(__file__).resolve().parent.parent
pytest.importorskip("pyspark", reason="pyspark is not installed: bash scripts/setup installs relsql[spark]")
if shutil.which("java") is None:
    pytest.skip("Spark needs Java 17 (apt-get install -y openjdk-17-jre-headless)", allow_module_level=True)

pytestmark = pytest.mark.spark  # a Spark session or server (JVM)


def copy_to_spark(duck: relsql.Database, spark) -> None:
    """Every table of `duck` as a temp view of the session (what a catalog table would be)."""
    for table in duck.tables():
        frame = duck.arrow(exp.select(exp.Star()).from_(exp.Table(this=exp.to_identifier(table, quoted=True))))
        spark.createDataFrame(frame).createOrReplaceTempView(table)


def assert_same_groundings(template: relsql.Template, duck: relsql.Database, on_spark: relsql.Database) -> dict:
    """The stores Spark and DuckDB write give equal groundings of every output row: the same heads,
    body row ids, encoded values, dictionaries and feature statistics. Returns Spark's manifest."""
    output = list(template.relations)[-1]
    grounders = [BatchGrounder(template, db, output, progress=False) for db in (duck, on_spark)]
    assert grounders[0].sizes == grounders[1].sizes
    stores = [GroundingStore.open(g, None, False) for g in grounders]
    expected, found = (s.ground(np.arange(grounders[0].sizes[output])) for s in stores)
    assert expected.relations.keys() == found.relations.keys()
    assert expected.feature_stats.keys() == found.feature_stats.keys()
    for key, stats in expected.feature_stats.items():
        assert stats == pytest.approx(found.feature_stats[key], rel=1e-9), key
    for name in expected.dictionaries:
        assert expected.dictionaries[name].equals(found.dictionaries[name]), name
    total = 0
    for name, relation in expected.relations.items():
        other = found.relations[name]
        assert len(relation.rules) == len(other.rules), name
        for a, b in zip(relation.rules, other.rules):
            assert torch.equal(a.head, b.head) and torch.equal(a.offsets, b.offsets), name
            assert all(torch.equal(x, y) for x, y in zip(a.refs, b.refs)), name
            for k in a.columns:
                assert torch.allclose(a.columns[k].double(), b.columns[k].double(), rtol=1e-12, atol=1e-12), (name, k)
            total += a.size
    assert total > 0
    assert all(len(rule["parts"]) == 1 for r in stores[0].manifest["relations"].values() for rule in r["rules"].values())
    return stores[1].manifest


@pytest.fixture(scope="module")
def mutag_on_spark(spark, mutag):
    """MUTAG's tables as temp views of the session, copied once for the module (only read)."""
    copy_to_spark(mutag, spark)
    return mutag


@pytest.fixture(scope="module")
def molecules_on_spark(spark, molecules):
    """The Mutagenesis tables as temp views of the session, copied once for the module (only read)."""
    copy_to_spark(molecules, spark)
    return molecules


@pytest.mark.parametrize("name", ["gcn.sql", "sage.sql", "gin.sql", "rgcn.sql", "gat.sql", "rgat.sql"])
def test_spark_grounds_the_graph_templates_like_duckdb(spark, mutag_on_spark, name):
    mutag = mutag_on_spark
    with relsql.connect(spark) as on_spark:
        assert_same_groundings(relsql.Template.from_file(relsql.sql_templates.path(name)), mutag, on_spark)


def test_spark_grounds_the_hgt_template_like_duckdb(spark, mutag_on_spark):
    """relsql/sql_templates/hgt.sql reads node and edge tables with type columns (another graph than MUTAG's, whose
    views it replaces for this test and puts back after)."""
    pytest.importorskip("torch_geometric")
    from tests.test_hgt import hetero_db

    graph = hetero_db()[0]
    copy_to_spark(graph, spark)
    try:
        with relsql.connect(spark) as on_spark:
            assert_same_groundings(relsql.Template.from_file(relsql.sql_templates.path("hgt")), graph, on_spark)
    finally:
        copy_to_spark(mutag_on_spark, spark)


def test_spark_grounds_mutagenesis_and_an_auto_template_on_tpch_like_duckdb(spark, molecules_on_spark):
    """Mutagenesis with Spark's partitions kept apart (no coalescing): the executors write a rule's
    groundings in several parts, in head order, and the store reads them as one."""
    molecules = molecules_on_spark
    coalesce = "spark.sql.adaptive.coalescePartitions.enabled"
    before = spark.conf.get(coalesce)
    spark.conf.set(coalesce, "false")
    try:
        with relsql.connect(spark) as on_spark:
            template = relsql.Template.from_file(relsql.sql_templates.path("mutagenesis"))
            manifest = assert_same_groundings(template, molecules, on_spark)
    finally:
        spark.conf.set(coalesce, before)
    parts = [len(rule["parts"]) for r in manifest["relations"].values() for rule in r["rules"].values()]
    assert max(parts) > 1, parts
    from relsql.datasets.tpch import generate

    tpch = relsql.connect()
    generate(tpch.con, 0.01)
    # one hop: 10 rules (two hops: 23, which cost ~100 s of Spark statements and add only more of the same joins)
    # keys are DuckDB's to infer; numbers="standardized" keeps this store test to plain features (the default
    # encoders on Spark are tests/test_spark_dialects.py's)
    template = relsql.Template.auto(tpch, "orders.o_orderpriority", hops=1, numbers="standardized")
    copy_to_spark(tpch, spark)
    with relsql.connect(spark) as on_spark:
        assert_same_groundings(template, tpch, on_spark)


def test_spark_numbers_keys_over_several_partitions_like_duckdb(spark, monkeypatch):
    """A key table's `_rid`s are BIGINT and 0..n-1 in key order, NULLs first, as DuckDB numbers
    them, with the keys spread over several partitions (a window over all rows has one, and INT
    row numbers)."""
    heads = pa.table({"_h0": [i % 7 if i % 11 else None for i in range(300)],
                      "_h1": [f"v{i % 5}" if i % 13 else None for i in range(300)]})
    spark.createDataFrame(heads).createOrReplaceTempView("heads")
    duck = relsql.connect()
    duck.register("heads", heads)
    partitions = []
    number = SparkDatabase._numbered

    def counted(self, placed, keys, shift=None):
        partitions.append(self.scalar(exp.select(exp.Count(this=exp.Distinct(expressions=[q.col(_PART)]))).from_(placed.copy()))[0])
        return number(self, placed, keys, shift)

    monkeypatch.setattr(SparkDatabase, "_numbered", counted)
    coalesce = "spark.sql.adaptive.coalescePartitions.enabled"
    before = spark.conf.get(coalesce)
    spark.conf.set(coalesce, "false")  # else AQE gives these few keys one partition
    try:
        with relsql.connect(spark) as on_spark:
            tables = [number_heads(db) for db in (duck, on_spark)]
    finally:
        spark.conf.set(coalesce, before)
    assert len(partitions) == 1 and partitions[0] > 1
    (expected, types), (found, spark_types) = tables
    assert spark_types == types == [("key", "BIGINT"), ("label.v", "VARCHAR"), ("_rid", "BIGINT")]
    assert found.equals(expected)
    pairs = set(zip(heads.column("_h0").to_pylist(), heads.column("_h1").to_pylist()))
    assert found.column("_rid").to_pylist() == list(range(len(pairs)))
    assert found.slice(0, 1).to_pylist() == [{"key": None, "label.v": None, "_rid": 0}]


def number_heads(db: relsql.Database) -> tuple[pa.Table, list[tuple[str, str]]]:
    """The key table `db` makes of the `heads` table's distinct (key, label.v) pairs, by `_rid`, and its column types."""
    target = db.temp_table("k", "heads")
    db.create_key_table(target, q.distinct_keys([exp.Table(this=q.ident("heads"))], ["key", "label.v"]), ["key", "label.v"])
    select = exp.select(exp.Star()).from_(target).order_by(q.col("_rid"))
    return db.arrow(select), db.result_columns(select)


def test_a_model_on_spark_trained_on_two_ranks_equals_one_duckdb_process(spark, molecules_on_spark, tmp_path):
    molecules = molecules_on_spark
    template = relsql.Template.from_file(relsql.sql_templates.path("mutagenesis"))

    def model(db) -> relsql.Model:
        return relsql.Model(db, template, "molecule.mutagenic", batch_size=64, dtype=torch.float64, progress=False)

    reference = model(molecules).fit(epochs=3, refit=False)  # ranks do not refit
    on_spark = relsql.connect(spark, scratch=tmp_path)
    scratch = on_spark.folder
    assert scratch.parent == tmp_path and scratch.exists()
    trained = model(on_spark).fit(epochs=3, workers=2)  # Spark grounds, 2 ranks train: one DuckDB process's steps
    for name, weight in reference.named_weights().items():
        assert torch.allclose(weight.detach(), trained.named_weights()[name].detach(), atol=1e-10, rtol=0), name
    assert trained.write_predictions("mutagenic_predictions") == 188
    assert spark.table("mutagenic_predictions").count() == 188
    with pytest.raises(relsql.RelsqlError, match="already exists"):
        trained.write_predictions("mutagenic_predictions")
    assert spark.table("molecule").count() == 188  # the user's tables are only read
    on_spark.close()
    with relsql.connect(spark, read_only=True) as frozen, pytest.raises(relsql.RelsqlError, match="read-only"):
        frozen.write_table("more_predictions", frozen.arrow("SELECT 1 AS x"))
    assert not scratch.exists()
    assert not [d.name for d in spark.catalog.listDatabases() if d.name.startswith("relsql_scratch")]


def test_spark_errors_name_the_statement(spark, molecules_on_spark):
    template = relsql.Template.from_sql("CREATE TABLE p AS SELECT m.molecule_id, linear(features(m.nope), 1, 'w') AS h "
                                        "FROM molecule m;")
    with relsql.connect(spark) as on_spark, pytest.raises(relsql.RelsqlError, match="nope"):
        relsql.Model(on_spark, template, "molecule.mutagenic", batch_size=64, progress=False)


def test_a_list_target_on_spark_references_what_it_references_on_duckdb(spark):
    """Spark's catalog declares no keys (SparkDatabase.key_catalog is False), yet a target
    references what it references on DuckDB over the same tables, from the keys inferred or given
    there: a list named after item's key (inferred: unique, never NULL) ranks item; a list named
    after no key is refused naming the fix, unless given as a foreign key (a link task's); a scalar
    column is a label unless given as a foreign key."""
    con = duckdb.connect()
    con.execute("CREATE TABLE wishes AS SELECT * FROM (VALUES (1, [10, 11], [11], [10], 10), (2, [11], [10, 11], [11], 11)) "
                "v(customer_id, item_id, gifts, wanted, best)")
    con.execute("CREATE TABLE item AS SELECT * FROM (VALUES (10, 1.0), (11, 2.0)) v(item_id, price)")
    keys = "FOREIGN KEY wishes(gifts) REFERENCES item(item_id)\nFOREIGN KEY wishes(best) REFERENCES item(item_id)"
    columns = ("item_id", "gifts", "best", "wanted", "customer_id")
    session = spark.newSession()  # its own temp views: keys are inferred over every table a session sees (2 here)
    try:
        with relsql.connect(con, keys=keys) as duck:
            copy_to_spark(duck, session)
            with relsql.connect(session, keys=keys) as on_spark:
                assert not on_spark.key_catalog and duck.key_catalog
                found = []
                for db in (duck, on_spark):
                    with db.frozen_schema():  # one catalog read each
                        found.append([answer(db, column) for column in columns])
    finally:
        for view in ("wishes", "item"):
            session.catalog.dropTempView(view)
        con.close()
    assert found[1] == found[0]
    items = Reference("item", "item_id", many=True)
    assert found[1][:3] == [items, items, Reference("item", "item_id", many=False)] and found[1][4] is None
    assert "no table has one" in found[1][3]


def answer(db: relsql.Database, column: str):
    """What `referenced` says of wishes.`column`: a Reference, None, or its error's message."""
    try:
        return referenced(db, "wishes", column)
    except relsql.RelsqlError as err:
        return str(err)


def test_spark_catalog_lists_columns_and_counts_rows_without_keys(spark):
    """SparkDatabase implements the engine's catalog itself (it inherited DuckDB's, which read a
    `con` of None): the columns and row count of a view this test made, no keys, all nullable."""
    spark.createDataFrame([(1, "a", 2.5), (2, None, 1.0), (3, "c", None)], "id long, name string, score double") \
        .createOrReplaceTempView("catalogued")
    with relsql.connect(spark) as on_spark:
        table = on_spark.catalog().tables["catalogued"]
    assert [(c.name, c.type, c.nullable) for c in table.columns] == [
        ("id", "BIGINT", True), ("name", "VARCHAR", True), ("score", "DOUBLE", True)]
    assert table.rows == 3 and table.primary_key == () and table.foreign_keys == ()
