"""The final refit: once validation has picked the number of epochs (and the blend's weight), train
on every labelled row (training, validation and test rows), as a user's own baseline learns from
every labelled row it is given: from the selected weights, for half the kept number of epochs, at the
kept epoch's rate (REFIT_SHARE); the blend's GBM is fitted again on the same rows for the rounds its
early stopping chose. Where the blend gives the network weight 0 (the GBM alone predicts) only the
GBM is fitted again: on the whole outside corpus that was 241 of 481 targets, whose network refit
cost time and changed no prediction (its record's `epochs` is then 0). predict() and
write_predictions then use the refit model.

The held-out scores are measured first: `learner.refit["held_out"]` keeps the validation and test
scores of the model validation selected (the blend included), and Model.evaluate on those splits
returns them, never the refit model's scores of rows it learned from. The selection run's history
and best epoch stay the record of how the epochs were chosen; `learner.refit` says what the refit did
(`kept_epochs`: the selected weights' epochs it went on from).

By default (`fit(refit=None)`) a model is refit where it can be (`unavailable` says where not: the
report names the reason); `refit=True` refuses what cannot be refit; `refit=False` keeps the
selected model, as before the refit existed.

Where the refit starts (REFIT_SHARE, not a fit() option; bench/refit_holdout.py sets it): None, from
the initial weights for the kept number of epochs, the selection's rates replayed (the default until
2026-12-05); a share s, from the selected weights for ceil(s x the kept epochs) epochs at the kept
epoch's rate; 0, the selected network kept, only the blend's GBM fitted again. Scored on an outer
hold-out (the latest 15 % of the labelled rows hidden from every run, 22 outside targets x 4 seeds
where the network keeps a share; docs/performance.md, "What the refit is worth"): against starting again,
s = 0.5 scored the same (mean gain +0.0002, s.e. 0.0031) for 0.88x the fit's CPU; s = 0.25 -0.0011
(0.0027) for 0.80x; 0 -0.0091 (0.0040): the refit of the network is worth keeping, not its restart.
"""

from __future__ import annotations

import dataclasses
import logging
import math

import numpy as np

from relsql.errors import RelsqlError
from relsql.ground.demand import database_embeddings
from relsql.train.learner.learner import Learner
from relsql.train.learner.record import FitRecord

log = logging.getLogger("relsql")

REFIT_SHARE: float | None = 0.5  # a share of the kept epochs, from the selected weights; None: start again


def unavailable(learner: Learner, workers: int, torchrun: bool) -> str | None:
    """Why this model cannot be refit on every labelled row (None: it can), before any training."""
    if not learner.blends:  # a ranking's positives are pairs its learner reads at build time
        return f"{learner.target} is a ranking target, whose training pairs are fixed when it is built"
    if not len(learner.rows["val"]):
        return "the split has no validation rows to choose the epochs on"
    if workers > 1 or torchrun:
        return "the model trained on several processes (workers > 1 or torchrun); the refit trains in one"
    stored = sorted(database_embeddings(learner.template))
    if stored:
        return (f"database-stored embeddings {stored} train in the database, where the refit does not go on with them "
                "(declare them storage='memory')")
    return None


def check(learner: Learner, workers: int, torchrun: bool = False) -> None:
    """What fit(refit=True) cannot do, refused before any training."""
    why = unavailable(learner, workers, torchrun)
    if why is not None:
        raise RelsqlError(f"fit(refit=True) trains the selected model on every labelled row, but {why}: "
                          "drop refit=True (or pass refit=False)")


def appeared(learner: Learner, initial: tuple[dict, dict]) -> list[str]:
    """Weights the selection run met that the initial weights lack (mini-batches creating them)."""
    return sorted(set(learner.weights_by_name()) - set(initial[0]) - {f"_head.{n}" for n in initial[1]})


