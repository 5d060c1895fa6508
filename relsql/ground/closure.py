"""Which rows of each relation some asked output rows can reach: the top-down half of grounding
only the asked rows (relsql/ground/demand.py, `BatchGrounder.restrict`).

A rule body reads other relations through their key tables. Given the heads asked of its
relation (some of its key columns, a table of their values), `reach` answers, per relation the
body reads, a query of key values that every grounding of an asked head uses of that relation:
the body with the relations taken out, each of their key columns replaced by an expression the
body equates it with (through its equalities and the asked heads'), and every condition on a
column without one dropped. Dropping conditions only widens, so the answer is a superset of the
rows used, and the bottom-up pass (each key table from its asked rows' groundings over the key
tables below it) decides which of them exist. A body this does not read (subqueries, outer joins,
GROUP BY, unqualified columns, tables no equality joins), or a relation of which no key column is
equated, is answered None: that relation is needed whole.
"""

from __future__ import annotations

from dataclasses import dataclass

import sqlglot.expressions as exp

from relsql import sql as q

# A body's clauses after which its rows are no longer those of its joins (a filter on the heads
# or a reduction to candidates would change them): such a body is not read.
_OPAQUE = ("group", "having", "qualify", "windows", "order", "limit", "offset", "with_", "with", "laterals", "pivots")


@dataclass(frozen=True)
class Asked:
    """Asked rows of a relation: a table of distinct values of some of its key columns."""

    table: exp.Table
    columns: tuple[str, ...]


@dataclass(frozen=True)
class Reach:
    """What one reference of a body (a key table under `alias`) needs of `relation`: the values of
    its key `columns` that `query` gives; `query` None: the relation whole."""

    alias: str
    relation: str
    columns: tuple[str, ...] = ()
    query: exp.Select | None = None
    same: bool = False  # `query` is the asked table itself (the same key columns, no other table or condition)


def _tables(select: exp.Select) -> dict[str, exp.Table] | None:
    """The body's tables by alias (FROM and inner JOINs of plain tables), or None for another shape."""
    if not isinstance(select, exp.Select) or any(select.args.get(a) for a in _OPAQUE):
        return None
    distinct = select.args.get("distinct")
    if isinstance(distinct, exp.Distinct) and distinct.args.get("on"):
        return None
    source = select.args.get("from_")
    if source is None or not isinstance(source.this, exp.Table):
        return None
    tables = [source.this]
    for join in select.args.get("joins") or []:
        if (not isinstance(join.this, exp.Table) or join.args.get("side") or join.args.get("using")
                or str(join.args.get("kind") or "INNER").upper() not in ("INNER", "CROSS")):
            return None
        tables.append(join.this)
    named: dict[str, exp.Table] = {}
    for table in tables:
        if not isinstance(table.this, exp.Identifier):
            return None
        named[table.alias_or_name] = table
    if len(named) != len(tables):
        return None
    for node in select.walk():
        if node is not select and isinstance(node, exp.Query | exp.Subquery | exp.Lateral | exp.Unnest):
            return None
        if isinstance(node, exp.Column) and node.table not in named:
            return None
        if isinstance(node, exp.Star):
            return None
    return named


def _conjuncts(condition: exp.Expression | None) -> list[exp.Expression]:
    if condition is None:
        return []
    while isinstance(condition, exp.Paren):
        condition = condition.this
    if isinstance(condition, exp.And):
        return _conjuncts(condition.this) + _conjuncts(condition.expression)
    return [condition]


def _heads(select: exp.Select) -> dict[int, exp.Expression]:
    return {int(item.alias[2:]): item.this for item in select.expressions
            if isinstance(item, exp.Alias) and item.alias.startswith("_h") and item.alias[2:].isdigit()}


def _key(node: exp.Expression) -> str:
    """A node's identity for the classes: a column by its table and name (the database ignores
    case and quotes), anything else by its SQL."""
    if isinstance(node, exp.Column):
        return f"column {node.table}.{node.name.casefold()}"
    return node.sql("duckdb")


class _Classes:
    """Expressions the body's equalities make equal (union-find over their SQL text)."""

    def __init__(self):
        self.parent: dict[str, str] = {}
        self.nodes: dict[str, exp.Expression] = {}

    def find(self, key: str) -> str:
        self.parent.setdefault(key, key)
        while self.parent[key] != key:
            self.parent[key] = self.parent[self.parent[key]]
            key = self.parent[key]
        return key

    def union(self, a: exp.Expression, b: exp.Expression) -> None:
        ka, kb = _key(a), _key(b)
        self.nodes.setdefault(ka, a)
        self.nodes.setdefault(kb, b)
        self.parent[self.find(ka)] = self.find(kb)

    def members(self, node: exp.Expression) -> list[exp.Expression]:
        root = self.find(_key(node))
        return [n for k, n in self.nodes.items() if self.find(k) == root]


