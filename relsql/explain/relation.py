"""Explanations as relations: `explain` (per explained row, the attribution of each input row and
column its groundings read) and `summary` (mean |attribution| by table.column and by relation,
with a blended GBM's share and its features' importances), both polars DataFrames."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import torch

from relsql import arguments
from relsql.data.duckdb import free_name
from relsql.errors import RelsqlError
from relsql.explain.inputs import Input, plain_plan
from relsql.explain.integrate import Attributed, Runner, attribute, owners
from relsql.train.learner import results

STEPS = 32  # Gauss-Legendre points: completeness to ~1e-12 on the smooth templates measured (tests/test_explain.py)
COLUMNS = ("table", "row_key", "column", "relation", "rule", "attribution", "output", "baseline")


def explain(learner, keys: object = None, where: str | None = None, *, steps: int = STEPS, per: str = "column",
            unit: int | None = None) -> pl.DataFrame:
    """Attributions of the network's output (log-odds of classes[1], a regression's standardized
    value, or class `unit`'s score, by default the predicted class) for the rows `keys`/`where`
    choose (as predict(); every row by default): one row per (explained row, input row, column),
    columns `table`, `row_key` (the input row's key, the grounding's head key as text), `column`
    (null with per="row": a row's columns summed), `relation` and `rule` (where it was read),
    `attribution`, and the explained row's `output` and `baseline` (its output with every input at
    the baseline): a row's attributions sum to output - baseline."""
    steps = arguments.integer("steps", steps, minimum=1, maximum=1024)
    if per not in ("column", "row"):
        raise RelsqlError(f"per must be 'column' (one attribution per input column) or 'row' (per input row), got {per!r}")
    if learner.answers != "predict":
        raise RelsqlError(f"{learner.goal.name} is a {learner.task.kind} target: explain() explains one value per row; "
                          "a ranking's candidates are not explained yet")
    if learner.mini_batches:
        raise RelsqlError("explain() runs the whole grounding in memory: this model trains in mini-batches "
                          "(batch_size= or embeddings stored in the database); load it without batch_size= "
                          "(relsql.Model.load(path, db)) to explain its rows")
    rows = results.chosen_rows(learner, keys, where)
    rids = rows["_rid"].to_numpy()
    net = learner.net
    plan, inputs = plain_plan(learner.template, net.grounding)
    runner = Runner(plan, inputs, net.weights_by_name(), learner.head, learner.output)
    units = _units(runner, rids, learner.task, unit)
    found = attribute(runner, rids, units, steps, owners(net.grounding, learner.output, rids))
    return _frame(found, inputs, rows.drop("_rid"), net.grounding, per)


def _units(runner: Runner, rids: np.ndarray, task, unit: int | None) -> np.ndarray:
    width = int(task.units)
    if unit is not None:
        unit = arguments.integer("unit", unit, minimum=0, maximum=width - 1)
        return np.full(len(rids), unit, dtype=np.int64)
    if width == 1:
        return np.zeros(len(rids), dtype=np.int64)
    out, _ = runner.outputs(1.0, grad=False)
    return out[rids].argmax(1).numpy()


def _row_keys(grounding, relation: str) -> list[str]:
    """Each row id's key as text: the value itself for one key column, else a JSON list."""
    keys = grounding.relations[relation].keys
    names = [c for c in keys.column_names if c != "_rid"]
    order = np.argsort(keys.column("_rid").to_numpy())
    columns = [keys.column(c).to_pylist() for c in names]
    if len(columns) == 1:
        return [None if columns[0][i] is None else str(columns[0][i]) for i in order]
    return [json.dumps([c[i] for c in columns], default=str) for i in order]


