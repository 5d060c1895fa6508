"""The predictors a relational model has to beat, on the model's own split.

- `majority`: the majority class of the training rows (classification) or their mean
  (regression): what a model knows without any input.
- `gbm_own_columns`: gradient-boosted trees (relsql/train/gbm/gbm.py) on the target table's own
  columns (relsql/train/gbm/flat.py: numbers, booleans, dates, text codes; never keys, identifiers,
  the label or copies of it): what a model knows without the other tables. If the model does
  not beat it, its joins add nothing.
- `gbm_one_hop`: the same trees on one-hop features the database computes (own columns, parent
  rows' columns, per-child count/mean/min/max): what a flat model over SQL features knows.
- `own_columns`: a linear model (logistic, softmax or least squares) on the target table's own
  numeric and boolean columns, the baseline of earlier versions.

The GBMs fit on the training rows and stop early on the validation rows, unless they are scored
on the validation rows themselves (then 200 rounds, no early stopping): a baseline never sees
the rows it is judged on.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import sqlglot.expressions as exp
import torch

from relsql import sql as q
from relsql.train.eager import eager
from relsql.train.gbm import flat, gbm

CHEAP_ROWS = 2_000_000  # own_columns reads the target table's rows into memory once


def majority(model, split: str) -> dict[str, float]:
    train, y = _labels(model, "train"), _labels(model, split)
    out = np.zeros((len(y), model.task.units))  # regression: the training mean is 0 in standardized units
    if model.task.kind == "binary":
        out[:, 0] = 1.0 if train.mean() >= 0.5 else -1.0
    elif model.task.kind == "multiclass":
        out[:, np.bincount(train.astype(np.int64), minlength=model.task.units).argmax()] = 1.0
    return model.task.scores(out, y)


def compare(learner, split: str = "test") -> dict[str, dict[str, float]]:
    """{name: scores on `split`} of "majority", "gbm_own_columns" and "gbm_one_hop" (a GBM is
    absent when it has no feature to use), scored with the task's metrics like the model."""
    out = {"majority": majority(learner, split)}
    spec = one_hop(learner)
    x = features(learner, spec)
    for name, width in (("gbm_own_columns", len(spec.own)), ("gbm_one_hop", x.shape[1])):
        if width:
            trees = fit_trees(learner, x[:, :width], early_stopping=split != "val")
            out[name] = learner.task.scores(trees.raw(x[learner.rows[split], :width]), _labels(learner, split))
    return out


def one_hop(learner) -> flat.Flat:
    """The target table's one-hop features (own columns first, as `Flat.names` orders them)."""
    return flat.plan(learner.db, learner.table, learner.column, learner.time_column)


def own_only(spec: flat.Flat) -> flat.Flat:
    return replace(spec, parents=[], children=[])


def features(learner, spec: flat.Flat) -> np.ndarray:
    """`spec`'s features of every labelled row, in the learner's order of labelled rows."""
    return spec.of_output(learner.db, learner.output, int(learner.output_rows))[learner.labelled]


def fit_trees(learner, x: np.ndarray, early_stopping: bool = True, **settings) -> gbm.Trees:
    """A GBM on the training rows of `x` (labelled order), stopping early on the validation rows;
    `settings` (a learning rate, a patience) over gbm.fit's defaults."""
    rows = learner.rows
    val = rows["val"] if early_stopping and len(rows["val"]) else None
    return gbm.fit(x[rows["train"]], _labels(learner, "train"), learner.task.kind, learner.task.units, learner.seed,
                   x_val=None if val is None else x[val], y_val=None if val is None else _labels(learner, "val"), **settings)


def own_columns(model, split: str) -> tuple[dict[str, float], list[str]] | None:
    """Scores on `split` of a linear model of the target table's own columns, and those columns;
    None when there are none to use or the table is too large to be cheap."""
    columns = _columns(model)
    if not columns or len(model.labelled) > CHEAP_ROWS:
        return None
    matrix = _matrix(model, columns)
    matrix = np.where(np.isfinite(matrix), matrix, np.nan)  # NaN and infinities are missing, as NULLs are
    with np.errstate(all="ignore"):
        mean = np.nan_to_num(np.nanmean(matrix[model.rows["train"]], axis=0))  # NULLs become the training mean
    matrix = np.where(np.isnan(matrix), mean, matrix)
    x = torch.as_tensor(matrix, dtype=torch.float64)
    train = torch.as_tensor(model.rows["train"])
    std = x[train].std(0, unbiased=False)
    x = (x - torch.as_tensor(mean)) / torch.where(std > 0, std, torch.ones_like(std))
    y = model.y.detach().to("cpu", torch.float64)
    weight = torch.zeros((x.shape[1], model.task.units), dtype=torch.float64, requires_grad=True)
    bias = torch.zeros(model.task.units, dtype=torch.float64, requires_grad=True)
    optimizer = eager(torch.optim.LBFGS)([weight, bias], max_iter=100, line_search_fn="strong_wolfe")

    def closure():
        optimizer.zero_grad()
        loss = model.task.loss(x[train] @ weight + bias, y[train]) + 1e-3 * weight.pow(2).sum()
        loss.backward()
        return loss

    optimizer.step(closure)
    rows = torch.as_tensor(model.rows[split])
    with torch.no_grad():
        out = (x[rows] @ weight + bias).numpy()
    return model.task.scores(out, y[rows].numpy()), columns


def _labels(model, split: str) -> np.ndarray:
    return model.y[model.rows[split]].detach().cpu().double().numpy()


def _columns(model) -> list[str]:
    """Numeric and boolean columns of the target table that say something about a row: not the
    target, the output's keys, the time column, or anything named like an identifier."""
    from relsql.data.coltypes import is_flag, is_number
    from relsql.template.auto import id_like
    from relsql.train.task.leakage import copies_of

    skip = {c.casefold() for c in (model.column, model.time_column, *model.template.relations[model.output].keys) if c}
    skip |= copies_of(model.db, model.table, model.column)
    skip |= key_columns(model.db).get(model.table, set())  # a foreign key is no quantity, whatever its name
    return [name for name, kind in model.db.columns(model.table)
            if name.casefold() not in skip and not id_like(name) and (is_number(kind) or is_flag(kind))]


def key_columns(db) -> dict[str, set[str]]:
    """Per table, its key columns (folded), declared or inferred (relsql.data.keys.schema)."""
    from relsql.data.keys import schema

    return flat.key_columns(schema(db, db.catalog()))


def _matrix(model, columns: list[str]) -> np.ndarray:
    """The columns for each labelled row, in the model's order of labelled rows (the output's
    row ids, as `Model._labels` joins them)."""
    keys = model.template.relations[model.output].keys
    k, t = "k", "t"
    on = exp.and_(*[exp.NullSafeEQ(this=q.col(key, k), expression=q.col(key, t)) for key in keys])
    select = (exp.select(*[exp.cast(q.col(c, t), exp.DataType.build("DOUBLE")) for c in columns])
              .from_(exp.alias_(model.db.temp_table("k", model.output), q.ident(k), table=True))
              .join(exp.alias_(exp.Table(this=q.ident(model.table)), q.ident(t), table=True), on=on)
              .where(exp.Not(this=exp.Is(this=q.col(model.column, t), expression=exp.Null())))
              .order_by(q.col("_rid", k)))
    table = model.db.arrow(select)
    return np.stack([table.column(i).to_numpy(zero_copy_only=False).astype(np.float64) for i in range(len(columns))], axis=1)
