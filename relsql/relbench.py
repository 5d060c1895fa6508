"""RelBench in relsql: a relbench `Database` as DuckDB tables with its keys and time columns,
RelBench tasks as target tables trained on RelBench's own split, and RelBench's metrics.

Duck-typed: relsql never imports relbench. A relbench `Database` is anything with a
`table_dict` of tables that have `df` (pandas), `pkey_col`, `fkey_col_to_pkey_table` and
`time_col`; a task is anything with `get_table(split, mask_input_cols=False)` and the
attributes of relbench's EntityTask (`entity_col`, `entity_table`, `target_col`, `time_col`,
`task_type`). A RelBench dataset folder opened with `relsql.connect(folder)` gets the same
(connectors/relbench.py).

Keys become given keys of relsql's key layer (`Database.given_keys`, as `connect(keys=...)`
gives them), so they hold for any source and nothing is declared in the user's tables. Time
columns are kept in `db.time_columns` ({table: column}): pass them to
`Template.auto(db, target, time_column=..., time_columns=db.time_columns)`.

A task becomes one table: its train, val and test rows in that order, numbered by a new
primary key column (`id`, or a free variant), with the entity column a foreign key to the
entity table. RelBench's splits are temporal (every train time is before every val time,
every val time before every test time), so relsql's time split with the fractions of the
split sizes (`RelbenchTask.model_options()`) trains, selects and tests on exactly RelBench's
rows; `evaluate` scores a model on RelBench's metrics, in the order of RelBench's tables.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import sqlglot.expressions as exp

from relsql import keyfile
from relsql import sql as q
from relsql.db import Database, free_name
from relsql.errors import RelsqlError, SchemaError

__all__ = ["RelbenchTask", "evaluate", "from_relbench", "metrics", "tasks", "time_columns"]

SPLITS = ("train", "val", "test")
ORIGIN = "the relbench Database"


@dataclass(frozen=True)
class RelbenchTask:
    """A RelBench task held as a table of `db`: rows `[0, rows["train"])` of its `key` column
    are RelBench's train split, the next `rows["val"]` its val split, then its test split."""

    table: str
    target: str  # the label column
    time_column: str | None
    task_type: str  # relbench's TaskType value ("binary_classification", "regression", ...); "" unknown
    entities: dict[str, str]  # foreign key column -> entity table
    rows: dict[str, int]  # per split, rows in the table
    labelled: dict[str, int]  # per split, rows with a label
    ordered: bool  # every labelled train time < every val time < every test time
    key: str = "id"
    hidden: tuple[tuple[str, str], ...] = ()  # (table, column) RelBench hides from this task
    train_std: float = float("nan")  # of the train labels (ddof=1), RelBench's NMAE scale

    @property
    def name(self) -> str:
        return f"{self.table}.{self.target}"

    def model_options(self) -> dict[str, Any]:
        """`relsql.Model(db, template, **task.model_options())`: target, time_column and split
        fractions that give exactly RelBench's train/val/test rows (checked: `split_positions`)."""
        if len(self.entities) != 1 or not self.target:
            raise RelsqlError(f"task `{self.table}` links {', '.join(self.entities)} (a recommendation task): relsql's "
                              "targets predict one value per row; train on an entity or autocomplete task")
        if self.time_column is None or not self.ordered:
            raise RelsqlError(f"task `{self.table}`: its train/val/test rows are not ordered by time, so relsql's time "
                              "split cannot reproduce them; check the task's timestamps")
        total = sum(self.labelled.values())
        if not total:
            raise RelsqlError(f"task `{self.table}` has no labelled rows in {self.target}")
        fractions = tuple(self.labelled[s] / total for s in SPLITS)
        return {"target": self.name, "time_column": self.time_column, "split": fractions}


@dataclass
class _Spec:
    """What a task's files or object say, before its table exists."""

    target: str
    time_column: str | None
    task_type: str
    entities: dict[str, str]
    hidden: tuple[tuple[str, str], ...] = ()
    frames: dict[str, pa.Table] = field(default_factory=dict)


def tasks(db: Database) -> dict[str, RelbenchTask]:
    """The RelBench tasks added to `db`, by table name."""
    return dict(getattr(db, "relbench_tasks", {}))


