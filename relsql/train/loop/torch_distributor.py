"""Ranks started by Spark's TorchDistributor when the model's engine is Spark.

`fit(workers=N)` on a `SparkDatabase` hands the job to `pyspark.ml.torch.distributor.TorchDistributor`,
which runs torchrun; every rank calls `relsql.train.loop.distributed.run_rank` with the rendezvous
torchrun put in its environment (env://), and rank 0's result comes back to this process.

Where the ranks run (TorchDistributor's `local_mode`):
- The driver (local_mode=True: one `torchrun --standalone` with N processes on this machine)
  when the session's master is `local[...]`: there the executors are threads of this same
  machine's JVM, so a barrier job would only add what it needs (pandas on the workers, N free
  task slots) and gain nothing. Also when a cluster has fewer task slots (cores / spark.task.cpus)
  than the job has tasks: a barrier stage needs all its tasks running at once, and Spark
  retries it for minutes before failing.
- The executors (local_mode=False: a barrier stage of N tasks, one rank each; one task per
  node with all its GPUs when `spark.task.resource.gpu.amount` > 1) on a cluster. The executors
  then need torch and pandas (TorchDistributor sends the result back as Arrow) importable by their
  Python, checked once per session (relsql itself is shipped with the job where they lack it:
  relsql.data.spark_ship), and the grounding store's folder (`Model(store=...)`) and any
  checkpoint path on storage every executor reads and writes at the same path: the default
  store is a temporary folder on the driver. Rank 0's result (the weights) comes back as a
  Spark result: weights larger than `spark.driver.maxResultSize` need it raised.
- The Spark setting `spark.relsql.ranksOn` (`driver` or `executors`) overrides the choice, e.g.
  `driver` on a cluster whose executors cannot see the driver's store.

Spark Connect: TorchDistributor runs over a Connect session too (it reads the server's settings;
its barrier stage is a Connect query). "The driver" is then this process's machine, the Connect
client, which also reads the store the executors wrote; with the server elsewhere, a `local[...]`
master runs the ranks here too.

GPUs: a CUDA model asks TorchDistributor for GPUs (`use_gpu`), which it takes from Spark's
resources: `spark.driver.resource.gpu.*` for the driver, `spark.task.resource.gpu.amount` for
executors.

Output: TorchDistributor copies torchrun's and the ranks' output to stdout. This module takes
it while training: rank 0's relsql log records are logged again here (under `relsql`), the
rest is logged at DEBUG (`relsql.torch_distributor`), and a failing rank's own one-line account
becomes the RelsqlError's message.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import logging
import os
import re
import sys
from collections import deque
from pathlib import Path

from relsql.data import spark_ship
from relsql.errors import RelsqlError

log = logging.getLogger("relsql")
chatter = logging.getLogger("relsql.torch_distributor")
SETTING = "spark.relsql.ranksOn"
_RECORD = re.compile(r"relsql-rank (\d+) (\w+): (.*)")  # a rank's log record in the output
_ERROR = re.compile(r"relsql-rank-error (\d+): (.*)")  # a failing rank's own account
_LEVELS = {"DEBUG": logging.DEBUG, "INFO": logging.INFO, "WARNING": logging.WARNING, "ERROR": logging.ERROR}


def applies(db) -> bool:
    """True for a Spark engine whose pyspark has TorchDistributor (pyspark is an optional extra)."""
    try:
        from pyspark.ml.torch.distributor import TorchDistributor  # noqa: F401

        from relsql.data.spark import SparkDatabase
    except ImportError:
        return False
    return isinstance(db, SparkDatabase)


def run(db, job, train) -> dict:
    """Train `job` on job.world ranks started by TorchDistributor, each calling `train(job, rank)`
    (relsql.train.loop.distributed.run_rank, passed in so this module does not import it back); rank 0's result."""
    gpu = _on_cuda(job)
    local = not on_executors(db.spark, job.world, gpu)
    log.info("training on %d ranks started by Spark's TorchDistributor on %s", job.world,
             _here(db.spark) if local else "Spark's executors")
    distributor = _distributor(job, local, gpu)
    entry = (_rank, (dataclasses.replace(job, init_method="env://"), train))
    if not local:  # the executors' Python: the modules a rank needs; relsql itself shipped when they lack it
        spark_ship.ensure(db.spark, spark_ship.TRAIN)
        entry = spark_ship.rank_entry(db.spark, entry[0], *entry[1])
    output = _Output()
    try:
        with contextlib.redirect_stdout(output), _importable(local):
            result = distributor.run(entry[0], *entry[1])
    except Exception as err:  # RuntimeError from torchrun, or Spark's error for a failed barrier stage
        chatter.debug("TorchDistributor failed: %s", err)
        raise RelsqlError(_failure(job.world, output, str(err), local)) from None
    finally:
        output.flush()
    if not isinstance(result, dict):
        raise RelsqlError(f"Spark's TorchDistributor returned {type(result).__name__} instead of rank 0's result")
    return result


