"""fit(workers=N) on a Spark engine starts its ranks through Spark's TorchDistributor
(relsql/train/loop/torch_distributor.py): a real local[2] session, ranks under torchrun, checked
against one DuckDB process training the same model (the oracle)."""

from __future__ import annotations

import logging
import shutil

import pytest
import sqlglot.expressions as exp
import torch

import relsql
from relsql.train.loop import torch_distributor

pytest.importorskip("pyspark.ml.torch.distributor", reason="pyspark is not installed: bash scripts/setup installs relsql[spark]")
if shutil.which("java") is None:
    pytest.skip("Spark needs Java 17 (apt-get install -y openjdk-17-jre-headless)", allow_module_level=True)

pytestmark = pytest.mark.spark  # a Spark session or server (JVM)


@pytest.fixture(scope="module")
def on_spark(spark, molecules, tmp_path_factory):
    for table in molecules.tables():  # what catalog tables would be: the session's temp views
        frame = molecules.arrow(exp.select(exp.Star()).from_(exp.Table(this=exp.to_identifier(table, quoted=True))))
        spark.createDataFrame(frame).createOrReplaceTempView(table)
    db = relsql.connect(spark, scratch=tmp_path_factory.mktemp("scratch"))
    yield db
    db.close()


# mutagenesis.sql cut to its atom embedding and readout: two relations for Spark to ground, not six
# (test_spark.py trains the whole template on 2 ranks, also through TorchDistributor)
TEMPLATE = """
CREATE TABLE atom_embed AS SELECT a.atom_id, tanh(embed(a.element, 8, 'atom_embed')) AS h FROM atom a;
CREATE TABLE predict AS
SELECT a.molecule_id, linear(avg(e.h), 1, 'predict') + bias(1, 'predict_bias') AS h
FROM atom a JOIN atom_embed e ON e.atom_id = a.atom_id GROUP BY a.molecule_id;
"""


def model(db) -> relsql.Model:
    return relsql.Model(db, relsql.Template.from_sql(TEMPLATE), "molecule.mutagenic", batch_size=64,
                        dtype=torch.float64, progress=False)


@pytest.fixture(scope="module")
def spark_model(on_spark) -> relsql.Model:
    return model(on_spark)  # grounded once, for both tests that train it


def test_the_launcher_applies_to_spark_only(on_spark, molecules, spark):
    assert torch_distributor.applies(on_spark) and not torch_distributor.applies(molecules)
    assert not torch_distributor.on_executors(spark, 2, gpu=False)  # local[2]: the driver runs torchrun
    try:
        spark.conf.set(torch_distributor.SETTING, "executors")
        assert torch_distributor.on_executors(spark, 2, gpu=False)
        spark.conf.set(torch_distributor.SETTING, "executor")
        with pytest.raises(relsql.RelsqlError, match="'driver' or 'executors'"):
            torch_distributor.on_executors(spark, 2, gpu=False)
    finally:
        spark.conf.unset(torch_distributor.SETTING)


def test_ranks_started_by_torch_distributor_equal_one_duckdb_process(spark_model, molecules, caplog, capsys):
    reference = model(molecules).fit(epochs=3, refit=False)  # ranks do not refit
    trained = spark_model
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="relsql"):
        trained.fit(epochs=3, workers=2)
    for name, weight in reference.named_weights().items():
        assert torch.allclose(weight.detach(), trained.named_weights()[name].detach(), atol=1e-10, rtol=0), name
    assert [h["epoch"] for h in trained.history] == [0, 1, 2]
    assert trained.history[-1]["train_loss"] == pytest.approx(reference.history[-1]["train_loss"], abs=1e-10)
    messages = [r.getMessage() for r in caplog.records if r.name == "relsql"]
    assert "training on 2 ranks started by Spark's TorchDistributor on this machine (Spark's driver)" in messages
    assert any(m.startswith("epoch 3 of 3: train loss") for m in messages), messages  # rank 0's record, relayed
    out = capsys.readouterr().out  # torchrun's banner and the ranks' lines went to logging, not to stdout
    assert "relsql-rank" not in out and "OMP_NUM_THREADS" not in out, out


def test_a_failing_rank_is_a_relsql_error_naming_it(spark_model, tmp_path):
    folder = spark_model.batched.grounding_store.folder
    moved = tmp_path / "moved"
    shutil.move(folder, moved)  # the ranks cannot read the store (as executors that do not share it)
    try:
        with pytest.raises(relsql.RelsqlError, match=r"training rank [01] of 2 failed: \w+Error: .*No such file"):
            spark_model.fit(epochs=1, workers=2)
    finally:
        shutil.move(moved, folder)


SUMMARY = """torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
Failures:
[1]:
  rank      : 1 (local_rank: 1)
  exitcode  : -15 (pid: 10632)  (SIGTERM)
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : -9 (pid: 10631)
============================================================"""


def test_a_rank_that_dies_without_a_word_is_named_from_torchruns_summary():
    output = torch_distributor._Output()
    output.write(SUMMARY)  # torchrun's own account (its format in torch 2.x), as it reaches stdout
    message = torch_distributor._failure(2, output, "TorchDistributor failed during training.", local=True)
    assert message == "training rank 0 of 2 failed: it ended with signal 9 before reporting an error"


def test_ranks_on_spark_executors_train_like_ranks_on_the_driver(spark_model, spark):
    """The executor path (local_mode=False: a barrier stage, one task per rank, each running
    torchrun) on local[2]'s two task slots: the same steps as the ranks the driver starts."""
    start = spark_model.learner.weights_copy()
    spark_model.fit(epochs=2, workers=2)
    on_driver = {n: w.detach().clone() for n, w in spark_model.named_weights().items()}
    spark_model.learner.restore_weights(start)
    spark.conf.set(torch_distributor.SETTING, "executors")
    try:
        spark_model.fit(epochs=2, workers=2)
    finally:
        spark.conf.unset(torch_distributor.SETTING)
    for name, weight in on_driver.items():
        assert torch.allclose(weight, spark_model.named_weights()[name].detach(), atol=1e-10, rtol=0), name
    assert not torch.equal(on_driver[name], start[0][name])  # it trained