def time_columns(db: Database) -> dict[str, str]:
    """{table: time column} that RelBench declared for `db`'s tables (and its task tables)."""
    return dict(getattr(db, "time_columns", {}))


# -- a relbench Database ------------------------------------------------------------------------------------------
def from_relbench(database: Any, db: Database | None = None, *, tasks: Mapping[str, Any] | None = None) -> Database:
    """A relbench `Database`'s tables as new tables of `db` (default a new in-memory DuckDB),
    with their primary and foreign keys given to relsql's key layer and their time columns in
    `db.time_columns`; `tasks` ({table name: relbench task}) adds each task's train/val/test
    tables as one task table (see the module docstring). Existing names are refused before
    anything is written."""
    tables = _relbench_tables(database)
    specs = {name: _task_spec(name, task) for name, task in (tasks or {}).items()}
    if db is None:
        db = Database.in_memory()  # as relsql.connect() (which imports the connectors, and they this module)
    elif not isinstance(db, Database):
        raise SchemaError(f"db must be a relsql.Database (from relsql.connect(...)), got {type(db).__name__}")
    _refuse_taken(db, [*tables, *specs])
    pkeys = {name: table.pkey_col for name, table in tables.items()}
    given: list[tuple] = []
    for name, table in tables.items():
        data = _arrow(name, table, tables)
        db.write_table(name, data)
        if table.pkey_col:
            given.append(("PRIMARY KEY", name, [table.pkey_col]))
        given.extend(_foreign(name, table.fkey_col_to_pkey_table, pkeys))
        if table.time_col:
            _record_time(db, name, table.time_col)
    _give_keys(db, given)
    for name, spec in specs.items():
        write_task(db, name, spec)
    return db


def _relbench_tables(database: Any) -> dict[str, Any]:
    """`database.table_dict`, checked to look like relbench's tables."""
    table_dict = getattr(database, "table_dict", None)
    if not isinstance(table_dict, Mapping) or not table_dict:
        raise SchemaError(f"from_relbench takes a relbench Database (its table_dict of Tables), got {type(database).__name__}")
    for name, table in table_dict.items():
        missing = [a for a in ("df", "fkey_col_to_pkey_table", "pkey_col", "time_col") if not hasattr(table, a)]
        if not isinstance(name, str) or missing:
            raise SchemaError(f"relbench table {name!r} lacks {', '.join(missing) or 'a text name'}; pass relbench Tables")
        columns = list(table.df.columns)
        for column in [table.pkey_col, table.time_col, *table.fkey_col_to_pkey_table]:
            if column is not None and column not in columns:
                raise SchemaError(f"relbench table `{name}` names column `{column}`, which its frame lacks; columns: "
                                  f"{', '.join(map(str, columns))}")
        for column, parent in table.fkey_col_to_pkey_table.items():
            if parent not in table_dict:
                raise SchemaError(f"relbench table `{name}`: foreign key `{column}` refers to table `{parent}`, which the "
                                  f"Database lacks; tables: {', '.join(table_dict)}")
    return dict(table_dict)


def _refuse_taken(db: Database, names: list[str]) -> None:
    taken = {t.casefold() for t in db.tables()}
    clash = [n for n in names if n.casefold() in taken]
    if clash:
        raise SchemaError(f"{db.description} already has table(s) {', '.join(clash)}; relsql adds RelBench's tables as new "
                          "tables only: pass another database (or none, for a new in-memory one)")
    if len({n.casefold() for n in names}) != len(names):
        raise SchemaError(f"table names {', '.join(names)} differ only in case; rename the tasks")


def _arrow(name: str, table: Any, tables: Mapping[str, Any]) -> pa.Table:
    """The frame as Arrow; a foreign key column pandas made float (NaN for a missing parent)
    becomes integers with NULLs when the parent's key is an integer."""
    data = pa.Table.from_pandas(table.df, preserve_index=False)
    for column, parent in table.fkey_col_to_pkey_table.items():
        key = tables[parent].pkey_col
        if key is None:
            continue
        parent_type = pa.Table.from_pandas(tables[parent].df[[key]], preserve_index=False).schema.field(key).type
        index = data.schema.get_field_index(column)
        values = data.column(index)
        if pa.types.is_floating(values.type) and pa.types.is_integer(parent_type):
            numbers = values.to_numpy(zero_copy_only=False)
            present = ~np.isnan(numbers)
            if np.array_equal(numbers[present], np.round(numbers[present])):
                data = data.set_column(index, column, pc.cast(values, parent_type))
    return data


