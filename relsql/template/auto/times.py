"""Each table's time, and how two times compare: what lets a temporal template keep every target
row's future out.

A table's time is, in order: the column given in `time_columns={table: column}` (a date/timestamp
column, a foreign key column leading to a table with one, or a number comparable with the target's
time); for the target table itself, `time_column`; a column named like the target's time and
comparable with it (a season's yearID); its own first DATE/TIMESTAMP column; an integer year named
as one (`year`, `yearID`, `season`); else the date of a date dimension its first foreign key to one
leads to (TPC-DS `store_sales.ss_sold_date_sk` -> `date_dim.d_date`: a referenced table with a
DATE/TIMESTAMP column whose name, or the foreign key column's, mentions date, day or calendar; its
column named `d_date`/`date`/`*_date` first). Dates compare with dates, an integer year with a
date through its year, other numbers only with numbers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import sqlglot.expressions as exp

from relsql.data.catalog import Column, ForeignKey, Table
from relsql.data.coltypes import is_integer, is_number, is_time_type
from relsql.data.engine import Database
from relsql.data.keys import Schema
from relsql.errors import SchemaError

YEARS = (1000, 3000)  # an integer time column whose values all lie within these is a year
_DATE_DIMENSION = re.compile(r"date|day|calendar", re.IGNORECASE)
_YEAR_NAME = re.compile(r"^(?:year|yr|season)(?:_?id)?$|_(?:year|season)$", re.IGNORECASE)  # year, yearID, season, fiscal_year


@dataclass(frozen=True)
class Time:
    """Where a table's rows get their time: its own column, or a date dimension's via a foreign key."""

    column: str  # the date column (of the table, or of `dimension`)
    via: ForeignKey | None = None  # the table's foreign key to the date dimension
    kind: str = "date"  # "date" (DATE/TIMESTAMP), "year" (an integer year) or "number" (another ordered number)

    def describe(self, table: str) -> str:
        if self.via is None:
            return f"{table}.{self.column}"
        return f"{table} via {', '.join(self.via.columns)} -> {self.via.table}.{self.column}"


def before(event: str, event_kind: str, target: str, target_kind: str, inclusive: bool = False) -> str | None:
    """SQL for "the event is earlier than the target time", across kinds of time columns (None:
    the two cannot be compared). An integer year is known once it is over: an event of year y
    is before a date d only if y < year(d), and a date is before year Y only if before Y's first day.
    `inclusive` (RelBench's cut: an event at exactly the task row's timestamp is visible, as
    relbench's `Database.upto` keeps `time <= timestamp`) makes times of one kind compare with
    `<=`; across kinds the cut stays strict (a year is known once it is over)."""
    scale = on_event_scale(target, target_kind, event_kind)
    if scale is None:
        return None
    return f"{event} {'<=' if inclusive and event_kind == target_kind else '<'} {scale}"


def on_event_scale(target: str, target_kind: str, event_kind: str) -> str | None:
    """The target time as a value of the events' kind such that `before(e, event_kind, target,
    target_kind)` (strict) is `e < ` it: what a running aggregate sorts events and targets by."""
    if event_kind == target_kind:
        return target
    if event_kind == "year" and target_kind == "date":
        return f"year({target})"
    if event_kind == "date" and target_kind == "year":
        return f"make_date(CAST({target} AS INTEGER), 1, 1)"
    return None


def seconds(value: str, kind: str) -> str | None:
    """A time as seconds since 1970 (a year as its first day), for ages; None for other numbers."""
    if kind == "date":
        return f"epoch({value})"
    if kind == "year":
        return f"epoch(make_date(CAST({value} AS INTEGER), 1, 1))"
    return None


def time_kind(db: Database, table: str, column: str, sql_type: str) -> str | None:
    """How a time column orders rows: "date", "year" (integers within YEARS) or "number" (other
    integers and numbers); None for a column that is no time at all (text, lists)."""
    upper = sql_type.upper()
    if is_time_type(upper):
        return "date"
    if not is_number(upper):
        return None
    if is_integer(upper):
        col = exp.column(exp.to_identifier(column, quoted=True))
        low, high = db.scalar(exp.select(exp.Min(this=col.copy()), exp.Max(this=col.copy())).from_(
            exp.Table(this=exp.to_identifier(table, quoted=True))))
        if low is not None and YEARS[0] <= low and high <= YEARS[1]:
            return "year"
    return "number"


def date_dimension(keys: Schema, table: str, fk: ForeignKey, named: bool) -> Time | None:
    """`fk` of `table` leads to a table with a date/timestamp column: the time it gives (`named`:
    only if that table's or the key column's name says it is about dates)."""
    parent = keys.tables.get(fk.table)
    if parent is None or fk.table == table:
        return None
    stamps = [c.name for c in parent.columns if is_time_type(c.type) and c.name not in fk.references]
    if not stamps:
        return None
    if named and not (_DATE_DIMENSION.search(fk.table) or any(_DATE_DIMENSION.search(c) for c in fk.columns)):
        return None
    preferred = sorted(stamps, key=lambda c: (c.lower() not in ("d_date", "date"), not c.lower().endswith("date")))
    return Time(preferred[0], via=fk)


def table_times(db: Database, catalog, keys: Schema, target: str, time_column: str, given: dict[str, str]) -> dict[str, Time]:
    """Each table's time (see the module docstring); tables without one, or with one that cannot
    be compared with the target's (a number that is not a year against a date), are absent."""
    target_type = next(c.type for c in keys.tables[target].columns if c.name == time_column)
    target_kind = time_kind(db, target, time_column, target_type)
    if target_kind is None:
        raise SchemaError(f"time_column {target}.{time_column} ({target_type}) is not a time: give a date, timestamp or "
                          "number column (an integer year is one)")
    times: dict[str, Time] = {target: Time(time_column, kind=target_kind)}
    for name, column in given.items():
        times[name] = _given(db, catalog, keys, name, column, f"{time_column} ({target_type})", target_kind)
    for name, info in keys.tables.items():
        if name not in times:
            time = _found(db, keys, name, info, time_column, target_kind)
            if time is not None:
                times[name] = time
    return times


def _comparable(db: Database, table: str, column: Column, target_kind: str) -> Time | None:
    """`column` as a time comparable with the target's, or None."""
    kind = time_kind(db, table, column.name, column.type)
    if kind is None or before("e", kind, "t", target_kind) is None:
        return None
    return Time(column.name, kind=kind)


def _given(db: Database, catalog, keys: Schema, name: str, column: str, target: str, target_kind: str) -> Time:
    """The time `time_columns` gives table `name` (`target`: the target's time column and type, for errors)."""
    if name not in keys.tables:
        raise SchemaError(f"time_columns names table `{name}`, which does not exist; tables: {', '.join(catalog.names)}")
    col = next((c for c in keys.tables[name].columns if c.name == column), None)
    if col is None:
        raise SchemaError(f"time_columns: `{name}` has no column `{column}`")
    dates = before("e", "date", "t", target_kind) is not None  # whether a date compares with the target's time
    if is_time_type(col.type):
        if not dates:
            raise SchemaError(f"time_columns: {name}.{column} ({col.type}) is a date, which cannot be compared with "
                              f"{target}, a number that is not a year")
        return Time(column)
    fk = next((fk for child, fk in keys.foreign_keys if child == name and fk.columns == (column,)), None)
    time = date_dimension(keys, name, fk, named=False) if fk is not None else None
    if time is not None and dates:
        return Time(time.column, via=fk)
    time = _comparable(db, name, col, target_kind)
    if time is None:
        raise SchemaError(f"time_columns: {name}.{column} ({col.type}) is neither a date/timestamp column, nor "
                          f"a foreign key to a table with one, nor a number comparable with {target}")
    return time


def _found(db: Database, keys: Schema, name: str, info: Table, time_column: str, target_kind: str) -> Time | None:
    """A table's time when none is given: a column named like the target's time, of a kind comparable
    with it (a season's yearID), else its first DATE/TIMESTAMP column, else an integer year named as
    one (year, yearID, season), else a date dimension's date."""
    same = next((c for c in info.columns if c.name == time_column), None)
    time = _comparable(db, name, same, target_kind) if same is not None else None
    if time is None:
        stamp = next((c for c in info.columns if is_time_type(c.type)), None)
        time = _comparable(db, name, stamp, target_kind) if stamp is not None else None
    if time is None:
        years = (_comparable(db, name, c, target_kind) for c in info.columns if _YEAR_NAME.search(c.name))
        time = next((t for t in years if t is not None and t.kind == "year"), None)
    if time is None and before("e", "date", "t", target_kind) is not None:
        dimensions = (date_dimension(keys, name, fk, named=True) for child, fk in keys.foreign_keys
                      if child == name and keys.primary_keys.get(fk.table))
        time = next((t for t in dimensions if t is not None), None)
    return time
