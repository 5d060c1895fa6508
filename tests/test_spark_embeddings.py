"""Database-stored embeddings with Spark as the engine (relsql/train/embeddings/swapped.py): trained on
ranks, written back as a new Parquet table swapped in. A real local[2] session; the oracle is
one DuckDB process training the same template on the same rows."""

from __future__ import annotations

import shutil

import numpy as np
import pyarrow as pa
import pytest
import sqlglot.expressions as exp
import torch

import relsql
from relsql import sql as q
from relsql.data.spark import _NEXT
from relsql.train.embeddings.embeddings import DatabaseEmbedding
from relsql.train.embeddings.swapped import SwappedEmbedding
from tests.test_batches import shop_db, shop_template
from tests.test_spark import copy_to_spark

pytest.importorskip("pyspark", reason="pyspark is not installed: bash scripts/setup installs relsql[spark]")
if shutil.which("java") is None:
    pytest.skip("Spark needs Java 17 (apt-get install -y openjdk-17-jre-headless)", allow_module_level=True)

pytestmark = pytest.mark.spark  # a Spark session or server (JVM)


def model(db) -> relsql.Model:
    return relsql.Model(db, shop_template("database"), "item.y", batch_size=256, dtype=torch.float64, progress=False)


def rows_and_step(trained: relsql.Model) -> tuple[dict, int]:
    table = trained.batched.store("user", None)
    return table.values(), table.step()


def assert_same_rows(a: dict, b: dict) -> None:
    assert a.keys() == b.keys() and len(a) == 300
    assert all(np.allclose(a[k], b[k], atol=1e-10, rtol=0) for k in a)


def test_spark_trains_stored_embeddings_on_ranks_like_one_duckdb_process(spark, tmp_path):
    """fit() on Spark trains the `user` table on one rank, fit(workers=2) goes on from the table on
    two: weights, the table's rows and its step counter equal one DuckDB process's after the same
    two fits; the table's comment carries the step; evaluation reads the rows with one join."""
    duck = shop_db()
    copy_to_spark(duck, spark)
    reference = model(duck)
    on_spark = relsql.connect(spark, scratch=tmp_path)
    trained = model(on_spark)
    with pytest.raises(relsql.RelsqlError, match="no transactions.*callback"):
        trained.fit(epochs=1, callback=print)

    reference.fit(epochs=2, lr=0.05)
    trained.fit(epochs=2, lr=0.05)  # one worker: one rank process, not step-by-step SQL
    first, first_step = rows_and_step(reference)
    assert first_step == 12
    assert rows_and_step(trained)[1] == first_step
    assert_same_rows(rows_and_step(trained)[0], first)
    description = spark.catalog.getTable("relsql_embedding_user").description
    assert description == "relsql embedding (weight 'user', step 12)"

    reference.fit(epochs=2, lr=0.05)
    trained.fit(epochs=2, lr=0.05, workers=2)
    for name, weight in reference.named_weights().items():
        assert torch.allclose(weight.detach(), trained.named_weights()[name].detach(), atol=1e-10, rtol=0), name
    (a, a_step), (b, b_step) = rows_and_step(reference), rows_and_step(trained)
    assert a_step == b_step == 24
    assert_same_rows(b, a)
    assert any(not np.allclose(first[k], b[k]) for k in b)  # the second fit moved them
    assert trained.evaluate()["loss"] == pytest.approx(reference.evaluate()["loss"], abs=1e-10)

    names = trained.gradients_as_relations("g_")  # summed per key in Spark, written as new tables
    assert names == reference.gradients_as_relations("g_") and names["user"] == "g_user"
    for table in names.values():
        ours = spark.table(table).toArrow().to_pylist()
        theirs = duck.arrow(f"SELECT * FROM {table}").to_pylist()
        key = "key" if table == "g_user" else "row"
        ours, theirs = sorted(ours, key=lambda r: r[key]), sorted(theirs, key=lambda r: r[key])
        assert len(ours) == len(theirs) > 0
        assert all(a[key] == b[key] and np.allclose(a["gradient"], b["gradient"], atol=1e-10, rtol=0)
                   for a, b in zip(ours, theirs)), table
    with pytest.raises(relsql.RelsqlError, match="already exists"):
        trained.gradients_as_relations("g_")
    assert spark.table("users").count() == 300  # the user's tables are only read
    on_spark.close()