def _foreign(table: str, fkeys: Mapping[str, str], pkeys: Mapping[str, str | None]) -> list[tuple]:
    """Given foreign keys of `table` to each referenced table's primary key; a parent without
    one links nothing (relsql needs a key to join on), which is said."""
    found = []
    for column, parent in fkeys.items():
        if not pkeys.get(parent):
            raise SchemaError(f"`{table}`.{column} refers to `{parent}`, which has no primary key; give `{parent}` a pkey_col")
        found.append(("FOREIGN KEY", table, [column], parent, [pkeys[parent]]))
    return found


def _give_keys(db: Database, entries: list[tuple]) -> None:
    """Add keys to the ones `db` was given (connect(keys=...)), checked against its tables now."""
    if not entries:
        return
    given = keyfile.from_tuples(entries)
    with db.frozen_schema():
        columns = {table: [c for c, _ in db.columns(table)] for table in db.tables()}
    given = keyfile.resolve(keyfile.GivenKeys(ORIGIN, given.keys, given.unit), columns)
    before = db.given_keys
    if before is not None:
        origin = before.origin if before.origin.endswith(ORIGIN) else f"{before.origin} and {ORIGIN}"
        given = keyfile.GivenKeys(origin, [*before.keys, *given.keys], before.unit)
    db.given_keys = given


def _record_time(db: Database, table: str, column: str) -> None:
    db.time_columns = {**getattr(db, "time_columns", {}), table: column}


# -- tasks ---------------------------------------------------------------------------------------------------------
def _value(attribute: Any) -> str:
    """An enum's value (relbench's TaskType) or the text itself."""
    return str(getattr(attribute, "value", attribute) or "")


def _task_spec(name: str, task: Any) -> _Spec:
    """Read a relbench task object's three tables and what they mean."""
    if not isinstance(name, str) or not hasattr(task, "get_table"):
        raise SchemaError(f"tasks must map table names to relbench tasks (with get_table), got {name!r}: {type(task).__name__}")
    frames = {}
    for split in SPLITS:
        table = task.get_table(split, mask_input_cols=False)
        frames[split] = pa.Table.from_pandas(table.df, preserve_index=False)
    if hasattr(task, "src_entity_col"):
        entities = {task.src_entity_col: task.src_entity_table, task.dst_entity_col: task.dst_entity_table}
        target = ""
    else:
        entities, target = {task.entity_col: task.entity_table}, task.target_col
    hidden = tuple(tuple(pair) for pair in getattr(task, "remove_columns", ()) or ())
    return _Spec(target, getattr(task, "time_col", None), _value(getattr(task, "task_type", "")), entities, hidden, frames)


def write_task(db: Database, name: str, spec: _Spec) -> RelbenchTask:
    """One task table from the split frames (train, val, test rows in order, numbered by a new
    key column), written as a new table of `db`, with its keys and time column recorded."""
    frames = [spec.frames[s] for s in SPLITS if s in spec.frames]
    data = pa.concat_tables(frames, promote_options="default")  # a masked test table lacks the label: NULLs
    key = free_name("id", {c.casefold() for c in data.column_names})
    data = data.add_column(0, key, pa.array(np.arange(data.num_rows, dtype=np.int64)))
    db.write_table(name, data, kind="task")
    pkeys = {**_primary_keys(db), name: key}
    _give_keys(db, [("PRIMARY KEY", name, [key]), *_foreign(name, spec.entities, pkeys)])
    rows = {s: spec.frames[s].num_rows if s in spec.frames else 0 for s in SPLITS}
    return register_task(db, name, spec, key, rows)