def reach(select: exp.Expression, keys: list[str], relations: dict[str, tuple[str, list[str]]],
          asked: Asked | None) -> list[Reach] | None:
    """Per key table the body `select` reads (`relations`: key table name -> (relation, its key
    columns)), what its relation must hold for the groundings of the heads in `asked` (a relation
    whose head keys are `keys`). None: the body's shape is not read, every relation it reads is
    needed whole (so with `asked` None)."""
    tables = _tables(select) if asked is not None else None
    if tables is None:
        return None
    referenced = {alias: relations[t.name] for alias, t in tables.items() if t.name in relations}
    conditions = [c for join in select.args.get("joins") or [] for c in _conjuncts(join.args.get("on"))]
    conditions += _conjuncts(select.args["where"].this) if select.args.get("where") else []
    heads = _heads(select)
    mark = asked.table.name  # the asked table's own (unique) name
    for column in asked.columns:
        head = heads.get(keys.index(column))
        if head is None:
            return None
        conditions.append(exp.NullSafeEQ(this=q.col(column, mark), expression=head))
    classes = _Classes()
    for condition in conditions:
        if isinstance(condition, exp.EQ | exp.NullSafeEQ):
            classes.union(condition.this, condition.expression)

    def outside(node: exp.Expression) -> bool:  # reads no referenced relation
        return all(c.table not in referenced for c in node.find_all(exp.Column)) and not (
            isinstance(node, exp.Column) and node.table in referenced)

    known: dict[tuple[str, str], exp.Expression] = {}  # (alias, key column) -> an expression equal to it
    for alias, (_, columns) in referenced.items():
        for column in columns:
            given = [n for n in classes.members(q.col(column, alias)) if outside(n)]
            if given:
                known[(alias, column.casefold())] = min(given, key=lambda n: (not isinstance(n, exp.Column), _key(n)))

    def substituted(node: exp.Expression) -> exp.Expression | None:
        columns = [c for c in node.find_all(exp.Column) if c.table in referenced]
        if any((c.table, c.name.casefold()) not in known for c in columns):
            return None
        return node.transform(  # copies `node` first
            lambda n: known[(n.table, n.name.casefold())].copy() if isinstance(n, exp.Column) and n.table in referenced else n)

    # `x = x` only drops NULLs and `x IS NOT DISTINCT FROM x` nothing: left out, the answer only widens
    kept = [c for c in (substituted(c) for c in conditions) if c is not None and not _same_sides(c)]
    remaining = [t for alias, t in tables.items() if alias not in referenced]
    if not _connected([t.alias_or_name for t in remaining] + [mark], kept):
        return [Reach(alias, relation) for alias, (relation, _) in referenced.items()]
    found = []
    for alias, (relation, columns) in referenced.items():
        bound = tuple(c for c in columns if (alias, c.casefold()) in known)
        if not bound:
            found.append(Reach(alias, relation))
            continue
        query = exp.select(*[q.alias(known[(alias, c.casefold())].copy(), c) for c in bound]).distinct(copy=False).from_(
            asked.table.copy(), copy=False)
        for table in remaining:
            query = query.join(table.copy(), join_type="cross", copy=False)  # the builders' own copies were a third of reach
        if kept:
            query = query.where(exp.and_(*[c.copy() for c in kept], copy=False), copy=False)
        same = (not remaining and bound == asked.columns and not kept
                and all(_key(known[(alias, c.casefold())]) == _key(q.col(c, mark)) for c in bound))
        found.append(Reach(alias, relation, bound, query, same))
    return found


def _same_sides(condition: exp.Expression) -> bool:
    """`x = x` or `x IS NOT DISTINCT FROM x`: true of every row where x is not NULL, or of every row."""
    return isinstance(condition, exp.EQ | exp.NullSafeEQ) and _key(condition.this) == _key(condition.expression)


def _connected(names: list[str], conditions: list[exp.Expression]) -> bool:
    """Whether the tables `names` are joined into one by the equalities among `conditions` (else
    the query would pair every row of one part with every row of another)."""
    parent = {n: n for n in names}

    def find(n: str) -> str:
        while parent[n] != n:
            n = parent[n]
        return n

    for condition in conditions:
        if not isinstance(condition, exp.EQ | exp.NullSafeEQ):
            continue
        touched = sorted({c.table for c in condition.find_all(exp.Column) if c.table in parent})
        for other in touched[1:]:
            parent[find(other)] = find(touched[0])
    return len({find(n) for n in names}) == 1


def narrowed(select: exp.Expression, keys: list[str], asked: Asked) -> exp.Select:
    """The body `select` keeping the groundings whose heads match a row of `asked` on its columns:
    joined inside where the shape allows (as `sql.heads_within`), else around the body."""
    heads = _heads(select) if isinstance(select, exp.Select) else {}
    mark = asked.table.name
    inside = _tables(select) is not None and all(keys.index(c) in heads for c in asked.columns)
    if inside:
        condition = exp.and_(*[exp.NullSafeEQ(this=q.col(c, mark), expression=heads[keys.index(c)].copy())
                               for c in asked.columns], copy=False)
        return select.copy().join(asked.table.copy(), on=condition, copy=False)
    condition = exp.and_(*[exp.NullSafeEQ(this=q.col(c, mark), expression=q.col(f"_h{keys.index(c)}", "s"))
                           for c in asked.columns], copy=False)
    return exp.select(exp.Column(this=exp.Star(), table=q.ident("s"))).from_(
        q.alias(exp.Subquery(this=select.copy()), "s", table=True)).join(asked.table.copy(), on=condition, copy=False)


__all__ = ["Asked", "Reach", "narrowed", "reach"]
