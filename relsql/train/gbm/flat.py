"""One-hop features computed by the database: the propositionalization a GBM learns from.

For each row of the target table: its own columns; the columns of each parent row (one foreign
key step up, many-to-one); and for each child table (a foreign key into the target table) the
count of its rows and the mean, min and max of each numeric column. At depth 2 (`plan(depth=2)`,
the blend's GBM: relsql/train/gbm/hybrid.py) also the parents' parents' columns, each parent's
other children aggregated the same way (siblings: the same plane's other flights), and the mean
of each child row's own parents' columns; two-hop parts are capped (MAX_FEATURES, MAX_PAIRS). All
of it is one SQL query built with sqlglot, run by the database.

What enters, and how: numbers, booleans (0/1), dates and timestamps (epoch seconds), and text
with at most MAX_CODES distinct values as an integer code (its position among the sorted values;
an unseen value is NULL). Never: key columns (primary and foreign, declared or inferred, see
relsql.data.keys.schema), columns named like identifiers (relsql.template.auto.id_like), the target
column, copies of it, the target's time column, task tables of other questions. NULL stays NaN.

With a time column (a temporal target), a child row counts only if its time (relsql.template.auto's
rules: its own date column, or a date dimension's) is earlier than the target row's time; child
tables whose time is unknown are left out, as Template.auto leaves them out. Under that cut a
sibling's target column is a feature (earlier labels are known at the target row's time); without
one it never is.

`Flat` is plain data (names and values, no code): a saved model recomputes the same features on
another database, in the same order with the same codes.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

import numpy as np
import sqlglot.expressions as exp

from relsql import sql as q
from relsql.data.engine import Database
from relsql.errors import RelsqlError

MAX_CODES = 100  # a text column with more distinct values is left out (a name, free text)
AGGREGATES = ("avg", "min", "max")
MAX_FEATURES = 400  # two-hop parts beyond this many features are left out (one-hop ones never)
MAX_PAIRS = 5_000_000  # a timed join of a parent's other children reading more pairs is left out (a hub)
# a timed join of a parent's other children reading at least this many pairs per row of its two tables is
# computed as running aggregates instead (Flat._running: sorting is cheaper than the pairs there; below it
# the join is, the window's own cost ~3x the join's on the small tables of the outside corpus)
RUNNING_PAIRS_PER_ROW = 200
SETTLED_BITS = 32  # the bits of mantissa a feature keeps (`settled`): within 2^-33 relative, 0.25 s of a 2020 epoch time


@dataclass
class Column:
    """One column as a feature: `kind` number, time (epoch seconds) or code (`codes` in order)."""

    name: str
    kind: str
    codes: list[str] = field(default_factory=list)


@dataclass
class Parent:
    columns: list[str]  # the target table's foreign key columns (or those of parent `of`)
    table: str
    references: list[str]
    features: list[Column]
    of: int = -1  # -1: a parent of the target row; i >= 0: a parent of parent i (two hops up)


@dataclass
class Child:
    table: str
    columns: list[str]  # the child's foreign key columns into the target table
    references: list[str]
    features: list[Column]
    time: str | None = None  # the child's time column (or the date dimension's, with `via`)
    via: list | None = None  # [fk columns, dimension table, referenced columns] for a date dimension
    time_kind: str = "date"  # how its time orders rows (relsql.template.auto.time_kind): date, year, number
    through: str | None = None  # a parent's other children: the parent table whose key `references` holds
    lookups: list[Parent] = field(default_factory=list)  # the child rows' own parents, their columns averaged
    running: bool = False  # timed and read through a parent: computed as running aggregates (Flat._running)


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
            up = f"{self.parents[p.of].table}." if p.of >= 0 else ""
            names += [f"{up}{p.table}({','.join(p.columns)}).{c.name}" for c in p.features]
        for c in self.children:
            up = f"{c.through}." if c.through else ""
            names.append(f"count({up}{c.table}({','.join(c.columns)}))")
            names += [f"{a}({up}{c.table}.{f.name})" for f in c.features for a in AGGREGATES]
            names += [f"avg({up}{c.table}.{p.table}({','.join(p.columns)}).{f.name})" for p in c.lookups for f in p.features]
        return names

    @property
    def depth(self) -> int:
        """2 when any feature lies two hops away (see `plan`), else 1."""
        return 2 if any(p.of >= 0 for p in self.parents) or any(c.through or c.lookups for c in self.children) else 1

    def to_plain(self) -> dict:
        return asdict(self)

    @classmethod
    def from_plain(cls, data: dict, where: str = "one-hop features") -> Flat:
        """A Flat from `to_plain`'s dict, checked: its names and codes reach SQL (as quoted
        identifiers and typed literals)."""
        try:
            flat = cls(table=data["table"], keys=list(data["keys"]), time_column=data["time_column"],
                       own=[Column(**c) for c in data["own"]], parents=[_parent(p) for p in data["parents"]],
                       children=[Child(**{**c, "features": [Column(**f) for f in c["features"]],
                                          "lookups": [_parent(p) for p in c.get("lookups", [])]})
                                 for c in data["children"]],
                       **({"time_kind": data["time_kind"]} if "time_kind" in data else {}))
        except (KeyError, TypeError):
            raise RelsqlError(f"{where} is damaged: not a description of one-hop features") from None
        texts = [flat.table, *flat.keys, *([flat.time_column] if flat.time_column else [])]
        lookups = [p for ch in flat.children for p in ch.lookups]
        columns = [*flat.own, *[c for p in [*flat.parents, *lookups] for c in p.features],
                   *[c for ch in flat.children for c in ch.features]]
        texts += [c.name for c in columns] + [s for c in columns for s in c.codes]
        for p in [*flat.parents, *lookups]:
            texts += [p.table, *p.columns, *p.references]
        if any(type(p.of) is not int or not -1 <= p.of < i or (p.of >= 0 and flat.parents[p.of].of != -1)
               for i, p in enumerate(flat.parents)) or any(p.of != -1 for p in lookups):
            raise RelsqlError(f"{where} is damaged: a parent's link")
        for c in flat.children:
            texts += [c.table, *c.columns, *c.references, *([c.time] if c.time else []), *([c.through] if c.through else [])]
            if c.via is not None:
                if not (isinstance(c.via, list) and len(c.via) == 3
                        and isinstance(c.via[0], list) and isinstance(c.via[2], list)):
                    raise RelsqlError(f"{where} is damaged: a date dimension's link")
                texts += [*c.via[0], c.via[1], *c.via[2]]
        if not all(isinstance(t, str) for t in texts) or any(c.kind not in ("number", "time", "code") for c in columns):
            raise RelsqlError(f"{where} is damaged: its names are not all text")
        if any(type(c.running) is not bool for c in flat.children):
            raise RelsqlError(f"{where} is damaged: a child's form")
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
                  .from_(exp.alias_(rows, q.ident("r"), table=True), copy=False)
                  .join(exp.alias_(_table(self.table), q.ident(t), table=True), on=on, join_type="left", copy=False))
        values = [_value(c, t) for c in self.own]
        for i, p in enumerate(self.parents):
            alias, below = f"p{i}", (f"p{p.of}" if p.of >= 0 else t)
            select = select.join(exp.alias_(_table(p.table), q.ident(alias), table=True), on=_link(p, below, alias),
                                 join_type="left", copy=False)
            values += [_value(c, alias) for c in p.features]
        for i, child in enumerate(self.children):
            alias = f"a{i}"
            if child.through and not self._cut(child):
                # a parent's other children, untimed: aggregated per parent row once, then looked up
                sub, link = self._grouped(child), [exp.EQ(this=q.col(f"k{j}", alias), expression=q.col(r, t))
                                                   for j, r in enumerate(child.references)]
            else:
                sub, link = self._aggregates(child), [exp.NullSafeEQ(this=q.col(f"k{j}", alias), expression=q.col(k, t))
                                                      for j, k in enumerate(self.keys)]
            select = select.join(exp.alias_(sub.subquery(copy=False), q.ident(alias), table=True), on=exp.and_(*link),
                                 join_type="left", copy=False)
            none = exp.Coalesce(this=q.col("n", alias), expressions=[q.real(0.0)])  # no child rows: 0, no target row: NULL
            values.append(exp.Case(ifs=[exp.If(this=exp.Is(this=q.col(self.keys[0], t), expression=exp.Null()),
                                               true=_as(exp.Null(), exp.DataType.Type.DOUBLE))], default=none))
            values += [q.col(name, alias) for name in _aggregate_names(child)]
        return select.select(*[q.alias(v, f"x{i}") for i, v in enumerate(values)], copy=False).order_by(q.col("_rid", "r"),
                                                                                                     copy=False)

    def _cut(self, child: Child) -> bool:
        return child.time is not None and self.time_column is not None

    def _measures(self, child: Child, select: exp.Select) -> exp.Select:
        """`select` with the child rows' count, mean/min/max per column, and the mean of each of
        their own parents' columns (joined to alias `c` as `l0`, `l1`, ...)."""
        c = "c"
        select = select.select(q.alias(_as(exp.Count(this=exp.Star()), exp.DataType.Type.DOUBLE), "n"), copy=False)
        measures = [fn(this=_value(f, c)) for f in child.features for fn in (exp.Avg, exp.Min, exp.Max)]
        measures += [exp.Avg(this=_value(f, f"l{i}")) for i, p in enumerate(child.lookups) for f in p.features]
        return select.select(*[q.alias(m, name) for m, name in zip(measures, _aggregate_names(child))], copy=False)

    def _lookups(self, child: Child, select: exp.Select) -> exp.Select:
        for i, p in enumerate(child.lookups):
            select = select.join(exp.alias_(_table(p.table), q.ident(f"l{i}"), table=True), on=_link(p, "c", f"l{i}"),
                                 join_type="left", copy=False)
        return select

    def _grouped(self, child: Child) -> exp.Select:
        """Per value of the child's foreign key: its rows' measures (no time cut)."""
        c = "c"
        select = exp.select(*[q.alias(q.col(k, c), f"k{j}") for j, k in enumerate(child.columns)])
        select = self._measures(child, select).from_(exp.alias_(_table(child.table), q.ident(c), table=True), copy=False)
        return self._lookups(child, select).group_by(*[q.col(k, c) for k in child.columns], copy=False)

    def _aggregates(self, child: Child) -> exp.Select:
        """Per target row: the count of its (earlier) child rows and their measures."""
        if child.running and self._cut(child):  # set only for a timed parent's other children (`plan`)
            running = self._running(child)
            if running is not None:
                return running
        t, c = "t", "c"
        link = [exp.EQ(this=q.col(a, c), expression=q.col(b, t)) for a, b in zip(child.columns, child.references)]
        select = exp.select(*[q.alias(q.col(k, t), f"k{j}") for j, k in enumerate(self.keys)])
        select = self._measures(child, select).from_(exp.alias_(_table(self.table), q.ident(t), table=True), copy=False)
        if self._cut(child):
            from relsql.template.auto import before

            when = q.col(child.time, "d" if child.via else c)
            cut = before(when.sql("duckdb"), child.time_kind, q.col(self.time_column, t).sql("duckdb"), self.time_kind)
            cut = exp.condition(cut, dialect="duckdb") if cut is not None else exp.false()
            if child.via:  # the child row, then its date in the dimension, earlier than the target's time
                fk, dimension, refs = child.via
                select = select.join(exp.alias_(_table(child.table), q.ident(c), table=True), on=exp.and_(*link), copy=False)
                link = [exp.EQ(this=q.col(a, c), expression=q.col(b, "d")) for a, b in zip(fk, refs)]
                select = select.join(exp.alias_(_table(dimension), q.ident("d"), table=True), on=exp.and_(*link, cut),
                                     copy=False)
                return self._lookups(child, select).group_by(*[q.col(k, t) for k in self.keys], copy=False)
            link.append(cut)
        select = select.join(exp.alias_(_table(child.table), q.ident(c), table=True), on=exp.and_(*link), copy=False)
        return self._lookups(child, select).group_by(*[q.col(k, t) for k in self.keys], copy=False)

    def _running(self, child: Child) -> exp.Select | None:
        """A parent's other children earlier than each target row, as running aggregates: the
        child rows and the target rows in one stream per parent key, in time order (a target row
        before a child row of the same time: the cut is strict), each target row reading the
        aggregates of the child rows before it. The join on the key and `c.time < t.time` it
        replaces reads every (target row, child row) pair of a parent: 6,099 flights x the ~2,000
        earlier flights of their carrier; this sorts each side once. None where the two times do
        not compare (the join then finds nothing)."""
        from relsql.template.auto.times import on_event_scale

        t, c, d = "t", "c", "d"
        when = q.col(child.time, d if child.via else c)
        order = on_event_scale(q.col(self.time_column, t).sql("duckdb"), self.time_kind, child.time_kind)
        if order is None:
            return None
        double = exp.DataType.Type.DOUBLE
        values = [_value(f, c) for f in child.features]
        links = [f"g{j}" for j in range(len(child.columns))]
        keys = [f"k{j}" for j in range(len(self.keys))]
        events = exp.select(*[q.alias(q.col(k, c), g) for k, g in zip(child.columns, links)], q.alias(when, "w"),
                            q.alias(exp.true(), "_c"), *[q.alias(exp.Null(), k) for k in keys],  # typed by the targets' keys
                            *[q.alias(v, f"v{i}") for i, v in enumerate(values)]).from_(
            exp.alias_(_table(child.table), q.ident(c), table=True), copy=False)
        if child.via:
            fk, dimension, refs = child.via
            events = events.join(exp.alias_(_table(dimension), q.ident(d), table=True), on=exp.and_(
                *[exp.EQ(this=q.col(a, c), expression=q.col(b, d)) for a, b in zip(fk, refs)]), copy=False)
        present = [exp.Not(this=exp.Is(this=e, expression=exp.Null())) for e in [*[q.col(k, c) for k in child.columns], when]]
        events = events.where(exp.and_(*present), copy=False)
        target_time = exp.condition(order, dialect="duckdb")
        targets = exp.select(*[q.alias(q.col(r, t), g) for r, g in zip(child.references, links)],
                             q.alias(target_time, "w"), q.alias(exp.false(), "_c"),
                             *[q.alias(q.col(k, t), name) for k, name in zip(self.keys, keys)],
                             *[q.alias(_as(exp.Null(), double), f"v{i}") for i in range(len(values))]).from_(
            exp.alias_(_table(self.table), q.ident(t), table=True), copy=False).where(exp.and_(
                *[exp.Not(this=exp.Is(this=e, expression=exp.Null()))
                  for e in [*[q.col(r, t) for r in child.references], target_time.copy()]]), copy=False)
        stream = exp.union(events, targets, distinct=False, copy=False)
        frame = exp.WindowSpec(kind="ROWS", start="UNBOUNDED", start_side="PRECEDING", end="1", end_side="PRECEDING")

        def over(aggregate: exp.Expression) -> exp.Expression:
            filtered = exp.Filter(this=aggregate, expression=exp.Where(this=q.col("_c")))
            return exp.Window(this=filtered, partition_by=[q.col(g) for g in links],
                              order=exp.Order(expressions=[exp.Ordered(this=q.col("w")), exp.Ordered(this=q.col("_c"))]),
                              spec=frame.copy())

        measures = [q.alias(_as(over(exp.Count(this=exp.Star())), double), "n")]
        measures += [q.alias(over(fn(this=q.col(f"v{i}"))), f"f{i}_{name}")
                     for i in range(len(values)) for fn, name in zip((exp.Avg, exp.Min, exp.Max), AGGREGATES)]
        running = exp.select(*[q.col(k) for k in keys], q.col("_c"), *measures).from_(
            exp.alias_(exp.Subquery(this=stream), q.ident("s"), table=True), copy=False)
        return exp.select(*[q.col(k) for k in keys], q.col("n"), *[q.col(name) for name in _aggregate_names(child)]).from_(
            exp.alias_(running.subquery(copy=False), q.ident("e"), table=True), copy=False).where(
            exp.and_(exp.Not(this=q.col("_c")), exp.GT(this=q.col("n"), expression=q.real(0.0))), copy=False)

    def matrix(self, db: Database, rows: exp.Expression) -> tuple[np.ndarray, np.ndarray]:
        """(`_rid`s, float64 features) of the rows `rows` names, in `_rid` order; NULL is NaN."""
        table = db.arrow(self.query(rows))
        rids = table.column(0).to_numpy(zero_copy_only=False).astype(np.int64)
        columns = [table.column(i).to_numpy(zero_copy_only=False) for i in range(1, table.num_columns)]
        matrix = np.stack([np.asarray(c, dtype=np.float64) for c in columns], axis=1) if columns else np.zeros((len(rids), 0))
        return rids, settled(matrix)

    def of_output(self, db: Database, output: str, size: int) -> np.ndarray:
        """Features of every row of a model's output relation (rows 0..size-1 by `_rid`), from its key
        table in the database: NaN for an output row without a target row."""
        rids, matrix = self.matrix(db, db.temp_table("k", output))
        out = np.full((size, matrix.shape[1]), np.nan)
        inside = (rids >= 0) & (rids < size)
        out[rids[inside]] = matrix[inside]
        return out


