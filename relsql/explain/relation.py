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
from relsql.explain import asked
from relsql.explain.inputs import Input, plain_plan
from relsql.explain.integrate import TOLERANCE, Attributed, Runner, adaptive, attribute, owners
from relsql.train.learner import results

STEPS = None  # Gauss-Legendre points: as many as completeness to TOLERANCE needs (integrate.adaptive)
COLUMNS = ("table", "row_key", "column", "relation", "rule", "attribution", "output", "baseline")


def explain(learner, keys: object = None, where: str | None = None, *, steps: int | None = STEPS, per: str = "column",
            unit: int | None = None) -> pl.DataFrame:
    """Attributions of the network's output (log-odds of classes[1], a regression's standardized
    value, or class `unit`'s score, by default the predicted class) for the rows `keys`/`where`
    choose (as predict(); every row by default): one row per (explained row, input row, column),
    columns `table`, `row_key` (the input row's key, the grounding's head key as text), `column`
    (null with per="row": a row's columns summed), `relation` and `rule` (where it was read),
    `attribution`, and the explained row's `output` and `baseline` (its output with every input at
    the baseline): a row's attributions sum to output - baseline (`steps` None: within TOLERANCE,
    with as few integration points as that takes; else exactly `steps` points)."""
    if steps is not None:
        steps = arguments.integer("steps", steps, minimum=1, maximum=1024)
    if per not in ("column", "row"):
        raise RelsqlError(f"per must be 'column' (one attribution per input column) or 'row' (per input row), got {per!r}")
    if learner.answers != "predict":
        raise RelsqlError(f"{learner.goal.name} is a {learner.task.kind} target: explain() explains one value per row; "
                          "a ranking's candidates are not explained yet")
    rows = results.chosen_rows(learner, keys, where)
    rids = rows["_rid"].to_numpy()
    frames = []
    for at, part in asked.parts(learner, rids):  # memory follows the rows asked for, not the database
        plan, inputs = plain_plan(learner.template, part.grounding)
        runner = Runner(plan, inputs, learner.net.weights_by_name(), learner.head, learner.output, part.external)
        units = _units(runner, part.rids, learner.task, unit)
        reach = owners(part.grounding, learner.output, part.rids)
        found = adaptive(runner, part.rids, units, reach, TOLERANCE) if steps is None else \
            attribute(runner, part.rids, units, steps, reach)
        frames.append(_frame(found, inputs, rows[at].drop("_rid"), part.grounding, per))
    return pl.concat(frames) if frames else _frame(_nothing(), [], rows.drop("_rid"), None, per)


def _nothing() -> Attributed:
    """The attributions of no rows."""
    none = np.zeros(0, dtype=np.int64)
    return Attributed(none, none, none, none, np.zeros(0), np.zeros(0), np.zeros(0))


def _units(runner: Runner, rids: np.ndarray, task, unit: int | None) -> np.ndarray:
    width = int(task.units)
    if unit is not None:
        unit = arguments.integer("unit", unit, minimum=0, maximum=width - 1)
        return np.full(len(rids), unit, dtype=np.int64)
    if width == 1:
        return np.zeros(len(rids), dtype=np.int64)
    out, _ = runner.outputs([1.0], grad=False)
    return out[0, rids].argmax(1).numpy()


def _key_texts(grounding, relation: str, ids: np.ndarray) -> pl.Series:
    """The key of each row id in `ids` as text: the value itself for one key column (str() of it),
    else a JSON list of the key's values."""
    keys = grounding.relations[relation].keys
    names = [c for c in keys.column_names if c != "_rid"]
    rid = keys.column("_rid").to_numpy()
    where = ids if np.array_equal(rid, np.arange(len(rid))) else np.argsort(rid)[ids]
    at = pl.Series(where, dtype=pl.Int64)
    picked = [pl.Series(keys.column(c)).gather(at) for c in names]
    if len(names) == 1 and (picked[0].dtype.is_integer() or picked[0].dtype == pl.String):
        return picked[0].cast(pl.String)
    columns = [c.to_list() for c in picked]
    if len(columns) == 1:
        return pl.Series([None if v is None else str(v) for v in columns[0]], dtype=pl.String)
    return pl.Series([json.dumps(list(v), default=str) for v in zip(*columns)], dtype=pl.String)


