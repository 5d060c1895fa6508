"""fit()'s arguments, checked once like a user's and filled in with the target kind's defaults
into one frozen FitConfig, which the strategies and the Trainer take whole. One place for every
kind of target: what differs by kind (the defaults, the loss's own options: Learner.fit_settings)
the learner declares."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import numpy as np

from relsql import arguments, ownfiles
from relsql.errors import RelsqlError
from relsql.train.learner.defaults import EPOCHS, LR, PATIENCE, ROW_STEPS, WARMUP
from relsql.train.loop.callbacks import Callback
from relsql.train.persist import checkpoint as checkpoints


@dataclasses.dataclass(frozen=True)
class FitConfig:
    """One fit's settings, checked. The defaults are the plain loop (Adam at a constant rate, no
    clipping, the best loss kept) that the Trainer's tests compare with by-hand loops; `checked`
    gives Model.fit's own defaults (AdamW, plateaus, clipping, the task's metric). `replace`
    makes a variant (a refit without a time budget, a search trial)."""

    epochs: int = EPOCHS
    batch_size: int | None = None
    whole_net: bool = False  # each batch_size step runs the whole net, its loss on the step's rows (not the store's batches)
    lr: float = LR
    patience: int = PATIENCE
    overfit: bool = False  # also stop where the net overfits or has fitted its training rows (EarlyStopping)
    weight_decay: float = 0.0
    optimizer: str = "adam"
    schedule: str | None = None
    warmup: float = WARMUP
    clip: float | None = None
    monitor: str = "loss"
    time_budget: float | None = None
    checkpoint: Path | None = None
    checkpoint_every: int | None = None
    resume: bool = False
    callback: Callable[[dict], None] | Callback | None = dataclasses.field(default=None, compare=False)
    callbacks: tuple[Callback, ...] = dataclasses.field(default=(), compare=False)  # the user's, after fit's own
    refit: bool | None = False  # None: where the model can be refit (Model.fit's default; relsql/train/loop/refit.py)
    hybrid: bool = False
    workers: int = 1
    regression_loss: str | None = None  # the task's loss settings, which ranks set on their copy of the task
    class_weights: tuple[float, ...] | None = None

    replace = dataclasses.replace

    @property
    def users(self) -> tuple:
        """The user's callbacks in the order they run: `callback=`, then each of `callbacks=`."""
        return ((self.callback,) if self.callback is not None else ()) + self.callbacks

    @classmethod
    def checked(cls, learner, *, epochs, batch_size, lr, patience, overfit, weight_decay, schedule, warmup, clip, monitor,
                time_budget, loss, class_weight, negatives, hard_negatives, refit, hybrid, checkpoint, resume,
                checkpoint_every, callback, callbacks, workers, steps_per_epoch=None) -> FitConfig:
        """Model.fit's arguments (documented there) checked, with the target kind's defaults; sets
        the task's loss settings on the learner as a side effect."""
        lr = arguments.number("lr", learner.fit_lr if lr is None else lr, positive=True)
        patience = arguments.integer("patience", learner.fit_patience if patience is None else patience, minimum=0)
        overfit = _overfit(learner, overfit)
        if batch_size is not None:
            batch_size = arguments.integer("batch_size", batch_size)
        hybrid = _hybrid(learner, hybrid)
        batch_size, whole_net = _steps(learner, batch_size, steps_per_epoch, hybrid)
        if checkpoint_every is not None:
            checkpoint_every = arguments.integer("checkpoint_every", checkpoint_every)
        if checkpoint is not None:
            checkpoint = checkpoints.writable(checkpoint, "checkpoint")
            ownfiles.check(checkpoint, "checkpoint", "pass a new file name for the checkpoint, or one relsql wrote")
        if callback is not None and not (callable(callback) or isinstance(callback, Callback)):
            raise RelsqlError(f"callback must be a function of one dict (each step's) or a relsql.Callback, got "
                              f"{type(callback).__name__}")
        callbacks = _callbacks(callbacks)
        if refit is not None and not isinstance(refit, bool):
            raise RelsqlError(f"refit must be True, False or None (refit where the model can be), got {refit!r}")
        if not isinstance(resume, bool):
            raise RelsqlError(f"resume must be True or False, got {resume!r}")
        settings = _settings(learner, schedule, warmup, clip, monitor, time_budget, loss, class_weight, negatives,
                             hard_negatives)
        weights = settings.pop("class_weights")
        return cls(epochs=arguments.integer("epochs", epochs), batch_size=batch_size, whole_net=whole_net, lr=lr,
                   patience=patience, overfit=overfit,
                   weight_decay=arguments.number("weight_decay", weight_decay, minimum=0.0), checkpoint=checkpoint,
                   checkpoint_every=checkpoint_every, resume=resume, callback=callback, callbacks=callbacks,
                   refit=refit, hybrid=hybrid, workers=arguments.integer("workers", workers, maximum=1024),
                   class_weights=None if weights is None else tuple(float(w) for w in np.asarray(weights).ravel()),
                   **settings)

    def trainer_settings(self) -> dict:
        """What the Trainer reads of it besides the epochs, rows, rate and patience."""
        return {"optimizer": self.optimizer, "schedule": self.schedule, "warmup": self.warmup, "clip": self.clip,
                "monitor": self.monitor, "time_budget": self.time_budget}