def _here(spark) -> str:
    """Where local_mode's ranks run: Spark's driver, or a Spark Connect client (not the driver)."""
    connect = type(spark).__module__.startswith("pyspark.sql.connect")
    return "this machine (the Spark Connect client)" if connect else "this machine (Spark's driver)"


def _distributor(job, local: bool, gpu: bool):
    """TorchDistributor for the job; its settings' complaints (GPU resources) as RelsqlError."""
    from pyspark.ml.torch.distributor import TorchDistributor

    try:
        distributor = TorchDistributor(num_processes=job.world, local_mode=local, use_gpu=gpu)
    except (RuntimeError, ValueError) as err:
        raise RelsqlError(f"Spark's TorchDistributor cannot start {job.world} ranks: {_first_line(str(err))}"
                          + (_GPU_HINT if gpu else "")) from None
    distributor.logger.setLevel(max(logging.INFO, job.log_level))  # its start/finish lines: only when relsql logs INFO
    return distributor


_GPU_HINT = (" (a CUDA model's ranks take Spark's GPU resources: set spark.driver.resource.gpu.amount and "
             "spark.driver.resource.gpu.discoveryScript for the driver, spark.task.resource.gpu.amount for executors)")


@contextlib.contextmanager
def _importable(local: bool):
    """torchrun's ranks on this machine import relsql (the pickled function names it) even when
    this process found it on its own sys.path only (a checkout, not an installed package)."""
    before = os.environ.get("PYTHONPATH")
    if local:
        root = str(Path(__file__).resolve().parents[2])
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [root, before]))
    try:
        yield
    finally:
        if local and before is None:
            os.environ.pop("PYTHONPATH", None)
        elif local:
            os.environ["PYTHONPATH"] = before


def on_executors(spark, world: int, gpu: bool) -> bool:
    """Whether the ranks run on the executors; see the module's docstring."""
    chosen = spark.conf.get(SETTING, "") or ""
    if chosen not in ("", "driver", "executors"):
        raise RelsqlError(f"{SETTING} is {chosen!r}: set it to 'driver' or 'executors', or unset it")
    if chosen:
        return chosen == "executors"
    master = spark.conf.get("spark.master", "") or ""
    if master == "local" or master.startswith("local["):
        return False
    slots = _task_slots(spark, gpu)
    if slots is not None and slots < _tasks(spark, world, gpu):
        log.warning("the Spark cluster has %d task slots for %d training ranks: they run on the driver", slots, world)
        return False
    return True


