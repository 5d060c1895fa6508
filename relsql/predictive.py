"""Predictive queries: a training task's labels from a one-line question, not hand-written SQL.

A model learns from a table of labelled examples; on a warehouse those examples are usually
"for each customer at a date, did X happen in the next N days" (RelBench's tasks, Kumo's
predictive queries). Writing that SQL by hand is where time leaks in: a label window that
overlaps the inputs, entities that did not exist yet, a window that runs past the data. This
module writes the TASK TABLE from a small question instead:

    COUNT(orders.*) OVER 30 DAYS > 0 FOR customer AT EVERY 30 DAYS

or in Python `PredictiveQuery(entity="customer", events="orders", window_days=30, op=">",
threshold=0, every_days=30).write(db, "task_churn")`. The table has one row per (entity,
snapshot):

- `task_id` BIGINT, the primary key (declared in DuckDB): one column, so the table is a target
  `Model` and `Template.auto` accept; the natural key (entity key, snapshot) is not one column.
- the entity's key column(s), named as in the entity table, so an automatic template finds the
  foreign key to the entity (inferred from the name; `foreign_key=True` declares it in DuckDB).
- `snapshot` (DATE, or TIMESTAMP when the events' time is a TIMESTAMP): the prediction time;
  pass it as `time_column` so that only rows earlier than it feed the prediction.
- `label`: BOOLEAN for a comparison (`> 0`), else DOUBLE (the count or sum, a regression
  target; DOUBLE so that relsql detects regression rather than classes of small counts).

Time safety. The label aggregates the events with snapshot <= time < snapshot + window. The
window is half-open on that side because relsql's templates (and `Template.auto` with
`time_column`) join a row only if its time is *strictly earlier* than the snapshot: every event
is then either an input or part of a label, never both and never neither (with a window
(snapshot, snapshot + N] an event stamped on the snapshot's day would be invisible to both).
Only entities that exist at the snapshot get a row: by default those with an event before it
(`ACTIVE`), or every entity row (`ALL`), or those whose creation column is before it (`SINCE
customer.created_at`). A window that ends after the data's last event time is not fully
observed: its label is NULL, which `Model` treats as a row to predict, not to learn from.

Every statement is a sqlglot AST: names are quoted identifiers resolved against the catalog,
numbers typed literals, dates literals printed from validated `date`/`datetime` values; no text
a user wrote reaches SQL.
"""

from __future__ import annotations

import datetime as dt
import math
import numbers
import re
from dataclasses import dataclass, field
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import sqlglot.expressions as exp

from relsql import arguments
from relsql.catalog import Catalog
from relsql.db import Database, check_table_name, first_line
from relsql.errors import RelsqlError, SchemaError, SourceError
from relsql.ground.query import integer, real

__all__ = ["PredictiveQuery", "QueryError", "TaskTable", "TimePath", "parse"]

OPS = {">": exp.GT, ">=": exp.GTE, "<": exp.LT, "<=": exp.LTE, "=": exp.EQ, "!=": exp.NEQ}
POPULATIONS = ("active", "all", "since")
TASK_COLUMNS = ("task_id", "snapshot", "label")
MAX_WINDOW_DAYS = 100_000
MAX_SNAPSHOTS = 10_000
_NATIVE = ("duckdb", "duckdb-file")  # sources where a primary (and foreign) key can be declared
_P = "__relsql_task_"  # CTE and column names of the generated query: never a user's name


class QueryError(RelsqlError):
    """A predictive query's text that cannot be parsed; `position` is the 0-based offset."""

    def __init__(self, message: str, position: int | None = None):
        super().__init__(message)
        self.position = position


@dataclass(frozen=True)
class TimePath:
    """The events' time read through a dimension table, as in star schemas (TPC-DS: store_sales.
    ss_sold_date_sk -> date_dim.d_date_sk, time date_dim.d_date): events.`column` = `table`.`key`,
    and the time is `table`.`date`."""

    column: str
    table: str
    key: str
    date: str


@dataclass(frozen=True)
class TaskTable:
    """What `PredictiveQuery.write` wrote."""

    name: str
    rows: int
    labelled: int  # rows with a label (the others' windows run past the data)
    positives: int | None  # rows whose label is true (None for a numeric label)
    snapshots: tuple[Any, ...]
    key: tuple[str, ...]  # the entity key columns, as named in the task table
    label_type: str  # BOOLEAN or DOUBLE
    time_columns: dict[str, str] = field(default_factory=dict)  # what an auto-template should filter by

    def __str__(self) -> str:
        positive = f", {self.positives:,} positive" if self.positives is not None else ""
        unlabelled = self.rows - self.labelled
        open_windows = f", {unlabelled:,} unlabelled (windows past the data's last event)" if unlabelled else ""
        span = f"{self.snapshots[0]} .. {self.snapshots[-1]}" if len(self.snapshots) > 1 else f"{self.snapshots[0]}"
        return (f"wrote {self.name}: {self.rows:,} rows{positive}{open_windows}; {len(self.snapshots)} "
                f"snapshot{'s' if len(self.snapshots) != 1 else ''} {span}")


def _when(value: object, what: str) -> dt.date:
    """A date or datetime from a value or ISO text ('2020-01-31', '2020-01-31T12:00')."""
    if isinstance(value, dt.date):
        return value
    if isinstance(value, str):
        try:
            return dt.datetime.fromisoformat(value) if re.search(r"[T ]\d", value) else dt.date.fromisoformat(value)
        except ValueError:
            pass
    raise RelsqlError(f"{what} must be a date (datetime.date, or text such as '2020-01-31' or '2020-01-31T12:00'), "
                      f"got {value!r}")


