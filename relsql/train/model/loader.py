"""Mini-batches of a model's rows for a training loop of your own.

The same batches `fit` trains on, from the same batch source (relsql/train/feed/source.py: the next
batch grounded while torch works on this one), in the same seeded order, so a plain torch loop
takes fit's steps::

    loader = relsql.Loader(model, batch_size=64)            # the training rows, shuffled per epoch as fit does
    optimizer = torch.optim.AdamW(loader.parameters(), lr=0.01, weight_decay=0.0)  # fit's defaults
    loader.optimizer = optimizer                              # weights a batch meets first join it
    for epoch in range(20):
        for batch in loader:                                  # each pass over the loader is one epoch
            optimizer.zero_grad()
            loss = batch.loss()                               # the task's loss of batch.outputs() against batch.y
            loss.backward()
            optimizer.step()

This is `model.fit(epochs=20, batch_size=64, lr=0.01, schedule=None, clip=None, hybrid=False,
time_budget=None)` without its model selection (fit keeps the best validation epoch's weights).
Database-stored embeddings are updated in the database with each batch's gradient when the loop
asks for the next batch (and at the epoch's end), as fit updates them after each step; a loop that
leaves an epoch early (break) leaves its last batch's stored rows as they were.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

from relsql import arguments
from relsql.errors import RelsqlError
from relsql.train.feed.batched import Batch
from relsql.train.feed.batches import batches
from relsql.train.feed.source import BatchSource, Whole
from relsql.train.learner import members
from relsql.train.learner.learner import Learner

SPLITS = ("train", "val", "test")


@dataclass
class MiniBatch:
    """One batch of target rows: `rows` (positions into model.labelled's rows), `keys` (the output
    relation's row ids), `y` (their labels as the model encodes them)."""

    learner: Learner
    batch: Batch | Whole
    external: dict[str, torch.Tensor]
    rows: np.ndarray
    y: torch.Tensor

    @property
    def keys(self) -> np.ndarray:
        return self.learner.labelled[self.rows]

    def outputs(self) -> torch.Tensor:
        """The model's outputs (logits, or the standardized number) for the batch's rows, with gradients."""
        return self.learner.batch_outputs(self.batch, self.external)

    def loss(self, outputs: torch.Tensor | None = None) -> torch.Tensor:
        """The task's loss (as fit computes it) of `outputs` (default: this batch's) against `y`."""
        return members.loss(self.learner.task, self.outputs() if outputs is None else outputs, self.y)


class Loader:
    """Iterating gives one epoch of MiniBatches of `split`'s rows; the next pass is the next epoch.

    `batch_size`: target rows per batch (default the model's; None on a full-batch model: one batch
    of every row). `shuffle` (default: for the training rows) orders each epoch's rows as fit
    does, seeded by (the model's seed, the epoch). The process preparing batches is kept between
    epochs; `close()` (or a `with` block) stops it."""

    def __init__(self, model, split: str = "train", batch_size: int | None = None, shuffle: bool | None = None,
                 optimizer: torch.optim.Optimizer | None = None):
        learner = getattr(model, "learner", model)
        if not isinstance(learner, Learner):
            raise RelsqlError(f"Loader takes a relsql.Model, got {type(model).__name__}")
        if learner.answers != "predict":  # a ranking's loss draws negatives per step: no (outputs, y) pair to hand out
            raise RelsqlError(f"Loader gives batches of one value per row, and {learner.goal.name} is a {learner.task.kind} "
                              "target (its steps score sampled negative candidates): train it with fit(), whose negatives=, "
                              "loss= and hard_negatives= options set that loop")
        if split not in SPLITS or split not in learner.rows:
            raise RelsqlError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
        if batch_size is not None:
            batch_size = arguments.integer("batch_size", batch_size)
        if shuffle is not None and not isinstance(shuffle, bool):
            raise RelsqlError(f"shuffle must be True, False or None (the training rows only), got {shuffle!r}")
        self.learner, self.split = learner, split
        self.batch_size = batch_size if batch_size is not None else learner.settings.batch_size
        self.batched = learner.mini_batches or batch_size is not None
        self.shuffle = split == "train" if shuffle is None else shuffle
        self.optimizer = optimizer
        self.epoch = 0
        self._source: BatchSource | None = None

    def parameters(self) -> list[torch.nn.Parameter]:
        """The weights fit trains (net and head), for your optimizer."""
        return self.learner.parameters()

    def order(self, epoch: int) -> list[np.ndarray]:
        """Epoch `epoch`'s batches as positions into model.labelled, fit's order for the training rows."""
        rows = self.learner.rows[self.split]
        if not self.batched:
            return [rows]
        generator = np.random.default_rng([self.learner.seed, epoch]) if self.shuffle else None
        return batches(rows, self.batch_size, generator)

    def __len__(self) -> int:
        return len(self.order(self.epoch))

    def __iter__(self) -> Iterator[MiniBatch]:
        learner, order, epoch = self.learner, self.order(self.epoch), self.epoch
        self.epoch += 1
        if not len(learner.rows[self.split]):
            return
        source = self._open()
        last: list = [None]  # (batch, its stored embeddings) the user is stepping on
        learner.net.train(True)  # dropout on while your steps run, as in fit
        try:
            if self.batched:
                learner.check_unchanged(source)
            for b, batch, external in self._epoch(source, order, epoch, last):
                self._new_weights(batch)
                rows = order[b]
                last[0] = (batch, external)
                yield MiniBatch(learner, batch, external, rows, learner.y[torch.as_tensor(rows, device=learner.device)])
            self._update(source, last)
        except GeneratorExit:  # an epoch left early (break): the process serves the next one
            raise
        except BaseException:
            self.close()  # a failed epoch leaves no process behind; the next one starts afresh
            raise
        finally:
            learner.net.train(False)

    def _open(self) -> BatchSource:
        """The batch source, kept from epoch to epoch as fit keeps it: its batch process (a fork
        of this process, ~0.5 s on a 25k-row shop) and the plans it replays serve every epoch."""
        if self._source is None:
            self._source = BatchSource(self.learner.ensure_batched() if self.batched else None, fork=True)
            self._finalizer = weakref.finalize(self, self._source.close)
        return self._source

    def close(self) -> None:
        """Stop the batch process and thread (also done when the Loader is garbage-collected or
        leaves a `with` block); iterating again starts them afresh."""
        if self._source is not None:
            self._finalizer()
            self._source = None

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _epoch(self, source: BatchSource, order: list[np.ndarray], epoch: int, last: list):
        """The source's batches; before the next one is read, the last one's stored embeddings are updated."""
        stream = source.epoch([self.learner.labelled[rows] for rows in order], epoch)
        while True:
            self._update(source, last)
            try:
                yield next(stream)
            except StopIteration:
                return

    def _update(self, source: BatchSource, last: list) -> None:
        """The stepped batch's database-stored embeddings updated (queued, in order before the next read), once."""
        done, last[0] = last[0], None
        if done is not None and isinstance(done[0], Batch) and done[1]:
            source.submit(self.learner.batched.update, done[0], done[1])

    def _new_weights(self, batch) -> None:
        """Weights a batch meets first are made now; they join `optimizer` (else your optimizer misses them)."""
        if not isinstance(batch, Batch):
            return
        created = [p for p in self.learner.net.add_weights(batch.plan) if p.requires_grad]
        if not created:
            return
        if self.optimizer is None:
            raise RelsqlError(f"this batch made new weights ({len(created)}): pass your optimizer to the Loader "
                              "(loader.optimizer = optimizer) so that they join it")
        defaults = {k: v for k, v in self.optimizer.param_groups[0].items() if k != "params"}
        self.optimizer.add_param_group({"params": created, **defaults})
