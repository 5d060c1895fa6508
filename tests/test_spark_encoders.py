"""ple(), calendar() and features() with NULLs grounded on Spark (relsql/data/spark.py) equal DuckDB's:
in bulk, where a ple column arrives as its number and is encoded and measured where it is read
(the same edges whichever engine), and through the grounding store, where Spark's executors write
what Spark's SQL encoded (DuckDB's `list_value` as Spark's `array`, `dayofweek` counted from
Sunday 0 as DuckDB counts)."""

from __future__ import annotations

import shutil
import warnings

import numpy as np
import pytest

import relsql
from relsql.ground.demand import BatchGrounder
from relsql.ground.execute import ground
from relsql.ground.store import GroundingStore
from tests.test_spark import copy_to_spark

pytest.importorskip("pyspark", reason="pyspark is not installed: bash scripts/setup installs relsql[spark]")
if shutil.which("java") is None:
    pytest.skip("Spark needs Java 17 (apt-get install -y openjdk-17-jre-headless)", allow_module_level=True)

pytestmark = pytest.mark.spark

TEMPLATE = ("CREATE TABLE f AS SELECT t.id, linear(concat(ple(t.a, t.b, t.d, 8), calendar(t.d, t.s), features(t.a)), 4, 'w') "
            "AS h FROM t;")


@pytest.fixture(scope="module")
def duck(spark):
    """Fractions with 17-digit quantile widths, ties, NULLs, dates and timestamps; copied to Spark."""
    db = relsql.connect()
    db.execute("CREATE TABLE t(id INT PRIMARY KEY, a DOUBLE, b INTEGER, d DATE, s TIMESTAMP, y BOOLEAN)")
    db.execute("""INSERT INTO t SELECT i,
                  CASE WHEN i % 13 = 0 THEN NULL ELSE round(0.75 + (i * 37 % 101) / 400.0, 3) END,
                  CASE WHEN i % 5 = 0 THEN NULL WHEN i % 3 = 0 THEN 0 ELSE i % 4 END,
                  CASE WHEN i % 7 = 0 THEN NULL ELSE DATE '2001-01-01' + CAST(i * 5 AS INTEGER) END,
                  TIMESTAMP '2020-06-01 00:00:00' + i * INTERVAL 7 HOUR + i * INTERVAL 11 MINUTE,
                  i % 2 = 0 FROM range(1, 240) r(i)""")
    copy_to_spark(db, spark)
    yield db
    db.con.close()


def assert_same(expected, found) -> None:
    """Equal statistics (a ple column's edges bit for bit: measured from the numbers either engine
    sends; the year's AVG and STDDEV_POP are each engine's own sums, and the spread of years near
    2020 loses digits: 4e-11 apart) and equal columns (the ple columns bit for bit; calendar's
    standardized year follows its statistics, and its sin and cos are each engine's own)."""
    assert expected.feature_stats.keys() == found.feature_stats.keys()
    for key, stats in expected.feature_stats.items():
        other = found.feature_stats[key]
        if stats.get("kind") == "ple":
            assert stats == other, key
        else:
            assert stats.keys() == other.keys() and stats.get("kind") == other.get("kind"), key
            assert {k: v for k, v in stats.items() if k != "kind"} == pytest.approx(
                {k: v for k, v in other.items() if k != "kind"}, rel=1e-9), key
    a, b = expected.relations["f"].rules[0], found.relations["f"].rules[0]
    assert np.array_equal(a.head.numpy(), b.head.numpy())
    for k in range(3):
        assert np.array_equal(a.columns[k].numpy(), b.columns[k].numpy()), k
    for k in a.columns:
        assert np.allclose(a.columns[k].numpy(), b.columns[k].numpy(), rtol=0, atol=1e-9), k


def test_spark_grounds_ple_in_bulk_like_duckdb(spark, duck):
    template = relsql.Template.from_sql(TEMPLATE)
    expected = ground(template, duck, progress=False)
    with relsql.connect(spark) as on_spark, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert_same(expected, ground(template, on_spark, progress=False))


def test_spark_writes_the_store_of_ple_calendar_and_nullable_features_like_duckdb(spark, duck):
    template = relsql.Template.from_sql(TEMPLATE)
    with relsql.connect(spark) as on_spark, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        grounders = [BatchGrounder(template, db, "f", progress=False) for db in (duck, on_spark)]
        stores = [GroundingStore.open(g, None, False) for g in grounders]
        rows = np.arange(grounders[0].sizes["f"])
        expected, found = (store.ground(rows) for store in stores)
    assert_same(expected, found)
    assert_same(ground(template, duck, progress=False), found)  # the store's SQL encoding equals the bulk reading's
