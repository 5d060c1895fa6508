"""A Spark standalone cluster on this machine, for tests/test_spark_cluster.py and bench/spark_cluster.py.

Spark's own master and workers (`spark-class org.apache.spark.deploy.master.Master` / `...Worker`),
each a JVM process of its own on loopback with ephemeral ports, torn down on exit; the driver is
a separate process that connects to the master's spark:// URL. `python_without` builds a Python
for the executors that has this environment's packages less some (relsql, say), to show that
relsql reaches executors that never installed it.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import sysconfig
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"  # as tests/conftest.py's session: many small jobs


@dataclass(frozen=True)
class Cluster:
    url: str  # the master's spark:// URL
    env: dict[str, str]  # the daemons' environment, for a driver process to start from
    folder: Path  # logs, the workers' folders
    sessions: tuple[int, ...] = ()  # the daemons' session ids (each starts a session of its own)

    def cpu_seconds(self) -> float:
        """CPU seconds of the daemons and everything they started (executors, Python workers)
        that is alive now, with their reaped children: read from /proc (Linux)."""
        total, tick = 0.0, os.sysconf("SC_CLK_TCK")
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue  # ended meanwhile
            if int(fields[3]) in self.sessions:  # fields after the name: state ppid pgrp session ...
                total += sum(int(f) for f in fields[11:15]) / tick  # utime stime cutime cstime
        return total


def spark_class() -> str:
    import pyspark

    return str(Path(pyspark.__file__).parent / "bin" / "spark-class")


def wait_for(path: Path, pattern: str, process: subprocess.Popen, seconds: float = 120) -> re.Match:
    """The first match of `pattern` in a daemon's log, waiting for it to be written."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = re.search(pattern, path.read_text(errors="replace")) if path.exists() else None
        if found:
            return found
        if process.poll() is not None:
            raise RuntimeError(f"{path.name}: the daemon exited ({process.returncode}):\n{path.read_text()[-3000:]}")
        time.sleep(0.5)
    raise RuntimeError(f"{path.name}: no {pattern!r} within {seconds} s:\n{path.read_text()[-3000:]}")


@contextlib.contextmanager
def standalone(folder: Path, workers: int = 2, cores: int = 1, memory: str = "1500m") -> Iterator[Cluster]:
    """A master and `workers` workers of `cores` cores each. The daemons' environment has no
    PYTHONPATH: the executors' Python finds relsql only where it is installed (or shipped)."""
    folder.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable,
           "SPARK_DAEMON_JAVA_OPTS": JVM, "SPARK_WORKER_DIR": str(folder / "work")}
    for name in ("SPARK_HOME", "PYTHONPATH", "SPARK_CONF_DIR"):
        env.pop(name, None)
    daemons: list[subprocess.Popen] = []

    def start(name: str, *args: str) -> tuple[subprocess.Popen, Path]:
        log = folder / f"{name}.log"
        with log.open("w") as out:
            process = subprocess.Popen([spark_class(), *args], stdout=out, stderr=subprocess.STDOUT, env=env,
                                       cwd=folder, start_new_session=True)
        daemons.append(process)
        return process, log

    try:
        master, log = start("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", "0",
                            "--webui-port", "0")
        url = wait_for(log, r"Starting Spark master at (spark://127\.0\.0\.1:\d+)", master).group(1)
        for k in range(workers):
            worker, worker_log = start(f"worker{k}", "org.apache.spark.deploy.worker.Worker", url, "--host", "127.0.0.1",
                                       "--port", "0", "--webui-port", "0", "--cores", str(cores), "--memory", memory)
            wait_for(worker_log, r"Successfully registered with master", worker)
        yield Cluster(url, env, folder, tuple(process.pid for process in daemons))
    finally:
        for process in daemons:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, 15)
        for process in daemons:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, 9)


def write_conf(folder: Path, settings: dict[str, str]) -> Path:
    """A SPARK_CONF_DIR whose spark-defaults.conf holds `settings` (what a user's cluster would
    say in its own), plus the JVM options of these small test JVMs."""
    conf = folder / "conf"
    conf.mkdir(parents=True, exist_ok=True)
    lines = {"spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false", "spark.sql.session.timeZone": "UTC",
             "spark.driver.extraJavaOptions": JVM, "spark.executor.extraJavaOptions": JVM, **settings}
    (conf / "spark-defaults.conf").write_text("".join(f"{k} {v}\n" for k, v in lines.items()))
    return conf


def python_without(folder: Path, hidden: tuple[str, ...]) -> str:
    """A Python with this environment's packages except `hidden` (import names; their
    .dist-info too) and relsql's editable install: a virtual environment of its own whose one
    .pth line names a folder of links to the rest of this one's site-packages (a .pth line adds
    a folder to sys.path without running the .pth files in it)."""
    folder.mkdir(parents=True, exist_ok=True)
    packages = folder / "packages"
    packages.mkdir(exist_ok=True)
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        name = entry.name
        if name.startswith("__editable__") or name.endswith(".pth") or any(
                name == h or name.startswith((f"{h}-", f"{h}.")) for h in hidden):
            continue
        link = packages / name
        if not link.exists():
            link.symlink_to(entry)
    venv = folder / "venv"
    if not (venv / "bin" / "python").exists():
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = subprocess.run([str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    (Path(site) / "packages.pth").write_text(f"{packages}\n")
    return str(venv / "bin" / "python")
