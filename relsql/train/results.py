"""What a trained model gives back: predictions for every output row and metrics on a split,
computed from a Learner's public members. A learner with a `hybrid` (relsql/train/hybrid.py)
gives the blend of its network and its GBM; `predict` says which split each row was in."""

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
        hybrid = getattr(learner, "hybrid", None)
        if hybrid is not None:
            out = hybrid.blend(learner, learner.labelled[learner.rows[split]], out)
        return learner.scores(out, y)


def baseline(learner: Learner, split: str) -> dict[str, float]:
    """The majority class (classification) or mean (regression) of the training rows, on a split."""
    if split not in learner.rows or not len(learner.rows[split]):
        raise RelsqlError(f"split {split!r} has no rows; use 'train', 'val' or 'test'")
    return baselines.majority(learner, split)


def _all_outputs(learner: Learner) -> tuple[pl.DataFrame, np.ndarray]:
    """(key columns with `_rid`, outputs) of every output row, in row-id order; blended with the
    learner's GBM when it has a hybrid."""
    if learner.mini_batches:
        keys = pl.from_arrow(learner.batched.grounder.keys(learner.output)).sort("_rid")
        out = learner.outputs_of(keys["_rid"].to_numpy())
    else:
        keys = pl.from_arrow(learner.net.grounding.relations[learner.output].keys).sort("_rid")
        with torch.no_grad():
            out = learner.outputs()
    hybrid = getattr(learner, "hybrid", None)
    if hybrid is not None:
        out = hybrid.blend(learner, keys["_rid"].to_numpy(), out)
    return keys, out.detach().cpu().double().numpy()


SPLITS = {"train": "train", "val": "val", "test": "test"}  # the split names predict() writes


def splits_of(learner: Learner, rids: np.ndarray) -> list[str | None]:
    """Which split each output row in `rids` was in: "train", "val", "test", or None for a row
    without a label (prediction only)."""
    where = {}
    for split, positions in learner.rows.items():
        for rid in learner.labelled[positions].tolist():
            where[rid] = SPLITS[split]
    return [where.get(rid) for rid in rids.tolist()]


def predict(learner: Learner, splits: bool = False) -> pl.DataFrame:
    """Every output row: its keys, `prediction`, and the class probabilities (see Model.predict);
    with `splits`, last a column `split`: the part of the labelled rows the row was in ("train",
    "val", "test"), null for prediction-only rows."""
    keys, out = _all_outputs(learner)
    rids = keys["_rid"].to_numpy()
    keys = keys.drop("_rid")
    predictions, probabilities = learner.task.decode(out)
    taken = {k.casefold() for k in keys.columns}
    frame = keys.with_columns(pl.Series(free_name("prediction", taken), predictions))
    if probabilities is not None and learner.task.kind == "binary":  # the probability of the positive class, classes[1]
        frame = frame.with_columns(pl.Series(free_name("probability", taken), probabilities[:, 1], dtype=pl.Float64))
    elif probabilities is not None:
        frame = frame.with_columns(pl.Series(free_name("probabilities", taken), probabilities.tolist(), dtype=pl.List(pl.Float64)))
    if splits:
        taken = {c.casefold() for c in frame.columns}
        frame = frame.with_columns(pl.Series(free_name("split", taken), splits_of(learner, rids), dtype=pl.String))
    return frame
