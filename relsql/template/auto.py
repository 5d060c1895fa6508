"""Automatic SQL templates from a schema's keys: `relsql template <db> --target t.c`.

The generated file is plain relsql SQL a user can read and edit. Its shape is the computation
tree of a relational GNN rooted at the target row: every table reachable within `hops`
foreign-key steps (both directions, never straight back over the edge just used) becomes a
tree node keyed by (target row, node row); nodes are filled top-down, then their values flow
bottom-up, with separate weights per foreign key and direction and a self term at each node.
Keying nodes by the target row is what lets `time_column` keep each target's future out: a
row joins the tree only if it is earlier than that target row's time.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import sqlglot.expressions as exp

from relsql import arguments
from relsql.catalog import ForeignKey, Table
from relsql.db import Database
from relsql.errors import SchemaError
from relsql.template import ir
from relsql.template.keys import Schema, schema
from relsql.train.task import detect

_FEATURE_TYPES = ("INT", "DECIMAL", "NUMERIC", "DOUBLE", "FLOAT", "REAL", "BOOL", "DATE", "TIMESTAMP")
_TIME_TYPES = ("DATE", "TIMESTAMP")
MAX_CATEGORIES = 1000  # text columns with more distinct values are skipped
SMALL_INTEGER_CATEGORIES = 10  # integer columns with at most this many values are codes


def _qi(name: str) -> str:
    return exp.to_identifier(name, quoted=True).sql("duckdb")


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


def _tree(schema: Schema, target: str, hops: int, labels: dict[str, str]) -> Node:
    """The computation tree; `labels` are the tables' distinct sanitized names. Node names are
    distinct too (they name relations x_<node>, p_<node>, h_<node> and weights)."""
    root = Node(labels[target], target, None, None)
    node_names = _Names([root.name])

    def grow(node: Node, depth: int) -> None:
        if depth == hops:
            return
        seen: dict[str, int] = {}
        for step in _steps(schema, node.table):
            if node.step is not None and step.fk == node.step.fk and step.child == node.step.child \
                    and step.to_child != node.step.to_child:
                continue  # never straight back over the edge we came by
            far = step.child if step.to_child else step.fk.table
            label = labels[far]
            seen[label] = seen.get(label, 0) + 1
            if seen[label] > 1 or sum(1 for s in _steps(schema, node.table)
                                      if (s.child if s.to_child else s.fk.table) == far) > 1:
                label = f"{label}_by_{_safe('_'.join(step.fk.columns))}"
            child = Node(node_names(f"{node.name}__{label}" if node.parent else label), far, step, node)
            node.children.append(child)
            grow(child, depth + 1)

    grow(root, 0)
    return root


def _walk(node: Node):
    yield node
    for child in node.children:
        yield from _walk(child)


class _Writer:
    def __init__(self, db: Database, schema: Schema, target: str, column: str, *, width: int, hops: int,
                 aggregation: str, time_column: str | None, time_columns: dict[str, str], labels: dict[str, str]):
        self.db, self.schema, self.target, self.column = db, schema, target, column
        self.labels = labels
        self.weight_name = _Names()
        self.width, self.hops, self.aggregation = width, hops, aggregation
        self.time_column, self.time_columns = time_column, time_columns
        self.out: list[str] = []
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
        numeric, categorical, skipped = [], [], []
        for col in info.columns:
            if col.name in keys or col.name in fks or (table == self.target and col.name == self.column):
                continue
            upper = col.type.upper()
            text = "CHAR" in upper or "TEXT" in upper or "STRING" in upper or "ENUM" in upper
            integer = "INT" in upper and "[]" not in upper
            distinct = self.distinct(table, col.name) if text or integer else 0
            if integer and distinct <= SMALL_INTEGER_CATEGORIES:
                categorical.append(col.name)  # a code such as a type or level: embedded
            elif any(t in upper for t in _FEATURE_TYPES) and "[]" not in upper:
                numeric.append(col.name)
            elif text:
                (categorical if distinct <= MAX_CATEGORIES else skipped).append(col.name)
            else:
                skipped.append(col.name)
        parts = []
        t = self.labels[table]
        if numeric:
            parts.append(f"linear(features({', '.join('t.' + _qi(c) for c in numeric)}), {self.width}, "
                         f"'{self.weight_name(f'enc_{t}_num')}')")
        for c in categorical:
            parts.append(f"embed(t.{_qi(c)}, {self.width}, '{self.weight_name(f'enc_{t}_{_safe(c)}')}')")
        value = f"tanh({' + '.join(parts)})" if parts else f"bias({self.width}, '{self.weight_name(f'enc_{t}_bias')}')"
        lines = [f"-- {table}: its own columns encoded into one {self.width}-wide vector per row"]
        if table == self.target:
            lines.append(f"-- (the target column {self.column} is never an input)")
        if skipped:
            lines.append(f"-- skipped columns (high-cardinality text or unsupported types): {', '.join(skipped)}")
        if not parts:
            lines.append("-- no usable columns: a learnable constant that still tells rows exist")
        key_sql = ", ".join(f"t.{_qi(k)}" for k in self.schema.primary_keys[table])
        lines.append(f"CREATE TABLE enc_{t} AS\nSELECT {key_sql}, {value} AS h\nFROM {_qi(table)} t;\n")
        self.out.append("\n".join(lines))

    def distinct(self, table: str, column: str) -> int:
        count = exp.select(exp.Count(this=exp.Distinct(expressions=[exp.column(exp.to_identifier(column, quoted=True))])))
        return self.db.con.execute(count.from_(exp.Table(this=exp.to_identifier(table, quoted=True))).sql("duckdb")).fetchone()[0]

    # -- tree -------------------------------------------------------------------------------
    def keys(self, node: Node) -> list[str]:
        """Key columns of a node relation: the target row's key (and time), then the node row's."""
        own = list(self.n(node.table).values())
        return list(self.r.values()) + ([self.r_time] if self.time_column else []) + own

    def near_row(self, node: Node) -> str:
        """Join a node relation's row back to its table row `q`, whose columns lead onwards."""
        on = " AND ".join(f"q.{_qi(k)} = p.{name}" for k, name in self.n(node.table).items())
        return f"JOIN {_qi(node.table)} q ON {on}"

    def time_filter(self, table: str, alias: str, target_time: str) -> str:
        column = self.time_columns.get(table)
        return f" AND {alias}.{_qi(column)} < {target_time}" if column else ""

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
        condition = node.step.condition(near, near_cols, "x") + (self.time_filter(node.table, "x", target_time) if self.time_column else "")
        names = self.keys(node)
        select = [f"{expr} AS {name}" for expr, name in zip(target_keys + [f"x.{_qi(k)}" for k in pk], names)]
        group = ", ".join(target_keys + [f"x.{_qi(k)}" for k in pk])
        join_enc = " AND ".join(f"e.{_qi(k)} = x.{_qi(k)}" for k in pk)
        direction = "child rows" if node.step.to_child else "parent row"
        self.out.append(
            f"-- {node.name}: the {direction} of {node.parent.table} in {node.table} (via {', '.join(node.step.fk.columns)})"
            + (", earlier than the target row's time" if self.time_column and node.table in self.time_columns else "")
            + f"\nCREATE TABLE x_{node.name} AS\nSELECT {', '.join(select)}, avg(e.h) AS h\n{source}\n"
            f"JOIN {_qi(node.table)} x ON {condition}\nJOIN enc_{t} e ON {join_enc}\nGROUP BY {group};\n")

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
            condition = child.step.condition(near, near_cols, "y")
            if self.time_column:
                condition += self.time_filter(child.table, "y", target_time)
            match = " AND ".join(target_match + [f"c.{name} = y.{_qi(k)}" for k, name in self.n(child.table).items()])
            aggregation = self.aggregation if child.step.to_child else "avg"
            kind = f"{aggregation} over its child rows in" if child.step.to_child else "its parent row in"
            self.out.append(
                f"-- {node.name} <- {child.name}: {kind} {child.table}, own weights for this key and direction\n"
                f"CREATE TABLE {relation} AS\n"
                f"SELECT {', '.join(f'{h} AS {_qi(k) if is_root else k}' for h, k in zip(head, keys))}, "
                f"{aggregation}(linear(c.h, {self.width}, '{self.weight_name('w_' + child.name + '_to_' + node.name)}')) AS h\n"
                f"{source}\nJOIN {_qi(child.table)} y ON {condition}\nJOIN {child_values[child.name]} c ON {match}\n"
                f"GROUP BY {', '.join(head)};\n")
        value = f"h_{node.name}"
        key_list = ", ".join(f"p.{_qi(k)}" if is_root else f"p.{k}" for k in keys)
        self.out.append(f"CREATE TABLE {value} AS\nSELECT {key_list}, tanh(p.h) AS h\nFROM {relation} p;\n")
        return value


