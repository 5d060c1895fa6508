"""Spark items of issue #27: keys given on temp views (a RecursionError before), relsql's mark on
the tables it writes there, and a clear error when the executors' Python cannot run relsql's
store writer (a real local session whose workers run the system Python, without relsql)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow as pa
import pytest
import sqlglot.expressions as exp

import relsql
from tests.test_model import build

ROOT = Path(__file__).resolve().parent.parent
SYSTEM_PYTHON = "/usr/bin/python3"
KEYS = """PRIMARY KEY customer(customer_id)
PRIMARY KEY orders(order_id)
FOREIGN KEY orders(customer_id) REFERENCES customer(customer_id)"""
pytest.importorskip("pyspark", reason="pyspark is not installed: bash scripts/setup installs relsql[spark]")
if shutil.which("java") is None:
    pytest.skip("Spark needs Java 17 (apt-get install -y openjdk-17-jre-headless)", allow_module_level=True)

pytestmark = pytest.mark.spark  # a Spark session or server (JVM)


@pytest.fixture(scope="module")
def shop_views(spark, tmp_path_factory):
    """The test_model shop as temp views of the shared session."""
    duck = build(tmp_path_factory.mktemp("views") / "shop.duckdb", n=30)
    for table in duck.tables():
        data = duck.arrow(exp.select(exp.Star()).from_(exp.Table(this=exp.to_identifier(table, quoted=True))))
        spark.createDataFrame(data).createOrReplaceTempView(table)
    duck.con.close()
    yield spark
    for table in ("customer", "orders"):
        spark.catalog.dropTempView(table)


def test_keys_given_on_temp_views(shop_views):
    db = relsql.connect(shop_views, keys=KEYS)  # checks the keys against the views' columns: a RecursionError before
    try:
        assert {"customer", "orders"} <= set(db.tables())
        with db.frozen_schema():
            assert [c for c, _ in db.columns("orders")][:2] == ["order_id", "customer_id"]
        assert db.given_keys is not None
    finally:
        db.close()


def test_spark_replaces_only_what_relsql_wrote(shop_views):
    db = relsql.connect(shop_views)
    try:
        before = sorted(db.arrow('SELECT * FROM `orders`').to_pylist(), key=repr)
        with pytest.raises(relsql.RelsqlError, match="`orders`.*not a table of predictions that relsql wrote"):
            db.write_table("ORDERS", pa.table({"x": [1]}), replace=True, kind="predictions")
        assert sorted(db.arrow('SELECT * FROM `orders`').to_pylist(), key=repr) == before
        db.write_table("own_preds", pa.table({"x": [1, 2]}), kind="predictions")
        try:
            db.write_table("own_preds", pa.table({"x": [3]}), replace=True, kind="predictions")
            assert db.arrow('SELECT x FROM `own_preds`').column("x").to_pylist() == [3]
            with pytest.raises(relsql.RelsqlError, match="`own_preds`.*a table of predictions, not a task table"):
                db.write_table("own_preds", pa.table({"x": [4]}), replace=True, kind="task")
        finally:
            db.execute(exp.Drop(tables=[exp.Table(this=exp.to_identifier("own_preds", quoted=True))], kind="TABLE", exists=True))
    finally:
        db.close()


WORKERS_SCRIPT = """
import sys
import relsql
from pyspark.sql import SparkSession
from tests.test_model import SIMPLE, build

session = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
           .config("spark.sql.shuffle.partitions", "2").config("spark.sql.warehouse.dir", sys.argv[2]).getOrCreate())
session.sparkContext.setLogLevel("OFF")
duck = build(sys.argv[1], n=30)
for table in duck.tables():
    session.createDataFrame(duck.arrow(f'SELECT * FROM "{table}"')).createOrReplaceTempView(table)
db = relsql.connect(session)
try:
    relsql.Model(db, relsql.Template.from_sql(SIMPLE), "customer.churned", batch_size=8, progress=False).fit(epochs=1)
    print("NO ERROR")
except relsql.RelsqlError as err:
    print("RELSQL ERROR:", err)
"""


def test_workers_without_relsql_are_named_with_the_fix(tmp_path):
    """PySpark's workers run PYSPARK_PYTHON: here the system Python, which has no relsql, numpy
    or pyarrow. Mini-batch grounding writes the store on the executors: a RelsqlError names that
    Python, what it lacks and what to set, before any job fails deep in a worker (relsql itself
    would be shipped; numpy and pyarrow cannot be)."""
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        pytest.skip(f"{SYSTEM_PYTHON} is not on this machine")
    found = subprocess.run([SYSTEM_PYTHON, "-c", "import relsql"], capture_output=True, cwd=tmp_path)
    if found.returncode == 0:
        pytest.skip(f"{SYSTEM_PYTHON} can import relsql here")
    env = {**os.environ, "PYSPARK_PYTHON": SYSTEM_PYTHON, "SPARK_LOCAL_IP": "127.0.0.1"}
    for name in ("PYSPARK_DRIVER_PYTHON", "PYTHONPATH"):  # the driver finds tests/ from its working folder
        env.pop(name, None)
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(WORKERS_SCRIPT), str(tmp_path / "shop.duckdb"),
                             str(tmp_path / "warehouse")], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    out = result.stdout
    assert "RELSQL ERROR:" in out, out + result.stderr[-3000:]
    assert SYSTEM_PYTHON in out and "PYSPARK_PYTHON" in out and "spark.pyspark.python" in out
    assert "cannot import numpy" in out and sys.executable in out
    assert "relsql itself is shipped with the job" in out  # what is not asked of them


def test_spark_refuses_an_explosive_grounding_with_an_estimate(spark):
    """Spark's planner gives no row estimate relsql can read: the product rule stands in (a join
    without an equality is the product of its sides), so a cross join is refused before it runs."""
    spark.range(300).selectExpr("id", "id % 2 = 0 AS label").createOrReplaceTempView("pair_a")
    spark.range(200).selectExpr("id", "(id % 5) / 5.0 AS x").createOrReplaceTempView("pair_b")
    template = relsql.Template.from_sql(
        "CREATE TABLE h AS SELECT a.id, linear(sum(b.x), 1, 'w') AS v FROM pair_a a, pair_b b GROUP BY a.id;")
    db = relsql.connect(spark)
    try:
        with pytest.raises(relsql.GroundingError, match=r"h, statement 1 .*about 60,000 groundings.*max_groundings=1,000"):
            relsql.compile(template, db, max_groundings=1_000)
    finally:
        db.close()
        for view in ("pair_a", "pair_b"):
            spark.catalog.dropTempView(view)