def _names(value: object, what: str, optional: bool = True) -> tuple[str, ...] | None:
    if value is None and optional:
        return None
    found = (value,) if isinstance(value, str) else tuple(value) if isinstance(value, list | tuple) else None
    if not found or not all(isinstance(v, str) and v for v in found):
        raise RelsqlError(f"{what} must be a column name or a list of column names, got {value!r}")
    return found


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
        put("key", _names(self.key, "key"))
        put("event_key", _names(self.event_key, "event_key"))
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
            found = [_when(v, f"snapshots[{i}]") for i, v in enumerate(self.snapshots)]
            unique = {_as_datetime(d): d for d in found}  # 2020-01-01 as a date and as midnight are one snapshot
            put("snapshots", tuple(unique[k] for k in sorted(unique)))
            if self.start is not None or self.end is not None:
                raise RelsqlError("start and end bound every_days snapshots; with a list of snapshots leave them out")
        else:
            put("every_days", arguments.integer("every_days", self.every_days, maximum=MAX_WINDOW_DAYS))
            for name in ("start", "end"):
                if getattr(self, name) is not None:
                    put(name, _when(getattr(self, name), name))
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
        what = f"COUNT({_name(self.events)}.*)" if self.aggregate == "count" else f"SUM({_name(self.events)}.{_name(self.value)})"
        out = [what, f"OVER {self.window_days} DAYS"]
        if self.op is not None:
            out.append(f"{self.op} {self.threshold!r}")
        entity = _name(self.entity)
        if self.key is not None:
            if len(self.key) > 1 or (self.event_key is not None and len(self.event_key) > 1):
                raise RelsqlError("a composite key has no text form; use the Python API")
            entity += f".{_name(self.key[0])}"
            if self.event_key is not None:
                entity += f" = {_name(self.events)}.{_name(self.event_key[0])}"
        elif self.event_key is not None:
            raise RelsqlError("the text form names event_key only together with key (FOR t.key = events.fk)")
        out.append(f"FOR {entity}")
        out.append(f"SINCE {_name(self.entity)}.{_name(self.since)}" if self.since else self.population.upper())
        if isinstance(self.event_time, TimePath):
            p = self.event_time
            out.append(f"TIME {_name(p.table)}.{_name(p.date)} VIA {_name(self.events)}.{_name(p.column)} = "
                       f"{_name(p.table)}.{_name(p.key)}")
        elif self.event_time is not None:
            out.append(f"TIME {_name(self.events)}.{_name(self.event_time)}")
        if self.snapshots is not None:
            out.append("AT " + ", ".join(_date_text(d) for d in self.snapshots))
        else:
            out.append(f"AT EVERY {self.every_days} DAYS")
            if self.start is not None:
                out.append(f"FROM {_date_text(self.start)}")
            if self.end is not None:
                out.append(f"TO {_date_text(self.end)}")
        return " ".join(out)

    # -- the database --------------------------------------------------------------------------
    def sql(self, db: Database) -> str:
        """The SELECT that computes the task table's rows, as DuckDB SQL (to read, not to run)."""
        return _Plan(db, self).select().sql("duckdb", pretty=True)

    def write(self, db: Database, name: str, *, replace: bool = False, foreign_key: bool = False) -> TaskTable:
        """Write the task table `name` as a NEW table (an existing one only with `replace=True`,
        never one the query reads), atomically. In DuckDB `task_id` is declared the primary key;
        `foreign_key=True` also declares the entity key a foreign key to the entity table (which
        then cannot be dropped or have referenced rows deleted while the task table exists, so it
        is off by default: `Template.auto` infers the link from the column's name)."""
        if not isinstance(db, Database):
            raise RelsqlError(f"db must be a relsql.Database (from relsql.connect(...)), got {type(db).__name__}")
        check_table_name(name)
        plan = _Plan(db, self)
        reads = {plan.entity.casefold(), plan.events.casefold()} | ({plan.path.table.casefold()} if plan.path else set())
        if name.casefold() in reads:
            raise SchemaError(f"cannot write the task table as `{name}`: the query reads that table; choose another name")
        existing = next((t for t in plan.catalog.names if t.casefold() == name.casefold()), None)
        if existing is not None and not replace:
            raise SchemaError(f"table `{existing}` already exists in {db.description}; choose another name or pass "
                              "replace=True (relsql task: --replace) to replace it")
        db.source.refuse_read_only(name)
        query = plan.select()
        native = db.source.kind in _NATIVE
        if foreign_key and not native:
            raise SchemaError(f"foreign_key=True declares a DuckDB constraint; {db.description} is a {db.source.kind} source: "
                              "leave foreign_key off (Template.auto infers the link from the column's name)")
        if native:
            _write_native(db, plan, name, existing, query, foreign_key)
            counted = db.arrow(_summary(name, plan.label_type)).to_pylist()[0]
            rows, labelled, positives = counted["rows"], counted["labelled"], counted["positives"]
        else:
            data = db.arrow(query)
            db.write_table(name, data, replace=replace)
            label = data.column("label")
            rows, labelled = data.num_rows, label.length() - label.null_count
            positives = int(pc.sum(pc.cast(label, pa.int64())).as_py() or 0) if plan.label_type == "BOOLEAN" else None
        time_columns = {} if plan.path else {plan.events: plan.time}
        return TaskTable(name, int(rows), int(labelled or 0), None if plan.label_type != "BOOLEAN" else int(positives or 0),
                         tuple(plan.snapshot_values), tuple(plan.key), plan.label_type, time_columns)


