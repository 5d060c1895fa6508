"""The words of a predictive query, shared by its layers: constants, the small value types and
the checks of single values. The bottom layer of relsql.predictive: parse (text -> fields) and plan
(fields -> SQL) stand on it, and query.py (the PredictiveQuery face) on all three."""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass, field
from typing import Any

import sqlglot.expressions as exp

from relsql.errors import RelsqlError

OPS = {">": exp.GT, ">=": exp.GTE, "<": exp.LT, "<=": exp.LTE, "=": exp.EQ, "!=": exp.NEQ}
POPULATIONS = ("active", "all", "since")
TASK_COLUMNS = ("task_id", "snapshot", "label")
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
    label_type: str  # BOOLEAN or DOUBLE
    time_columns: dict[str, str] = field(default_factory=dict)  # what an auto-template should filter by

    def __str__(self) -> str:
        positive = f", {self.positives:,} positive" if self.positives is not None else ""
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


_KEYWORDS = {"COUNT", "SUM", "OVER", "DAY", "DAYS", "FOR", "EACH", "ACTIVE", "ALL", "SINCE", "TIME", "VIA", "AT",
             "EVERY", "FROM", "TO"}


def text_name(name: str) -> str:
    """A name as the text form writes it: bare if it can be, else double-quoted."""
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_$]*", name) and name.upper() not in _KEYWORDS:
        return name
    return '"' + name.replace('"', '""') + '"'


def date_text(value: dt.date) -> str:
    if isinstance(value, dt.datetime):
        return value.isoformat(timespec="seconds" if not value.microsecond else "microseconds")
    return value.isoformat()

