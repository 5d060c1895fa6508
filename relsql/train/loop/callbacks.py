"""What the training loop does around its epochs, as callbacks it runs in order: model selection
and early stopping (the best epoch's weights kept and put back at the end), the learning rate's
epoch step, the time budget, checkpoint files, and the user's own: fit's `callback=` (a function
of each step, or a Callback such as a TensorBoard or MLflow tracker), then its `callbacks=[...]`.
The loop itself (relsql/train/loop/trainer.py) only trains and validates; each callback's
`on_epoch_end` may give a reason to stop, and the first reason given is the record's `stopped`.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

from relsql.data.engine import first_line
from relsql.errors import RelsqlError
from relsql.train.learner.defaults import FITTED_SHARE, OVERFIT_EPOCHS, OVERFIT_MARGIN
from relsql.train.loop.schedule import LearningRate
from relsql.train.persist.checkpoint import is_number

if TYPE_CHECKING:
    from relsql.train.learner.learner import Learner
    from relsql.train.loop.trainer import Trainer

# the monitored scores that are better larger; the others (loss, mae, rmse) are minimized. A ranking
# metric is named with its cut-off (map@10): its name before the @ is looked up.
MAXIMIZED = {"roc_auc", "accuracy", "f1", "map", "recall", "ndcg", "mrr", "precision"}


def ranked(metric: str, value: float, loss: float) -> tuple[float, float]:
    """(score, -loss), larger better, of a run scored `value` in `metric` (e.g. "roc_auc", "map@10",
    "mae"; "loss": the loss alone) with loss `loss`: how model selection compares epochs and search
    compares trials. The loss breaks ties; an undefined (NaN) value or loss ranks below every defined one."""
    tie = -loss if loss == loss else float("-inf")
    if metric == "loss":
        return tie, tie
    if value != value:  # NaN: the metric is undefined (e.g. one class only among the rows)
        return float("-inf"), tie
    return (value if metric.split("@", 1)[0] in MAXIMIZED else -value), tie


def improves(new: tuple[float, float], best: tuple[float, float]) -> bool:
    """Whether an epoch ranked `new` (ranked's pair) beats the best so far: a better score by more
    than rounding, or the same score and a lower loss."""
    return new[0] > best[0] + 1e-7 or (new[0] >= best[0] - 1e-7 and new[1] > best[1] + 1e-7)


class Callback:
    """A part of the loop that watches training (`relsql.Callback`: subclass it, override the hooks
    you need, pass instances as `model.fit(callbacks=[...])`). Every hook is called on every
    callback, in the trainer's order; those not overridden do nothing. `trainer.record` is the
    fit's FitRecord so far (history, best_epoch, ...)."""

    def on_fit_start(self, trainer: Trainer) -> None:
        """Before the first epoch (after a resumed checkpoint's state is back)."""

    def on_batch_end(self, trainer: Trainer, step: dict) -> None:
        """After each optimizer step; `step`: {"epoch", "batch", "batches", "loss"}."""

    def on_epoch_end(self, trainer: Trainer, epoch: int, record: dict) -> str | None:
        """After the epoch's validation (`record`, already in the history): a reason to stop, or None."""
        return None

    def on_fit_end(self, trainer: Trainer, last: int | None) -> None:
        """After the last epoch, `last` (None if none ran), or after a loss that stopped being a number."""


class EarlyStopping(Callback):
    """Model selection and early stopping: the best epoch's score and weights on the monitored split
    (validation, else training); stop after `patience` epochs without improvement; the best
    weights put back at the end. `metric`: the score compared ("loss", or a task metric such as
    "roc_auc" or "mae" where validation rows exist), the loss breaking ties and standing in where
    the metric is undefined (NaN). `overfit` (validation rows only): also stop OVERFIT_EPOCHS epochs
    after the best once the net overfits (each of those epochs' validation loss at least 1 +
    OVERFIT_MARGIN times the best epoch's) or has learnt its training rows by heart (training loss at
    most FITTED_SHARE times the best validation loss); relsql/train/learner/defaults.py says why.
    `last=True` (a refit): no selection, the last epoch is kept. `extra`: the strategy's copy of its
    embeddings at the best epoch."""

    def __init__(self, learner: Learner, patience: int, metric: str = "loss", last: bool = False,
                 overfit: bool = False):
        self.learner, self.patience, self.last = learner, patience, last
        self.monitor = "val" if len(learner.rows["val"]) else "train"
        self.metric = metric if self.monitor == "val" else "loss"
        self.overfit = overfit and self.monitor == "val"
        self.loss, self.score, self.state, self.extra = float("inf"), float("-inf"), None, None
        self.best_epoch: int | None = None
        self.improved = False  # whether the last epoch seen was the best so far (the plateau schedule hears it)
        self.worse = 0  # epochs in a row, since the best, whose validation loss was OVERFIT_MARGIN above the best's
        self.why = ""  # what the last stop answered

    @property
    def key(self) -> str:
        """The history's entry compared: e.g. "val_roc_auc"."""
        return f"{self.monitor}_{self.metric}"

    def ranked(self, record: dict) -> tuple[float, float]:
        """(score, -loss), larger better; an undefined score ranks below every defined one."""
        return ranked(self.metric, record.get(self.key, float("nan")), record[f"{self.monitor}_loss"])

    def update(self, epoch: int, record: dict | float) -> tuple[bool, bool]:
        """(improved, stop) after an epoch with record `record` (a bare number: the monitored loss)."""
        record = record if isinstance(record, dict) else {f"{self.monitor}_loss": record}
        score, loss = self.ranked(record)
        if improves((score, loss), (self.score, -self.loss)):
            self.score, self.loss, self.worse = score, -loss, 0
            self.best_epoch, self.state = epoch, self.learner.weights_copy()
            return True, False
        since = epoch - self.best_epoch
        self.worse = self.worse + 1 if -loss >= (1 + OVERFIT_MARGIN) * self.loss else 0
        if since >= self.patience:
            self.why = f"no validation improvement in {self.metric} for {self.patience} epochs"
        elif self.overfit and since >= OVERFIT_EPOCHS and self.worse >= OVERFIT_EPOCHS:
            self.why = (f"overfitting: validation loss at least {1 + OVERFIT_MARGIN:g} x the best epoch's "
                        f"{self.loss:.4g} for {self.worse} epochs")
        elif self.overfit and since >= OVERFIT_EPOCHS and record.get("train_loss", float("inf")) <= FITTED_SHARE * self.loss:
            self.why = (f"training rows fitted: training loss {record['train_loss']:.4g} at most {FITTED_SHARE:g} x the "
                        f"best validation loss {self.loss:.4g}, {since} epochs after the best")
        else:
            return False, False
        return False, True

    def on_fit_start(self, trainer: Trainer) -> None:
        trainer.record.monitor = self.key

    def on_epoch_end(self, trainer: Trainer, epoch: int, record: dict) -> str | None:
        if self.last:  # a refit: its last epoch is the one wanted, no selection
            self.improved, stop, self.best_epoch = False, False, epoch
        else:
            self.improved, stop = self.update(epoch, record)
        trainer.record.best_epoch = self.best_epoch
        if self.improved:
            trainer.strategy.best(trainer)
        return f"early ({self.why})" if stop else None

    def on_fit_end(self, trainer: Trainer, last: int | None) -> None:
        """Put back the weights (and stored embeddings) of the best epoch, if one finished."""
        if self.state is None:
            return
        self.learner.restore_weights(self.state)
        trainer.strategy.keep_best(trainer, last)

    def state_dict(self) -> dict:
        """What a checkpoint file keeps of the selection (its entries at the file's top level)."""
        return {"best_epoch": self.best_epoch, "best_loss": float(self.loss), "best_score": float(self.score),
                "best_state": self.state, "overfit_worse": self.worse}

    def load_state_dict(self, state: dict) -> None:
        best, loss, worse = state["best_epoch"], state["best_loss"], state.get("overfit_worse", 0)
        if not (is_number(loss) and (best is None or (type(best) is int and best >= 0)) and type(worse) is int and worse >= 0
                and is_number(state.get("best_score", 0.0))):
            raise ValueError("its model selection (best epoch, loss, score) is not a number")  # the resume names the file
        self.best_epoch, self.loss, self.state = best, float(loss), state["best_state"]
        self.score, self.worse = float(state.get("best_score", -self.loss)), worse


class Schedule(Callback):
    """The learning rate's epoch step: the plateau schedule hears whether the epoch improved the
    monitored score; with `replay` (the rate's share after each epoch of another run: a refit
    replays the plateaus its selection run met) that share is taken instead."""

    def __init__(self, rate: LearningRate, stopping: EarlyStopping, replay: list[float] | None = None):
        self.rate, self.stopping, self.replay = rate, stopping, replay

    def on_epoch_end(self, trainer: Trainer, epoch: int, record: dict) -> str | None:
        if self.replay:
            self.rate.scale = self.replay[min(epoch, len(self.replay) - 1)]
        else:
            self.rate.epoch_end(self.stopping.improved)
        return None


class TimeBudget(Callback):
    """Stop once `seconds` have passed since fit started (never after the last epoch: that one
    ends by the epoch budget). Asked of every epoch, budget or not: training ranks agree on it."""

    def __init__(self, seconds: float | None):
        self.seconds = seconds

    def on_epoch_end(self, trainer: Trainer, epoch: int, record: dict) -> str | None:
        over = (self.seconds is not None and time.perf_counter() - trainer.started >= self.seconds
                and epoch + 1 < trainer.epochs)
        return f"time budget ({self.seconds:g}s)" if trainer.strategy.agree(over) else None


class Checkpoint(Callback):
    """A checkpoint file after every epoch and every `every` batches (the strategy writes it)."""

    def __init__(self, path: str | Path | None, every: int | None):
        self.path, self.every = None if path is None else str(path), every

    def due(self, batch: int, count: int) -> bool:
        return self.path is not None and bool(self.every) and (batch + 1) % self.every == 0 and batch + 1 < count

    def on_batch_end(self, trainer: Trainer, step: dict) -> None:
        if self.due(step["batch"], step["batches"]):
            trainer.strategy.checkpoint(trainer, step["epoch"], step["batch"] + 1)

    def on_epoch_end(self, trainer: Trainer, epoch: int, record: dict) -> str | None:
        if self.path is not None:
            trainer.strategy.checkpoint(trainer, epoch + 1, 0)
        return None


class Users(Callback):
    """One of the user's callbacks: fit's `callback=` (a function of each step, or a Callback) or one
    of its `callbacks=` (Callbacks). What it raises is said as relsql's error naming it, its own
    exception chained; training stops there."""

    def __init__(self, given):
        self.given = given
        self.name = getattr(given, "__qualname__", None) or type(given).__name__

    def on_fit_start(self, trainer: Trainer) -> None:
        if isinstance(self.given, Callback):
            self._call(lambda: self.given.on_fit_start(trainer), "before the first epoch")

    def on_batch_end(self, trainer: Trainer, step: dict) -> None:
        call = (lambda: self.given.on_batch_end(trainer, step)) if isinstance(self.given, Callback) else lambda: self.given(step)
        self._call(call, f"after step {step['batch'] + 1} of epoch {step['epoch'] + 1} (the model holds that step's weights, "
                         "its history the epochs that finished)")

    def on_epoch_end(self, trainer: Trainer, epoch: int, record: dict) -> str | None:
        if not isinstance(self.given, Callback):
            return None
        return self._call(lambda: self.given.on_epoch_end(trainer, epoch, record),
                          f"after epoch {epoch + 1} (the model holds its weights, its history the epochs that finished)")

    def on_fit_end(self, trainer: Trainer, last: int | None) -> None:
        if isinstance(self.given, Callback):
            self._call(lambda: self.given.on_fit_end(trainer, last), "at its end (the model holds the kept epoch's weights)")

    def _call(self, call, where: str):
        try:
            return call()
        except Exception as err:  # the user's code: said as relsql's error, naming it, its own chained
            raise RelsqlError(f"fit's callback {self.name} raised {type(err).__name__}: {first_line(err)[:300]}; "
                              f"training stopped {where}: fix the callback, then fit again") from err
