"""One-hop features computed by the database: the propositionalization a GBM learns from.

For each row of the target table: its own columns; the columns of each parent row (one foreign
key step up, many-to-one); and for each child table (a foreign key into the target table) the
count of its rows and the mean, min and max of each numeric column. All of it is one SQL query
built with sqlglot, run by the database.

What enters, and how: numbers, booleans (0/1), dates and timestamps (epoch seconds), and text
with at most MAX_CODES distinct values as an integer code (its position among the sorted values;
an unseen value is NULL). Never: key columns (primary and foreign, declared or inferred, see
relsql.data.keys.schema), columns named like identifiers (relsql.template.auto.id_like), the target
column, copies of it, the target's time column, task tables of other questions. NULL stays NaN.

With a time column (a temporal target), a child row counts only if its time (relsql.template.auto's
rules: its own date column, or a date dimension's) is earlier than the target row's time; child
tables whose time is unknown are left out, as Template.auto leaves them out.

`Flat` is plain data (names and values, no code): a saved model recomputes the same features on
another database, in the same order with the same codes.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np
import sqlglot.expressions as exp

from relsql import sql as q
from relsql.data.engine import Database
from relsql.errors import RelsqlError

MAX_CODES = 100  # a text column with more distinct values is left out (a name, free text)
_NUMBERS = ("INT", "DECIMAL", "NUMERIC", "DOUBLE", "FLOAT", "REAL", "BOOL")
_TIMES = ("DATE", "TIMESTAMP")
AGGREGATES = ("avg", "min", "max")


@dataclass
class Column:
    """One column as a feature: `kind` number, time (epoch seconds) or code (`codes` in order)."""

    name: str
    kind: str
    codes: list[str] = field(default_factory=list)


@dataclass
class Parent:
    columns: list[str]  # the target table's foreign key columns
    table: str
    references: list[str]
    features: list[Column]


@dataclass
class Child:
    table: str
    columns: list[str]  # the child's foreign key columns into the target table
    references: list[str]
    features: list[Column]
    time: str | None = None  # the child's time column (or the date dimension's, with `via`)
    via: list | None = None  # [fk columns, dimension table, referenced columns] for a date dimension
    time_kind: str = "date"  # how its time orders rows (relsql.template.auto.time_kind): date, year, number


@dataclass
class Flat:
    """Which features a target table gets (see the module docstring); `names` says what each is."""

    table: str
    keys: list[str]
    time_column: str | None
    own: list[Column]
    parents: list[Parent]
    children: list[Child]
    time_kind: str = "date"  # the target time's kind (relsql.template.auto.time_kind)

    @property
    def names(self) -> list[str]:
        names = [c.name for c in self.own]
        for p in self.parents:
            names += [f"{p.table}({','.join(p.columns)}).{c.name}" for c in p.features]
        for c in self.children:
            names.append(f"count({c.table}({','.join(c.columns)}))")
            names += [f"{a}({c.table}.{f.name})" for f in c.features for a in AGGREGATES]
        return names

    def to_plain(self) -> dict:
        return asdict(self)

    @classmethod
    def from_plain(cls, data: dict, where: str = "one-hop features") -> Flat:
        """A Flat from `to_plain`'s dict, checked: its names and codes reach SQL (as quoted
        identifiers and typed literals)."""
        try:
            flat = cls(table=data["table"], keys=list(data["keys"]), time_column=data["time_column"],
                       own=[Column(**c) for c in data["own"]],
                       parents=[Parent(**{**p, "features": [Column(**c) for c in p["features"]]}) for p in data["parents"]],
                       children=[Child(**{**c, "features": [Column(**f) for f in c["features"]]}) for c in data["children"]],
                       **({"time_kind": data["time_kind"]} if "time_kind" in data else {}))
        except (KeyError, TypeError):
            raise RelsqlError(f"{where} is damaged: not a description of one-hop features") from None
        texts = [flat.table, *flat.keys, *([flat.time_column] if flat.time_column else [])]
        columns = [*flat.own, *[c for p in flat.parents for c in p.features], *[c for ch in flat.children for c in ch.features]]
        texts += [c.name for c in columns] + [s for c in columns for s in c.codes]
        for p in flat.parents:
            texts += [p.table, *p.columns, *p.references]
        for c in flat.children:
            texts += [c.table, *c.columns, *c.references, *([c.time] if c.time else [])]
            if c.via is not None:
                if not (isinstance(c.via, list) and len(c.via) == 3
                        and isinstance(c.via[0], list) and isinstance(c.via[2], list)):
                    raise RelsqlError(f"{where} is damaged: a date dimension's link")
                texts += [*c.via[0], c.via[1], *c.via[2]]
        if not all(isinstance(t, str) for t in texts) or any(c.kind not in ("number", "time", "code") for c in columns):
            raise RelsqlError(f"{where} is damaged: its names are not all text")
        if any(kind not in ("date", "year", "number") for kind in [flat.time_kind, *[c.time_kind for c in flat.children]]):
            raise RelsqlError(f"{where} is damaged: a time's kind")
        return flat

    # -- the query --------------------------------------------------------------------------------
    def query(self, rows: exp.Expression) -> exp.Select:
        """Features of the target rows that `rows` (a table with the key columns and `_rid`) names,
        in `_rid` order: `_rid`, then one column per name."""
        t = "t"
        on = exp.and_(*[exp.NullSafeEQ(this=q.col(k, "r"), expression=q.col(k, t)) for k in self.keys])
        select = (exp.select(q.col("_rid", "r"))
                  .from_(exp.alias_(rows, q.ident("r"), table=True))
                  .join(exp.alias_(_table(self.table), q.ident(t), table=True), on=on, join_type="left"))
        values = [_value(c, t) for c in self.own]
        for i, p in enumerate(self.parents):
            alias = f"p{i}"
            link = exp.and_(*[exp.EQ(this=q.col(a, t), expression=q.col(b, alias)) for a, b in zip(p.columns, p.references)])
            select = select.join(exp.alias_(_table(p.table), q.ident(alias), table=True), on=link, join_type="left")
            values += [_value(c, alias) for c in p.features]
        for i, child in enumerate(self.children):
            alias = f"a{i}"
            link = exp.and_(*[exp.NullSafeEQ(this=q.col(f"k{j}", alias), expression=q.col(k, t))
                              for j, k in enumerate(self.keys)])
            select = select.join(exp.alias_(self._aggregates(child).subquery(), q.ident(alias), table=True), on=link,
                                 join_type="left")
            none = exp.Coalesce(this=q.col("n", alias), expressions=[q.real(0.0)])  # no child rows: 0, no target row: NULL
            values.append(exp.Case(ifs=[exp.If(this=exp.Is(this=q.col(self.keys[0], t), expression=exp.Null()),
                                               true=exp.cast(exp.Null(), "DOUBLE"))], default=none))
            values += [q.col(f"f{j}_{a}", alias) for j in range(len(child.features)) for a in AGGREGATES]
        return select.select(*[q.alias(v, f"x{i}") for i, v in enumerate(values)], copy=False).order_by(q.col("_rid", "r"))

    def _aggregates(self, child: Child) -> exp.Select:
        """Per target row: the count of its (earlier) child rows and their mean/min/max per column."""
        t, c = "t", "c"
        link = [exp.EQ(this=q.col(a, c), expression=q.col(b, t)) for a, b in zip(child.columns, child.references)]
        select = exp.select(*[q.alias(q.col(k, t), f"k{j}") for j, k in enumerate(self.keys)])
        select = select.select(q.alias(exp.cast(exp.Count(this=exp.Star()), "DOUBLE"), "n"), copy=False)
        for j, f in enumerate(child.features):
            value = _value(f, c)
            select = select.select(*[q.alias(fn(this=value.copy()), f"f{j}_{a}") for a, fn in
                                     zip(AGGREGATES, (exp.Avg, exp.Min, exp.Max))], copy=False)
        select = select.from_(exp.alias_(_table(self.table), q.ident(t), table=True))
        if child.time is not None and self.time_column is not None:
            when = q.col(child.time, c)
            if child.via:
                fk, dimension, refs = child.via
                select = select.join(exp.alias_(_table(child.table), q.ident(c), table=True), on=exp.and_(*link))
                link = [exp.EQ(this=q.col(a, c), expression=q.col(b, "d")) for a, b in zip(fk, refs)]
                select = select.join(exp.alias_(_table(dimension), q.ident("d"), table=True), on=exp.and_(*link))
                when = q.col(child.time, "d")
                link = []
            from relsql.template.auto import before

            cut = before(when.sql("duckdb"), child.time_kind, q.col(self.time_column, t).sql("duckdb"), self.time_kind)
            link.append(exp.condition(cut, dialect="duckdb") if cut is not None else exp.false())
        if link:
            select = select.join(exp.alias_(_table(child.table), q.ident(c), table=True), on=exp.and_(*link))
        return select.group_by(*[q.col(k, t) for k in self.keys])

    def matrix(self, db: Database, rows: exp.Expression) -> tuple[np.ndarray, np.ndarray]:
        """(`_rid`s, float64 features) of the rows `rows` names, in `_rid` order; NULL is NaN."""
        table = db.arrow(self.query(rows))
        rids = table.column(0).to_numpy(zero_copy_only=False).astype(np.int64)
        columns = [table.column(i).to_numpy(zero_copy_only=False) for i in range(1, table.num_columns)]
        matrix = np.stack([np.asarray(c, dtype=np.float64) for c in columns], axis=1) if columns else np.zeros((len(rids), 0))
        return rids, matrix

    def of_output(self, db: Database, output: str, size: int) -> np.ndarray:
        """Features of every row of a model's output relation (rows 0..size-1 by `_rid`), from its key
        table in the database: NaN for an output row without a target row."""
        rids, matrix = self.matrix(db, db.temp_table("k", output))
        out = np.full((size, matrix.shape[1]), np.nan)
        inside = (rids >= 0) & (rids < size)
        out[rids[inside]] = matrix[inside]
        return out


def _table(name: str) -> exp.Table:
    return exp.Table(this=q.ident(name))


def _value(column: Column, table: str) -> exp.Expression:
    """A column as a DOUBLE: a number as it is, a date as epoch seconds, text as its code."""
    ref = q.col(column.name, table)
    if column.kind == "code":
        ref = exp.cast(ref, "VARCHAR")
    if column.kind == "time":
        return exp.cast(exp.TimeToUnix(this=ref), "DOUBLE")
    if column.kind == "code":
        ifs = [exp.If(this=exp.EQ(this=ref.copy(), expression=exp.Literal.string(v)), true=q.real(float(i)))
               for i, v in enumerate(column.codes)]
        return exp.Case(ifs=ifs, default=exp.Null()) if ifs else exp.cast(exp.Null(), "DOUBLE")
    return exp.cast(ref, "DOUBLE")


# -- which columns ---------------------------------------------------------------------------------
def plan(db: Database, table: str, column: str, time_column: str | None = None, keys=None) -> Flat:
    """The one-hop features of target `table.column` (see the module docstring)."""
    from relsql.data.keys import schema
    from relsql.predictive.terms import TASK_COLUMNS, is_task_table
    from relsql.template.auto import table_times as _times
    from relsql.train.task.leakage import copies_of

    catalog = db.catalog()
    if table not in catalog.tables:
        raise RelsqlError(f"one-hop features: table `{table}` does not exist; tables: {', '.join(catalog.names)}")
    found = schema(db, catalog, **({"given": keys} if keys is not None else {}))
    tasks = {n for n, info in found.tables.items() if n != table and is_task_table(info.columns)}
    keyed = key_columns(found)
    primary = list(found.primary_keys.get(table) or ())
    if not primary:
        raise RelsqlError(f"one-hop features: target table `{table}` has no primary key (declared or inferable); declare one")
    skip = {column.casefold(), *(c for c in copies_of(db, table, column))} | ({time_column.casefold()} if time_column else set())
    own = _features(db, found.tables[table], keyed.get(table, set()) | skip, found.values.get(table, set()))
    parents = [Parent(list(fk.columns), fk.table, list(fk.references),
                      _features(db, found.tables[fk.table], keyed.get(fk.table, set()), found.values.get(fk.table, set())))
               for child, fk in found.foreign_keys if child == table and fk.table not in tasks and fk.table in found.tables]
    times = _times(db, catalog, found, table, time_column, {}) if time_column else {}
    children = []
    for child, fk in found.foreign_keys:
        if fk.table != table or child in tasks:
            continue
        time = times.get(child)
        if time_column and time is None:
            continue  # events whose time is unknown may lie after the target row's time
        numbers = [c for c in _features(db, found.tables[child], keyed.get(child, set()) | ({c.casefold() for c in TASK_COLUMNS}),
                                        found.values.get(child, set()))
                   if c.kind != "code"]
        via = [list(time.via.columns), time.via.table, list(time.via.references)] if time and time.via else None
        children.append(Child(child, list(fk.columns), list(fk.references), numbers, time.column if time else None, via,
                              time.kind if time else "date"))
    kind = times[table].kind if time_column else "date"
    return Flat(table, primary, time_column, own, [p for p in parents if p.features], children, kind)


def key_columns(found) -> dict[str, set[str]]:
    """Per table, its key columns (folded): primary key, foreign key columns, referenced columns."""
    out: dict[str, set[str]] = {}
    for name, columns in found.primary_keys.items():
        out.setdefault(name, set()).update(c.casefold() for c in columns)
    for child, fk in found.foreign_keys:
        out.setdefault(child, set()).update(c.casefold() for c in fk.columns)
        out.setdefault(fk.table, set()).update(c.casefold() for c in fk.references)
    return out


def _features(db: Database, info, skip: set[str], values: set[str] = frozenset()) -> list[Column]:
    """A table's columns that may enter as features, with their kinds. `values`: columns named like
    identifiers that are values (a year no key holds, relsql.data.keys.Schema.is_value)."""
    from relsql.template.auto import id_like, is_interval

    out = []
    for c in info.columns:
        kind, upper = None, c.type.upper()
        if c.name.casefold() in skip or (id_like(c.name) and c.name not in values) or "[]" in upper or is_interval(upper) \
                or "STRUCT" in upper or "MAP" in upper:
            continue
        if any(t in upper for t in _TIMES):
            kind = "time"
        elif any(n in upper for n in _NUMBERS):
            kind = "number"
        elif any(n in upper for n in ("CHAR", "TEXT", "STRING", "ENUM")):
            codes = _codes(db, info.name, c.name)
            if codes is not None:
                out.append(Column(c.name, "code", codes))
            continue
        if kind:
            out.append(Column(c.name, kind))
    return out


def _codes(db: Database, table: str, column: str) -> list[str] | None:
    """The sorted distinct values of a text column, or None when there are more than MAX_CODES."""
    ref = exp.cast(q.col(column), "VARCHAR")
    query = (exp.select(q.alias(ref, "v")).distinct().from_(_table(table))
             .where(exp.Not(this=exp.Is(this=q.col(column), expression=exp.Null()))).order_by(q.col("v"))
             .limit(q.integer(MAX_CODES + 1)))
    values = db.arrow(query).column(0).to_pylist()
    return None if len(values) > MAX_CODES else [str(v) for v in values]
