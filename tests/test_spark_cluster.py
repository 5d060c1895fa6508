"""relsql on a real Spark standalone cluster: a master and two workers started here as separate
processes (Spark's own `spark-class ...Master` / `...Worker`, loopback, ephemeral ports, torn down
after), `relsql.connect("spark://...")` from a driver process of its own; the grounding store is
written by the executors (each a JVM of its own, with its own Python workers) and
`fit(workers=2)` runs its ranks on the executors through TorchDistributor. The oracle: one
DuckDB process training the same model (float64, 1e-10)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

import relsql

pytest.importorskip("pyspark.ml.torch.distributor", reason="pyspark is not installed: bash scripts/setup installs relsql[spark]")
if shutil.which("java") is None:
    pytest.skip("Spark needs Java 17 (apt-get install -y openjdk-17-jre-headless)", allow_module_level=True)

pytestmark = [pytest.mark.spark, pytest.mark.slow]  # three JVMs here, two more for the executors

ROOT = Path(__file__).resolve().parent.parent
JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"  # as tests/conftest.py's session: many small jobs

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
model.fit(epochs=2, workers=2)
written = model.write_predictions("cluster_predictions")
result = {"weights": {n: w.detach().tolist() for n, w in model.named_weights().items()},
          "history": [h["train_loss"] for h in model.history], "written": written,
          "rows": session.table("cluster_predictions").count(), "on_executors": on_executors,
          "store_files": sum(1 for p in pathlib.Path(store).rglob("*") if p.is_file()),
          "executors": session.sparkContext._jsc.sc().getExecutorMemoryStatus().size() - 1}  # less the driver
db.close()
session.stop()
pathlib.Path(out).write_text(json.dumps(result))
"""


def _spark_class() -> str:
    import pyspark

    return str(Path(pyspark.__file__).parent / "bin" / "spark-class")


def _wait_for(path: Path, pattern: str, process: subprocess.Popen, seconds: float = 120) -> re.Match:
    """The first match of `pattern` in a daemon's log, waiting for it to be written."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = re.search(pattern, path.read_text(errors="replace")) if path.exists() else None
        if found:
            return found
        if process.poll() is not None:
            raise AssertionError(f"{path.name}: the daemon exited ({process.returncode}):\n{path.read_text()[-3000:]}")
        time.sleep(0.5)
    raise AssertionError(f"{path.name}: no {pattern!r} within {seconds} s:\n{path.read_text()[-3000:]}")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A standalone master and two one-core workers on loopback; yields the master's spark:// URL."""
    folder = tmp_path_factory.mktemp("cluster")
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable,
           "SPARK_DAEMON_JAVA_OPTS": JVM, "SPARK_WORKER_DIR": str(folder / "work")}
    env.pop("SPARK_HOME", None)
    daemons: list[subprocess.Popen] = []

    def start(name: str, *args: str) -> tuple[subprocess.Popen, Path]:
        log = folder / f"{name}.log"
        process = subprocess.Popen([_spark_class(), *args], stdout=log.open("w"), stderr=subprocess.STDOUT, env=env,
                                   cwd=folder, start_new_session=True)
        daemons.append(process)
        return process, log

    try:
        master, log = start("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", "0",
                            "--webui-port", "0")
        url = _wait_for(log, r"Starting Spark master at (spark://127\.0\.0\.1:\d+)", master).group(1)
        for k in range(2):
            worker, worker_log = start(f"worker{k}", "org.apache.spark.deploy.worker.Worker", url, "--host", "127.0.0.1",
                                       "--port", "0", "--webui-port", "0", "--cores", "1", "--memory", "1500m")
            _wait_for(worker_log, r"Successfully registered with master", worker)
        yield url, env, folder
    finally:
        for process in daemons:
            try:
                os.killpg(process.pid, 15)
            except ProcessLookupError:
                pass
        for process in daemons:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, 9)


def test_a_standalone_cluster_grounds_stores_and_trains_like_one_duckdb_process(cluster, molecules):
    url, env, folder = cluster
    out = folder / "result.json"
    conf = folder / "conf"
    conf.mkdir(exist_ok=True)
    (conf / "spark-defaults.conf").write_text("\n".join([  # what a user's cluster would say in its own
        "spark.ui.enabled false", "spark.ui.showConsoleProgress false", "spark.sql.shuffle.partitions 4",
        "spark.sql.session.timeZone UTC", "spark.executor.memory 1g", "spark.executor.cores 1", "spark.driver.memory 1g",
        f"spark.sql.warehouse.dir {folder / 'warehouse'}",
        f"spark.driver.extraJavaOptions {JVM}", f"spark.executor.extraJavaOptions {JVM}", ""]))
    driver = subprocess.run([sys.executable, "-c", textwrap.dedent(DRIVER), url, str(folder / "scratch"),
                             str(folder / "store"), str(out), TEMPLATE],
                            capture_output=True, text=True, env={**env, "SPARK_CONF_DIR": str(conf)}, cwd=ROOT,
                            timeout=900)
    assert driver.returncode == 0 and out.exists(), driver.stdout[-3000:] + driver.stderr[-5000:]
    result = json.loads(out.read_text())
    reference = relsql.Model(molecules, relsql.Template.from_sql(TEMPLATE), "molecule.mutagenic", batch_size=64,
                             dtype=torch.float64, progress=False).fit(epochs=2, refit=False)  # ranks never refit
    for name, weight in reference.named_weights().items():
        theirs = torch.tensor(result["weights"][name], dtype=torch.float64)
        assert torch.allclose(weight.detach(), theirs, atol=1e-10, rtol=0), name
    assert result["history"] == pytest.approx([h["train_loss"] for h in reference.history], abs=1e-10)
    assert result["on_executors"] is True  # two workers' task slots: the ranks ran as barrier tasks there
    assert result["written"] == result["rows"] == 188
    assert result["store_files"] > 0  # the grounding store, written by the executors
    assert result["executors"] == 2  # one executor per worker, each a JVM of its own