# -- resolving names and computing the query -------------------------------------------------------------------
def _as_datetime(value: dt.date) -> dt.datetime:
    return value if isinstance(value, dt.datetime) else dt.datetime.combine(value, dt.time())


def _time_kind(sql_type: str, where: str) -> str | None:
    upper = sql_type.upper()
    if upper == "DATE":
        return "DATE"
    if upper.startswith("TIMESTAMP"):
        if "TIME ZONE" in upper or upper == "TIMESTAMPTZ":
            raise SchemaError(f"{where} is a {sql_type}: a snapshot date is ambiguous across time zones; expose it as a "
                              "TIMESTAMP (a view casting it in the zone you mean) and use that")
        return "TIMESTAMP"
    return None


def _date_literal(value: dt.date, kind: str) -> exp.Expression:
    """A DATE or TIMESTAMP literal printed from a validated date/datetime value (never user text)."""
    text = value.isoformat(sep=" ") if isinstance(value, dt.datetime) else value.isoformat()
    return exp.cast(exp.Literal.string(text), exp.DataType.build(kind))


def _id(name: str) -> exp.Identifier:
    return exp.to_identifier(name, quoted=True)


def _col(name: str, table: str | None = None) -> exp.Column:
    return exp.Column(this=_id(name), table=_id(table) if table else None)


def _table(name: str, alias: str | None = None) -> exp.Expression:
    table = exp.Table(this=_id(name))
    return exp.alias_(table, _id(alias), table=True) if alias else table


