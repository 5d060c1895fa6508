"""RelBench in relsql: a relbench `Database` as DuckDB tables with its keys and time columns,
RelBench tasks as target tables trained on RelBench's own split, and RelBench's metrics.

Duck-typed: relsql never imports relbench. A relbench `Database` is anything with a
`table_dict` of tables that have `df` (pandas), `pkey_col`, `fkey_col_to_pkey_table` and
`time_col`; a task is anything with `get_table(split, mask_input_cols=False)` and the
attributes of relbench's EntityTask (`entity_col`, `entity_table`, `target_col`, `time_col`,
`task_type`). A RelBench dataset folder opened with `relsql.connect(folder)` gets the same
(relsql/connectors/relbench.py).

Keys become given keys of relsql's key layer (`Database.given_keys`, as `connect(keys=...)`
gives them), so they hold for any source and nothing is declared in the user's tables. Time
columns are kept in `db.time_columns` ({table: column}): pass them to
`Template.auto(db, target, time_column=..., time_columns=db.time_columns)`.

A task becomes one table: its train, val and test rows in that order, numbered by a new
primary key column (`id`, or a free variant), with the entity column a foreign key to the
entity table. A recommendation (link) task's destination column, a list of the destination
table's keys, is its target: given as a foreign key over a list, which the key layer keeps out of
joins and a ranking target ranks (`recommendations`, `evaluate`: RelBench's MAP@eval_k). Task
tables are named alike on both routes (`table_name`: `customer-churn` -> `customer_churn`).

RelBench's splits are temporal (every train time is before every val time, every val time
before every test time), so relsql's time split with the fractions of the
split sizes (`RelbenchTask.model_options()`) trains, selects and tests on exactly RelBench's
rows; `evaluate` scores a model on RelBench's metrics, in the order of RelBench's tables.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import sqlglot.expressions as exp

from relsql import sql as q
from relsql.data import keyfile
from relsql.data.duckdb import DuckDBDatabase, free_name
from relsql.data.engine import Database, first_line
from relsql.data.references import is_list
from relsql.errors import RelsqlError, SchemaError

__all__ = ["RelbenchTask", "evaluate", "from_relbench", "map_at_k", "metrics", "recommendations", "tasks", "time_columns"]

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
    eval_k: int | None = None  # a link task's k (RelBench's MAP@k); None: an entity task, or not known

    @property
    def name(self) -> str:
        return f"{self.table}.{self.target}"

    @property
    def link(self) -> bool:
        """A recommendation (link) task: its target is the destination column, a list of keys of
        the destination table, which relsql trains as a ranking target."""
        return bool(self.target) and self.target in self.entities

    def model_options(self) -> dict[str, Any]:
        """`relsql.Model(db, template, **task.model_options())`: target, time_column and split
        fractions that give exactly RelBench's train/val/test rows (checked: `split_positions`).
        A link task's target is its destination list: a ranking target (docs/recommendation.md)."""
        if not self.target:
            raise RelsqlError(f"task `{self.table}` names no target column (it links {', '.join(self.entities)}); "
                              "give the task its target_col, or for a link task its dst_entity_col")
        if self.time_column is None or not self.ordered:
            raise RelsqlError(f"task `{self.table}`: its train/val/test rows are not ordered by time, so relsql's time "
                              "split cannot reproduce them; check the task's timestamps")
        total = sum(self.labelled.values())
        if not total:
            raise RelsqlError(f"task `{self.table}` has no labelled rows in {self.target}")
        fractions = tuple(self.labelled[s] / total for s in SPLITS)
        return {"target": self.name, "time_column": self.time_column, "split": fractions}


@dataclass
class TaskSpec:
    """What a task's files or object say, before its table exists."""

    target: str
    time_column: str | None
    task_type: str
    entities: dict[str, str]
    hidden: tuple[tuple[str, str], ...] = ()
    frames: dict[str, pa.Table] = field(default_factory=dict)
    eval_k: int | None = None  # a link task's k