def _frame(found: Attributed, inputs: list[Input], keys: pl.DataFrame, grounding, per: str) -> pl.DataFrame:
    texts: dict[str, np.ndarray] = {}
    # what each (input, part) names, looked up per entry by one index
    labels = [(i.columns[p][0], i.columns[p][1], i.relation, i.rule) for i in inputs for p in range(len(i.widths))]
    first = np.cumsum([0, *[len(i.widths) for i in inputs]])[:-1]
    label = first[found.source] + found.part if len(found.source) else np.zeros(0, dtype=np.int64)
    lookup = np.empty((len(labels), 4), dtype=object)
    for n, named in enumerate(labels):
        lookup[n] = named
    table, column, relation, rule = (lookup[label, k].tolist() for k in range(4))
    row_key = np.empty(len(found.source), dtype=object)
    for n, i in enumerate(inputs):
        mine = np.flatnonzero(found.source == n)
        if len(mine):
            if i.relation not in texts:
                texts[i.relation] = np.asarray(_row_keys(grounding, i.relation), dtype=object)
            row_key[mine] = texts[i.relation][i.rg.head[torch.as_tensor(found.grounding[mine])].numpy()]
    row_key = row_key.tolist()
    names = {k.casefold() for k in keys.columns}
    out = {c: free_name(c, names) for c in COLUMNS}
    frame = keys[found.row.tolist()].with_columns(
        pl.Series(out["table"], table, dtype=pl.String), pl.Series(out["row_key"], row_key, dtype=pl.String),
        pl.Series(out["column"], column, dtype=pl.String), pl.Series(out["relation"], relation, dtype=pl.String),
        pl.Series(out["rule"], rule, dtype=pl.String), pl.Series(out["attribution"], found.value, dtype=pl.Float64),
        pl.Series("_row", found.row, dtype=pl.Int64))
    by = [*keys.columns, out["table"], out["row_key"], out["column"], out["relation"], out["rule"]]
    if per == "row":
        frame = frame.with_columns(pl.lit(None, dtype=pl.String).alias(out["column"]))
    frame = frame.group_by(["_row", *by], maintain_order=True).agg(pl.col(out["attribution"]).sum())
    frame = frame.with_columns(pl.Series(out["output"], found.output[frame["_row"].to_numpy()], dtype=pl.Float64),
                               pl.Series(out["baseline"], found.baseline[frame["_row"].to_numpy()], dtype=pl.Float64))
    missing = np.setdiff1d(np.arange(keys.height), frame["_row"].to_numpy())
    if len(missing):  # a row no input reaches: one line with null input, so that its output is still said
        empty = keys[missing.tolist()].with_columns(
            *[pl.lit(None, dtype=pl.String).alias(out[c]) for c in ("table", "row_key", "column", "relation", "rule")],
            pl.lit(0.0).alias(out["attribution"]), pl.Series("_row", missing, dtype=pl.Int64),
            pl.Series(out["output"], found.output[missing]), pl.Series(out["baseline"], found.baseline[missing]))
        frame = pl.concat([frame, empty.select(frame.columns)])
    return frame.sort("_row", maintain_order=True).drop("_row")


def summary(explanation: pl.DataFrame, keys: list[str], hybrid=None) -> pl.DataFrame:
    """Mean |attribution| over the explained rows by `table.column` (kind "column") and by relation
    (kind "relation": where the input was read, the path's first step), each with its `share` of
    its kind's total; a row's attributions per name are summed before the absolute value. With a
    blended GBM: kind "blend" rows ("network", "gbm") whose share is the blend weight, and kind
    "gbm_feature" rows with the GBM's split counts per feature as `share` (the GBM part is not
    attributed to input rows)."""
    frame = explanation.filter(pl.col("table").is_not_null())
    rows = max(explanation.select(keys).unique().height, 1)
    parts = []
    for kind, name in (("column", pl.concat_str([pl.col("table"), pl.col("column")], separator=".")),
                       ("relation", pl.col("relation"))):
        named = frame.with_columns(name.alias("name"))
        per_row = named.group_by([*keys, "name"]).agg(pl.col("attribution").sum().abs().alias("a"))
        means = per_row.group_by("name").agg((pl.col("a").sum() / rows).alias("mean_abs_attribution"))
        total = float(means["mean_abs_attribution"].sum()) or 1.0
        parts.append(means.with_columns(pl.lit(kind).alias("kind"), (pl.col("mean_abs_attribution") / total).alias("share"))
                     .sort("mean_abs_attribution", descending=True))
    if hybrid is not None:
        parts.append(pl.DataFrame({"name": ["network", "gbm"], "mean_abs_attribution": [None, None],
                                   "kind": ["blend", "blend"], "share": [hybrid.weight, 1.0 - hybrid.weight]},
                                  schema={"name": pl.String, "mean_abs_attribution": pl.Float64, "kind": pl.String,
                                          "share": pl.Float64}))
        parts.append(gbm_importances(hybrid))
    columns = ["kind", "name", "mean_abs_attribution", "share"]
    return pl.concat([p.select(columns).cast({"mean_abs_attribution": pl.Float64, "share": pl.Float64}) for p in parts])


def gbm_importances(hybrid) -> pl.DataFrame:
    """The blended GBM's split count per feature, as a share of all its splits."""
    trees = hybrid.trees
    names = hybrid.features.names
    names = list(names() if callable(names) else names)
    used = trees.feature[trees.feature >= 0]
    counts = np.bincount(used, minlength=len(names)).astype(np.float64)[: len(names)]
    share = counts / max(counts.sum(), 1.0)
    return pl.DataFrame({"kind": ["gbm_feature"] * len(names), "name": names, "mean_abs_attribution": [None] * len(names),
                         "share": share}, schema={"kind": pl.String, "name": pl.String, "mean_abs_attribution": pl.Float64,
                                                  "share": pl.Float64}).sort("share", descending=True)
