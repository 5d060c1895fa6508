"""Mini-batches of target rows: their order, and the database work done for them in the background.

All of a model's database work during training (grounding the next batch, reading and updating
database-stored embeddings) runs in one worker thread, in submission order, on the model's
DuckDB connection; DuckDB releases the GIL, so the next batch is grounded while torch trains on
the current one. The time the trainer spends waiting for the worker is counted.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np


def batches(rows: np.ndarray, size: int | None, generator: np.random.Generator | None) -> list[np.ndarray]:
    """`rows` split into batches of `size` (all at once for None), shuffled when a generator is given."""
    order = rows if generator is None else rows[generator.permutation(len(rows))]
    if not size or size >= len(order):
        return [order]
    return [order[i:i + size] for i in range(0, len(order), size)]


class Worker:
    """One background thread for database work; `wait` returns a result and books the waiting."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="relsql-db")
        self._optional: list[Future] = []
        self._required: list[Future] = []
        self.waited = 0.0  # seconds the trainer spent blocked on the database

    def submit(self, fn: Callable, *args, **kwargs) -> Future:
        """Queue work that must happen (a database update): closing waits for it, and its error
        is raised by the next `wait` (or by `close`), never lost."""
        future = self._pool.submit(fn, *args, **kwargs)
        self._required = [f for f in self._required if not f.done() or f.exception() is not None] + [future]
        return future

    def _raise_failed(self) -> None:
        for future in self._required:
            if future.done() and not future.cancelled() and future.exception() is not None:
                self._required = []
                raise future.exception()

    def prefetch(self, fn: Callable, *args, **kwargs) -> Future:
        """Queue work that may be dropped (grounding a batch ahead): closing cancels it if not started."""
        future = self._pool.submit(fn, *args, **kwargs)
        self._optional = [f for f in self._optional if not f.done()] + [future]
        return future

    def wait(self, future: Future):
        started = time.perf_counter()
        try:
            result = future.result()
        finally:
            self.waited += time.perf_counter() - started
            self._required = [f for f in self._required if f is not future]  # its error reaches the caller here, once
        self._raise_failed()  # work queued before this one (an update) that failed
        return result

    def run(self, fn: Callable, *args, **kwargs):
        """Submit and wait (database work that must happen now, in order with the queue)."""
        return self.wait(self.submit(fn, *args, **kwargs))

    def close(self) -> None:
        """Drop prefetches not started, let every other queued step finish (a database update
        always completes), then stop."""
        for future in self._optional:
            future.cancel()
        self._pool.shutdown(wait=True)
        self._raise_failed()

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