def settled(matrix: np.ndarray, bits: int = SETTLED_BITS) -> np.ndarray:
    """`matrix` with every number's mantissa rounded to `bits` bits (the exponent, NaN and
    infinities kept). A database adds a mean's terms in an order its threads choose: the same
    feature came back one unit in the last place apart between two queries of one database, so
    equal values became distinct, the trees' bins and splits moved, and a loaded model predicted
    other numbers than the model saved. Rounded, such values are equal again (they differ only
    where they straddle a rounding boundary: about 2^-(53 - bits) of them, 1e-6 at 32 bits)."""
    mantissa, exponent = np.frexp(matrix)
    return np.ldexp(np.round(mantissa * 2.0 ** bits) / 2.0 ** bits, exponent)


def _parent(data: dict) -> Parent:
    return Parent(**{**data, "features": [Column(**c) for c in data["features"]]})


def _link(parent: Parent, below: str, alias: str) -> exp.Expression:
    """`below`'s foreign key columns equal parent `alias`'s referenced columns."""
    return exp.and_(*[exp.EQ(this=q.col(a, below), expression=q.col(b, alias))
                      for a, b in zip(parent.columns, parent.references)])


def _aggregate_names(child: Child) -> list[str]:
    """The columns a child's aggregate subquery gives after `n`, in `Flat.names`' order."""
    names = [f"f{j}_{a}" for j in range(len(child.features)) for a in AGGREGATES]
    return names + [f"l{i}_{j}" for i, p in enumerate(child.lookups) for j in range(len(p.features))]


