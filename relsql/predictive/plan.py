"""A predictive query as SQL: the snapshots, the population, the label window, and the task table's
writing (a declared primary key where the source has them)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import numbers

import duckdb
import sqlglot.expressions as exp

from relsql import sql as q
from relsql.data.catalog import Catalog, ForeignKey
from relsql.data.coltypes import is_number
from relsql.data.engine import Database, first_line
from relsql.data.keys import schema
from relsql.errors import SchemaError, SourceError
from relsql.predictive.terms import (
    MAX_SNAPSHOTS,
    OPS,
    PREFIX,
    TASK_COLUMNS,
    QueryError,
    Question,
    TimePath,
    as_datetime,
    text_name,
)
from relsql.sql import integer, real


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


_id, _col = q.ident, q.col  # quoted identifiers and columns, as every generated statement builds them


def _table(name: str, alias: str | None = None) -> exp.Expression:
    table = exp.Table(this=_id(name))
    return exp.alias_(table, _id(alias), table=True) if alias else table


class TaskPlan:
    """A query resolved against one database's catalog: real table and column names, key and time
    columns, the snapshots' values."""

    def __init__(self, db: Database, query: Question):
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
        self.listed = query.aggregate == "list_distinct"
        self.references = self.listed_key() if self.listed else None
        self.target = self.references[1] if self.references else "label"
        if self.value and not self.listed and not is_number(self.type(self.events, self.value)):
            raise SchemaError(f"SUM({self.events}.{self.value}): the column is {self.type(self.events, self.value)}, "
                              "not a number; sum a numeric column or use COUNT")
        self.since = self.column(self.entity, query.since, "since") if query.since else None
        if self.since and _time_kind(self.type(self.entity, self.since), f"{self.entity}.{self.since}") is None:
            raise SchemaError(f"SINCE {self.entity}.{self.since}: the column is {self.type(self.entity, self.since)}; "
                              "it must be the entity's creation DATE or TIMESTAMP")
        self.label_type = (f"{self.type(self.events, self.value)}[]" if self.listed else
                           "BOOLEAN" if query.op is not None else "DOUBLE")
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
        """Declared keys plus inferred ones (the same inference `Template.auto` uses), computed once.
        List, struct and map columns (a LIST_DISTINCT task table's list) are left out: no key is one,
        and the inference's containment test cannot compare a list with a key."""
        if self._schema is None:
            self._schema = schema(self.db, _flat(self.catalog), infer=True)
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
                              f"key='...' (text form: FOR {text_name(self.entity)}.<key column>)")
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

    def listed_key(self) -> tuple[str, str]:
        """LIST_DISTINCT(events.c): c must be a one-column foreign key (declared, else inferred) from
        the events to a table R other than the entity link; returns (R, R's key column). The list
        column is named like R's key column (no list can be declared a foreign key, so a ranking
        target finds R by that name), which must not clash with the task table's other columns."""
        value, where = self.value, f"LIST_DISTINCT({self.events}.{self.value})"
        if value in self.event_key:
            raise QueryError(f"{where}: `{value}` is the events' link to the entity `{self.entity}`, so each list would hold "
                             f"the entity itself; list the key of what the events reference, e.g. {self.events}.<item key>")
        def key_of(fks) -> ForeignKey | None:
            return next((fk for fk in fks if fk.columns == (value,) and fk.table in self.catalog.tables), None)
        found = key_of(self.catalog[self.events].foreign_keys) or key_of(
            fk for child, fk in self.schema().foreign_keys if child == self.events)
        if found is None:
            keys = sorted({fk.columns[0] for child, fk in self.schema().foreign_keys
                           if child == self.events and len(fk.columns) == 1 and fk.columns[0] not in self.event_key})
            raise QueryError(f"{where}: `{value}` is not a foreign key (declared or inferable from its name) to another "
                             f"table's key, so there is nothing to rank; list a key column"
                             + (f" ({', '.join(keys)})" if keys else ", or declare the foreign key: "
                                f"{self.events}({value}) REFERENCES <table>(<key>)"))
        column = found.references[0]
        clash = [c for c in (*self.key, "task_id", "snapshot") if c.casefold() == column.casefold()]
        if clash:
            raise QueryError(f"{where}: the list column is named like the key it holds, `{found.table}.{column}`, but the "
                             f"task table already has a column `{clash[0]}` (the entity's key or a task column); expose "
                             f"`{found.table}` through a view that renames its key")
        return found.table, column

    def events_key(self) -> tuple[str, ...]:
        if self.q.event_key is not None:
            found = tuple(self.column(self.events, k, "event_key") for k in self.q.event_key)
            if len(found) != len(self.key):
                raise SchemaError(f"event_key ({', '.join(found)}) and the entity key ({', '.join(self.key)}) "
                                  "must have as many columns")
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
                          f"inferable; name it: event_key='...' "
                          f"(text form: FOR {text_name(self.entity)}.{text_name(self.key[0])} = "
                          f"{text_name(self.events)}.<column>)")

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
                          f"{'s' if len(found) != 1 else ''}"
                          f"{' (' + ', '.join(c for c, _ in found) + ')' if found else ''}; {fix}")

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
        select = [exp.alias_(_col(k, e), _id(f"{PREFIX}k{i}")) for i, k in enumerate(self.event_key)]
        select.append(exp.alias_(time.copy(), _id(f"{PREFIX}t")))
        if self.listed:
            select.append(exp.alias_(_col(self.value, e), _id(f"{PREFIX}v")))
        elif self.value:
            select.append(exp.alias_(exp.cast(_col(self.value, e), exp.DataType.build("DOUBLE")), _id(f"{PREFIX}v")))
        query = exp.select(*select).from_(_table(self.events, e))
        if self.path:
            query = query.join(_table(self.path.table, "d"),
                               on=exp.EQ(this=_col(self.path.column, e), expression=_col(self.path.key, "d")))
        present = [_col(k, e) for k in self.event_key] + [time]
        return query.where(exp.and_(*[exp.Not(this=exp.Is(this=c.copy(), expression=exp.Null())) for c in present]))

    def span(self) -> tuple[dt.date, dt.date]:
        t = _col(f"{PREFIX}t")
        row = self.db.arrow(exp.select(exp.Min(this=t.copy()), exp.Max(this=t.copy())).from_(
            exp.alias_(exp.Subquery(this=self.events_rows()), _id("ev"), table=True))).to_pylist()[0]
        first, last = row.values()
        if first is None:
            raise SchemaError(f"events table `{self.events}` has no event with a {', '.join(self.event_key)} and a time; "
                              "there is nothing to count")
        return first, last

    def observed_until(self) -> dt.datetime:
        """Windows ending at or before this are fully covered by the data (events up to `last`)."""
        last = as_datetime(self.last)
        return last + dt.timedelta(days=1) if self.kind == "DATE" else last

    def snapshots(self) -> list[dt.date]:
        q, window = self.q, dt.timedelta(days=self.q.window_days)
        if q.snapshots is not None:
            values = list(q.snapshots)
        else:
            last = (self.observed_until() - window).date()
            end = min(last, _day(q.end)) if q.end is not None else last
            start = _day(q.start) if q.start is not None else as_datetime(self.first).date() + dt.timedelta(days=1)
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
        return [as_datetime(v) for v in values]

    def select(self) -> exp.Select:
        kind, window = self.kind, dt.timedelta(days=self.q.window_days)
        horizon = self.observed_until()
        rows = [exp.Tuple(expressions=[_date_literal(s, kind), _date_literal(s + window, kind),
                                       exp.true() if as_datetime(s) + window <= horizon else exp.false()])
                for s in self.snapshot_values]
        snaps_name, events_name, window_name, first_name = (f"{PREFIX}{n}" for n in ("snapshots", "events", "window", "first"))
        s, until, observed = "snapshot", f"{PREFIX}until", f"{PREFIX}observed"
        values = exp.select(exp.Star()).from_(exp.Values(expressions=rows, alias=exp.TableAlias(
            this=_id("v"), columns=[_id(s), _id(until), _id(observed)])))
        keys = [f"{PREFIX}k{i}" for i in range(len(self.key))]
        t = f"{PREFIX}t"
        counted = exp.select(*[_col(k, "ev") for k in keys], _col(s, "s"), *self.measures()).from_(
            _table(events_name, "ev")).join(
            _table(snaps_name, "s"), on=exp.and_(exp.GTE(this=_col(t, "ev"), expression=_col(s, "s")),
                                                 exp.LT(this=_col(t, "ev"), expression=_col(until, "s")))
        ).group_by(*[_col(k, "ev") for k in keys], _col(s, "s"))
        if self.listed:  # a NULL key is no item: an entity with only such events has no list (no row)
            counted = counted.where(exp.Not(this=exp.Is(this=_col(f"{PREFIX}v", "ev"), expression=exp.Null())))
        ctes = [(snaps_name, values), (events_name, self.events_rows()), (window_name, counted)]
        x = "x"
        label = exp.Case(ifs=[exp.If(this=_col(observed, "s"), true=self.label())])
        order = [exp.Ordered(this=_col(s, "s")), *[exp.Ordered(this=_col(k, x)) for k in self.key]]
        task_id = exp.Window(this=exp.RowNumber(), order=exp.Order(expressions=order))
        query = exp.select(
            exp.alias_(exp.cast(task_id, exp.DataType.build("BIGINT")), _id("task_id")),
            *[exp.alias_(_col(k, x), _id(k)) for k in self.key],
            exp.alias_(_col(s, "s"), _id("snapshot")),
            exp.alias_(exp.cast(label, exp.DataType.build(self.label_type, dialect="duckdb")), _id(self.target)),
        ).from_(_table(self.entity, x)).join(_table(snaps_name, "s"), join_type="cross")
        conditions = [exp.Not(this=exp.Is(this=_col(k, x), expression=exp.Null())) for k in self.key]
        if self.q.population == "active":  # an event strictly before the snapshot: the template can see it
            first = exp.select(*[_col(k) for k in keys], exp.alias_(exp.Min(this=_col(t)), _id(f"{PREFIX}first"))).from_(
                _table(events_name)).group_by(*[_col(k) for k in keys])
            ctes.append((first_name, first))
            query = query.join(_table(first_name, "f"), on=exp.and_(
                *[exp.EQ(this=_col(k, "f"), expression=_col(c, x)) for k, c in zip(keys, self.key)],
                exp.LT(this=_col(f"{PREFIX}first", "f"), expression=_col(s, "s"))))
        elif self.q.population == "since":
            conditions.append(exp.LT(this=_col(self.since, x), expression=_col(s, "s")))
        query = query.join(_table(window_name, "w"), join_type="left", on=exp.and_(
            *[exp.EQ(this=_col(k, "w"), expression=_col(c, x)) for k, c in zip(keys, self.key)],
            exp.EQ(this=_col(s, "w"), expression=_col(s, "s"))))
        if self.listed:  # a ranking row needs an item: observed windows without one get no row (the package docstring says why)
            conditions.append(exp.or_(exp.Not(this=_col(observed, "s")),
                                      exp.Not(this=exp.Is(this=_col(f"{PREFIX}items", "w"), expression=exp.Null()))))
        query = query.where(exp.and_(*conditions))
        for name, body in ctes:
            query = query.with_(_id(name), as_=body)
        return query


    def label(self) -> exp.Expression:
        """The label of an observed window, from its aggregates (CTE alias `w`): the list, the
        comparison, or the number; an entity without events in the window counts 0."""
        if self.listed:
            return _col(f"{PREFIX}items", "w")
        measure = exp.Coalesce(this=_col(f"{PREFIX}sum" if self.value else f"{PREFIX}n", "w"), expressions=[integer(0)])
        if self.q.op is not None:
            number = self.q.threshold
            literal = integer(number) if isinstance(number, numbers.Integral) else real(number)
            return OPS[self.q.op](this=measure, expression=literal)
        return exp.cast(measure, exp.DataType.build("DOUBLE"))

    def measures(self) -> list[exp.Expression]:
        """The window's aggregates per (entity, snapshot): the count, and the sum for SUM, or for
        LIST_DISTINCT the distinct keys sorted ascending."""
        v = _col(f"{PREFIX}v", "ev")
        if self.listed:
            items = exp.Anonymous(this="list_sort", expressions=[exp.Anonymous(this="list_distinct", expressions=[
                exp.ArrayAgg(this=v)])])
            return [exp.alias_(items, _id(f"{PREFIX}items"))]
        out = [exp.alias_(exp.Count(this=exp.Star()), _id(f"{PREFIX}n"))]
        if self.value:
            out.append(exp.alias_(exp.Sum(this=v), _id(f"{PREFIX}sum")))
        return out