class _Plan:
    """A query resolved against one database's catalog: real table and column names, key and time
    columns, the snapshots' values."""

    def __init__(self, db: Database, query: PredictiveQuery):
        self.db, self.q = db, query
        self.catalog: Catalog = db.catalog()
        self._schema = None
        self.entity = self.table(query.entity, "entity")
        self.events = self.table(query.events, "events")
        self.key = self.entity_key()
        self.event_key = self.events_key()
        for column in self.key:
            if column.casefold() in TASK_COLUMNS:
                raise SchemaError(f"entity key column `{self.entity}.{column}` is named like a column the task table adds "
                                  f"({', '.join(TASK_COLUMNS)}); expose the entity through a view that renames it")
        self.path: TimePath | None = None
        self.time, self.kind = self.event_time()
        self.value = self.column(self.events, query.value, "value") if query.value else None
        if self.value and not any(t in self.type(self.events, self.value) for t in ("INT", "DECIMAL", "NUMERIC", "DOUBLE", "FLOAT", "REAL")):
            raise SchemaError(f"SUM({self.events}.{self.value}): the column is {self.type(self.events, self.value)}, not a number; "
                              "sum a numeric column or use COUNT")
        self.since = self.column(self.entity, query.since, "since") if query.since else None
        if self.since and _time_kind(self.type(self.entity, self.since), f"{self.entity}.{self.since}") is None:
            raise SchemaError(f"SINCE {self.entity}.{self.since}: the column is {self.type(self.entity, self.since)}; it must be the "
                              "entity's creation DATE or TIMESTAMP")
        self.label_type = "BOOLEAN" if query.op is not None else "DOUBLE"
        self.first, self.last = self.span()
        self.snapshot_values = self.snapshots()

    # names
    def table(self, name: str, what: str) -> str:
        if name in self.catalog.tables:
            return name
        folded = [t for t in self.catalog.names if t.casefold() == name.casefold()]
        if len(folded) == 1:
            return folded[0]
        raise SchemaError(f"{what} table `{name}` does not exist in {self.db.description}; tables: "
                          f"{', '.join(self.catalog.names) or 'none'}")

    def column(self, table: str, name: str, what: str) -> str:
        names = self.catalog[table].column_names
        if name in names:
            return name
        folded = [c for c in names if c.casefold() == name.casefold()]
        if len(folded) == 1:
            return folded[0]
        raise SchemaError(f"{what}: table `{table}` has no column `{name}`; its columns: {', '.join(names)}")

    def type(self, table: str, column: str) -> str:
        return self.catalog[table].column(column).type

    def schema(self):
        """Declared keys plus inferred ones (the same inference `Template.auto` uses), computed once."""
        if self._schema is None:
            from relsql.template.keys import schema
            self._schema = schema(self.db, self.catalog, infer=True)
        return self._schema

    def entity_key(self) -> tuple[str, ...]:
        if self.q.key is not None:
            key = tuple(self.column(self.entity, k, "key") for k in self.q.key)
            if key != self.catalog[self.entity].primary_key:
                self.check_unique(key)
            return key
        key = self.catalog[self.entity].primary_key or self.schema().primary_keys.get(self.entity)
        if not key:
            raise SchemaError(f"entity table `{self.entity}` has no primary key (declared or inferable); name its key: "
                              f"key='...' (text form: FOR {_name(self.entity)}.<key column>)")
        return tuple(key)

    def check_unique(self, key: tuple[str, ...]) -> None:
        cols = [_col(k) for k in key]
        distinct = exp.select(*cols).distinct().from_(_table(self.entity)).where(
            exp.and_(*[exp.Not(this=exp.Is(this=c.copy(), expression=exp.Null())) for c in cols]))
        counted = exp.select(exp.Count(this=exp.Star())).from_(exp.alias_(exp.Subquery(this=distinct), _id("d"), table=True))
        n = self.db.arrow(counted).column(0)[0].as_py()
        if n != self.catalog[self.entity].rows:
            raise SchemaError(f"key ({', '.join(key)}) of `{self.entity}` is not unique and non-NULL ({n} distinct of "
                              f"{self.catalog[self.entity].rows} rows): each task row must be one entity; name the "
                              "entity's key")

    def events_key(self) -> tuple[str, ...]:
        if self.q.event_key is not None:
            found = tuple(self.column(self.events, k, "event_key") for k in self.q.event_key)
            if len(found) != len(self.key):
                raise SchemaError(f"event_key ({', '.join(found)}) and the entity key ({', '.join(self.key)}) must have as many columns")
            return found
        declared = [(self.events, fk) for fk in self.catalog[self.events].foreign_keys]
        for found in (declared, None):
            for child, fk in found if found is not None else self.schema().foreign_keys:
                if child == self.events and fk.table == self.entity and set(fk.references) == set(self.key):
                    order = dict(zip(fk.references, fk.columns))
                    return tuple(order[k] for k in self.key)
        names = self.catalog[self.events].column_names
        if all(k in names for k in self.key):
            return self.key
        raise SchemaError(f"no foreign key from `{self.events}` to `{self.entity}`({', '.join(self.key)}) is declared or "
                          f"inferable; name it: event_key='...' (text form: FOR {_name(self.entity)}.{_name(self.key[0])} = "
                          f"{_name(self.events)}.<column>)")

    def event_time(self) -> tuple[str, str]:
        given = self.q.event_time
        if isinstance(given, TimePath):
            dim = self.table(given.table, "TIME ... VIA: dimension")
            path = TimePath(self.column(self.events, given.column, "TIME ... VIA"), dim,
                            self.column(dim, given.key, "TIME ... VIA"), self.column(dim, given.date, "TIME"))
            kind = _time_kind(self.type(dim, path.date), f"{dim}.{path.date}")
            if kind is None:
                raise SchemaError(f"TIME {dim}.{path.date} is {self.type(dim, path.date)}; name a DATE or TIMESTAMP column")
            self.check_dimension(path)
            self.path = path
            return path.date, kind
        if given is not None:
            column = self.column(self.events, given, "event_time")
            kind = _time_kind(self.type(self.events, column), f"{self.events}.{column}")
            if kind is None:
                raise SchemaError(f"event_time {self.events}.{column} is {self.type(self.events, column)}; name a DATE or "
                                  "TIMESTAMP column (or a path through a dimension table)")
            return column, kind
        found = [(c.name, _time_kind(c.type, f"{self.events}.{c.name}")) for c in self.catalog[self.events].columns
                 if c.name not in self.event_key]
        found = [(c, k) for c, k in found if k]
        if len(found) == 1:
            return found[0]
        fix = ("name one: event_time='<column>' (text form: TIME <events>.<column>)" if found else
               "read it through a dimension table: event_time=(fk column, table, key, date column) (text form: "
               "TIME dim.date VIA events.fk = dim.key)")
        raise SchemaError(f"events table `{self.events}` has {len(found) or 'no'} DATE/TIMESTAMP column"
                          f"{'s' if len(found) != 1 else ''}{' (' + ', '.join(c for c, _ in found) + ')' if found else ''}; {fix}")

    def check_dimension(self, path: TimePath) -> None:
        """The dimension's key must be unique, or an event would be counted once per matching row."""
        key = _col(path.key)
        row = self.db.arrow(exp.select(exp.Count(this=key.copy()), exp.Count(this=exp.Distinct(expressions=[key.copy()])))
                            .from_(_table(path.table))).to_pylist()[0]
        values = list(row.values())
        if values[0] != values[1]:
            raise SchemaError(f"TIME ... VIA: `{path.table}.{path.key}` is not unique ({values[1]} distinct of {values[0]}), "
                              "so events would be counted once per matching row; name the dimension's key")

    # the query
    def events_rows(self) -> exp.Select:
        """One row per event with an entity key and a time: the key columns, `t`, and `v` for SUM."""
        e = "e"
        time = _col(self.time, "d") if self.path else _col(self.time, e)
        select = [exp.alias_(_col(k, e), _id(f"{_P}k{i}")) for i, k in enumerate(self.event_key)]
        select.append(exp.alias_(time.copy(), _id(f"{_P}t")))
        if self.value:
            select.append(exp.alias_(exp.cast(_col(self.value, e), exp.DataType.build("DOUBLE")), _id(f"{_P}v")))
        query = exp.select(*select).from_(_table(self.events, e))
        if self.path:
            query = query.join(_table(self.path.table, "d"),
                               on=exp.EQ(this=_col(self.path.column, e), expression=_col(self.path.key, "d")))
        present = [_col(k, e) for k in self.event_key] + [time]
        return query.where(exp.and_(*[exp.Not(this=exp.Is(this=c.copy(), expression=exp.Null())) for c in present]))

    def span(self) -> tuple[dt.date, dt.date]:
        t = _col(f"{_P}t")
        row = self.db.arrow(exp.select(exp.Min(this=t.copy()), exp.Max(this=t.copy())).from_(
            exp.alias_(exp.Subquery(this=self.events_rows()), _id("ev"), table=True))).to_pylist()[0]
        first, last = row.values()
        if first is None:
            raise SchemaError(f"events table `{self.events}` has no event with a {', '.join(self.event_key)} and a time; "
                              "there is nothing to count")
        return first, last

    def observed_until(self) -> dt.datetime:
        """Windows ending at or before this are fully covered by the data (events up to `last`)."""
        last = _as_datetime(self.last)
        return last + dt.timedelta(days=1) if self.kind == "DATE" else last

    def snapshots(self) -> list[dt.date]:
        q, window = self.q, dt.timedelta(days=self.q.window_days)
        if q.snapshots is not None:
            values = list(q.snapshots)
        else:
            last = (self.observed_until() - window).date()
            end = min(last, _day(q.end)) if q.end is not None else last
            start = _day(q.start) if q.start is not None else _as_datetime(self.first).date() + dt.timedelta(days=1)
            values, day = [], end
            while day >= start:
                values.append(day)
                if len(values) > MAX_SNAPSHOTS:
                    raise SchemaError(f"EVERY {q.every_days} DAYS gives more than {MAX_SNAPSHOTS} snapshots between "
                                      f"{start} and {end}; step by more days or bound them with FROM/TO")
                day -= dt.timedelta(days=q.every_days)
            values.reverse()
            if not values:
                raise SchemaError(f"no snapshot fits: the events run from {self.first} to {self.last}, and a {q.window_days}-day "
                                  f"window must end by {self.observed_until().date()} and start after the first event "
                                  f"(from {start}); shorten OVER, or give FROM/TO or a list of snapshots")
        if self.kind == "DATE":
            for v in values:
                if isinstance(v, dt.datetime) and v.time() != dt.time():
                    raise SchemaError(f"snapshot {v} has a time of day, but the events' time {self.time} is a DATE; "
                                      "give dates")
            return [v.date() if isinstance(v, dt.datetime) else v for v in values]
        return [_as_datetime(v) for v in values]

    def select(self) -> exp.Select:
        kind, window = self.kind, dt.timedelta(days=self.q.window_days)
        horizon = self.observed_until()
        rows = [exp.Tuple(expressions=[_date_literal(s, kind), _date_literal(_until(s, window), kind),
                                       exp.true() if _as_datetime(s) + window <= horizon else exp.false()])
                for s in self.snapshot_values]
        snaps_name, events_name, window_name, first_name = (f"{_P}{n}" for n in ("snapshots", "events", "window", "first"))
        s, until, observed = "snapshot", f"{_P}until", f"{_P}observed"
        values = exp.select(exp.Star()).from_(exp.Values(expressions=rows, alias=exp.TableAlias(
            this=_id("v"), columns=[_id(s), _id(until), _id(observed)])))
        keys = [f"{_P}k{i}" for i in range(len(self.key))]
        t = f"{_P}t"
        counted = exp.select(*[_col(k, "ev") for k in keys], _col(s, "s"),
                             exp.alias_(exp.Count(this=exp.Star()), _id(f"{_P}n")),
                             *([exp.alias_(exp.Sum(this=_col(f"{_P}v", "ev")), _id(f"{_P}sum"))] if self.value else []),
                             ).from_(_table(events_name, "ev")).join(
            _table(snaps_name, "s"), on=exp.and_(exp.GTE(this=_col(t, "ev"), expression=_col(s, "s")),
                                                 exp.LT(this=_col(t, "ev"), expression=_col(until, "s")))
        ).group_by(*[_col(k, "ev") for k in keys], _col(s, "s"))
        ctes = [(snaps_name, values), (events_name, self.events_rows()), (window_name, counted)]
        x = "x"
        measure = exp.Coalesce(this=_col(f"{_P}sum" if self.value else f"{_P}n", "w"), expressions=[integer(0)])
        if self.q.op is not None:
            number = self.q.threshold
            literal = integer(number) if isinstance(number, numbers.Integral) else real(number)
            label = OPS[self.q.op](this=measure, expression=literal)
        else:
            label = exp.cast(measure, exp.DataType.build("DOUBLE"))
        label = exp.Case(ifs=[exp.If(this=_col(observed, "s"), true=label)])
        order = [exp.Ordered(this=_col(s, "s")), *[exp.Ordered(this=_col(k, x)) for k in self.key]]
        task_id = exp.Window(this=exp.RowNumber(), order=exp.Order(expressions=order))
        query = exp.select(
            exp.alias_(exp.cast(task_id, exp.DataType.build("BIGINT")), _id("task_id")),
            *[exp.alias_(_col(k, x), _id(k)) for k in self.key],
            exp.alias_(_col(s, "s"), _id("snapshot")),
            exp.alias_(exp.cast(label, exp.DataType.build(self.label_type)), _id("label")),
        ).from_(_table(self.entity, x)).join(_table(snaps_name, "s"), join_type="cross")
        conditions = [exp.Not(this=exp.Is(this=_col(k, x), expression=exp.Null())) for k in self.key]
        if self.q.population == "active":  # an event strictly before the snapshot: the template can see it
            first = exp.select(*[_col(k) for k in keys], exp.alias_(exp.Min(this=_col(t)), _id(f"{_P}first"))).from_(
                _table(events_name)).group_by(*[_col(k) for k in keys])
            ctes.append((first_name, first))
            query = query.join(_table(first_name, "f"), on=exp.and_(
                *[exp.EQ(this=_col(k, "f"), expression=_col(c, x)) for k, c in zip(keys, self.key)],
                exp.LT(this=_col(f"{_P}first", "f"), expression=_col(s, "s"))))
        elif self.q.population == "since":
            conditions.append(exp.LT(this=_col(self.since, x), expression=_col(s, "s")))
        query = query.join(_table(window_name, "w"), join_type="left", on=exp.and_(
            *[exp.EQ(this=_col(k, "w"), expression=_col(c, x)) for k, c in zip(keys, self.key)],
            exp.EQ(this=_col(s, "w"), expression=_col(s, "s"))))
        query = query.where(exp.and_(*conditions))
        for name, body in ctes:
            query = query.with_(_id(name), as_=body)
        return query