def _table(name: str) -> exp.Table:
    return exp.Table(this=q.ident(name))


def _as(value: exp.Expression, kind: exp.DataType.Type) -> exp.Cast:
    """CAST(value AS kind), built without parsing the type's name (a GBM query holds thousands)."""
    return exp.Cast(this=value, to=exp.DataType(this=kind))


def _value(column: Column, table: str) -> exp.Expression:
    """A column as a DOUBLE: a number as it is, a date as epoch seconds, text as its code."""
    ref = q.col(column.name, table)
    if column.kind == "code":
        ref = _as(ref, exp.DataType.Type.VARCHAR)
    if column.kind == "time":
        return _as(exp.TimeToUnix(this=ref), exp.DataType.Type.DOUBLE)
    if column.kind == "code":
        ifs = [exp.If(this=exp.EQ(this=ref.copy(), expression=exp.Literal.string(v)), true=q.real(float(i)))
               for i, v in enumerate(column.codes)]
        return exp.Case(ifs=ifs, default=exp.Null()) if ifs else _as(exp.Null(), exp.DataType.Type.DOUBLE)
    return _as(ref, exp.DataType.Type.DOUBLE)


# -- which columns ---------------------------------------------------------------------------------
def plan(db: Database, table: str, column: str, time_column: str | None = None, keys=None, depth: int = 1) -> Flat:
    """The features of target `table.column` (see the module docstring): one hop, or with
    `depth=2` also two (Deep Feature Synthesis' depth 2, as far as the database computes it in one
    query): the parents' parents, each parent's other children (a plane's earlier flights, a
    player's earlier salaries: under the time cut, the target column's earlier values among them;
    without one, never the target column), and the mean of each child's own parents' columns."""
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
    label = {column.casefold(), *(c for c in copies_of(db, table, column))}
    skip = label | ({time_column.casefold()} if time_column else set())
    seen: dict[tuple, list[Column]] = {}

    def features(name: str, leave: frozenset[str] = frozenset(), numbers: bool = False) -> list[Column]:
        if (name, leave) not in seen:
            seen[name, leave] = _features(db, found.tables[name], keyed.get(name, set()) | leave, found.values.get(name, set()))
        return [c for c in seen[name, leave] if not numbers or c.kind != "code"]

    def usable(name: str) -> bool:
        return name not in tasks and name in found.tables

    own = features(table, frozenset(skip))
    ups = [fk for child, fk in found.foreign_keys if child == table and usable(fk.table)]
    parents = [Parent(list(fk.columns), fk.table, list(fk.references), features(fk.table)) for fk in ups]
    times = _times(db, catalog, found, table, time_column, {}) if time_column else {}
    events = frozenset(c.casefold() for c in TASK_COLUMNS)

    def child_of(name: str, fk, references: list[str], through: str | None, leave: frozenset[str]) -> Child | None:
        time = times.get(name)
        if time_column and time is None:
            return None  # events whose time is unknown may lie after the target row's time
        lookups = [] if depth < 2 or through else [
            Parent(list(up.columns), up.table, list(up.references), features(up.table, numbers=True))
            for below, up in found.foreign_keys if below == name and up.table != table and usable(up.table)]
        via = [list(time.via.columns), time.via.table, list(time.via.references)] if time and time.via else None
        return Child(name, list(fk.columns), references, features(name, leave, numbers=True), time.column if time else None,
                     via, time.kind if time else "date", through, [p for p in lookups if p.features])

    children = [child_of(name, fk, list(fk.references), None, events)
                for name, fk in found.foreign_keys if fk.table == table and usable(name)]
    if depth >= 2:
        for i, up in enumerate(ups):
            parents += [Parent(list(fk.columns), fk.table, list(fk.references), features(fk.table), of=i)
                        for below, fk in found.foreign_keys
                        if below == up.table and fk.table != table and usable(fk.table)]
        for up in ups:
            if up.table == table:
                continue
            for name, fk in found.foreign_keys:
                if fk.table != up.table or tuple(fk.references) != tuple(up.references) or not usable(name):
                    continue
                leave = events | (frozenset(label) if name == table and not time_column else frozenset())
                cousin = child_of(name, fk, list(up.columns), up.table, leave)
                if cousin is None or not time_column:
                    children.append(cousin)
                    continue
                pairs = _pairs(db, table, up.columns, name, fk.columns)
                if pairs <= MAX_PAIRS:
                    rows = sum(db.scalar(exp.select(exp.Count(this=exp.Star())).from_(_table(n)))[0] for n in {table, name})
                    children.append(replace(cousin, running=pairs >= RUNNING_PAIRS_PER_ROW * max(rows, 1)))
    kind = times[table].kind if time_column else "date"
    kept = [i for i, p in enumerate(parents) if p.of == -1 and (p.features or any(g.of == i and g.features for g in parents))]
    moved = {i: j for j, i in enumerate(kept)}
    parents = [parents[i] for i in kept] + [replace(p, of=moved[p.of]) for p in parents if p.of in moved and p.features]
    return _within(Flat(table, primary, time_column, own, parents, [c for c in children if c is not None], kind))