def _frame(found: Attributed, inputs: list[Input], keys: pl.DataFrame, grounding, per: str) -> pl.DataFrame:
    """One row per (explained row, input row, label), attributions summed over the groundings and
    elements that share them; grouped on integer codes (polars' group_by over the text columns was
    a third of an explanation's time)."""
    uid: dict[tuple, int] = {}  # (table, column, relation, rule) -> its code; column None with per="row"
    code = [uid.setdefault((i.columns[p][0], None if per == "row" else i.columns[p][1], i.relation, i.rule), len(uid))
            for i in inputs for p in range(len(i.widths))]
    first = np.cumsum([0, *[len(i.widths) for i in inputs]])[:-1].astype(np.int64)
    label = np.asarray(code, dtype=np.int64)[first[found.source] + found.part] if len(found.source) else \
        np.zeros(0, dtype=np.int64)
    head = np.zeros(len(found.source), dtype=np.int64)  # the input row: a row id of the input's relation
    for n, i in enumerate(inputs):
        mine = np.flatnonzero(found.source == n)
        head[mine] = i.rg.head[torch.as_tensor(found.grounding[mine])].numpy()
    order = np.lexsort((head, label, found.row))
    row, label, head, value = found.row[order], label[order], head[order], found.value[order]
    if len(row):
        starts = np.flatnonzero(np.r_[True, (row[1:] != row[:-1]) | (label[1:] != label[:-1]) | (head[1:] != head[:-1])])
        row, label, head, value = row[starts], label[starts], head[starts], np.add.reduceat(value, starts)
    missing = np.flatnonzero(np.bincount(row, minlength=keys.height) == 0)
    if len(missing):  # a row no input reaches: one line with null input, so that its output is still said
        row, label = np.concatenate([row, missing]), np.concatenate([label, np.full(len(missing), -1)])
        head = np.concatenate([head, np.zeros(len(missing), dtype=np.int64)])
        value = np.concatenate([value, np.zeros(len(missing))])
        again = np.argsort(row, kind="stable")
        row, label, head, value = row[again], label[again], head[again], value[again]
    labels = list(uid)
    label = np.where(label < 0, len(labels), label)
    relations = list(dict.fromkeys(t[2] for t in labels))
    relation_of = np.asarray([relations.index(t[2]) for t in labels] + [-1], dtype=np.int64)[label]
    mines = [np.flatnonzero(relation_of == r) for r in range(-1, len(relations))]
    texts = [pl.Series([None] * len(mines[0]), dtype=pl.String),
             *[_key_texts(grounding, relation, head[mine]) for relation, mine in zip(relations, mines[1:])]]
    inverse = np.empty(len(row), dtype=np.int64)
    inverse[np.concatenate(mines)] = np.arange(len(row))
    row_key = pl.concat(texts).gather(pl.Series(inverse, dtype=pl.Int64))
    names = {k.casefold() for k in keys.columns}
    out = {c: free_name(c, names) for c in COLUMNS}
    at = pl.Series(label, dtype=pl.Int64)
    named = [pl.Series(out[c], [t[k] for t in labels] + [None], dtype=pl.String).gather(at)
             for k, c in enumerate(("table", "column", "relation", "rule"))]
    rows = pl.Series(row, dtype=pl.Int64)
    return pl.DataFrame([*[keys[c].gather(rows) for c in keys.columns], named[0], row_key.alias(out["row_key"]), *named[1:],
                         pl.Series(out["attribution"], value, dtype=pl.Float64),
                         pl.Series(out["output"], found.output[row], dtype=pl.Float64),
                         pl.Series(out["baseline"], found.baseline[row], dtype=pl.Float64)])


def summary(explanation: pl.DataFrame, keys: list[str], hybrid=None) -> pl.DataFrame:
    """Mean |attribution| over the explained rows by `table.column` (kind "column") and by relation
    (kind "relation": where the input was read, the path's first step), each with its `share` of
    its kind's total; a row's attributions per name are summed before the absolute value. With a
    blended GBM: kind "blend" rows ("network", "gbm") whose share is the blend weight, and kind
    "gbm_feature" rows with the GBM's split counts per feature as `share` (the GBM part is not
    attributed to input rows)."""
    role = roles(explanation)  # where a target key is itself named `table`, ..., explain renamed these
    frame = explanation.filter(pl.col(role["table"]).is_not_null())
    rows = max(explanation.select(keys).unique().height, 1)
    parts = []
    for kind, name in (("column", pl.concat_str([pl.col(role["table"]), pl.col(role["column"])], separator=".")),
                       ("relation", pl.col(role["relation"]))):
        named = frame.with_columns(name.alias("__relsql_name"))
        per_row = named.group_by([*keys, "__relsql_name"]).agg(pl.col(role["attribution"]).sum().abs().alias("a"))
        means = per_row.group_by("__relsql_name").agg((pl.col("a").sum() / rows).alias("mean_abs_attribution")) \
            .rename({"__relsql_name": "name"})
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


def roles(explanation: pl.DataFrame) -> dict[str, str]:
    """The names `explain` gave its own columns (COLUMNS, last, in that order; a name a target key
    already has gets a suffix)."""
    return dict(zip(COLUMNS, explanation.columns[len(explanation.columns) - len(COLUMNS):]))


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
