"""What differs between training in one process and training as one of several ranks: the
Trainer's loop (relsql/train/loop/trainer.py) is the same, and asks its Strategy at each point where
they differ. OneProcess (trainer.py) and Ranks (distributed.py) implement it."""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from torch import nn

    from relsql.train.feed.source import BatchSource
    from relsql.train.learner.learner import Learner
    from relsql.train.loop.trainer import Trainer


class Strategy(abc.ABC):
    """How one process takes part in a fit. `main`: it logs and reports; `bars`: it shows progress
    bars; `world`: how many processes train together; `keeps_forward`: its validation may keep its
    forward for the next full-batch step; `compacts`: its trainer may train text tables on the rows
    their plan reads."""

    main: bool = True
    bars: bool = True
    world: int = 1
    keeps_forward: bool = False  # a full-batch validation forward may serve the next step (relsql/train/loop/reuse.py)
    compacts: bool = False  # full batch on the CPU, its text tables may train on the rows read (relsql/compile/compact.py)

    @abc.abstractmethod
    def source(self, learner: Learner, batched: bool) -> BatchSource:
        """Where this process's batches come from."""

    @abc.abstractmethod
    def shares(self, order: list[np.ndarray]) -> list[np.ndarray]:
        """This process's rows of each global batch of an epoch."""

    @abc.abstractmethod
    def create_weights(self, trainer: Trainer, batch) -> list[nn.Parameter]:
        """Weights a batch meets first (typed weights' new types), made alike on every process."""

    @abc.abstractmethod
    def reduce(self, trainer: Trainer, loss: torch.Tensor, external: dict) -> tuple[float, object]:
        """After backward: the step's loss over all processes, and what after_step applies."""

    @abc.abstractmethod
    def after_step(self, trainer: Trainer, batch, external: dict, reduced) -> None:
        """After the optimizers' step: embeddings kept outside the net are updated."""

    @abc.abstractmethod
    def validate(self, trainer: Trainer, train_loss: float) -> dict[str, float]:
        """The epoch's record: training loss, validation loss and metrics."""

    @abc.abstractmethod
    def best(self, trainer: Trainer) -> None:
        """An epoch improved: keep what the learner's weights do not hold (embedding tables, shards)."""

    @abc.abstractmethod
    def keep_best(self, trainer: Trainer, last: int | None) -> None:
        """The fit ended: put back the best epoch's embeddings kept by `best`."""

    @abc.abstractmethod
    def checkpoint(self, trainer: Trainer, epoch: int, batch: int) -> None:
        """Write a checkpoint (where this process writes them)."""

    @abc.abstractmethod
    def resume(self, trainer: Trainer, state: dict, where: str) -> None:
        """Resume from a checkpoint's state: what the learner's own state does not cover."""

    @abc.abstractmethod
    def timings(self, trainer: Trainer) -> dict[str, float]:
        """Seconds per phase to add to the learner's timings."""

    @abc.abstractmethod
    def agree(self, stop: bool) -> bool:
        """Whether every process stops, given this one's wish."""