def _day(value: dt.date) -> dt.date:
    return value.date() if isinstance(value, dt.datetime) else value


def _until(snapshot: dt.date, window: dt.timedelta) -> dt.date:
    return snapshot + window  # date + timedelta(days) stays a date, datetime stays a datetime


def _write_native(db: Database, plan: _Plan, name: str, existing: str | None, query: exp.Select, foreign_key: bool) -> None:
    """DuckDB: one transaction that drops a table being replaced, creates the task table with its
    primary key (and, if asked, the foreign key), and fills it from `query`."""
    target = exp.Table(this=_id(name))
    statements: list[exp.Expression] = []
    if existing is not None:
        statements.append(exp.Drop(tables=[exp.Table(this=_id(existing))], kind="TABLE"))
    if foreign_key:
        if tuple(plan.key) != tuple(plan.catalog[plan.entity].primary_key):
            raise SchemaError(f"foreign_key=True: DuckDB references only a declared primary key, and "
                              f"`{plan.entity}`({', '.join(plan.key)}) is not one; leave foreign_key off")
        snapshot_type = plan.kind
        columns = [exp.ColumnDef(this=_id("task_id"), kind=exp.DataType.build("BIGINT"),
                                 constraints=[exp.ColumnConstraint(kind=exp.PrimaryKeyColumnConstraint())])]
        for k in plan.key:
            try:
                kind = exp.DataType.build(plan.type(plan.entity, k), dialect="duckdb")
            except Exception:  # sqlglot cannot spell every DuckDB type
                raise SchemaError(f"foreign_key=True: cannot declare a column of type {plan.type(plan.entity, k)} "
                                  f"(`{plan.entity}.{k}`); leave foreign_key off") from None
            columns.append(exp.ColumnDef(this=_id(k), kind=kind, constraints=[exp.ColumnConstraint(kind=exp.NotNullColumnConstraint())]))
        columns += [exp.ColumnDef(this=_id("snapshot"), kind=exp.DataType.build(snapshot_type)),
                    exp.ColumnDef(this=_id("label"), kind=exp.DataType.build(plan.label_type))]
        reference = exp.ForeignKey(expressions=[_id(k) for k in plan.key], reference=exp.Reference(
            this=exp.Schema(this=exp.Table(this=_id(plan.entity)), expressions=[_id(k) for k in plan.key])))
        statements.append(exp.Create(this=exp.Schema(this=target.copy(), expressions=[*columns, reference]), kind="TABLE"))
        statements.append(exp.Insert(this=exp.Schema(this=target.copy(), expressions=[_id(c) for c in ("task_id", *plan.key, "snapshot", "label")]),
                                     expression=query))
    else:
        statements.append(exp.Create(this=target.copy(), kind="TABLE", expression=query))
        statements.append(exp.Alter(this=target.copy(), kind="TABLE", actions=[
            exp.AddConstraint(expressions=[exp.PrimaryKey(expressions=[_id("task_id")])])]))
    try:
        db.transaction(statements)
    except duckdb.Error as err:
        raise SourceError(f"could not write the task table `{name}` to {db.description} (nothing was written): "
                          f"{first_line(err)}") from None