def register_task(db: Database, name: str, spec: _Spec, key: str, rows: dict[str, int]) -> RelbenchTask:
    """Record a task table whose keys `db` knows: its time column and split summary."""
    if spec.time_column:
        _record_time(db, name, spec.time_column)
    labelled, ordered, std = _summary(db, name, key, spec.target, spec.time_column, rows)
    task = RelbenchTask(name, spec.target, spec.time_column, spec.task_type, dict(spec.entities), rows, labelled,
                        ordered, key, spec.hidden, std)
    db.relbench_tasks = {**getattr(db, "relbench_tasks", {}), name: task}
    return task


def _primary_keys(db: Database) -> dict[str, str]:
    """Single-column primary keys known to `db`'s given keys (RelBench's are single columns)."""
    given = db.given_keys
    return {k.table: k.columns[0] for k in (given.primary if given else []) if len(k.columns) == 1}


def _split_of(key: str, rows: dict[str, int]) -> exp.Expression:
    """0, 1, 2 for the train, val, test rows of a task table, from its key's ranges."""
    return exp.Case(ifs=[exp.If(this=exp.LT(this=q.col(key), expression=q.integer(rows["train"])), true=q.integer(0)),
                         exp.If(this=exp.LT(this=q.col(key), expression=q.integer(rows["train"] + rows["val"])),
                                true=q.integer(1))],
                    default=q.integer(2))


def _summary(db: Database, table: str, key: str, target: str, time: str | None,
             rows: dict[str, int]) -> tuple[dict[str, int], bool, float]:
    """Labelled rows per split, whether labelled times order the splits, and the train labels' std."""
    labelled = {s: 0 for s in SPLITS}
    if not target:
        return labelled, False, float("nan")
    split = _split_of(key, rows)
    when = q.col(time) if time else exp.Null()
    query = (exp.select(exp.alias_(split, "s"), exp.Count(this=q.col(target)),
                        exp.Min(this=when), exp.Max(this=when))
             .from_(exp.Table(this=q.ident(table))).where(exp.Not(this=exp.Is(this=q.col(target), expression=exp.Null())))
             .group_by(split).order_by(exp.column("s")))
    found = db.arrow(query).to_pylist()
    ranges = []
    for row in found:
        values = list(row.values())
        labelled[SPLITS[values[0]]] = values[1]
        ranges.append((values[2], values[3]))
    ordered = time is not None and all(a[1] is not None and b[0] is not None and a[1] < b[0] for a, b in zip(ranges, ranges[1:]))
    std = float("nan")
    if labelled["train"] > 1:
        train = (exp.select(exp.func("stddev_samp", exp.cast(q.col(target), "DOUBLE"))).from_(exp.Table(this=q.ident(table)))
                 .where(exp.LT(this=q.col(key), expression=q.integer(rows["train"]))))
        try:
            value = db.arrow(train).column(0)[0].as_py()
            std = float(value) if value is not None else std
        except Exception:  # a label that is not a number (a class name) has no std  # noqa: BLE001
            pass
    return labelled, ordered, std


# -- RelBench's metrics ------------------------------------------------------------------------------------------
def average_precision(y: np.ndarray, score: np.ndarray) -> float:
    """Mean precision at each positive, ranked by score (ties: all rows of a tied score count
    at once, as scikit-learn's step function does)."""
    positives = int((y == 1).sum())
    if positives == 0:
        return float("nan")
    order = np.argsort(-score, kind="stable")
    sorted_score, hits = score[order], (y[order] == 1).astype(np.float64)
    last = np.r_[np.flatnonzero(np.diff(sorted_score)), len(score) - 1]  # end of each run of tied scores
    true_pos = np.cumsum(hits)[last]
    seen = last + 1
    recall_steps = np.diff(np.r_[0.0, true_pos]) / positives
    return float((recall_steps * true_pos / seen).sum())


def r2(y: np.ndarray, predicted: np.ndarray) -> float:
    """Coefficient of determination (1 - residual / total sum of squares)."""
    total = float(((y - y.mean()) ** 2).sum()) if len(y) else 0.0
    if total == 0:
        return float("nan")
    return 1.0 - float(((y - predicted) ** 2).sum()) / total


