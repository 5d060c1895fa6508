"""relsql on a real Spark standalone cluster: a master and two workers started here as separate
processes (Spark's own `spark-class ...Master` / `...Worker`, loopback, ephemeral ports, torn down
after), `relsql.connect("spark://...")` from a driver process of its own; the grounding store is
written by the executors (each a JVM of its own, with its own Python workers) and
`fit(workers=2)` runs its ranks on the executors through TorchDistributor. The oracle: one
DuckDB process training the same model (float64, 1e-10)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import relsql
from bench.spark_standalone import python_without, standalone, write_conf

pytest.importorskip("pyspark.ml.torch.distributor", reason="pyspark is not installed: bash scripts/setup installs relsql[spark]")
if shutil.which("java") is None:
    pytest.skip("Spark needs Java 17 (apt-get install -y openjdk-17-jre-headless)", allow_module_level=True)

pytestmark = [pytest.mark.spark, pytest.mark.slow]  # three JVMs here, two more for the executors

ROOT = Path(__file__).resolve().parent.parent

TEMPLATE = """
CREATE TABLE atom_embed AS SELECT a.atom_id, tanh(embed(a.element, 8, 'atom_embed')) AS h FROM atom a;
CREATE TABLE predict AS
SELECT a.molecule_id, linear(avg(e.h), 1, 'predict') + bias(1, 'predict_bias') AS h
FROM atom a JOIN atom_embed e ON e.atom_id = a.atom_id GROUP BY a.molecule_id;
"""

DRIVER = """
import json, pathlib, sys
import torch
import relsql
from pyspark.sql import SparkSession
from relsql.data import spark_ship
from relsql.datasets.mutagenesis import load
from relsql.train.loop import torch_distributor

master, scratch, store, out, template = sys.argv[1:6]
session = SparkSession.builder.master(master).getOrCreate()  # settings from SPARK_CONF_DIR's spark-defaults.conf
session.sparkContext.setLogLevel("ERROR")
duck = relsql.connect()
load(duck.con)
for table in duck.tables():  # the user's tables, as temp views of the session
    session.createDataFrame(duck.arrow(f'SELECT * FROM "{table}"')).createOrReplaceTempView(table)
db = relsql.connect(master, scratch=scratch)  # the same session (getOrCreate)
model = relsql.Model(db, relsql.Template.from_sql(template), "molecule.mutagenic", batch_size=64,
                     dtype=torch.float64, progress=False, store=store)
on_executors = torch_distributor.on_executors(session, 2, gpu=False)
result = {"store_files": lambda: sum(1 for p in pathlib.Path(store).rglob("*") if p.is_file())}
try:
    model.fit(epochs=2, workers=2)
except relsql.RelsqlError as err:
    result = {"error": str(err), "store_files": result["store_files"]()}
else:
    written = model.write_predictions("cluster_predictions")
    where = session.sparkContext.parallelize([0, 1], 2).map(lambda _: __import__("relsql").__file__).collect()
    result = {"weights": {n: w.detach().tolist() for n, w in model.named_weights().items()},
              "history": [h["train_loss"] for h in model.history], "written": written,
              "rows": session.table("cluster_predictions").count(), "on_executors": on_executors,
              "store_files": result["store_files"](), "shipped": spark_ship.shipped(session),
              "executor_relsql": where,
              "executors": session.sparkContext._jsc.sc().getExecutorMemoryStatus().size() - 1}  # less the driver
db.close()
session.stop()
pathlib.Path(out).write_text(json.dumps(result))
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A standalone master and two one-core workers on loopback (bench/spark_standalone.py)."""
    with standalone(tmp_path_factory.mktemp("cluster")) as running:
        yield running


def _drive(cluster, name: str, python: str) -> dict:
    """The driver script in a process of its own against the cluster, its executors running `python`."""
    folder = cluster.folder / name
    out = folder / "result.json"
    conf = write_conf(folder, {"spark.sql.shuffle.partitions": "4", "spark.executor.memory": "1g",
                               "spark.executor.cores": "1", "spark.driver.memory": "1g",
                               "spark.sql.warehouse.dir": str(folder / "warehouse")})
    env = {**cluster.env, "SPARK_CONF_DIR": str(conf), "PYSPARK_PYTHON": python}  # relsql: from ROOT, the working folder
    driver = subprocess.run([sys.executable, "-c", textwrap.dedent(DRIVER), cluster.url, str(folder / "scratch"),
                             str(folder / "store"), str(out), TEMPLATE],
                            capture_output=True, text=True, env=env, cwd=ROOT, timeout=900)
    assert driver.returncode == 0 and out.exists(), driver.stdout[-3000:] + driver.stderr[-5000:]
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def reference(molecules):
    """The oracle: one DuckDB process training the same model."""
    return relsql.Model(molecules, relsql.Template.from_sql(TEMPLATE), "molecule.mutagenic", batch_size=64,
                        dtype=torch.float64, progress=False).fit(epochs=2, refit=False)  # ranks never refit


def _assert_trained_like(result: dict, reference) -> None:
    for name, weight in reference.named_weights().items():
        theirs = torch.tensor(result["weights"][name], dtype=torch.float64)
        assert torch.allclose(weight.detach(), theirs, atol=1e-10, rtol=0), name
    assert result["history"] == pytest.approx([h["train_loss"] for h in reference.history], abs=1e-10)
    assert result["on_executors"] is True  # two workers' task slots: the ranks ran as barrier tasks there
    assert result["written"] == result["rows"] == 188
    assert result["store_files"] > 0  # the grounding store, written by the executors
    assert result["executors"] == 2  # one executor per worker, each a JVM of its own


def test_a_standalone_cluster_grounds_stores_and_trains_like_one_duckdb_process(cluster, reference):
    """Executors running this environment's Python (relsql installed there, or shipped when the
    installed one is another version of it)."""
    _assert_trained_like(_drive(cluster, "installed", sys.executable), reference)


def test_executors_without_relsql_get_it_shipped_with_the_job(cluster, reference, tmp_path_factory):
    """The executors' Python has torch, pandas, pyarrow... but no relsql: the package travels
    with the job (addPyFile for the store writer, a zip carried by the ranks' function for
    torchrun's processes), and the numbers are DuckDB's."""
    python = python_without(tmp_path_factory.mktemp("python"), ("relsql",))
    for code, found in (("import relsql", False), ("import torch, pandas, pyarrow", True)):  # as the workers run it
        ran = subprocess.run([python, "-c", code], cwd=cluster.folder, env=cluster.env, capture_output=True)
        assert (ran.returncode == 0) is found, (code, ran.stderr[-2000:])
    result = _drive(cluster, "shipped", python)
    _assert_trained_like(result, reference)
    assert result["shipped"] is True
    assert all(".zip" in where for where in result["executor_relsql"]), result["executor_relsql"]


def test_executors_missing_a_dependency_are_told_what_to_install(cluster, tmp_path_factory):
    """torch is a compiled wheel no zip carries: fit(workers=2) on executors without it stops
    before the barrier job with the executors' Python, what it lacks and the pip command; the
    store (which needs no torch) was written by then."""
    python = python_without(tmp_path_factory.mktemp("python"), ("relsql", "torch"))
    result = _drive(cluster, "no_torch", python)
    message = result.get("error", "")
    assert f"{python} cannot import torch" in message, result
    assert f"{python} -m pip install 'torch=={torch.__version__.split('+')[0]}'" in message
    assert "spark.relsql.ranksOn=driver" in message
    assert result["store_files"] > 0  # relsql shipped for the store writer, which imports no torch