def tasks(db: Database) -> dict[str, RelbenchTask]:
    """The RelBench tasks added to `db`, by table name."""
    return dict(getattr(db, "relbench_tasks", {}))


def time_columns(db: Database) -> dict[str, str]:
    """{table: time column} that RelBench declared for `db`'s tables (and its task tables)."""
    return dict(getattr(db, "time_columns", {}))


# -- a relbench Database ------------------------------------------------------------------------------------------
def from_relbench(database: Any, db: Database | None = None, *,
                  tasks: Mapping[str, Any] | list[Any] | None = None) -> Database:
    """A relbench `Database`'s tables as new tables of `db` (default a new in-memory DuckDB),
    with their primary and foreign keys given to relsql's key layer and their time columns in
    `db.time_columns`; `tasks` ({name: relbench task}, or a list of tasks relbench loaded, named
    by their `name`) adds each task's train/val/test tables as one task table (see the module
    docstring), named by `table_name` as a dataset folder's are. Everything is read and checked (frames
    converted, names and types checked) before anything is written, and existing names are
    refused first."""
    tables = _relbench_tables(database)
    named = _named_tasks(tasks)
    specs = {name: _task_spec(name, task, tables) for name, task in named.items()}
    if db is None:
        db = DuckDBDatabase.in_memory()  # as relsql.connect() (which imports the connectors, and they this module)
    elif not isinstance(db, Database):
        raise SchemaError(f"db must be a relsql.Database (from relsql.connect(...)), got {type(db).__name__}")
    _refuse_taken(db, [*tables, *specs])
    data = {name: _arrow(name, table, tables) for name, table in tables.items()}
    frames = {name: _task_frame(name, spec) for name, spec in specs.items()}
    pkeys = {name: table.pkey_col for name, table in tables.items()}
    given: list[tuple] = []
    for name, table in tables.items():
        db.write_table(name, data[name])
        if table.pkey_col:
            given.append(("PRIMARY KEY", name, [table.pkey_col]))
        given.extend(_foreign(name, table.fkey_col_to_pkey_table, pkeys))
        if table.time_col:
            _record_time(db, name, table.time_col)
    _give_keys(db, given)
    for name, spec in specs.items():
        write_task(db, name, spec, frames[name])
    return db


def table_name(task_name: str) -> str:
    """The task table's name for a RelBench task name, the same through both routes: a dataset
    folder's `tasks/customer-churn` and `from_relbench(..., tasks={"customer-churn": task})` both
    give `customer_churn` (a name SQL needs no quotes for), so a model trained on one loads on the other."""
    return re.sub(r"\W", "_", task_name)


def _named_tasks(tasks: Any) -> dict[str, Any]:
    """{table name: task}: a mapping's names, or for a list of relbench's loaded tasks their own
    `name`s (relbench.load gives each one), each as `table_name` writes it."""
    if tasks is None:
        return {}
    if isinstance(tasks, Mapping):
        pairs = list(tasks.items())
    elif isinstance(tasks, list | tuple):
        nameless = [type(t).__name__ for t in tasks if not isinstance(getattr(t, "name", None), str) or not t.name]
        if nameless:
            raise SchemaError(f"tasks is a list, and its {nameless[0]} has no `name` to call its table: pass a mapping, "
                              f"tasks={{'my_task': task}}")
        pairs = [(t.name, t) for t in tasks]
    else:
        raise SchemaError(f"tasks must map table names to relbench tasks ({{name: task}}), got {type(tasks).__name__}")
    found: dict[str, Any] = {}
    for name, task in pairs:
        if not isinstance(name, str) or not name:
            raise SchemaError(f"tasks must map table names to relbench tasks (with get_table), got {name!r}: "
                              f"{type(task).__name__}")
        table = table_name(name)
        if table in found:
            raise SchemaError(f"tasks `{name}` and another both become table `{table}`; give them distinct names")
        found[table] = task
    return found


