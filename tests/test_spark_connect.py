"""Spark Connect as the engine (relsql/data/spark.py): a real Spark Connect server (pyspark's own
SparkConnectServer on local[2], in a JVM of its own) and relsql as its client, checked against
DuckDB on the same tables (the oracle).

The client runs in a process of its own (this file run as a script): pyspark lets one process
hold either a classic SparkContext (tests/conftest.py's `spark` fixture) or Spark Connect
sessions, not both. It runs the steps in order and reports each one's facts, or its traceback,
as one JSON line; the tests below check the report."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import NamedTuple

import pytest

pytestmark = pytest.mark.spark  # a Spark session or server (JVM)

ROOT = Path(__file__).resolve().parent.parent
STEPS = 300  # seconds the client may take (~70 s on 2 idle cores)
TEMPLATE = """
CREATE TABLE atom_h AS
SELECT a.atom_id, tanh(embed(a.element, 8, 'element')) AS h
FROM atom a;

CREATE TABLE bond_h AS
SELECT b.molecule_id, tanh(avg(linear(features(b.bond_type), 8, 'bond'))) AS h
FROM bond b
GROUP BY b.molecule_id;

CREATE TABLE predict AS
SELECT a.molecule_id, linear(avg(x.h), 1, 'atoms') + linear(avg(y.h), 1, 'bonds') + bias(1, 'b') AS h
FROM atom a
JOIN atom_h x ON x.atom_id = a.atom_id
JOIN bond_h y ON y.molecule_id = a.molecule_id
GROUP BY a.molecule_id;
"""  # an element dictionary (embed), feature statistics (features) and a readout: what a store holds


def _skip_reason() -> str | None:
    """Why this machine cannot run a Spark Connect server and client, or None."""
    try:
        from pyspark.sql.connect.utils import check_dependencies
    except ImportError:
        return "pyspark is not installed: bash scripts/setup installs relsql[spark]"
    try:
        check_dependencies()
    except ImportError as err:
        return f"Spark Connect's client is not installed ({err}): bash scripts/setup installs relsql[spark]"
    if shutil.which("java") is None:
        return "Spark needs Java 17 (apt-get install -y openjdk-17-jre-headless)"
    return None


if __name__ != "__main__" and _skip_reason():
    pytest.skip(_skip_reason(), allow_module_level=True)


# -- the server and the client's report ------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _environment() -> dict:
    """The executors' Python workers unpickle relsql's functions: they import it from this checkout."""
    return {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


def _wait_for(server: subprocess.Popen, port: int, log: Path, limit: float = 180) -> None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"the Spark Connect server ended ({server.returncode}): {log.read_text()[-3000:]}")
        if _listens(port):
            return
        time.sleep(0.5)
    raise RuntimeError(f"the Spark Connect server did not listen on {port} in {limit} s: {log.read_text()[-3000:]}")


def _listens(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


class Server(NamedTuple):
    url: str
    port: int
    process: subprocess.Popen
    log: Path


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """pyspark's SparkConnectServer on local[2], started (`report` waits until it listens), stopped after the module."""
    import pyspark

    folder = tmp_path_factory.mktemp("connect-server")
    port = _free_port()
    submit = Path(pyspark.__file__).parent / "bin" / "spark-submit"
    settings = {"spark.connect.grpc.binding.address": "127.0.0.1", "spark.connect.grpc.binding.port": str(port),
                "spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2", "spark.sql.session.timeZone": "UTC",
                "spark.sql.warehouse.dir": str(folder / "warehouse")}
    command = [str(submit), "--class", "org.apache.spark.sql.connect.service.SparkConnectServer", "--master", "local[2]",
               "--driver-memory", "1g", "--driver-java-options", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
               *[arg for key, value in settings.items() for arg in ("--conf", f"{key}={value}")]]
    log = folder / "server.log"
    with open(log, "w") as out:
        process = subprocess.Popen(command, cwd=folder, env=_environment(), stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    try:
        yield Server(f"sc://127.0.0.1:{port}", port, process, log)
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture(scope="module")
def report(server, tmp_path_factory) -> dict:
    """The client's steps over `server`, run once for the module's tests.

    The client starts at once, beside the server's JVM: it loads DuckDB's tables and trains its
    reference model while the server starts, and waits for the server's port before its first
    step (a server that ends or never listens fails here, with its log)."""
    folder = tmp_path_factory.mktemp("connect-client")
    out, err = folder / "client.out", folder / "client.err"
    with open(out, "w") as stdout, open(err, "w") as stderr:
        client = subprocess.Popen([sys.executable, __file__, server.url, str(folder)], cwd=ROOT, env=_environment(),
                                  stdout=stdout, stderr=stderr, text=True)
    try:
        began = time.monotonic()
        _wait_for(server.process, server.port, server.log)
        print(f"Spark Connect server listening after {time.monotonic() - began:.1f} s")
        try:
            client.wait(STEPS)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the client took over {STEPS} s once the server listened; its last output:\n{err.read_text()[-4000:]}")
    finally:
        if client.poll() is None:
            client.kill()
            client.wait()
    stdout, stderr = out.read_text(), err.read_text()
    lines = [line for line in stdout.splitlines() if line.startswith("REPORT ")]
    assert client.returncode == 0 and lines, f"the client failed ({client.returncode}): {stderr[-4000:]}"
    found = json.loads(lines[-1][len("REPORT "):])
    found["stderr"] = stderr
    print("client steps (s):", {name: facts.get("seconds") for name, facts in found.items() if isinstance(facts, dict)})
    return found


def step(report: dict, name: str) -> dict:
    facts = report.get(name)
    assert facts is not None, f"step {name} did not run"
    assert "error" not in facts, f"step {name} failed:\n{facts['error']}"
    return facts


# -- the tests ------------------------------------------------------------------------------------
def test_an_sc_url_opens_a_spark_connect_session_and_grounds_like_duckdb(report):
    facts = step(report, "grounding")
    assert facts["session"] == "pyspark.sql.connect.session"
    assert facts["description"].startswith("Spark at sc://127.0.0.1:")
    assert facts["relations"] == 3 and facts["parts"] >= 3  # equal stores (assert_same_groundings ran in the client)


def test_a_model_over_spark_connect_trains_like_one_duckdb_process(report):
    facts = step(report, "one_process")
    assert len(facts["losses"]) == 2 and facts["losses"][1] < facts["losses"][0]  # it trained
    assert facts["difference"] <= 1e-10


def test_predictions_over_spark_connect_go_to_a_new_table(report):
    facts = step(report, "predictions")
    assert facts["written"] == facts["rows"] == 188
    assert "already exists" in facts["again"]
    assert facts["molecules"] == 188  # the user's tables are only read


def test_two_ranks_started_by_torch_distributor_over_spark_connect_equal_one_duckdb_process(report):
    facts = step(report, "two_ranks")
    assert facts["difference"] <= 1e-10
    assert "TorchDistributor on this machine (the Spark Connect client)" in facts["log"]


def test_two_ranks_on_the_executors_over_spark_connect_equal_one_duckdb_process(report):
    assert step(report, "executor_ranks")["difference"] <= 1e-10


def test_spark_connect_errors_name_the_statement_without_pyspark_logging_them(report):
    facts = step(report, "errors")
    assert facts["type"] == "SchemaError" and "nope" in facts["message"]
    assert "SQLQueryContextLogger" not in report["stderr"] and "UNRESOLVED_COLUMN" not in report["stderr"]


def test_a_spark_connect_session_object_connects_and_the_scratch_database_is_dropped(report):
    facts = step(report, "cleanup")
    assert facts["description"] == "Spark session (Spark Connect)"
    assert "read-only" in facts["refused"]
    assert facts["scratch_databases"] == [] and facts["folders"] == []


def test_an_sc_url_without_a_server_is_refused_at_once():
    import relsql

    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        url = f"sc://127.0.0.1:{closed.getsockname()[1]}"
        started = time.monotonic()
        with pytest.raises(relsql.RelsqlError, match="no Spark Connect server answers at"):
            relsql.connect(url)
    assert time.monotonic() - started < 10  # Spark Connect's client alone retries for ~10 minutes


# -- the client (this file run as a script) --------------------------------------------------------
def _steps(url: str, folder: Path) -> dict:
    """Each step's facts (or its traceback), in order; a step runs only if the ones before it did."""
    import logging

    import relsql
    from relsql.datasets.mutagenesis import load
    from tests.test_spark import assert_same_groundings, copy_to_spark

    duck = relsql.connect()
    load(duck.con)
    template = relsql.Template.from_sql(TEMPLATE)
    reference = _model(duck, template).fit(epochs=2, refit=False)  # ranks do not refit
    state: dict = {}
    report: dict = {}

    def grounding() -> dict:
        _await_server(url)  # started beside this process (see `report`)
        db = state["db"] = relsql.connect(url, scratch=folder / "scratch")
        copy_to_spark(duck, db.spark)
        manifest = assert_same_groundings(template, duck, db)
        rules = [rule for relation in manifest["relations"].values() for rule in relation["rules"].values()]
        return {"session": type(db.spark).__module__, "description": db.description,
                "relations": len(manifest["relations"]), "parts": sum(len(rule["parts"]) for rule in rules)}

    def one_process() -> dict:
        model = state["model"] = _model(state["db"], template, store=folder / "store").fit(epochs=2, refit=False)
        return {"losses": [epoch["train_loss"] for epoch in model.history], "difference": _difference(reference, model)}

    def predictions() -> dict:
        spark = state["db"].spark
        written = state["model"].write_predictions("mutagenic_predictions")
        try:
            state["model"].write_predictions("mutagenic_predictions")
            again = "written twice"
        except relsql.RelsqlError as err:
            again = str(err)
        return {"written": written, "rows": spark.table("mutagenic_predictions").count(), "again": again,
                "molecules": spark.table("molecule").count()}

    def two_ranks() -> dict:
        """The one-process model trains on, 2 more epochs on 2 ranks (its store is reused), like
        the DuckDB model 2 more epochs in its process."""
        lines: list[str] = []
        handler = logging.Handler()
        handler.emit = lambda record: lines.append(record.getMessage())
        logging.getLogger("relsql").addHandler(handler)
        logging.getLogger("relsql").setLevel(logging.INFO)
        try:
            model = state["model"].fit(epochs=2, workers=2)
        finally:
            logging.getLogger("relsql").removeHandler(handler)
        return {"difference": _difference(reference.fit(epochs=2, refit=False), model), "log": "\n".join(lines)}

    def executor_ranks() -> dict:
        """2 more epochs on 2 ranks in a barrier stage on the server's executors (a Connect query)."""
        spark = state["db"].spark
        spark.conf.set("spark.relsql.ranksOn", "executors")
        try:
            model = state["model"].fit(epochs=2, workers=2)
        finally:
            spark.conf.unset("spark.relsql.ranksOn")
        return {"difference": _difference(reference.fit(epochs=2, refit=False), model)}

    def errors() -> dict:
        broken = relsql.Template.from_sql("CREATE TABLE p AS SELECT m.molecule_id, linear(features(m.nope), 1, 'w') AS h "
                                          "FROM molecule m;")
        try:
            relsql.Model(state["db"], broken, "molecule.mutagenic", batch_size=64, progress=False)
        except relsql.RelsqlError as err:
            return {"type": type(err).__name__, "message": str(err)}
        return {"type": "none", "message": "no error"}

    def cleanup() -> dict:
        spark = state["db"].spark
        with relsql.connect(spark, scratch=folder / "scratch", read_only=True) as frozen:
            description = frozen.description
            try:
                frozen.write_table("more_predictions", frozen.arrow("SELECT 1 AS x"))
                refused = "written"
            except relsql.RelsqlError as err:
                refused = str(err)
        state["db"].close()
        return {"description": description, "refused": refused,
                "scratch_databases": [d.name for d in spark.catalog.listDatabases() if d.name.startswith("relsql_scratch")],
                "folders": [p.name for p in (folder / "scratch").iterdir()]}

    for name, run in [("grounding", grounding), ("one_process", one_process), ("predictions", predictions),
                      ("two_ranks", two_ranks), ("executor_ranks", executor_ranks), ("errors", errors), ("cleanup", cleanup)]:
        began = time.monotonic()
        try:
            report[name] = run()
            report[name]["seconds"] = round(time.monotonic() - began, 1)
        except BaseException:
            report[name] = {"error": traceback.format_exc()}
            if name in ("grounding", "one_process"):
                break  # the later steps use what these made
    return report


def _await_server(url: str, limit: float = 180) -> None:
    """Until the server at `url` listens (the test's fixture stops this process if the server ends)."""
    port, deadline = int(url.rsplit(":", 1)[1]), time.monotonic() + limit
    while not _listens(port):
        if time.monotonic() > deadline:
            raise RuntimeError(f"no Spark Connect server listens at {url} after {limit} s")
        time.sleep(0.5)


def _model(db, template, **settings):
    import torch

    import relsql

    return relsql.Model(db, template, "molecule.mutagenic", batch_size=64, dtype=torch.float64, progress=False, **settings)


def _difference(one, other) -> float:
    """The largest difference between two models' weights."""
    mine, theirs = one.named_weights(), other.named_weights()
    assert mine.keys() == theirs.keys()
    return max(float((mine[n].detach() - theirs[n].detach()).abs().max()) for n in mine)


if __name__ == "__main__":
    print("REPORT " + json.dumps(_steps(sys.argv[1], Path(sys.argv[2]))), flush=True)
