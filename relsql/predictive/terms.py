"""A predictive query as data, the bottom layer of relsql.predictive: its constants, small value
types, the checks of single values, and `Question` (the query's fields, their checks and its text
form). parse (text -> fields) and plan (Question -> SQL) stand on it, and query.py (the
PredictiveQuery face: a Question with its parser and its database verbs) on all three."""

from __future__ import annotations

import datetime as dt
import math
import numbers
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import sqlglot.expressions as exp

from relsql import arguments
from relsql.errors import RelsqlError

OPS = {">": exp.GT, ">=": exp.GTE, "<": exp.LT, "<=": exp.LTE, "=": exp.EQ, "!=": exp.NEQ}
POPULATIONS = ("active", "all", "since")
TASK_COLUMNS = ("task_id", "snapshot", "label")
AGGREGATES = ("count", "sum", "list_distinct")
MAX_WINDOW_DAYS = 100_000
MAX_SNAPSHOTS = 10_000
PREFIX = "__relsql_task_"  # CTE and column names of the generated query: never a user's name


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
    label_type: str  # BOOLEAN or DOUBLE; for LIST_DISTINCT the list's type, e.g. BIGINT[]
    time_columns: dict[str, str] = field(default_factory=dict)  # what an auto-template should filter by
    target: str = "label"  # the column to learn: `label`, or for LIST_DISTINCT the list column (e.g. item_id)
    k: int | None = None  # RANK TOP k: how many items a ranking model is judged on (None: not given)
    references: tuple[str, str] | None = None  # LIST_DISTINCT: the (table, key column) the list's items are keys of

    def __str__(self) -> str:
        positive = f", {self.positives:,} positive" if self.positives is not None else ""
        if self.references is not None:
            top = f", RANK TOP {self.k}" if self.k is not None else ""
            positive = f" (`{self.target}`: lists of {self.references[0]}.{self.references[1]}{top})"
        unlabelled = self.rows - self.labelled
        open_windows = f", {unlabelled:,} unlabelled (windows past the data's last event)" if unlabelled else ""
        span = f"{self.snapshots[0]} .. {self.snapshots[-1]}" if len(self.snapshots) > 1 else f"{self.snapshots[0]}"
        return (f"wrote {self.name}: {self.rows:,} rows{positive}{open_windows}; {len(self.snapshots)} "
                f"snapshot{'s' if len(self.snapshots) != 1 else ''} {span}")


def when(value: object, what: str) -> dt.date:
    """A date or datetime from a value or ISO text ('2020-01-31', '2020-01-31T12:00'), without a
    time zone (see `naive`)."""
    if isinstance(value, dt.date):
        return naive(value, what)
    if isinstance(value, str):
        try:
            found = dt.datetime.fromisoformat(value) if re.search(r"[T ]\d", value) else dt.date.fromisoformat(value)
        except ValueError:
            found = None
        if found is not None:
            return naive(found, what)
    raise RelsqlError(f"{what} must be a date (datetime.date, or text such as '2020-01-31' or '2020-01-31T12:00'), "
                      f"got {value!r}")


class ZonedTimeError(RelsqlError):
    """A snapshot with a time zone; `local` is the same clock time without it (the fix to suggest)."""

    def __init__(self, message: str, local: str):
        super().__init__(message)
        self.local = local


def naive(value: dt.date, what: str) -> dt.date:
    """Snapshots are compared with the events' DATE or TIMESTAMP column, which holds no time zone
    (a TIMESTAMP WITH TIME ZONE column is refused): an offset or zone on a snapshot has no meaning
    against it, and converting to some zone would be a guess. Refused, with the fix."""
    if isinstance(value, dt.datetime) and value.tzinfo is not None:
        local = value.replace(tzinfo=None).isoformat(sep=" ")
        raise ZonedTimeError(f"{what} {value.isoformat(sep=' ')} has a time zone, but the events' time column holds none "
                          f"(a DATE or TIMESTAMP in the data's own clock); write the snapshot in that clock without an "
                          f"offset, e.g. '{local}'", local)
    return value