def metrics(task_type: str, y: np.ndarray, prediction: np.ndarray, score: np.ndarray | None = None,
            train_std: float = float("nan")) -> dict[str, float]:
    """RelBench's metrics for a task type: binary classification roc_auc, average_precision,
    accuracy and f1 (`score`: the positive class's probability; `prediction`: 0/1); regression
    mae, rmse, r2 and nmae (MAE over the train labels' std, RelBench 3's metric); multi-class
    accuracy and macro f1."""
    from relsql.train import metrics as m

    y, prediction = np.asarray(y, dtype=np.float64), np.asarray(prediction, dtype=np.float64)
    if task_type == "binary_classification":
        score = np.asarray(score if score is not None else prediction, dtype=np.float64)
        return {"roc_auc": m.roc_auc(y, score), "average_precision": average_precision(y, score),
                "accuracy": m.accuracy(y, prediction), "f1": m.f1(y, prediction)}
    if task_type == "regression":
        mae = m.mae(y, prediction)
        return {"mae": mae, "rmse": m.rmse(y, prediction), "r2": r2(y, prediction), "nmae": mae / train_std}
    if task_type == "multiclass_classification":
        classes = int(max(y.max(initial=0), prediction.max(initial=0))) + 1
        return {"accuracy": m.accuracy(y, prediction), "f1": m.f1(y, prediction, classes)}
    raise RelsqlError(f"no RelBench metrics for task type {task_type!r}; RelBench scores binary_classification, "
                      "regression and multiclass_classification entity tasks")


def evaluate(model: Any, task: RelbenchTask | str, split: str = "test") -> dict[str, float]:
    """`model`'s predictions for `split`'s labelled rows of a RelBench task, in RelBench's row
    order, scored with RelBench's metrics (`metrics`)."""
    if isinstance(task, str):
        known = tasks(model.db)
        if task not in known:
            raise RelsqlError(f"no RelBench task `{task}` in {model.db.description}; tasks: {', '.join(known) or 'none'}")
        task = known[task]
    if split not in SPLITS:
        raise RelsqlError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    start = sum(task.rows[s] for s in SPLITS[:SPLITS.index(split)])
    frame = model.predict()
    if task.key not in frame.columns:
        raise RelsqlError(f"the model's output is not keyed by `{task.table}`.{task.key}; train it with "
                          f"target={task.name!r} and an output relation keyed by {task.key}")
    rows = (exp.select(q.col(task.key), q.col(task.target)).from_(exp.Table(this=q.ident(task.table)))
            .where(exp.and_(exp.GTE(this=q.col(task.key), expression=q.integer(start)),
                            exp.LT(this=q.col(task.key), expression=q.integer(start + task.rows[split])),
                            exp.Not(this=exp.Is(this=q.col(task.target), expression=exp.Null()))))
            .order_by(q.col(task.key)))
    labels = model.db.arrow(rows)
    by_key = dict(zip(frame[task.key].to_list(), range(frame.height)))
    missing = [k for k in labels.column(0).to_pylist() if k not in by_key]
    if missing:
        raise RelsqlError(f"the model predicts no row for {len(missing)} of {split}'s rows of `{task.table}` "
                          f"(e.g. {task.key} {missing[0]})")
    index = [by_key[k] for k in labels.column(0).to_pylist()]
    kind = task.task_type or {"binary": "binary_classification", "regression": "regression",
                              "multiclass": "multiclass_classification"}[model.learner.task.kind]
    y = labels.column(1).to_numpy(zero_copy_only=False)
    prediction = frame["prediction"].to_numpy()[index]
    score = None
    if kind == "binary_classification":
        classes = model.learner.task.classes
        positive = frame["probability"].to_numpy()[index]
        score = positive if classes[-1] in (1, True) else 1 - positive
        y = np.asarray([1.0 if v in (1, True) else 0.0 for v in y.tolist()])
        prediction = np.asarray([1.0 if v in (1, True) else 0.0 for v in prediction.tolist()])
    elif kind == "multiclass_classification":
        codes = {v: i for i, v in enumerate(model.learner.task.classes)}
        y = np.asarray([codes.get(v, -1) for v in y.tolist()], dtype=np.float64)
        prediction = np.asarray([codes.get(v, -1) for v in prediction.tolist()], dtype=np.float64)
    return metrics(kind, y, prediction, score, task.train_std)