def _is_frame(value: Any) -> bool:
    """A pandas DataFrame (relbench's `Table.df`), without importing pandas: if it is not loaded,
    nothing is a DataFrame."""
    pandas = sys.modules.get("pandas")
    return pandas is not None and isinstance(value, pandas.DataFrame)


def _frame_columns(frame: Any, where: str) -> list[str]:
    """A DataFrame's column names, checked: distinct text (they become SQL identifiers)."""
    if not _is_frame(frame):
        raise SchemaError(f"{where}: `df` must be a pandas DataFrame, got {type(frame).__name__}; pass relbench Tables")
    columns = list(frame.columns)
    odd = [c for c in columns if not isinstance(c, str) or not c]
    if odd:
        raise SchemaError(f"{where}: column names must be text, got {odd[0]!r}; rename them "
                          "(df.columns = [str(c) for c in df.columns])")
    if len(set(columns)) != len(columns):
        twice = sorted({c for c in columns if columns.count(c) > 1})
        raise SchemaError(f"{where}: column(s) {', '.join(twice)} appear twice; rename them")
    return columns


def _optional_name(value: Any, where: str) -> str | None:
    if value is None or (isinstance(value, str) and value):
        return value
    raise SchemaError(f"{where} must be a column or table name (text) or None, got {type(value).__name__} "
                      f"{str(value)[:60]!r}")


def _relbench_tables(database: Any) -> dict[str, Any]:
    """`database.table_dict`, checked to look like relbench's tables: frames, names and keys."""
    table_dict = getattr(database, "table_dict", None)
    if not isinstance(table_dict, Mapping) or not table_dict:
        raise SchemaError(f"from_relbench takes a relbench Database (its table_dict of Tables), got {type(database).__name__}")
    for name, table in table_dict.items():
        missing = [a for a in ("df", "fkey_col_to_pkey_table", "pkey_col", "time_col") if not hasattr(table, a)]
        if not isinstance(name, str) or not name or missing:
            raise SchemaError(f"relbench table {name!r} lacks {', '.join(missing) or 'a text name'}; pass relbench Tables")
        where = f"relbench table `{name}`"
        columns = _frame_columns(table.df, where)
        fkeys = table.fkey_col_to_pkey_table
        if not isinstance(fkeys, Mapping):
            raise SchemaError(f"{where}: fkey_col_to_pkey_table must map columns to tables, got {type(fkeys).__name__}")
        for column, parent in fkeys.items():
            _optional_name(column, f"{where}: a foreign key column")
            _optional_name(parent, f"{where}: foreign key `{column}`'s table")
        for attribute in ("pkey_col", "time_col"):
            _optional_name(getattr(table, attribute), f"{where}: {attribute}")
        for column in [table.pkey_col, table.time_col, *fkeys]:
            if column is not None and column not in columns:
                raise SchemaError(f"relbench table `{name}` names column `{column}`, which its frame lacks; columns: "
                                  f"{', '.join(map(str, columns))}")
        for column, parent in fkeys.items():
            if parent not in table_dict:
                raise SchemaError(f"relbench table `{name}`: foreign key `{column}` refers to table `{parent}`, which the "
                                  f"Database lacks; tables: {', '.join(table_dict)}")
    return dict(table_dict)


def _from_pandas(frame: Any, where: str) -> pa.Table:
    """A DataFrame as Arrow; a column Arrow cannot type (mixed values, Python objects) is named."""
    try:
        return pa.Table.from_pandas(frame, preserve_index=False)
    except (pa.ArrowException, ValueError, TypeError) as err:
        bad = next((c for c in frame.columns if not _converts(frame[[c]])), None)
        column = f"column `{bad}`" if bad is not None else "a column"
        raise SchemaError(f"{where}: {column} holds values of no one type Arrow can store ({first_line(err)[:200]}); "
                          f"convert it to one type first, e.g. df[{bad!r}] = df[{bad!r}].astype(str)") from None