def _summary(name: str, label_type: str) -> exp.Select:
    label = _col("label")
    positives = (exp.Sum(this=exp.Case(ifs=[exp.If(this=label.copy(), true=integer(1))], default=integer(0)))
                 if label_type == "BOOLEAN" else exp.Null())
    return exp.select(exp.alias_(exp.Count(this=exp.Star()), _id("rows")), exp.alias_(exp.Count(this=label.copy()), _id("labelled")),
                      exp.alias_(positives, _id("positives"))).from_(_table(name))


# -- the text form ---------------------------------------------------------------------------------------------
GRAMMAR = """\
query      := aggregate OVER <integer> DAYS [comparison] FOR [EACH] entity [population] [time] AT snapshots
aggregate  := COUNT(<events>.*) | SUM(<events>.<column>)
comparison := (> | >= | < | <= | = | != | <>) <number>         (absent: the label is the number itself)
entity     := <table> [.<key column> [= <events>.<foreign key column>]]
population := ACTIVE                 (default: entities with an event before the snapshot)
            | ALL                    (every entity row)
            | SINCE <table>.<column> (entities whose creation date is before the snapshot)
time       := TIME <events>.<column>                              (default: the events' one date column)
            | TIME <dim>.<date column> VIA <events>.<fk> = <dim>.<key>
snapshots  := <date> {, <date>} | EVERY <integer> DAYS [FROM <date>] [TO <date>]
<date>     := 2020-01-31 | 2020-01-31T12:00[:00] | '2020-01-31 12:00:00'
names: letters, digits, _ and $ (not first), or "double quoted" ("" for a quote); keywords in any case
the label aggregates the events with snapshot <= time < snapshot + N days; NULL if that runs past the last event"""

