"""The parent's side of database-stored embeddings trained on ranks (relsql/train/embeddings/sharded.py).

Before the ranks start, each table's rows go to a file they start from. While they train, a
thread of the parent watches the checkpoint file: each new checkpoint's shards (every rank's
rows, saved beside it) are written into the tables with their step counters, so the database
follows training at checkpoint granularity, and a run killed between checkpoints leaves the
tables at the last one. At the end, the ranks' final rows are written back the same way. Each
write-back is atomic per table (a transaction on DuckDB, a table swapped in on Spark).

A table's step counter is the step it had when the run began (kept in the checkpoint, so a
resumed run counts from the same base) plus the updates the ranks made.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from relsql.ground.demand import database_embeddings
from relsql.train.embeddings.embeddings import table_suffix
from relsql.train.embeddings.sharded import EmbeddingJob, read_results, saved_rows
from relsql.train.persist import checkpoint as checkpoints

log = logging.getLogger("relsql")
POLL = 0.5  # seconds between looks at the checkpoint file


def export(model, folder: str, resumed: dict | None) -> dict[str, EmbeddingJob]:
    """Each database-stored embedding's table rows, into a file the ranks start from. A resumed
    run counts its steps from the base its checkpoint names."""
    base = ((resumed or {}).get("shards") or {}).get("base", {})
    jobs = {}
    for weight in sorted(database_embeddings(model.template)):
        keys = model.batched.grounding_store.embedding_keys[weight]
        table = model.batched.store(weight, keys.type)  # created here if it does not exist yet
        path = str(Path(folder) / f"start.{table_suffix(weight)}.arrow")  # a file name whatever the weight's name
        table.export(path)
        step = int(base[weight]) if weight in base else table.step()
        jobs[weight] = EmbeddingJob(table.width, table.key_arrow, table.optimizer, table.lr, table.seed, step, path)
    return jobs


def write_result(model, jobs: dict[str, EmbeddingJob], folder: str, world: int, updates: dict) -> None:
    """The rows the ranks changed, into each table, with its step counter."""
    for weight, spec in jobs.items():
        model.batched.stores[weight].replace_rows(read_results(folder, weight, world), spec.step + int(updates[weight]))


class CheckpointWriter(threading.Thread):
    """While the ranks run: each new checkpoint's embedding rows into the tables."""

    def __init__(self, model, jobs: dict[str, EmbeddingJob], checkpoint: str | None, world: int):
        super().__init__(name="relsql-checkpoint-write-back", daemon=True)
        self.model, self.jobs, self.world = model, jobs, world
        self.checkpoint = None if checkpoint is None else Path(checkpoint)
        self.stopping = threading.Event()
        self.written: str | None = None  # the shard tag last written
        self.seen = self._stamp()  # a checkpoint there before the ranks started is not theirs

    def __enter__(self) -> CheckpointWriter:
        if self.jobs and self.checkpoint is not None:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        if self.is_alive():
            self.join()

    def _stamp(self) -> tuple[int, int] | None:
        try:
            stat = self.checkpoint.stat()
        except (OSError, AttributeError):
            return None
        return stat.st_mtime_ns, stat.st_size

    def run(self) -> None:
        while not self.stopping.wait(POLL):
            stamp = self._stamp()
            if stamp is None or stamp == self.seen:
                continue
            self.seen = stamp
            try:
                self._write()
            except Exception as err:  # shards superseded while read, a database error: the next checkpoint or the end goes on
                log.warning("could not write the embeddings of checkpoint %s back yet: %s", self.checkpoint, err)

    def _write(self) -> None:
        shards = checkpoints.load(self.checkpoint).get("shards")
        if not shards or shards["world"] != self.world or shards["now"] == self.written:
            return
        folder = Path(str(self.checkpoint) + ".shards")
        found = {w: saved_rows(folder, w, shards["now"], self.model.batched.grounding_store.embedding_keys[w], self.world)
                 for w in self.jobs}  # all read before any is written
        for weight, (rows, updates) in found.items():
            self.model.batched.stores[weight].replace_rows(rows, self.jobs[weight].step + updates)
        self.written = shards["now"]
        log.info("embeddings %s written back at the checkpoint of step %s", sorted(found), shards["now"])
