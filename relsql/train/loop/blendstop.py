"""Stop the selection run once the blend stops improving and the network has stopped moving.

fit()'s default blends the network with a GBM (relsql/train/gbm/hybrid.py). On half the outside
targets the blend gives the network weight 0, yet the network trained on until its own validation
score had not improved for 100 epochs. The GBMs do not depend on the network, so fit() fits them
first; after every epoch where the network improved, this callback scores the best blend of the
network's best-so-far validation outputs with each GBM (the weights fit picks from). Training stops
once that blend has not improved for PATIENCE epochs and the network's own best validation score
moved by at most DELTA over those epochs (relative for MAE, RMSE and the loss; absolute for ROC-AUC
and accuracy). The second condition keeps slow learners: replayed offline on 141 outside runs
(docs/performance.md, "Stopping when the blend stops improving"), the blend alone stopped plurel_6
at epoch 21 where its network earns weight 0.2 after epoch 200 (RMSE 0.249 -> 0.276); with both,
the test scores stayed within noise (2 better / 3 worse / 76 the same; 1 / 0 / 59 on fresh
databases) on 73-84 % of the selection epochs. The network's epoch is still the one its own
validation score chose; only where the run ends changes.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from relsql.train.gbm import hybrid
from relsql.train.loop.callbacks import Callback

if TYPE_CHECKING:
    from relsql.train.loop.trainer import Trainer

PATIENCE = 50  # epochs without a better blend
DELTA = 0.005  # the network's best validation score moved by at most this over those epochs
LOWER_IS_BETTER = ("rmse", "mae", "loss")


class BlendStopping(Callback):
    """The stop rule of the module docstring, for the blend candidates `found` (hybrid.candidates)."""

    def __init__(self, learner, found: list, patience: int = PATIENCE, delta: float = DELTA):
        self.learner, self.found, self.patience, self.delta = learner, found, patience, delta
        self.metric, self.truth = "loss", None
        self.best, self.last = float("-inf"), 0  # the best blend so far and the epoch it was reached
        self.network: list[float] = []  # the network's best (larger-is-better) validation score after each epoch

    def on_fit_start(self, trainer: Trainer) -> None:
        self.metric = trainer.stopping.metric
        _, y = self.learner.goal.split_index("val")
        self.truth = y.detach().cpu().double().numpy()

    def on_epoch_end(self, trainer: Trainer, epoch: int, record: dict) -> str | None:
        out = trainer.val_outputs
        if out is None:
            return None
        self.network.append(float(trainer.stopping.score))
        if trainer.stopping.improved:  # the network's best outputs changed: so may the blend
            net = out.detach().cpu().double().numpy()
            value = hybrid.best_blend(self.learner.task, net, self.found, self.truth, self.metric)
            if value > self.best + 1e-12:
                self.best, self.last = value, epoch
        if epoch - self.last < self.patience or len(self.network) <= self.patience:
            return None
        now, before = self.network[-1], self.network[-1 - self.patience]
        if not math.isfinite(before) or self._moved(now, before) > self.delta:
            return None
        return (f"early (the blend with the GBM has not improved on validation for {self.patience} epochs, nor the "
                f"network's {self.metric} by more than {self.delta:g})")

    def _moved(self, now: float, before: float) -> float:
        gain = now - before
        return gain / max(abs(now), 1e-12) if self.metric in LOWER_IS_BETTER else gain

    def state_dict(self) -> dict:
        """What a checkpoint keeps, so that a resumed run stops where an uninterrupted one does."""
        return {"blendstop_best": self.best, "blendstop_last": self.last, "blendstop_network": list(self.network)}

    def load_state_dict(self, state: dict) -> None:
        if "blendstop_best" in state:  # a checkpoint written before this rule: it starts afresh
            self.best, self.last = float(state["blendstop_best"]), int(state["blendstop_last"])
            self.network = [float(v) for v in state["blendstop_network"]]