_TOKEN = re.compile(r"""
    (?P<space>\s+)
  | (?P<date>\d{4}-\d{2}-\d{2}(?:T\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?)?)
  | (?P<number>[+-]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?)
  | (?P<string>'(?:[^']|'')*')
  | (?P<quoted>"(?:[^"]|"")*")
  | (?P<word>[A-Za-z_][A-Za-z0-9_$]*)
  | (?P<op>>=|<=|!=|<>|[><=])
  | (?P<punct>[(),.*])
""", re.VERBOSE)
_KEYWORDS = {"COUNT", "SUM", "OVER", "DAY", "DAYS", "FOR", "EACH", "ACTIVE", "ALL", "SINCE", "TIME", "VIA", "AT",
             "EVERY", "FROM", "TO"}


@dataclass
class _Token:
    kind: str  # date number string quoted word op punct end
    text: str
    at: int

    @property
    def word(self) -> str:
        return self.text.upper() if self.kind == "word" else ""


def _tokens(text: str) -> list[_Token]:
    out, at = [], 0
    while at < len(text):
        m = _TOKEN.match(text, at)
        if m is None:
            raise _error(text, at, f"unexpected character {text[at]!r}", "names are letters, digits and _ (or \"quoted\"); "
                         "see the grammar in relsql/predictive.py")
        if m.lastgroup == "quoted" and m.group() == '""':
            raise _error(text, at, "an empty quoted name", "write the name between the quotes")
        if m.lastgroup != "space":
            out.append(_Token(m.lastgroup, m.group(), at))
        at = m.end()
    out.append(_Token("end", "", len(text)))
    return out


def _error(text: str, at: int, problem: str, fix: str) -> QueryError:
    shown = text.replace("\n", " ").replace("\t", " ")
    return QueryError(f"predictive query, position {at + 1}: {problem}; {fix}\n  {shown}\n  {' ' * at}^", at)


