"""The final refit: once validation has picked the number of epochs, train again from the same
initial weights on the training and validation rows together for that many epochs, as a user's
own baseline learns from every labelled row it is given. The selection run's history and best
epoch stay the record of how the epochs were chosen; `learner.refit` says what the refit did.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from relsql.errors import RelsqlError
from relsql.ground.demand import database_embeddings
from relsql.train.learner.learner import Learner
from relsql.train.learner.record import FitRecord


def check(learner: Learner, workers: int) -> None:
    """What a refit cannot do, refused before any training."""
    if not len(learner.rows["val"]):
        raise RelsqlError("fit(refit=True) retrains on training + validation rows at the epoch count validation selected, "
                          "but this model has no validation rows: give split= a validation part, or drop refit=True")
    if workers > 1:
        raise RelsqlError("fit(refit=True) retrains in this process: use workers=1, or drop refit=True")
    stored = sorted(database_embeddings(learner.template))
    if stored:
        raise RelsqlError(f"fit(refit=True) starts again from the initial weights, which database-stored embeddings {stored} "
                          "do not keep: declare them storage='memory', or drop refit=True")


def retrain(learner: Learner, initial: tuple[dict, dict], run) -> FitRecord:
    """Put back the `initial` weights and call `run(epochs)` (one Trainer's fit, keeping its last
    epoch, returning its record) on training + validation rows for the selected number of epochs.
    The split is put back afterwards; the learner's record is the selection's again, with the
    refit's seconds added and its `diverged`, which is returned."""
    selection = learner.record
    if selection.best_epoch is None:
        return selection
    met = set(learner.weights_by_name()) - set(initial[0]) - {f"_head.{n}" for n in initial[1]}
    if met:
        raise RelsqlError(f"fit(refit=True) starts again from the initial weights, but weights {sorted(met)[:5]} first "
                          "appeared during training (mini-batches met them): train full-batch, or drop refit=True")
    epochs, rows = selection.best_epoch + 1, dict(learner.rows)
    learner.restore_weights(initial)
    learner.goal.rows = {**rows, "train": np.concatenate([rows["train"], rows["val"]]), "val": rows["val"][:0]}
    learner.record = dataclasses.replace(selection.continued(), history=[])  # the refit's epochs apart from the selection's
    try:
        refit = run(epochs)
    finally:
        learner.goal.rows = rows
    learner.record = dataclasses.replace(selection, timings=refit.timings, diverged=refit.diverged)
    learner.refit = {"epochs": epochs, "rows": int(len(rows["train"]) + len(rows["val"])),
                     "train_loss": float(refit.history[-1]["train_loss"]) if refit.history else float("nan")}
    return learner.record