def _converts(frame: Any) -> bool:
    try:
        pa.Table.from_pandas(frame, preserve_index=False)
        return True
    except (pa.ArrowException, ValueError, TypeError):
        return False


def _refuse_taken(db: Database, names: list[str]) -> None:
    taken = {t.casefold() for t in db.tables()}
    clash = [n for n in names if n.casefold() in taken]
    if clash:
        raise SchemaError(f"{db.description} already has table(s) {', '.join(clash)}; relsql adds RelBench's tables as new "
                          "tables only: pass another database (or none, for a new in-memory one)")
    if len({n.casefold() for n in names}) != len(names):
        twice = sorted({n for n in names if [m.casefold() for m in names].count(n.casefold()) > 1})
        raise SchemaError(f"table name(s) {', '.join(twice)} are used twice (names are compared ignoring case): "
                          "a task needs a name of its own; rename the tasks")


def _arrow(name: str, table: Any, tables: Mapping[str, Any]) -> pa.Table:
    """The frame as Arrow; a foreign key column pandas made float (NaN for a missing parent)
    becomes integers with NULLs when the parent's key is an integer."""
    data = _from_pandas(table.df, f"relbench table `{name}`")
    for column, parent in table.fkey_col_to_pkey_table.items():
        key = tables[parent].pkey_col
        if key is None:
            continue
        parent_type = _from_pandas(tables[parent].df[[key]], f"relbench table `{parent}`").schema.field(key).type
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


def _task_spec(name: str, task: Any, tables: Mapping[str, Any]) -> TaskSpec:
    """Read a relbench task object's three tables and what they mean, each checked: the task is
    the user's object, and what it returns or raises is named, not passed through."""
    if not isinstance(name, str) or not name or not hasattr(task, "get_table"):
        raise SchemaError(f"tasks must map table names to relbench tasks (with get_table), got {name!r}: {type(task).__name__}")
    where = f"task `{name}`"
    recommendation = hasattr(task, "src_entity_col")
    wanted = (("src_entity_col", "src_entity_table", "dst_entity_col", "dst_entity_table") if recommendation
              else ("entity_col", "entity_table", "target_col"))
    missing = [a for a in wanted if not isinstance(getattr(task, a, None), str) or not getattr(task, a)]
    if missing:
        raise SchemaError(f"{where} needs {', '.join(wanted)} as names (text); {', '.join(missing)} "
                          f"{'is' if len(missing) == 1 else 'are'} missing or not text: pass a relbench task")
    time = _optional_name(getattr(task, "time_col", None), f"{where}: time_col")
    eval_k = None
    if recommendation:
        entities = {task.src_entity_col: task.src_entity_table, task.dst_entity_col: task.dst_entity_table}
        target = task.dst_entity_col  # a list of the destination table's keys: a ranking target
        eval_k = eval_k_of(getattr(task, "eval_k", None), where)
    else:
        entities, target = {task.entity_col: task.entity_table}, task.target_col
    for table in entities.values():
        if table not in tables:
            raise SchemaError(f"{where}: its entity table `{table}` is not a table of the relbench Database "
                              f"({', '.join(tables)})")
    hidden = getattr(task, "remove_columns", ()) or ()
    try:
        hidden = tuple((t, c) for t, c in hidden)
    except (TypeError, ValueError):
        hidden = None
    if hidden is None or not all(isinstance(x, str) for pair in hidden for x in pair):
        raise SchemaError(f"{where}: remove_columns must list (table, column) pairs of names")
    frames = {}
    for split in SPLITS:
        try:
            table = task.get_table(split, mask_input_cols=False)
        except Exception as err:  # the user's code: whatever it raises is named, with the task  # noqa: BLE001
            raise SchemaError(f"{where}: get_table({split!r}) raised {type(err).__name__}: {first_line(err)[:200]}; "
                              "fix the task (relsql reads its train, val and test tables)") from None
        part = f"{where}: get_table({split!r})"
        if not hasattr(table, "df"):
            raise SchemaError(f"{part} returned {type(table).__name__}, not a relbench Table (with a `df` DataFrame)")
        columns = _frame_columns(table.df, part)
        for column in [*entities, *([time] if time else []), *([target] if target else [])]:
            if column not in columns:
                raise SchemaError(f"{part} has no column `{column}`, which the task names; columns: {', '.join(columns)}")
        frames[split] = _from_pandas(table.df, part)
    return TaskSpec(target, time, _value(getattr(task, "task_type", "")), entities, hidden, frames, eval_k)