class _Parser:
    def __init__(self, text: str):
        self.text = text
        self.tokens = _tokens(text)
        self.i = 0

    @property
    def peek(self) -> _Token:
        return self.tokens[self.i]

    def fail(self, expected: str, fix: str, token: _Token | None = None) -> QueryError:
        token = token or self.peek
        found = "the end of the query" if token.kind == "end" else repr(token.text)
        return _error(self.text, token.at, f"expected {expected}, found {found}", fix)

    def keyword(self, *words: str, fix: str = "") -> str:
        if self.peek.word in words:
            self.i += 1
            return self.tokens[self.i - 1].word
        raise self.fail(" or ".join(words), fix or f"write {words[0]} here (grammar: relsql.predictive.GRAMMAR)")

    def accept(self, *words: str) -> str | None:
        if self.peek.word in words:
            self.i += 1
            return self.tokens[self.i - 1].word
        return None

    def punct(self, symbol: str, fix: str) -> None:
        if self.peek.kind in ("punct", "op") and self.peek.text == symbol:
            self.i += 1
            return
        raise self.fail(f"'{symbol}'", fix)

    def name(self, what: str, fix: str) -> tuple[str, _Token]:
        token = self.peek
        if token.kind == "word":
            self.i += 1
            return token.text, token
        if token.kind == "quoted":
            self.i += 1
            return token.text[1:-1].replace('""', '"'), token
        raise self.fail(what, fix)

    def dotted(self, what: str, fix: str) -> tuple[str, str, _Token]:
        table, token = self.name(f"{what} (table.column)", fix)
        self.punct(".", fix)
        column, _ = self.name(f"{what}'s column after the dot", fix)
        return table, column, token

    def integer(self, what: str, fix: str) -> int:
        token = self.peek
        if token.kind == "number" and token.text.isdigit() and int(token.text) >= 1:
            self.i += 1
            return int(token.text)
        raise self.fail(f"{what} (a whole number of at least 1)", fix)

    def days(self, fix: str) -> None:
        self.keyword("DAYS", "DAY", fix=fix)

    def date(self, fix: str) -> dt.date:
        token = self.peek
        if token.kind in ("date", "string"):
            self.i += 1
            raw = token.text[1:-1].replace("''", "'") if token.kind == "string" else token.text
            try:
                return _when(raw, "date")
            except RelsqlError:
                raise _error(self.text, token.at, f"{token.text} is not a valid date", fix) from None
        raise self.fail("a date such as 2020-01-31", fix)

    def parse(self) -> PredictiveQuery:
        fields_: dict[str, Any] = {}
        head = self.keyword("COUNT", "SUM", fix="start with COUNT(<events>.*) or SUM(<events>.<column>)")
        self.punct("(", f"write {head}(<events>.{'*' if head == 'COUNT' else '<column>'})")
        events, _ = self.name("the events table", "write e.g. COUNT(orders.*)")
        self.punct(".", f"write {head}({events}.{'*' if head == 'COUNT' else '<column>'})")
        if head == "COUNT":
            self.punct("*", f"COUNT counts events: write COUNT({events}.*)")
        else:
            fields_["aggregate"] = "sum"
            fields_["value"], _ = self.name("the column to sum", f"write SUM({events}.<numeric column>)")
        self.punct(")", "close the parenthesis")
        self.keyword("OVER", fix="give the label's window: OVER 30 DAYS")
        fields_["window_days"] = self.integer("the window's length in days", "write e.g. OVER 30 DAYS")
        self.days("write e.g. OVER 30 DAYS")
        if self.peek.kind == "op":
            op = self.peek.text
            self.i += 1
            token = self.peek
            if token.kind != "number":
                raise self.fail(f"a number after {op}", f"compare with a number, e.g. {op} 0")
            self.i += 1
            fields_["op"] = op
            fields_["threshold"] = int(token.text) if re.fullmatch(r"[+-]?\d+", token.text) else float(token.text)
        self.keyword("FOR", fix="name the entity: FOR customer (after the window and an optional comparison such as > 0)")
        if self.peek.word == "EACH" and self.tokens[self.i + 1].kind in ("word", "quoted"):
            self.i += 1
        entity, _ = self.name("the entity table", "write e.g. FOR customer")
        if self.peek.kind == "punct" and self.peek.text == ".":
            self.i += 1
            fields_["key"], _ = self.name("the entity's key column", f"write FOR {entity}.<key column>")
            if self.peek.kind == "op" and self.peek.text == "=":
                self.i += 1
                table, column, token = self.dotted("the events' foreign key", f"write FOR {entity}.{fields_['key']} = {events}.<column>")
                if table.casefold() != events.casefold():
                    raise _error(self.text, token.at, f"the foreign key must be a column of the events table `{events}`",
                                 f"write {events}.<column>")
                fields_["event_key"] = column
        population = self.accept("ACTIVE", "ALL", "SINCE")
        if population == "SINCE":
            table, column, token = self.dotted("the entity's creation column", f"write SINCE {entity}.<date column>")
            if table.casefold() != entity.casefold():
                raise _error(self.text, token.at, f"SINCE names a column of the entity table `{entity}`",
                             f"write SINCE {entity}.<date column>")
            fields_["since"] = column
        elif population:
            fields_["population"] = population.lower()
        if self.accept("TIME"):
            table, column, token = self.dotted("the events' time column", f"write TIME {events}.<date column>")
            if self.accept("VIA"):
                fk_table, fk, fk_token = self.dotted("the events' foreign key to the dimension",
                                                     f"write VIA {events}.<fk> = {table}.<key>")
                if fk_table.casefold() != events.casefold():
                    raise _error(self.text, fk_token.at, f"VIA starts at a column of the events table `{events}`",
                                 f"write VIA {events}.<fk> = {table}.<key>")
                self.punct("=", f"write VIA {events}.{fk} = {table}.<key>")
                dim, key, dim_token = self.dotted("the dimension's key", f"write VIA {events}.{fk} = {table}.<key>")
                if dim.casefold() != table.casefold():
                    raise _error(self.text, dim_token.at, f"the key must be a column of `{table}`, the table TIME names",
                                 f"write = {table}.<key>")
                fields_["event_time"] = TimePath(fk, table, key, column)
            elif table.casefold() != events.casefold():
                raise _error(self.text, token.at, f"TIME {table}.{column} is not a column of the events table `{events}`",
                             f"write TIME {events}.<column>, or TIME {table}.{column} VIA {events}.<fk> = {table}.<key>")
            else:
                fields_["event_time"] = column
        self.keyword("AT", fix="give the snapshots: AT 2020-01-01, 2020-07-01 or AT EVERY 30 DAYS")
        if self.accept("EVERY"):
            fields_["every_days"] = self.integer("the days between snapshots", "write e.g. AT EVERY 30 DAYS")
            self.days("write e.g. AT EVERY 30 DAYS")
            if self.accept("FROM"):
                fields_["start"] = self.date("write FROM 2020-01-01")
            if self.accept("TO"):
                fields_["end"] = self.date("write TO 2020-12-31")
        else:
            dates = [self.date("write AT 2020-01-01 (dates separated by commas) or AT EVERY 30 DAYS")]
            while self.peek.kind == "punct" and self.peek.text == ",":
                self.i += 1
                dates.append(self.date("write a date after the comma, e.g. 2020-07-01"))
            fields_["snapshots"] = tuple(dates)
        if self.peek.kind != "end":
            raise self.fail("the end of the query", "the snapshots come last; remove the rest or move it before AT")
        try:
            return PredictiveQuery(entity=entity, events=events, **fields_)
        except RelsqlError as err:
            raise QueryError(f"predictive query: {err}") from None


def parse(text: str) -> PredictiveQuery:
    """A `PredictiveQuery` from its one-line text form (grammar: `GRAMMAR`), parsed without eval.

    `COUNT(orders.*) OVER 30 DAYS > 0 FOR customer AT EVERY 30 DAYS` asks, for each customer active
    before each snapshot, whether it orders in the 30 days from the snapshot. An error names the
    position (1-based) and the fix.
    """
    if not isinstance(text, str) or not text.strip():
        raise QueryError("predictive query is empty; write e.g. COUNT(orders.*) OVER 30 DAYS > 0 FOR customer AT EVERY 30 DAYS")
    return _Parser(text).parse()


def _name(name: str) -> str:
    """A name as the text form writes it: bare if it can be, else double-quoted."""
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_$]*", name) and name.upper() not in _KEYWORDS:
        return name
    return '"' + name.replace('"', '""') + '"'


def _date_text(value: dt.date) -> str:
    if isinstance(value, dt.datetime):
        return value.isoformat(timespec="seconds" if not value.microsecond else "microseconds")
    return value.isoformat()