def test_a_swap_cut_short_is_finished_or_undone_when_the_table_is_opened(spark):
    """Killed after dropping the old table, the new one (complete) is renamed into place; killed
    before, the old table stands and the half-written one goes. A fresh key starts from the row
    DuckDB gives it (the same hash)."""
    db = relsql.connect(spark)
    try:
        table = SwappedEmbedding(db, "swap", 2, pa.int64(), seed=7)
        assert table.step() == 0 and table.rows() == 0
        keys = pa.array([5, 11], pa.int64())
        fresh = table.fetch(keys).numpy()
        with relsql.connect() as duck:
            assert np.allclose(fresh, DatabaseEmbedding(duck, "swap", 2, pa.int64(), seed=7).fetch(keys).numpy(), atol=0, rtol=0)

        def rows(values: list[float]) -> pa.Table:
            return pa.table({"key": pa.array([5], pa.int64()), "e0": values[:1], "e1": values[1:2], "a0": [0.0], "a1": [0.0]})

        table.replace_rows(rows([1.0, 2.0]), 3)
        assert table.step() == 3 and np.allclose(table.fetch(keys).numpy(), [[1.0, 2.0], fresh[1]])

        def half_done(values: list[float], step: int, drop_old: bool) -> None:
            """What replace_table leaves when killed after writing the new table (and the drop)."""
            row = [exp.cast(q.integer(5), exp.DataType.build("BIGINT")), *[q.real(v) for v in [*values, 0.0, 0.0]]]
            new = exp.select(*[exp.alias_(v, q.ident(c)) for v, c in zip(row, table.columns())])
            db.execute(exp.Create(this=exp.Table(this=q.ident(table.name + _NEXT)), kind="TABLE", expression=new,
                                  properties=exp.Properties(expressions=[exp.FileFormatProperty(this=exp.Var(this="PARQUET")),
                                                                         exp.SchemaCommentProperty(this=exp.Literal.string(
                                                                             table._comment(step)))])))
            if drop_old:
                db.execute(exp.Drop(tables=[exp.Table(this=q.ident(table.name))], kind="TABLE"))

        half_done([8.0, 9.0], 4, drop_old=False)
        reopened = SwappedEmbedding(db, "swap", 2, None, seed=7)
        assert reopened.step() == 3 and np.allclose(reopened.fetch(keys[:1]).numpy(), [[1.0, 2.0]])
        assert not spark.catalog.tableExists(table.name + _NEXT)

        half_done([8.0, 9.0], 4, drop_old=True)
        reopened = SwappedEmbedding(db, "swap", 2, None, seed=7)
        assert reopened.step() == 4 and np.allclose(reopened.fetch(keys[:1]).numpy(), [[8.0, 9.0]])
        assert not spark.catalog.tableExists(table.name + _NEXT)

        with pytest.raises(relsql.RelsqlError, match="not an embedding of width 3"):
            SwappedEmbedding(db, "swap", 3, None)
        spark.createDataFrame(rows([1.0, 2.0])).write.saveAsTable("relsql_embedding_foreign")
        with pytest.raises(relsql.RelsqlError, match="no relsql step counter"):
            SwappedEmbedding(db, "foreign", 2, None)
        with pytest.raises(relsql.RelsqlError, match="no transactions"):
            reopened.update(keys, torch.zeros(2, 2))
    finally:
        for name in ("relsql_embedding_swap", "relsql_embedding_foreign"):
            spark.sql(exp.Drop(tables=[exp.Table(this=q.ident(name))], kind="TABLE", exists=True).sql("spark"))
        db.close()
