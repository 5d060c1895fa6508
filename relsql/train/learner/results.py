"""What a trained model gives back: predictions for every output row and metrics on a split,
computed from a Learner's public members. A learner with a `hybrid` (relsql/train/gbm/hybrid.py)
gives the blend of its network and its GBM; `predict` says which split each row was in."""

from __future__ import annotations

import logging

import numpy as np
import polars as pl
import sqlglot.expressions as exp
import torch

from relsql import sql as q
from relsql.data.duckdb import free_name
from relsql.errors import RelsqlError
from relsql.train.learner import rows as chosen
from relsql.train.learner.learner import Learner

log = logging.getLogger("relsql")


def evaluate(learner: Learner, split: str) -> dict[str, float]:
    """Loss and metrics on a split, as the learner measures them (Learner.evaluate): accuracy, ROC-AUC,
    F1 (classification), MAE, RMSE (regression), or a ranking's MAP@k, recall@k, ... After a refit on
    every labelled row, the validation and test scores are those measured before it (the refit model
    has learned those rows: scoring them with it would say nothing about new rows)."""
    if split not in learner.rows:
        raise RelsqlError(f"unknown split {split!r}; use 'train', 'val' or 'test'")
    if len(learner.rows[split]) == 0:
        raise RelsqlError(f"the {split} split has no rows")
    held_out = (getattr(learner, "refit", None) or {}).get("held_out", {})
    if split in held_out:
        log.info("evaluate(%r): the scores measured before the refit on every labelled row, on rows the selected model "
                 "had not seen (the refit model, which predict() uses, has learned them)", split)
        return dict(held_out[split])
    return learner.evaluate(split)


def _key_frame(learner: Learner, keys: object = None, where: object = None, splits: bool = False) -> pl.DataFrame:
    """Every output row's key columns and `_rid`, in row-id order. A grounder of the asked rows
    alone (`rows_only`, a loaded model's) is first restricted to those of `keys` and `where`:
    then every row means every row it holds, numbered among them."""
    if learner.mini_batches:
        grounder = learner.batched.grounder
        if getattr(grounder, "rows_only", False):
            _restrict(learner, grounder, keys, where, splits)
        return pl.from_arrow(grounder.keys(learner.output)).sort("_rid")
    return pl.from_arrow(learner.net.grounding.relations[learner.output].keys).sort("_rid")


def _restrict(learner, grounder, keys: object, where: object, splits: bool) -> None:
    """Key tables of the rows `keys` (else those `where` picks) reach; of every row where the split
    column cannot be found by key (`_labelled_order`), or `where`'s keys do not fit the output's types."""
    names, table = list(learner.goal.keys), learner.table
    # the split column's positions, found once per call (`_splits_by_key` reads them); none wanted where
    # no split was kept: every row's split is None then
    wanted = splits and any(len(p) for p in learner.goal.rows.values())
    grounder.labelled_order = _labelled_order(learner, grounder, whole=False) if wanted else None
    if (keys is None and where is None) or (wanted and grounder.labelled_order is None):
        grounder.restrict(None)
        return
    schema = pl.from_arrow(grounder.keys(learner.output).slice(0, 0)).drop("_rid").schema
    if keys is not None:
        asked = chosen.typed_keys(keys, names, table, schema)
    else:
        try:
            asked = chosen.where_keys(learner.db, table, names, where).with_columns(
                [pl.col(k).cast(schema[k], strict=True) for k in names])
        except pl.exceptions.PolarsError:  # of_where says so, over every row
            grounder.restrict(None)
            return
    grounder.restrict(asked.unique(maintain_order=True).to_arrow())


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


def chosen_rows(learner: Learner, keys: object = None, where: object = None, splits: bool = False) -> pl.DataFrame:
    """The key columns and `_rid` of the output rows `keys` and `where` choose (relsql/train/learner/rows.py):
    the rows of `keys` in its order, those satisfying `where` in row-id order, or with both the rows
    of `keys` that satisfy `where`; every row when both are None. `splits`: their split is wanted too."""
    known = _key_frame(learner, keys, where, splits)
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