def generate(db: Database, target: str, *, hops: int = 2, width: int = 16, aggregation: str = "avg",
             time_column: str | None = None, time_columns: dict[str, str] | None = None, infer_keys: bool = True) -> str:
    """An editable SQL template predicting `target` ("table.column") from its relational context."""
    table, column = arguments.target(target)
    hops = arguments.integer("hops", hops, minimum=0, maximum=16)
    width = arguments.integer("width", width, maximum=ir.MAX_WIDTH)
    arguments.text("time_column", time_column, optional=True)
    if time_columns is not None and (not isinstance(time_columns, dict)
                                     or not all(isinstance(k, str) and isinstance(v, str) for k, v in time_columns.items())):
        raise SchemaError(f"time_columns must map table names to column names, got {time_columns!r}")
    if not isinstance(db, Database):
        raise SchemaError(f"db must be a relsql.Database (from relsql.connect(...)), got {type(db).__name__}")
    catalog = db.catalog()
    if table not in catalog.tables:
        raise SchemaError(f"target table `{table}` does not exist; tables: {', '.join(catalog.names)}")
    if column not in [c.name for c in catalog[table].columns]:
        raise SchemaError(f"target {target}: `{table}` has no column `{column}`")
    if aggregation not in ("avg", "sum", "max"):
        raise SchemaError(f"aggregation must be avg, sum or max, got {aggregation!r}")
    keys = schema(db, catalog, infer=infer_keys)
    for name, info in keys.tables.items():  # names go into the template's comments, one per line
        for label in [name, *[c.name for c in info.columns]]:
            if re.search(r"[\x00-\x1f\x7f]", label):
                raise SchemaError(f"{'table' if label == name else f'table {name!r}: column'} {label!r} has a line break "
                                  "or control character in its name; rename it to generate a template")
    if not keys.primary_keys.get(table):
        raise SchemaError(f"target table `{table}` has no primary key (declared or inferable); declare one so each "
                          "prediction has a key")
    if time_column is not None:
        if time_column not in [c.name for c in catalog[table].columns]:
            raise SchemaError(f"time_column `{time_column}` is not a column of `{table}`")
        found = {}
        for name, info in keys.tables.items():
            stamp = next((c.name for c in info.columns if any(t in c.type.upper() for t in _TIME_TYPES)), None)
            if stamp and name != table:
                found[name] = stamp
        time_columns = {**found, **(time_columns or {})}
    else:
        time_columns = {}
    labels = dict(zip(keys.tables, _distinct([_safe(t) for t in keys.tables])))
    root = _tree(keys, table, hops, labels)
    nodes = list(_walk(root))
    writer = _Writer(db, keys, table, column, width=width, hops=hops, aggregation=aggregation,
                     time_column=time_column, time_columns=time_columns, labels=labels)
    values = db.arrow(exp.select(exp.column(exp.to_identifier(column, quoted=True))).from_(exp.Table(this=exp.to_identifier(table, quoted=True)))).column(0)
    units = detect(values, target).units
    tables = list(dict.fromkeys(n.table for n in nodes))
    for name in tables:
        writer.encoder(name)
    for node in nodes[1:]:
        writer.node_rows(node)
    value = writer.node_value(root)
    value_keys = ", ".join(f"v.{_qi(k)}" for k in writer.target_keys)
    writer.out.append(f"-- the prediction for each {table} row ({units} output{'s' if units > 1 else ''}; "
                      "relsql.Model adds the loss)\n"
                      f"CREATE TABLE predict AS\nSELECT {value_keys}, linear(v.h, {units}, '{writer.weight_name('w_out')}') AS h\n"
                      f"FROM {value if root.children else 'enc_' + labels[table]} v;\n")
    header = [f"-- relsql automatic template: predict {target} from up to {hops} foreign-key hops away",
              f"-- width {width}, aggregation {aggregation}; edit freely and retrain.",
              f"-- tables used: {', '.join(tables)}"]
    unreachable = [t for t in keys.tables if t not in tables]
    if unreachable:
        header.append(f"-- left out (not reachable within {hops} hops): {', '.join(unreachable)}")
    for name in sorted(keys.inferred_primary):
        header.append(f"-- inferred primary key {name}({', '.join(keys.primary_keys[name])})")
    for child, fk in keys.inferred_foreign:
        header.append(f"-- inferred foreign key {child}({', '.join(fk.columns)}) -> {fk.table}({', '.join(fk.references)})")
    if time_column:
        header.append(f"-- time: rows of {', '.join(f'{t}.{c}' for t, c in time_columns.items()) or 'no table'} join a "
                      f"target row only if earlier than its {time_column}")
    return "\n".join(header) + "\n\n" + "\n".join(writer.out)