def _within(spec: Flat) -> Flat:
    """`spec` with its two-hop parts dropped from the last (a parent's other children, then the
    children's parents, then the parents' parents) until it has at most MAX_FEATURES features:
    a wide schema's GBM stays a few hundred columns, as DFS's is (the one-hop part is never cut)."""
    while len(spec.names) > MAX_FEATURES:
        cousins = [i for i, c in enumerate(spec.children) if c.through]
        looked = [i for i, c in enumerate(spec.children) if c.lookups]
        if cousins:
            spec = replace(spec, children=spec.children[:cousins[-1]] + spec.children[cousins[-1] + 1:])
        elif looked:
            child = spec.children[looked[-1]]
            spec.children[looked[-1]] = replace(child, lookups=child.lookups[:-1])
        elif any(p.of >= 0 for p in spec.parents):
            spec = replace(spec, parents=spec.parents[:-1])  # the parents' parents come last
        else:
            break
    return spec


def _pairs(db: Database, table: str, columns, child: str, child_columns) -> int:
    """How many (target row, child row) pairs share a foreign key value: the rows a timed join of a
    parent's other children reads before its time cut."""
    def counts(name: str, keys) -> exp.Select:
        return (exp.select(*[q.alias(q.col(k), f"k{j}") for j, k in enumerate(keys)],
                           q.alias(exp.Count(this=exp.Star()), "n"))
                .from_(_table(name)).group_by(*[q.col(k) for k in keys]))

    on = exp.and_(*[exp.EQ(this=q.col(f"k{j}", "a"), expression=q.col(f"k{j}", "b")) for j in range(len(columns))])
    query = (exp.select(exp.Sum(this=exp.Mul(this=exp.cast(q.col("n", "a"), "DOUBLE"), expression=q.col("n", "b"))))
             .from_(exp.alias_(counts(table, columns).subquery(), q.ident("a"), table=True))
             .join(exp.alias_(counts(child, child_columns).subquery(), q.ident("b"), table=True), on=on))
    row = db.scalar(query)
    return int(row[0] or 0) if row else 0


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
    from relsql.data.coltypes import is_flag, is_interval, is_nested, is_number, is_text, is_time_type
    from relsql.template.auto import id_like

    out = []
    for c in info.columns:
        kind = None
        if c.name.casefold() in skip or (id_like(c.name) and c.name not in values) or is_nested(c.type) \
                or is_interval(c.type):
            continue
        if is_time_type(c.type):
            kind = "time"
        elif is_number(c.type) or is_flag(c.type):
            kind = "number"
        elif is_text(c.type):
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
