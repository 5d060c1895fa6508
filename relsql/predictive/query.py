"""A predictive query and the task table it writes: the question as data (see the package docstring)."""

from __future__ import annotations

import datetime as dt
import math
import numbers
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import sqlglot.expressions as exp

from relsql import arguments
from relsql.db import Database, check_table_name
from relsql.errors import RelsqlError, SchemaError
from relsql.predictive.parse import parse_fields
from relsql.predictive.plan import TaskPlan, summary, write_native
from relsql.predictive.terms import (
    MAX_SNAPSHOTS,
    MAX_WINDOW_DAYS,
    OPS,
    POPULATIONS,
    TASK_COLUMNS,
    QueryError,
    TaskTable,
    TimePath,
    as_datetime,
    date_text,
    names,
    text_name,
    when,
)

_NATIVE = ("duckdb", "duckdb-file")  # sources where a primary (and foreign) key can be declared


@dataclass(frozen=True)
class PredictiveQuery:
    """"For each `entity` at each snapshot: the COUNT (or SUM of `value`) of its `events` in the
    next `window_days`" — compared with `threshold` by `op` for a boolean label, or as a number.

    Names default from the catalog: `key` is the entity's primary key (declared, else inferred),
    `event_key` the events' foreign key to it (declared, else inferred, else the columns named like
    `key`), `event_time` the events' one DATE/TIMESTAMP column; a column name, or a `TimePath`
    (or its 4-tuple) to read it through a dimension table. Snapshots: a list of dates, or
    `every_days` stepping back from the last snapshot whose window the data covers (`end`) to the
    first after the first event (`start`). `population`: "active" (an event before the snapshot),
    "all", or "since" (`since`, a creation date column of the entity, before the snapshot).
    """

    entity: str
    events: str
    window_days: int
    aggregate: str = "count"
    value: str | None = None
    op: str | None = None
    threshold: int | float = 0
    key: tuple[str, ...] | None = None
    event_key: tuple[str, ...] | None = None
    event_time: str | TimePath | None = None
    snapshots: tuple[dt.date, ...] | None = None
    every_days: int | None = None
    start: dt.date | None = None
    end: dt.date | None = None
    population: str = "active"
    since: str | None = None

    def __post_init__(self) -> None:
        put = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731 (frozen)
        arguments.text("entity", self.entity)
        arguments.text("events", self.events)
        put("window_days", arguments.integer("window_days", self.window_days, maximum=MAX_WINDOW_DAYS))
        arguments.choice("aggregate", self.aggregate, ("count", "sum"))
        if (self.aggregate == "sum") != (self.value is not None):
            raise RelsqlError("value (the column to sum) goes with aggregate='sum', and only with it; "
                              f"got aggregate={self.aggregate!r}, value={self.value!r}")
        arguments.text("value", self.value, optional=True)
        arguments.choice("op", self.op, (None, *OPS, "<>"))
        if self.op == "<>":
            put("op", "!=")
        if isinstance(self.threshold, bool) or not isinstance(self.threshold, numbers.Real) \
                or not math.isfinite(self.threshold):
            raise RelsqlError(f"threshold must be a finite number, got {self.threshold!r}")
        put("key", names(self.key, "key"))
        put("event_key", names(self.event_key, "event_key"))
        if self.key and self.event_key and len(self.key) != len(self.event_key):
            raise RelsqlError(f"key {self.key} and event_key {self.event_key} must have as many columns")
        if isinstance(self.event_time, tuple | list) and len(self.event_time) == 4:
            put("event_time", TimePath(*self.event_time))
        if self.event_time is not None and not (isinstance(self.event_time, str) and self.event_time) and not (
                isinstance(self.event_time, TimePath) and all(isinstance(v, str) and v for v in vars(self.event_time).values())):
            raise RelsqlError("event_time must be a column of the events table, or a path (events' foreign key column, "
                              f"dimension table, dimension key, dimension date column), got {self.event_time!r}")
        if (self.snapshots is None) == (self.every_days is None):
            raise RelsqlError("give the snapshots either as a list of dates (snapshots=[...]) or as every_days=N, "
                              "exactly one of the two")
        if self.snapshots is not None:
            if isinstance(self.snapshots, str | dt.date) or not isinstance(self.snapshots, list | tuple) or not self.snapshots:
                raise RelsqlError(f"snapshots must be a non-empty list of dates, got {self.snapshots!r}")
            if len(self.snapshots) > MAX_SNAPSHOTS:
                raise RelsqlError(f"at most {MAX_SNAPSHOTS} snapshots, got {len(self.snapshots)}")
            found = [when(v, f"snapshots[{i}]") for i, v in enumerate(self.snapshots)]
            unique = {as_datetime(d): d for d in found}  # 2020-01-01 as a date and as midnight are one snapshot
            put("snapshots", tuple(unique[k] for k in sorted(unique)))
            if self.start is not None or self.end is not None:
                raise RelsqlError("start and end bound every_days snapshots; with a list of snapshots leave them out")
        else:
            put("every_days", arguments.integer("every_days", self.every_days, maximum=MAX_WINDOW_DAYS))
            for name in ("start", "end"):
                if getattr(self, name) is not None:
                    put(name, when(getattr(self, name), name))
        if self.since is not None:
            arguments.text("since", self.since)
            if self.population == "active":
                put("population", "since")
        arguments.choice("population", self.population, POPULATIONS)
        if (self.population == "since") != (self.since is not None):
            raise RelsqlError("population='since' needs since=<the entity's creation date column>, and since= goes "
                              f"with no other population; got population={self.population!r}, since={self.since!r}")

    # -- the text form ------------------------------------------------------------------------
    @classmethod
    def parse(cls, text: str) -> PredictiveQuery:
        """The query written in one line; see `parse`."""
        return parse(text)

    def __str__(self) -> str:
        """The query in the text form (`parse(str(q)) == q`)."""
        what = f"COUNT({text_name(self.events)}.*)" if self.aggregate == "count" else f"SUM({text_name(self.events)}.{text_name(self.value)})"
        out = [what, f"OVER {self.window_days} DAYS"]
        if self.op is not None:
            out.append(f"{self.op} {self.threshold!r}")
        entity = text_name(self.entity)
        if self.key is not None:
            if len(self.key) > 1 or (self.event_key is not None and len(self.event_key) > 1):
                raise RelsqlError("a composite key has no text form; use the Python API")
            entity += f".{text_name(self.key[0])}"
            if self.event_key is not None:
                entity += f" = {text_name(self.events)}.{text_name(self.event_key[0])}"
        elif self.event_key is not None:
            raise RelsqlError("the text form names event_key only together with key (FOR t.key = events.fk)")
        out.append(f"FOR {entity}")
        out.append(f"SINCE {text_name(self.entity)}.{text_name(self.since)}" if self.since else self.population.upper())
        if isinstance(self.event_time, TimePath):
            p = self.event_time
            out.append(f"TIME {text_name(p.table)}.{text_name(p.date)} VIA {text_name(self.events)}.{text_name(p.column)} = "
                       f"{text_name(p.table)}.{text_name(p.key)}")
        elif self.event_time is not None:
            out.append(f"TIME {text_name(self.events)}.{text_name(self.event_time)}")
        if self.snapshots is not None:
            out.append("AT " + ", ".join(date_text(d) for d in self.snapshots))
        else:
            out.append(f"AT EVERY {self.every_days} DAYS")
            if self.start is not None:
                out.append(f"FROM {date_text(self.start)}")
            if self.end is not None:
                out.append(f"TO {date_text(self.end)}")
        return " ".join(out)

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
        if foreign_key and not native:
            raise SchemaError(f"foreign_key=True declares a DuckDB constraint; {db.description} is a {db.source.kind} source: "
                              "leave foreign_key off (Template.auto infers the link from the column's name)")
        if native:
            _write_marked(db, plan, name, replace, query, foreign_key)
            counted = db.arrow(summary(name, plan.label_type)).to_pylist()[0]
            rows, labelled, positives = counted["rows"], counted["labelled"], counted["positives"]
        else:
            data = db.arrow(query)
            db.write_table(name, data, replace=replace, kind="task")
            label = data.column("label")
            rows, labelled = data.num_rows, label.length() - label.null_count
            positives = int(pc.sum(pc.cast(label, pa.int64())).as_py() or 0) if plan.label_type == "BOOLEAN" else None
        time_columns = {} if plan.path else {plan.events: plan.time}
        return TaskTable(name, int(rows), int(labelled or 0), None if plan.label_type != "BOOLEAN" else int(positives or 0),
                         tuple(plan.snapshot_values), tuple(plan.key), plan.label_type, time_columns)


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
