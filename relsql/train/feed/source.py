"""The batch source: the batches of an epoch behind one iterator, the next one prepared ahead.

A full-batch model's "batch" is the whole output relation (`Whole`: the net runs its own plan);
a mini-batch model's are read from the grounding store (or grounded in the database) and
planned while torch trains on the current one (in a child process where that pays:
relsql/train/feed/batch_process.py; else in the model's database worker thread), its
database-stored embeddings read in order with the previous batch's update. One loop serves
training, validation, prediction and gradients, on one process or on a rank's share of rows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import torch

from relsql.train.feed import batch_process
from relsql.train.feed.batch_process import BatchProcess
from relsql.train.feed.batched import Batch, Batched
from relsql.train.feed.batches import Worker


@dataclass
class Whole:
    """The full batch: output rows `rids` of the net's whole grounding."""

    rids: np.ndarray


class BatchSource:
    """Batches of output rows from `batched` (None: full batch), prepared one ahead on `worker`
    (or in a child process, with `fork`).

    `fetch(batch)` reads a batch's database-stored embeddings (default: from the database, on the
    worker, after the updates queued before it); training ranks pass their shards' instead."""

    def __init__(self, batched: Batched | None, worker: Worker | None = None,
                 fetch: Callable[[Batch | None], dict[str, torch.Tensor]] | None = None, fork: bool = False):
        self.batched = batched
        self.owned = worker is None and batched is not None
        self.worker = worker if worker is not None or batched is None else Worker()
        self.fetch = fetch or self._fetch
        # `fork` (training's sources): batches prepared in a child process where that pays (batch_process.usable).
        # Not for prediction's: a child's recorded plans die with it, the thread's stay in the model's cache.
        self.forks = fork and self.owned and fetch is None and batch_process.usable(batched)
        self.process: BatchProcess | None = None  # started by the first epoch of more than one batch

    @property
    def full(self) -> bool:
        return self.batched is None

    @property
    def waited(self) -> float:
        """Seconds the consumer spent waiting for a batch or the database."""
        return (0.0 if self.worker is None else self.worker.waited) + (0.0 if self.process is None else self.process.waited)

    def epoch(self, chunks: list[np.ndarray], sample: int = 0, first: int = 0
              ) -> Iterator[tuple[int, Batch | Whole | None, dict[str, torch.Tensor]]]:
        """(index, batch, its stored embeddings) for chunks[first:]; batch t + 1 is prepared while
        the consumer works on batch t. An empty chunk (a rank's empty share) is None."""
        if self.full:
            for b in range(first, len(chunks)):
                yield b, Whole(chunks[b]), {}
            return
        if self.forks and self.process is None and len(chunks) - first > 1:
            self.process = BatchProcess(self.batched)
        pending = self._ahead(chunks[first], sample) if first < len(chunks) else None
        for b in range(first, len(chunks)):
            batch = self._wait(pending)
            pending = None
            external = self.fetch(batch)
            pending = self._ahead(chunks[b + 1], sample) if b + 1 < len(chunks) else None
            yield b, batch, external

    def _ahead(self, rids: np.ndarray, sample: int):
        if self.process is not None and len(rids):
            return self.process.request(rids, sample)
        return self.worker.prefetch(self._prepare, rids, sample)

    def _wait(self, pending) -> Batch | None:
        if isinstance(pending, int):  # a request to the batch process
            return self.process.receive(pending)
        return self.worker.wait(pending)

    def _prepare(self, rids: np.ndarray, sample: int) -> Batch | None:
        return self.batched.prepare(rids, sample) if len(rids) else None

    def _fetch(self, batch: Batch | None) -> dict[str, torch.Tensor]:
        if batch is None or not batch.embedding_keys:  # no database-stored embedding: no round trip
            return {}
        return self.worker.run(self.batched.fetch, batch)

    def run(self, fn: Callable, *args):
        """Database work that must happen now, in order with the queue."""
        return fn(*args) if self.worker is None else self.worker.run(fn, *args)

    def submit(self, fn: Callable, *args) -> None:
        """Database work that must happen, queued (a step's embedding update)."""
        self.worker.submit(fn, *args)

    def close(self) -> None:
        """Prefetches not started are dropped; queued updates complete."""
        try:
            if self.process is not None:
                self.process.close()
        finally:
            if self.owned:
                self.worker.close()

    def __enter__(self) -> BatchSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
