"""A predictive query and the task table it writes: the question as data (see the package docstring)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import sqlglot.expressions as exp

from relsql.data.engine import Database, check_table_name
from relsql.errors import RelsqlError, SchemaError
from relsql.predictive.parse import parse_fields
from relsql.predictive.plan import TaskPlan, summary, write_native
from relsql.predictive.terms import (
    MAX_SNAPSHOTS,
    TASK_COLUMNS,
    QueryError,
    Question,
    TaskTable,
    TimePath,
)

_NATIVE = ("duckdb", "duckdb-file")  # sources where a primary (and foreign) key can be declared
_NO_LISTS = ("sqlite",)  # sources that cannot store a LIST_DISTINCT task table's list column


class PredictiveQuery(Question):
    """"For each `entity` at each snapshot: the COUNT (or SUM of `value`) of its `events` in the
    next `window_days`" — compared with `threshold` by `op` for a boolean label, or as a number;
    or with aggregate="list_distinct" the sorted distinct keys `value` of those events (a ranking
    target, see the package docstring), `k` (RANK TOP k) the ranking's cut-off.

    Names default from the catalog: `key` is the entity's primary key (declared, else inferred),
    `event_key` the events' foreign key to it (declared, else inferred, else the columns named like
    `key`), `event_time` the events' one DATE/TIMESTAMP column; a column name, or a `TimePath`
    (or its 4-tuple) to read it through a dimension table. Snapshots: a list of dates, or
    `every_days` stepping back from the last snapshot whose window the data covers (`end`) to the
    first after the first event (`start`). `population`: "active" (an event before the snapshot),
    "all", or "since" (`since`, a creation date column of the entity, before the snapshot).
    """

    @classmethod
    def parse(cls, text: str) -> PredictiveQuery:
        """The query written in one line; see `parse`."""
        return parse(text)

    # -- the database --------------------------------------------------------------------------
    def sql(self, db: Database) -> str:
        """The SELECT that computes the task table's rows, as DuckDB SQL (to read, not to run)."""
        return TaskPlan(db, self).select().sql("duckdb", pretty=True)

    def write(self, db: Database, name: str, *, replace: bool = False, foreign_key: bool = False) -> TaskTable:
        """Write the task table `name` as a NEW table (an existing one only with `replace=True`,
        never one the query reads), atomically. In DuckDB `task_id` is declared the primary key;
        `foreign_key=True` also declares the entity key a foreign key to the entity table (which
        then cannot be dropped or have referenced rows deleted while the task table exists, so it
        is off by default: `Template.auto` infers the link from the column's name)."""
        if not isinstance(db, Database):
            raise RelsqlError(f"db must be a relsql.Database (from relsql.connect(...)), got {type(db).__name__}")
        check_table_name(name)
        plan = TaskPlan(db, self)
        reads = {plan.entity.casefold(), plan.events.casefold()} | ({plan.path.table.casefold()} if plan.path else set())
        if name.casefold() in reads:
            raise SchemaError(f"cannot write the task table as `{name}`: the query reads that table; choose another name")
        db.replaceable(name, replace, "task")  # early: before the query runs (checked again as it writes)
        db.source.refuse_read_only(name)
        query = plan.select()
        native = db.source.kind in _NATIVE
        if plan.listed and db.source.kind in _NO_LISTS:
            raise SchemaError(f"LIST_DISTINCT writes a list column, and {db.description} (a {db.source.kind} source) has no list "
                              "type (it would store the list as text); write the task table to a DuckDB file or a folder of "
                              "Parquet files holding the same tables")
        if foreign_key and not native:
            raise SchemaError(f"foreign_key=True declares a DuckDB constraint; {db.description} is a {db.source.kind} source: "
                              "leave foreign_key off (Template.auto infers the link from the column's name)")
        if native:
            _write_marked(db, plan, name, replace, query, foreign_key)
            counted = db.arrow(summary(name, plan.label_type, plan.target)).to_pylist()[0]
            rows, labelled, positives = counted["rows"], counted["labelled"], counted["positives"]
        else:
            data = db.arrow(query)
            db.write_table(name, data, replace=replace, kind="task")
            label = data.column(plan.target)
            rows, labelled = data.num_rows, label.length() - label.null_count
            positives = int(pc.sum(pc.cast(label, pa.int64())).as_py() or 0) if plan.label_type == "BOOLEAN" else None
        time_columns = {} if plan.path else {plan.events: plan.time}
        return TaskTable(name, int(rows), int(labelled or 0), None if plan.label_type != "BOOLEAN" else int(positives or 0),
                         tuple(plan.snapshot_values), tuple(plan.key), plan.label_type, time_columns,
                         target=plan.target, k=self.k, references=plan.references)


def _write_marked(db: Database, plan, name: str, replace: bool, query: exp.Select, foreign_key: bool) -> None:
    """DuckDB's task table (with its keys, relsql/predictive/plan.py), written as relsql's task
    table: the table it replaces is checked, and the new one marked, in the write's transaction."""
    with db.writing(name, "task", replace) as existing:
        write_native(db, plan, name, existing, query, foreign_key)


def parse(text: str) -> PredictiveQuery:
    """A `PredictiveQuery` from its one-line text form (grammar: `GRAMMAR`), parsed without eval.

    `COUNT(orders.*) OVER 30 DAYS > 0 FOR customer AT EVERY 30 DAYS` asks, for each customer active
    before each snapshot, whether it orders in the 30 days from the snapshot. An error names the
    position (1-based) and the fix.
    """
    fields_ = parse_fields(text)
    try:
        return PredictiveQuery(**fields_)
    except RelsqlError as err:
        raise QueryError(f"predictive query: {err}") from None


__all__ = ["MAX_SNAPSHOTS", "TASK_COLUMNS", "PredictiveQuery", "QueryError", "TaskTable", "TimePath", "parse"]
