"""What a trained model gives back: predictions for every output row and metrics on a split,
computed from a Learner's public members."""

from __future__ import annotations

import numpy as np
import polars as pl
import torch

from relsql.db import free_name
from relsql.errors import RelsqlError
from relsql.train import baselines
from relsql.train.learner import Learner


def evaluate(learner: Learner, split: str) -> dict[str, float]:
    """Loss and metrics on a split: accuracy, ROC-AUC, F1 (classification) or MAE, RMSE (regression)."""
    if split not in learner.rows:
        raise RelsqlError(f"unknown split {split!r}; use 'train', 'val' or 'test'")
    if len(learner.rows[split]) == 0:
        raise RelsqlError(f"the {split} split has no rows")
    with torch.no_grad():
        out, y = learner.split_outputs(split)
        return learner.scores(out, y)


def baseline(learner: Learner, split: str) -> dict[str, float]:
    """The majority class (classification) or mean (regression) of the training rows, on a split."""
    if split not in learner.rows or not len(learner.rows[split]):
        raise RelsqlError(f"split {split!r} has no rows; use 'train', 'val' or 'test'")
    return baselines.majority(learner, split)


def _all_outputs(learner: Learner) -> tuple[pl.DataFrame, np.ndarray]:
    """(key columns, outputs) of every output row, in row-id order."""
    if learner.mini_batches:
        keys = pl.from_arrow(learner.batched.grounder.keys(learner.output)).sort("_rid")
        out = learner.outputs_of(keys["_rid"].to_numpy()).cpu().double().numpy()
        return keys.drop("_rid"), out
    with torch.no_grad():
        out = learner.outputs().cpu().double().numpy()
    return pl.from_arrow(learner.net.grounding.relations[learner.output].keys).sort("_rid").drop("_rid"), out


def predict(learner: Learner) -> pl.DataFrame:
    """Every output row: its keys, `prediction`, and the class probabilities (see Model.predict)."""
    keys, out = _all_outputs(learner)
    predictions, probabilities = learner.task.decode(out)
    taken = {k.casefold() for k in keys.columns}
    frame = keys.with_columns(pl.Series(free_name("prediction", taken), predictions))
    if probabilities is None:
        return frame
    if learner.task.kind == "binary":  # one number: the probability of the positive class, classes[1]
        return frame.with_columns(pl.Series(free_name("probability", taken), probabilities[:, 1], dtype=pl.Float64))
    name = free_name("probabilities", taken)
    return frame.with_columns(pl.Series(name, probabilities.tolist(), dtype=pl.List(pl.Float64)))