def _tasks(spark, world: int, gpu: bool) -> int:
    """Barrier tasks TorchDistributor asks for: one per rank, or per `spark.task.resource.gpu.amount` GPUs."""
    per_task = int(float(spark.conf.get("spark.task.resource.gpu.amount", "1") or 1)) if gpu else 1
    return max(1, world // max(1, per_task))


def _task_slots(spark, gpu: bool) -> int | None:
    """Tasks the cluster runs at once now (cores / spark.task.cpus); None when unknown (Spark Connect)."""
    try:
        cores = spark.sparkContext.defaultParallelism
    except Exception:  # Spark Connect has no SparkContext on this side
        return None
    if gpu:
        return None  # GPU slots are Spark's to count; TorchDistributor checks its GPU settings
    return cores // max(1, int(spark.conf.get("spark.task.cpus", "1") or 1))


def _on_cuda(job) -> bool:
    return str(job.model.device).split(":")[0] == "cuda"


# -- in each rank ------------------------------------------------------------------------------
def _rank(job, train) -> dict | None:
    """One rank under torchrun: train; rank 0 returns the result. A failure prints a line the
    driver reads back. Ranks sharing one torchrun share one output file, so only each node's
    first rank returns through it; the others end here, successfully."""
    import torch

    rank = int(os.environ["RANK"])
    try:
        torch.set_num_threads(job.threads)
        if rank == 0 and job.log_level < logging.WARNING:
            logging.basicConfig(level=job.log_level, stream=sys.stdout, force=True,
                                format=f"relsql-rank {rank} %(levelname)s: %(message)s")
        result = train(job, rank)
    except BaseException as err:
        text = str(err).strip()
        print(f"relsql-rank-error {rank}: {type(err).__name__}: {text.splitlines()[0] if text else ''}", flush=True)
        raise
    finally:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
    if int(os.environ.get("LOCAL_RANK", "0")) != 0:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)  # TorchDistributor's script would write None over the node's output file
    return result


# -- back in this process: the ranks' output and failures ------------------------------------------
class _Output(io.TextIOBase):
    """Stdout while TorchDistributor runs: rank log records relogged, the rest at DEBUG, the tail kept."""

    def __init__(self) -> None:
        self.partial, self.relaying, self.original = "", False, sys.stdout
        self.tail: deque[str] = deque(maxlen=200)

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        if self.relaying:  # a log handler that writes to stdout: not back into this
            return self.original.write(text)
        lines = (self.partial + text).split("\n")
        self.partial = lines.pop()
        for line in lines:
            self._line(line.rstrip("\r"))
        return len(text)

    def flush(self) -> None:
        if self.partial:
            self._line(self.partial)
            self.partial = ""

    def _line(self, line: str) -> None:
        self.tail.append(line)
        record = _RECORD.search(line)
        self.relaying = True
        try:
            if record:
                log.log(_LEVELS.get(record.group(2), logging.INFO), "%s", record.group(3))
            elif line.strip():
                chatter.debug("%s", line)
        finally:
            self.relaying = False


def _failure(world: int, output: _Output, error: str, local: bool) -> str:
    """A failed run in one line: the failing rank's own account, else torchrun's word on how a
    rank ended, else the last error line torchrun or Spark gave."""
    lines = [*output.tail, *error.splitlines()]
    account = next((m.groups() for m in map(_ERROR.search, lines) if m), None)
    if account is None:
        account = _ended(lines)
    if account is not None:
        message = f"training rank {account[0]} of {world} failed: {account[1]}"
    else:
        errors = [line.strip() for line in lines if re.match(r"\s*[\w.]+(Error|Exception): ", line)]
        message = f"training ranks started by Spark's TorchDistributor failed: {errors[-1] if errors else _first_line(error)}"
    if not local:
        message += (" (the ranks ran on Spark's executors: they need the grounding store and checkpoint on storage "
                    f"every executor reads at the same path, torch and pandas installed; {SETTING}=driver "
                    "runs them on the driver)")
    return message


def _ended(lines: list[str]) -> tuple[str, str] | None:
    """(rank, how it ended) from torchrun's failure summary (its root cause: the first rank to
    fail; the others were stopped after it), for a rank that died without a word."""
    root = next((i for i, line in enumerate(lines) if "Root Cause" in line), 0)
    rank = None
    for line in lines[root:]:
        if found := re.match(r"\s*rank\s*:\s*(\d+)", line):
            rank = found.group(1)
        elif (found := re.match(r"\s*exitcode\s*:\s*(-?\d+)", line)) and rank is not None:
            code = int(found.group(1))
            how = f"signal {-code}" if code < 0 else f"exit code {code}"
            return rank, f"it ended with {how} before reporting an error"
    return None


def _first_line(text: str) -> str:
    stripped = text.strip()
    return stripped.splitlines()[0] if stripped else "no message"
