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
from relsql.train import rows as chosen
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


def _key_frame(learner: Learner) -> pl.DataFrame:
    """Every output row's key columns and `_rid`, in row-id order."""
    if learner.mini_batches:
        return pl.from_arrow(learner.batched.grounder.keys(learner.output)).sort("_rid")
    return pl.from_arrow(learner.net.grounding.relations[learner.output].keys).sort("_rid")


def _outputs(learner: Learner, rids: np.ndarray) -> np.ndarray:
    """The outputs of output rows `rids`, in that order, blended with the learner's GBM when it has
    a hybrid. Mini-batches compute only the rows asked for."""
    with torch.no_grad():
        if learner.mini_batches:
            out = learner.outputs_of(rids)
        else:
            out = learner.outputs().index_select(0, torch.as_tensor(rids, dtype=torch.long, device=learner.device))
    hybrid = getattr(learner, "hybrid", None)
    if hybrid is not None and len(rids):
        out = hybrid.blend(learner, rids, out)
    return out.detach().cpu().double().numpy()


def chosen_rows(learner: Learner, keys: object = None, where: object = None) -> pl.DataFrame:
    """The key columns and `_rid` of the output rows `keys` and `where` choose (relsql/train/rows.py):
    the rows of `keys` in its order, those satisfying `where` in row-id order, or with both the rows
    of `keys` that satisfy `where`; every row when both are None."""
    known = _key_frame(learner)
    names = list(learner.goal.keys)
    if keys is None and where is None:
        return known
    rids = None if keys is None else chosen.of_keys(known, keys, names, learner.table)
    if where is not None:
        passing = chosen.of_where(learner.db, known, where, names, learner.table)
        rids = passing if rids is None else rids[np.isin(rids, passing)]
    if not len(rids):
        return known.head(0)
    position = np.zeros(int(known["_rid"].max()) + 1, dtype=np.int64)  # known's row of each _rid
    position[known["_rid"].to_numpy()] = np.arange(known.height)
    return known[position[rids].tolist()]


SPLITS = {"train": "train", "val": "val", "test": "test"}  # the split names predict() writes


def splits_of(learner: Learner, rids: np.ndarray) -> list[str | None]:
    """Which split each output row in `rids` was in: "train", "val", "test", or None for a row
    without a label (prediction only)."""
    where = {}
    for split, positions in learner.rows.items():
        for rid in learner.labelled[positions].tolist():
            where[rid] = SPLITS[split]
    return [where.get(rid) for rid in rids.tolist()]


def predict(learner: Learner, splits: bool = False, keys: object = None, where: object = None) -> pl.DataFrame:
    """The output rows chosen by `keys` and `where` (see `chosen_rows`; default every row): their
    keys, `prediction`, and the class probabilities (see Model.predict); with `splits`, last a
    column `split`: the part of the labelled rows the row was in ("train", "val", "test"), null for
    prediction-only rows."""
    if learner.task.kind == "ranking":  # the CLI and a loaded model's learner come here without Model.predict's check
        raise RelsqlError(f"{learner.goal.name} is a ranking target: its model ranks candidates, it has no single value "
                          "per row to predict; use recommend (Model.recommend(k=10), or `relsql recommend --model ...` "
                          "on the command line) for each row's k best candidates")
    rows = chosen_rows(learner, keys, where)
    rids = rows["_rid"].to_numpy()
    out = _outputs(learner, rids)
    keys = rows.drop("_rid")
    predictions, probabilities = learner.task.decode(out)
    taken = {k.casefold() for k in keys.columns}
    frame = keys.with_columns(pl.Series(free_name("prediction", taken), predictions))
    if probabilities is not None and learner.task.kind == "binary":  # the probability of the positive class, classes[1]
        frame = frame.with_columns(pl.Series(free_name("probability", taken), probabilities[:, 1], dtype=pl.Float64))
    elif probabilities is not None:
        frame = frame.with_columns(pl.Series(free_name("probabilities", taken), probabilities.tolist(),
                                             dtype=pl.List(pl.Float64)))
    if splits:
        taken = {c.casefold() for c in frame.columns}
        frame = frame.with_columns(pl.Series(free_name("split", taken), splits_of(learner, rids), dtype=pl.String))
    return frame