def _steps(learner, batch_size: int | None, steps: object, hybrid: bool) -> tuple[int | None, bool]:
    """fit's rows per step and whether each step runs the whole net. `batch_size=` is the model's
    mini-batches (a ranking's steps); `steps_per_epoch=` cuts a full-batch model's training rows into that
    many seeded steps of the whole net; neither: the learner's default (a ranking's steps, a mini-batch
    model's own batches), else ROW_STEPS steps of the whole net where an automatic template's network is
    the whole model (no blend), one step on every training row otherwise (defaults.py says why)."""
    if steps is not None:
        steps = arguments.integer("steps_per_epoch", steps, minimum=1)
        if batch_size is not None:
            raise RelsqlError("batch_size= trains on mini-batches of that many rows, steps_per_epoch= on shares of the "
                              "whole net's training rows: pass one of them")
        if learner.mini_batches:
            raise RelsqlError(f"steps_per_epoch= splits a full-batch model's epoch; this model trains in mini-batches of "
                              f"{learner.settings.batch_size or 'its'} rows: pass batch_size= instead")
    elif batch_size is not None:
        return batch_size, learner.whole_net_batches
    else:
        default = learner.fit_batch_size()
        if default is not None or learner.mini_batches:
            return default, learner.whole_net_batches
        steps = ROW_STEPS if not hybrid and learner.automatic else 1
    rows = len(learner.rows["train"])
    if steps <= 1 or rows <= 1:  # every training row in one step: a ranking's own steps say so by their size
        return (max(rows, 1), True) if learner.whole_net_batches else (None, False)
    return -(-rows // min(steps, rows)), True


def _overfit(learner, overfit: object) -> bool:
    """fit's `overfit=`: None is the learner's default (on for a label, off for a ranking, whose training
    loss and validation loss are not on one scale); True where the learner cannot take it is refused."""
    if overfit is None:
        return learner.fit_overfit
    if not isinstance(overfit, bool):
        raise RelsqlError(f"overfit must be True, False or None (the target's default), got {overfit!r}")
    if overfit and not learner.fit_overfit:
        raise RelsqlError(f"overfit=True compares the training loss with the validation loss, which {learner.target}'s "
                          "ranking losses do not share a scale for: drop overfit= (patience stops it)")
    return overfit


def _callbacks(callbacks: object) -> tuple[Callback, ...]:
    """fit's `callbacks=`: a list (or tuple) of relsql.Callback objects, or None."""
    if callbacks is None:
        return ()
    if isinstance(callbacks, Callback) or not isinstance(callbacks, list | tuple):
        raise RelsqlError(f"callbacks must be a list of relsql.Callback objects (callbacks=[MyCallback()]), got "
                          f"{type(callbacks).__name__}")
    for index, given in enumerate(callbacks):
        if not isinstance(given, Callback):
            if isinstance(given, type) and issubclass(given, Callback):
                fix = f"pass an instance, callbacks=[{given.__name__}(...)]"
            elif callable(given):
                fix = "a function of each step goes to callback=, or subclass relsql.Callback and pass an instance"
            else:
                fix = "subclass relsql.Callback and pass an instance"
            raise RelsqlError(f"callbacks[{index}] must be a relsql.Callback instance, got {type(given).__name__}: {fix}")
    return tuple(callbacks)


def _hybrid(learner, hybrid) -> bool:
    """Whether to blend a GBM after training: hybrid=, or by default for Template.auto's templates."""
    if hybrid is not None and not isinstance(hybrid, bool):
        raise RelsqlError(f"hybrid must be True, False or None (automatic templates only), got {hybrid!r}")
    if hybrid is None:
        return learner.automatic and learner.blends
    if hybrid and not learner.blends:
        raise RelsqlError("hybrid=True blends a GBM with a label's prediction; a ranking target has none: drop hybrid=")
    return hybrid


def _settings(learner, schedule, warmup, clip, monitor, time_budget, loss, class_weight, negatives, hard_negatives) -> dict:
    """The checked convergence settings: optimizer, schedule, warmup, clip, time budget, monitor and the loss's."""
    arguments.choice("schedule", schedule, ("cosine", "plateau", None))
    if warmup is None:
        warmup = WARMUP
    else:
        warmup = arguments.number("warmup", warmup, minimum=0.0)
        if warmup >= 1:
            raise RelsqlError(f"warmup is the share of the steps spent warming up, below 1; got {warmup!r}")
        if warmup > 0 and schedule != "cosine":  # accepted and ignored, the user would think it ran
            raise RelsqlError(f"warmup={warmup!r} warms up the cosine schedule only; schedule={schedule!r} has no warm-up: "
                              "pass schedule='cosine' with it, or drop warmup=")
    if clip is not None:
        clip = arguments.number("clip", clip, positive=True)
    if time_budget is not None:
        time_budget = arguments.number("time_budget", time_budget, positive=True)
    common = {"optimizer": "adamw", "schedule": schedule, "warmup": warmup, "clip": clip, "time_budget": time_budget}
    return {**common, **learner.fit_settings(monitor, loss, class_weight, negatives, hard_negatives)}