def names(value: object, what: str, optional: bool = True) -> tuple[str, ...] | None:
    if value is None and optional:
        return None
    found = (value,) if isinstance(value, str) else tuple(value) if isinstance(value, list | tuple) else None
    if not found or not all(isinstance(v, str) and v for v in found):
        raise RelsqlError(f"{what} must be a column name or a list of column names, got {value!r}")
    return found


def as_datetime(value: dt.date) -> dt.datetime:
    return value if isinstance(value, dt.datetime) else dt.datetime.combine(value, dt.time())


_KEYWORDS = {"COUNT", "SUM", "LIST_DISTINCT", "RANK", "TOP", "OVER", "DAY", "DAYS", "FOR", "EACH", "ACTIVE", "ALL", "SINCE",
             "TIME", "VIA", "AT", "EVERY", "FROM", "TO"}


def is_task_table(columns: Iterable[Any]) -> bool:
    """Whether a table with these columns (objects with .name and .type, e.g. catalog Columns) looks
    like a task table relsql.PredictiveQuery wrote: task_id, snapshot and a `label`, or a list column
    (LIST_DISTINCT). Automatic templates leave other task tables out: their labels and lists hold
    events after their snapshots."""
    found = list(columns)
    names = {c.name for c in found}
    return {"task_id", "snapshot"} <= names and ("label" in names or any(c.type.upper().endswith("]") for c in found))


def text_name(name: str) -> str:
    """A name as the text form writes it: bare if it can be, else double-quoted."""
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_$]*", name) and name.upper() not in _KEYWORDS:
        return name
    return '"' + name.replace('"', '""') + '"'


def date_text(value: dt.date) -> str:
    if isinstance(value, dt.datetime):
        return value.isoformat(timespec="seconds" if not value.microsecond else "microseconds")
    return value.isoformat()


@dataclass(frozen=True)
class Question:
    """A predictive query as data: its fields, their checks and its text form. The database's
    verbs (`sql`, `write`) and the parser are added above, by `PredictiveQuery` (query.py)."""

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
    k: int | None = None

    def __post_init__(self) -> None:
        put = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731 (frozen)
        arguments.text("entity", self.entity)
        arguments.text("events", self.events)
        put("window_days", arguments.integer("window_days", self.window_days, maximum=MAX_WINDOW_DAYS))
        arguments.choice("aggregate", self.aggregate, AGGREGATES)
        if (self.aggregate != "count") != (self.value is not None):
            raise RelsqlError("value (the column to sum, or to list) goes with aggregate='sum' or 'list_distinct', and "
                              f"only with them; got aggregate={self.aggregate!r}, value={self.value!r}")
        arguments.text("value", self.value, optional=True)
        arguments.choice("op", self.op, (None, *OPS, "<>"))
        self.check_ranking()
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

    def check_ranking(self) -> None:
        """LIST_DISTINCT's rules: its label is a list (nothing to compare), and RANK TOP k goes with
        it only, with k >= 1."""
        if self.aggregate == "list_distinct" and self.op is not None:
            raise QueryError(f"LIST_DISTINCT({self.events}.{self.value}) gives a list of keys, not a number to compare with "
                             f"{self.op} {self.threshold!r}: remove the comparison (for a yes/no label write "
                             f"COUNT({self.events}.*) OVER {self.window_days} DAYS > 0)")
        if self.k is None:
            return
        if self.aggregate != "list_distinct":
            raise QueryError(f"RANK TOP {self.k!r} ranks the keys of a LIST_DISTINCT query; with {self.aggregate.upper()} "
                             "remove it, or write LIST_DISTINCT(<events>.<key column>)")
        if isinstance(self.k, bool) or not isinstance(self.k, numbers.Integral) or self.k <= 0:
            raise QueryError(f"RANK TOP k needs a whole number k of at least 1 (how many items to rank), got {self.k!r}; "
                             "write e.g. RANK TOP 10 (k=10), or leave it out")
        object.__setattr__(self, "k", int(self.k))

    # -- the text form ------------------------------------------------------------------------

    def __str__(self) -> str:
        """The query in the text form (`parse(str(q)) == q`)."""
        what = (f"COUNT({text_name(self.events)}.*)" if self.aggregate == "count" else
                f"{self.aggregate.upper()}({text_name(self.events)}.{text_name(self.value)})")
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
        if self.k is not None:
            out.append(f"RANK TOP {self.k}")
        return " ".join(out)