def splits_of(learner: Learner, rids: np.ndarray, rows: pl.DataFrame | None = None) -> list[str | None]:
    """Which split each output row in `rids` was in: "train", "val", "test", or None for a row
    without a label (prediction only). A grounder of the asked rows alone (`rows_only`) finds
    them by key (`rows`: their keys): its row ids number only the rows asked for."""
    if learner.mini_batches and getattr(learner.batched.grounder, "rows_only", False):
        return _splits_by_key(learner, rows)
    where = {}
    for split, positions in learner.rows.items():
        for rid in learner.labelled[positions].tolist():
            where[rid] = SPLITS[split]
    return [where.get(rid) for rid in rids.tolist()]


def _labelled_order(learner, grounder, whole: bool) -> pl.DataFrame | None:
    """Each labelled output row's keys and `_position` among the labelled rows (what the saved
    split's positions count), found without the labels' row ids. With `whole` (the grounder holds
    every output row): the target rows with a label and an output row, in row-id order, as the
    labels are read (`Target.read`). Else the target rows with a label, in key order (the output's
    row-id order), where they are exactly the labelled output rows: the split holds positions
    0..n-1 and the table n labelled rows of distinct keys (on the database the model was trained
    on, whose n labelled rows all had an output row); None where that does not hold."""
    goal = learner.goal
    taken = np.concatenate([np.asarray(p, dtype=np.int64) for p in goal.rows.values()] or [np.zeros(0, np.int64)])
    names = list(goal.keys)
    order = exp.Order(expressions=[exp.Ordered(this=q.col(k, "t"), nulls_first=True) for k in names])
    position = exp.Sub(this=exp.Window(this=exp.RowNumber(), order=order), expression=q.integer(1))
    query = exp.select(*[q.col(k, "t") for k in names], q.alias(position, "_position")).from_(
        q.alias(exp.Table(this=q.ident(goal.table)), "t", table=True)).where(
        exp.Not(this=exp.Is(this=q.col(goal.column, "t"), expression=exp.Null())))
    if whole:
        on = exp.and_(*[exp.NullSafeEQ(this=q.col(k, "k"), expression=q.col(k, "t")) for k in names])
        return pl.from_arrow(learner.db.arrow(query.join(q.alias(grounder.key_tables[goal.output].copy(), "k", table=True),
                                                          on=on)))
    if not np.array_equal(np.sort(taken), np.arange(len(taken))):
        return None
    found = pl.from_arrow(learner.db.arrow(query))
    if found.height != len(taken) or found.select(names).unique().height != found.height:
        return None
    return found


def _splits_by_key(learner, rows: pl.DataFrame) -> list[str | None]:
    grounder = learner.batched.grounder
    goal = learner.goal
    if not any(len(p) for p in goal.rows.values()):  # no split kept (another database's model)
        return [None] * rows.height
    order = getattr(grounder, "labelled_order", None)  # `_restrict`'s, of this call
    if order is None:  # `_restrict` kept every output row: as the labels are read
        order = _labelled_order(learner, grounder, whole=True)
    split = np.full(int(order["_position"].max() or 0) + 1 if order.height else 0, None, dtype=object)
    for name, positions in goal.rows.items():
        positions = np.asarray(positions, dtype=np.int64)
        split[positions[positions < len(split)]] = SPLITS[name]
    names = list(goal.keys)
    found = rows.select(names).with_row_index("_order").join(order, on=names, how="left", nulls_equal=True).sort("_order")
    return [None if p is None else split[p] for p in found["_position"].to_list()]


def predict(learner: Learner, splits: bool = False, keys: object = None, where: object = None) -> pl.DataFrame:
    """The output rows chosen by `keys` and `where` (see `chosen_rows`; default every row): their
    keys, `prediction`, and the class probabilities (see Model.predict); with `splits`, last a
    column `split`: the part of the labelled rows the row was in ("train", "val", "test"), null for
    prediction-only rows."""
    if learner.answers != "predict":  # the CLI and a loaded model's learner come here without Model.predict's check
        raise RelsqlError(f"{learner.goal.name} is a {learner.task.kind} target: its model ranks candidates, it has no "
                          "single value per row to predict; use recommend (Model.recommend(k=10), or "
                          "`relsql recommend --model ...` on the command line) for each row's k best candidates")
    rows = chosen_rows(learner, keys, where, splits)
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
        frame = frame.with_columns(pl.Series(free_name("split", taken), splits_of(learner, rids, rows), dtype=pl.String))
    return frame
