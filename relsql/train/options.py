"""fit()'s convergence settings, checked like a user's arguments and turned into the Trainer's
keyword arguments (and the task's loss settings). One place for every kind of target."""

from __future__ import annotations

import numpy as np

from relsql import arguments
from relsql.errors import RelsqlError
from relsql.train.ranking.task import LOSSES as RANKING_LOSSES
from relsql.train.ranking.task import NEGATIVES


def fit_options(learner, schedule, warmup, clip, monitor, time_budget, loss, class_weight, negatives=None,
                hard_negatives=None) -> dict:
    """The checked settings as {"optimizer", "schedule", "warmup", "clip", "time_budget", "monitor", ...}."""
    arguments.choice("schedule", schedule, ("cosine", "plateau", None))
    warmup = arguments.number("warmup", warmup, minimum=0.0)
    if warmup >= 1:
        raise RelsqlError(f"warmup is the share of the steps spent warming up, below 1; got {warmup!r}")
    if clip is not None:
        clip = arguments.number("clip", clip, positive=True)
    if time_budget is not None:
        time_budget = arguments.number("time_budget", time_budget, positive=True)
    common = {"optimizer": "adamw", "schedule": schedule, "warmup": warmup, "clip": clip, "time_budget": time_budget}
    if learner.task.kind == "ranking":
        return {**common, **_ranking(learner, monitor, loss, class_weight, negatives, hard_negatives)}
    if negatives is not None or hard_negatives is not None:
        raise RelsqlError(f"negatives= and hard_negatives= are for a ranking target; {learner.target} is {learner.task.kind}: "
                          "drop them")
    return {**common, **_labels(learner, monitor, loss, class_weight)}


def _labels(learner, monitor, loss, class_weight) -> dict:
    """A classification or regression target's monitor, loss and class weights."""
    task = learner.task
    metrics = ("loss", *task.scores(np.zeros((2, task.units)), np.zeros(2)))
    arguments.choice("monitor", monitor, ("auto", *metrics))
    if task.kind == "regression":
        loss = arguments.choice("loss", "huber" if loss is None else loss, ("huber", "mse", "mae"))
        if class_weight is not None:
            raise RelsqlError(f"class_weight weighs classes, but {learner.target} is a regression target: drop class_weight=")
    elif loss is not None:
        raise RelsqlError(f"loss= chooses a regression loss; {learner.target} is {task.kind} (cross-entropy): drop loss=")
    arguments.choice("class_weight", class_weight, ("balanced", None))
    task.regression_loss = loss or task.regression_loss
    task.class_weights = None
    if class_weight == "balanced":
        task.balance(learner.y[learner.rows["train"]].cpu().numpy())
    return {"monitor": task.selects_on(learner.y[learner.rows["val"]].cpu().numpy()) if monitor == "auto" else monitor,
            "regression_loss": task.regression_loss, "class_weights": task.class_weights}


def _ranking(learner, monitor, loss, class_weight, negatives, hard_negatives) -> dict:
    """A ranking target's monitor (MAP@k by default), loss and negatives (hard ones: this fit's only)."""
    task = learner.task
    arguments.choice("monitor", monitor, ("auto", "loss", *task.metric_names()))
    if class_weight is not None:
        raise RelsqlError(f"class_weight weighs classes; {learner.target} is a ranking target: drop class_weight=")
    task.loss = arguments.choice("loss", task.loss if loss is None else loss, RANKING_LOSSES)
    task.negatives = arguments.choice("negatives", task.negatives if negatives is None else negatives, NEGATIVES)
    learner.use_hard_negatives(hard_negatives)
    if monitor == "auto":
        monitor = task.selects_on(len(learner.rows["val"]))
    return {"monitor": monitor, "regression_loss": task.regression_loss, "class_weights": None}
