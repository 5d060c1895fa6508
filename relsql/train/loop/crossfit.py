"""Validation outputs whose epoch their own labels did not choose, for the blend's weight.

Model selection keeps the epoch that scored best on the validation rows, so those rows flatter the
kept network: on the outside corpus its validation ROC-AUC exceeded its test ROC-AUC by a mean
0.031, the GBM's by 0.008 (docs/quality.md), and a blend weight picked on them leaned to the
network. Here the same run is judged twice more, on two seeded halves of the validation rows:
for each half, the epoch selection would keep by that half alone (ranked as EarlyStopping ranks),
and the other half's outputs at that epoch. Every validation row then has an output of the same
training run at an epoch chosen without its label; relsql/train/gbm/hybrid.py picks the weight on
them. It costs no training: the epochs are the selection run's, only scored per half.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from relsql.train.loop.callbacks import Callback, improves, ranked

if TYPE_CHECKING:
    from relsql.train.learner.learner import Learner
    from relsql.train.loop.trainer import Trainer

SEED_STREAM = 7  # the halves' draw: rng([seed, 7]), apart from the split's and the batches' streams
MIN_ROWS = 4  # fewer validation rows than this: no halves, the blend uses the selected network's outputs


class CrossFitted(Callback):
    """Each epoch's validation outputs (the trainer's `val_outputs`) scored on two seeded halves;
    `outputs()`: per row, the output at the epoch its other half chose, or None where an epoch had
    no outputs to give (training ranks) or there are too few rows."""

    def __init__(self, learner: Learner):
        count = len(learner.rows["val"])
        order = np.random.default_rng([learner.seed, SEED_STREAM]).permutation(count)
        halves = (np.sort(order[: count // 2]), np.sort(order[count // 2:]))
        self.halves = tuple(torch.as_tensor(h, dtype=torch.long, device=learner.device) for h in halves)
        self.learner, self.metric, self.usable = learner, "loss", count >= MIN_ROWS
        self.best = [(float("-inf"), float("-inf")), (float("-inf"), float("-inf"))]
        self.kept: torch.Tensor | None = None
        self.labels: torch.Tensor | None = None

    def on_fit_start(self, trainer: Trainer) -> None:
        self.metric = trainer.stopping.metric
        _, self.labels = self.learner.goal.split_index("val")  # the same every epoch

    def on_epoch_end(self, trainer: Trainer, epoch: int, record: dict) -> str | None:
        out = trainer.val_outputs
        if out is None or not self.usable:
            self.usable = False
            return None
        y = self.labels
        if self.kept is None:
            self.kept = torch.zeros_like(out)
        for mine, other in ((0, 1), (1, 0)):
            rows = self.halves[mine]
            rank = ranked(self.metric, *self.learner.metric_and_loss(out.index_select(0, rows), y.index_select(0, rows),
                                                                     self.metric))
            if improves(rank, self.best[mine]):
                self.best[mine] = rank
                self.kept[self.halves[other]] = out.index_select(0, self.halves[other])
        return None

    def on_fit_end(self, trainer: Trainer, last: int | None) -> None:
        trainer.record.crossfit = self.outputs()

    def outputs(self) -> torch.Tensor | None:
        """The validation rows' cross-fitted outputs (in the split's order), or None."""
        unset = (float("-inf"), float("-inf"))
        if not self.usable or self.kept is None or unset in self.best:
            return None
        return self.kept

    def state_dict(self) -> dict:
        """What a checkpoint keeps, so that a resumed run picks the weight an uninterrupted one does."""
        return {"crossfit_best": [list(b) for b in self.best], "crossfit_kept": self.kept, "crossfit_usable": self.usable}

    def load_state_dict(self, state: dict) -> None:
        """A checkpoint's halves; one written without them (an older file) leaves the blend on the selected outputs."""
        if "crossfit_best" not in state:
            self.usable = False
            return
        self.best = [tuple(float(v) for v in b) for b in state["crossfit_best"]]
        self.kept, self.usable = state["crossfit_kept"], bool(state["crossfit_usable"])