def _nested(sql_type: str) -> bool:
    upper = sql_type.upper()
    return upper.endswith("]") or upper.startswith(("STRUCT", "MAP", "UNION"))


def _flat(catalog: Catalog) -> Catalog:
    """`catalog` without its nested-type columns (see TaskPlan.schema)."""
    tables = {name: dataclasses.replace(t, columns=tuple(c for c in t.columns if not _nested(c.type)))
              for name, t in catalog.tables.items()}
    return dataclasses.replace(catalog, tables=tables)


def _day(value: dt.date) -> dt.date:
    return value.date() if isinstance(value, dt.datetime) else value


def write_native(db: Database, plan: TaskPlan, name: str, existing: str | None, query: exp.Select, foreign_key: bool) -> None:
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
            columns.append(exp.ColumnDef(this=_id(k), kind=kind,
                                         constraints=[exp.ColumnConstraint(kind=exp.NotNullColumnConstraint())]))
        columns += [exp.ColumnDef(this=_id("snapshot"), kind=exp.DataType.build(snapshot_type)),
                    exp.ColumnDef(this=_id(plan.target), kind=exp.DataType.build(plan.label_type, dialect="duckdb"))]
        reference = exp.ForeignKey(expressions=[_id(k) for k in plan.key], reference=exp.Reference(
            this=exp.Schema(this=exp.Table(this=_id(plan.entity)), expressions=[_id(k) for k in plan.key])))
        statements.append(exp.Create(this=exp.Schema(this=target.copy(), expressions=[*columns, reference]), kind="TABLE"))
        statements.append(exp.Insert(
            this=exp.Schema(this=target.copy(), expressions=[_id(c) for c in ("task_id", *plan.key, "snapshot", plan.target)]),
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


def summary(name: str, label_type: str, target: str = "label") -> exp.Select:
    """rows, labelled (a non-NULL target) and positives (BOOLEAN labels only) of task table `name`."""
    label = _col(target)
    positives = (exp.Sum(this=exp.Case(ifs=[exp.If(this=label.copy(), true=integer(1))], default=integer(0)))
                 if label_type == "BOOLEAN" else exp.Null())
    return exp.select(exp.alias_(exp.Count(this=exp.Star()), _id("rows")),
                      exp.alias_(exp.Count(this=label.copy()), _id("labelled")),
                      exp.alias_(positives, _id("positives"))).from_(_table(name))