def held_out(learner: Learner) -> dict[str, dict[str, float]]:
    """The selected model's scores on its validation and test rows (blend included): what evaluate()
    reports for those splits once the refit model has seen them."""
    return {split: learner.evaluate(split) for split in ("val", "test") if len(learner.rows[split])}


def retrain(learner: Learner, initial: tuple[dict, dict], run, required: bool, replay: list[float] = ()) -> FitRecord:
    """Put back the `initial` weights and call `run(epochs)` (one Trainer's fit, keeping its last
    epoch, returning its record) on every labelled row for the selected number of epochs, after
    measuring the held-out scores; then refit the blend's GBM (if any) on the same rows. With
    REFIT_SHARE, `run(epochs, share)` continues from the selected weights at `share` of the base
    rate (`replay`: the selection's shares per epoch, the kept epoch's is taken). The split
    is put back afterwards; the learner's record is the selection's again, with the refit's seconds
    added and its `diverged`, which is returned. `required`: refit=True (a refit that cannot be done
    is an error; by default it is skipped and `learner.no_refit` says why)."""
    selection = learner.record
    if selection.best_epoch is None:
        learner.no_refit = "no epoch was selected"
        return selection
    met = appeared(learner, initial) if REFIT_SHARE is None else []
    if met:
        why = (f"weights {met[:5]} first appeared during training (mini-batches met them), so there are no initial "
               "weights to start again from")
        if required:
            raise RelsqlError(f"fit(refit=True) starts again from the initial weights, but {why}: train full-batch, or "
                              "drop refit=True")
        learner.no_refit = why
        return selection
    scores = held_out(learner)
    epochs, rows = selection.best_epoch + 1, dict(learner.rows)
    every = np.concatenate([rows["train"], rows["val"], rows["test"]])
    blend = getattr(learner, "hybrid", None)
    if blend is not None and (blend.weight == 0.0 or REFIT_SHARE == 0):  # the GBM alone predicts (or the network stays)
        log.info("refit: the blend gives the network weight 0, so only its GBM is fitted again, on all %d labelled "
                 "rows; the network stays the selected one", len(every))
        learner.refit = {"epochs": 0, "rows": int(len(every)), "train_loss": float("nan"), "held_out": scores,
                         "gbm_rounds": blend.refit(learner, every)}
        return selection
    if REFIT_SHARE == 0:  # no GBM to fit again: the selected network stays the model
        learner.no_refit = "REFIT_SHARE is 0, which keeps the selected network"
        return selection
    share = None
    if REFIT_SHARE is None:
        learner.restore_weights(initial)
    else:  # the selected weights (fit kept the best epoch's) go on at the kept epoch's rate
        epochs = max(1, math.ceil(REFIT_SHARE * epochs))
        share = replay[selection.best_epoch] if selection.best_epoch < len(replay) else 1.0
    log.info("refit: training again on all %d labelled rows (train + validation + test) for %d epochs%s; the "
             "held-out scores were measured before it", len(every), epochs,
             ", the epochs validation chose" if share is None else ", continuing from the selected weights")
    learner.goal.rows = {**rows, "train": every, "val": rows["val"][:0], "test": rows["test"][:0]}
    learner.record = dataclasses.replace(selection.continued(), history=[])  # the refit's epochs apart from the selection's
    try:
        refit = run(epochs) if share is None else run(epochs, share)
    finally:
        learner.goal.rows = rows
    learner.record = dataclasses.replace(selection, timings=refit.timings, diverged=refit.diverged)
    learner.refit = {"epochs": epochs, "rows": int(len(every)),
                     "train_loss": float(refit.history[-1]["train_loss"]) if refit.history else float("nan"),
                     "held_out": scores, **({} if share is None else {"kept_epochs": selection.best_epoch + 1})}
    if blend is not None and blend.weight < 1.0 and not refit.diverged:  # weight 1: the network alone, no GBM to refit
        learner.refit["gbm_rounds"] = blend.refit(learner, every)
    return learner.record