def eval_k_of(value: Any, where: str) -> int | None:
    """A link task's eval_k: a positive integer, or None (unknown: evaluate then needs k=)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise SchemaError(f"{where}: eval_k must be a positive integer, got {value!r}")
    return int(value)


def _task_frame(name: str, spec: TaskSpec) -> pa.Table:
    """The split frames as one table (train, val, test rows in order), numbered by a new key column
    (the first); splits whose columns cannot be merged are named."""
    frames = [spec.frames[s] for s in SPLITS if s in spec.frames]
    try:
        data = pa.concat_tables(frames, promote_options="default")  # a masked test table lacks the label: NULLs
    except (pa.ArrowException, ValueError, TypeError) as err:
        raise SchemaError(f"task `{name}`: its train, val and test tables hold different types in one column "
                          f"({first_line(err)[:200]}); give each column one type in every split") from None
    key = free_name("id", {c.casefold() for c in data.column_names})
    return data.add_column(0, key, pa.array(np.arange(data.num_rows, dtype=np.int64)))


def write_task(db: Database, name: str, spec: TaskSpec, data: pa.Table | None = None) -> RelbenchTask:
    """One task table from the split frames (`_task_frame`, made here unless given), written as a
    new table of `db`, with its keys and time column recorded."""
    data = _task_frame(name, spec) if data is None else data
    key = data.column_names[0]
    db.write_table(name, data, kind="task")
    pkeys = {**_primary_keys(db), name: key}
    _give_keys(db, [("PRIMARY KEY", name, [key]), *_foreign(name, spec.entities, pkeys)])
    rows = {s: spec.frames[s].num_rows if s in spec.frames else 0 for s in SPLITS}
    return register_task(db, name, spec, key, rows)


def register_task(db: Database, name: str, spec: TaskSpec, key: str, rows: dict[str, int]) -> RelbenchTask:
    """Record a task table whose keys `db` knows: its time column and split summary."""
    if spec.time_column:
        _record_time(db, name, spec.time_column)
    labelled, ordered, std = _summary(db, name, key, spec.target, spec.time_column, rows)
    task = RelbenchTask(name, spec.target, spec.time_column, spec.task_type, dict(spec.entities), rows, labelled,
                        ordered, key, spec.hidden, std, spec.eval_k)
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
    has_label = exp.Not(this=exp.Is(this=q.col(target), expression=exp.Null()))
    listed = is_list(dict(db.columns(table)).get(target, ""))
    if listed:  # a link task's row with an empty list has nothing to rank (RelBench drops such rows)
        has_label = exp.and_(has_label, exp.GT(this=exp.func("len", q.col(target)), expression=q.integer(0)))
    query = (exp.select(exp.alias_(split, "s"), exp.Count(this=exp.Star()),
                        exp.Min(this=when), exp.Max(this=when))
             .from_(exp.Table(this=q.ident(table))).where(has_label)
             .group_by(split).order_by(exp.column("s")))
    found = db.arrow(query).to_pylist()
    ranges = []
    for row in found:
        values = list(row.values())
        labelled[SPLITS[values[0]]] = values[1]
        ranges.append((values[2], values[3]))
    ordered = time is not None and all(a[1] is not None and b[0] is not None and a[1] < b[0] for a, b in zip(ranges, ranges[1:]))
    std = float("nan")
    if labelled["train"] > 1 and not listed:
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
    from relsql.train.task import metrics as m

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


def refuse_pairs_as_keys(db: Database, table: str, keys: object) -> None:
    """A RelBench task table's rows are numbered (its key, e.g. `id`), so `keys` of (entity, time)
    pairs name no row of it: say how such pairs become rows (the template reads them from the table)."""
    task = getattr(db, "relbench_tasks", {}).get(table)
    if task is None or keys is None:
        return
    columns = keys.keys() if isinstance(keys, dict) else getattr(keys, "columns", getattr(keys, "column_names", ()))
    given = {str(c) for c in columns}
    if task.key in given or not given & {*task.entities, task.time_column}:
        return
    verb = "recommend" if task.link else "predict"
    raise RelsqlError(f"keys: rows of the RelBench task table `{task.table}` are chosen by its key `{task.key}` "
                      f"(its train, val and test rows numbered 0..{sum(task.rows.values()) - 1}), not by "
                      f"{', '.join(sorted(given))}. To {verb} for (entity, time) pairs of your own, make them rows "
                      f"of the task: save the model, add the pairs to `{task.table}` with new {task.key}s and a NULL "
                      f"{task.target} in a database you can write (relsql.from_relbench gives an in-memory one; a "
                      f"dataset folder is read-only), then relsql.Model.load(path, db).{verb}("
                      f"where=\"{task.target} IS NULL\")")


def _task_of(model: Any, task: Any, verb: str) -> RelbenchTask:
    """`task` as relsql's RelbenchTask: itself, or the task table it names in `model.db`. A relbench
    task object is refused, naming the relsql task that holds its rows."""
    db = getattr(model, "db", None)
    if not isinstance(db, Database) or not hasattr(model, "learner"):
        raise RelsqlError(f"{verb} takes a relsql.Model (trained or Model.load-ed), got {type(model).__name__}")
    known = tasks(db)
    if isinstance(task, RelbenchTask):
        return task
    if isinstance(task, str):
        if task not in known:
            raise RelsqlError(f"no RelBench task `{task}` in {db.description}; tasks: {', '.join(known) or 'none'}")
        return known[task]
    if hasattr(task, "get_table"):  # relbench's own task object: its rows are one of relsql's task tables
        same = [n for n, t in known.items() if _matches(t, task)]
        named = f"relsql.relbench.tasks(db)[{same[0]!r}] (or the name {same[0]!r})" if len(same) == 1 else \
            f"relsql.relbench.tasks(db)[name] (or the name) for one of: {', '.join(known) or 'none'}"
        raise RelsqlError(f"{verb} takes relsql's task (the task table from_relbench or a dataset folder made), not "
                          f"relbench's {type(task).__name__} object: pass {named}")
    raise RelsqlError(f"{verb}: task must be a task of relsql.relbench.tasks(db) or its name, got {type(task).__name__}")


def _matches(ours: RelbenchTask, theirs: Any) -> bool:
    """Whether relbench's task object names the same columns and tables as relsql's task."""
    if hasattr(theirs, "src_entity_col"):
        entities = {getattr(theirs, "src_entity_col", None): getattr(theirs, "src_entity_table", None),
                    getattr(theirs, "dst_entity_col", None): getattr(theirs, "dst_entity_table", None)}
        target = getattr(theirs, "dst_entity_col", None)
    else:
        entities = {getattr(theirs, "entity_col", None): getattr(theirs, "entity_table", None)}
        target = getattr(theirs, "target_col", None)
    return ours.entities == entities and ours.target == target and ours.time_column == getattr(theirs, "time_col", None)


def _split_range(task: RelbenchTask, split: str) -> tuple[int, int]:
    """[start, end) of the split's rows in the task table's key."""
    if split not in SPLITS:
        raise RelsqlError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    start = sum(task.rows[s] for s in SPLITS[:SPLITS.index(split)])
    return start, start + task.rows[split]


def recommendations(model: Any, task: RelbenchTask | str, split: str = "test", k: int | None = None) -> np.ndarray:
    """A link task's predictions as RelBench takes them: an [n, k] array of destination keys, one
    row per row of `split`'s table in RelBench's order, best first (`task.evaluate(array, table)`
    of relbench scores it). `k`: the task's eval_k unless given. Fewer candidates than k leave
    -1 in the last places (never a destination)."""
    task = _task_of(model, task, "recommendations")
    if not task.link:
        raise RelsqlError(f"task `{task.table}` predicts one value per row ({task.target}): use evaluate() or "
                          "model.predict()")
    k = _k_of(task, k)
    start, end = _split_range(task, split)
    if model.learner.answers != "recommend":
        raise RelsqlError(f"the model predicts {model.target}, not the task's links `{task.name}`: train it with "
                          f"**relsql.relbench.tasks(db)[{task.table!r}].model_options()")
    keys = {task.key: list(range(start, end))}
    frame = model.recommend(k, keys=keys)
    if model.target != task.name:
        raise RelsqlError(f"the model ranks {model.target}, not the task's target {task.name}")
    n = end - start
    width = frame.height // n if n else 0
    order = frame[task.key].to_numpy().reshape(n, width) if width else np.arange(start, end)[:, None]
    if width and not (order == np.arange(start, end)[:, None]).all():
        raise RelsqlError(f"the model's recommendations for `{task.table}` are not one block per row; retrain it")
    picked = frame[task.target].to_numpy().reshape(n, width) if width else np.zeros((n, 0), dtype=np.int64)
    if width < k:
        pad = np.full((n, k - width), -1, dtype=picked.dtype if picked.dtype.kind in "iu" else object)
        picked = np.concatenate([picked.astype(pad.dtype), pad], axis=1)
    return picked


def _k_of(task: RelbenchTask, k: int | None) -> int:
    if k is None:
        k = task.eval_k
    if k is None:
        raise RelsqlError(f"task `{task.table}` does not say its eval_k (a dataset folder without manifests): pass k=, "
                          "RelBench's eval_k for the task")
    if isinstance(k, bool) or not isinstance(k, int | np.integer) or k < 1:
        raise RelsqlError(f"k must be a positive integer, got {k!r}")
    return int(k)


def map_at_k(predicted: np.ndarray, truth: list[list[Any]]) -> float:
    """RelBench's MAP@k over rows with a non-empty truth: per row the precision at each hit,
    summed, over min(k, |truth|)."""
    k = predicted.shape[1]
    total, rows = 0.0, 0
    for guess, true in zip(predicted, truth):
        if not len(true):
            continue
        hit = np.isin(np.asarray(guess), np.asarray(true)).astype(np.float64)
        total += float((np.cumsum(hit) / np.arange(1, k + 1) * hit).sum() / min(k, len(true)))
        rows += 1
    return total / rows if rows else float("nan")


def evaluate(model: Any, task: RelbenchTask | str, split: str = "test", k: int | None = None) -> dict[str, float]:
    """`model`'s predictions for `split`'s labelled rows of a RelBench task, in RelBench's row
    order, scored with RelBench's metrics (`metrics`). A link task: RelBench's `map` (MAP@k, k
    its eval_k unless given) of `recommendations`, as relbench's task.evaluate computes it."""
    task = _task_of(model, task, "evaluate")
    start, end = _split_range(task, split)
    if task.link:
        predicted = recommendations(model, task, split, k)
        rows = (exp.select(q.col(task.target)).from_(exp.Table(this=q.ident(task.table)))
                .where(exp.and_(exp.GTE(this=q.col(task.key), expression=q.integer(start)),
                                exp.LT(this=q.col(task.key), expression=q.integer(end))))
                .order_by(q.col(task.key)))
        truth = model.db.arrow(rows).column(0).to_pylist()
        if any(t is None for t in truth):
            raise RelsqlError(f"{sum(t is None for t in truth)} of {split}'s rows of `{task.table}` have no "
                              f"{task.target} (a masked split): RelBench scores it with the labels")
        return {"map": map_at_k(predicted, truth)}
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
