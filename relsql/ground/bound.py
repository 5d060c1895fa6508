"""A certain upper bound on a rule query's rows, read from its AST and its tables' row counts.

The size check before a rule runs (execute.Grounder.check_size) asks the database's planner for
an estimate: one EXPLAIN per rule, a fifth of a small database's grounding statements. Where the
AST proves that the query cannot return more than `max_groundings` rows, the estimate cannot
change the outcome and is not asked for.

The bound multiplies, in the query's own FROM/JOIN order, one factor per source: its row count,
or 1 where an earlier source determines its row (every column of a unique set of it is equal to
a column of an earlier source of the same type: relsql's key tables hold each key once), or 1
for a LATERAL subquery without FROM (one row per row). Filters, DISTINCT and GROUP BY only take
rows away. Whatever the bound cannot read (a subquery, a table function, UNNEST, a RIGHT or FULL
join, a table whose count is unknown) gives no bound, and the planner is asked as before."""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlglot import exp

# functions that return several rows per row in a SELECT list (DuckDB's)
_ROW_MAKERS = frozenset({"unnest", "generate_subscripts", "json_each", "json_tree"})


@dataclass
class Source:
    """What the bound knows of one table: its rows, its unique column sets (lower-cased names)
    and its columns' types (lower-cased name -> the engine's type name; missing: unknown)."""

    rows: int
    unique: list[tuple[str, ...]] = field(default_factory=list)
    types: dict[str, str] = field(default_factory=dict)


def row_bound(select: exp.Expression, source_of) -> int | None:
    """At least as many rows as `select` returns, or None where the AST does not prove a bound.
    `source_of(table) -> Source | None` tells what is known of a table (None: nothing)."""
    if (not isinstance(select, exp.Select) or any(select.args.get(k) for k in ("with", "laterals", "pivots"))
            or _makes_rows(select)):
        return None
    first = select.args.get("from_") or select.args.get("from")
    if first is None:
        return None
    joins = select.args.get("joins") or []
    laterals = [j.this for j in joins if isinstance(j.this, exp.Lateral)]
    if any(_nested_query(node, laterals) for node in select.walk()):
        return None
    inner = _conjuncts(select.args.get("where") and select.args["where"].this)
    for join in joins:
        if not join.args.get("side"):
            inner.extend(_conjuncts(join.args.get("on")))
    placed: dict[str, Source] = {}
    first_source = _table(first.this, source_of)
    if first_source is None:
        return None
    placed[first.this.alias_or_name] = first_source
    bound = max(first_source.rows, 1)
    for join in joins:
        factor = _join_factor(join, placed, inner, source_of)
        if factor is None:
            return None
        bound *= factor
    return bound


def _join_factor(join: exp.Join, placed: dict[str, Source], inner: list[exp.Expression], source_of) -> int | None:
    """The most rows one row of the sources before `join` meets in it (at least 1: a LEFT join keeps
    the row unmatched); None where it cannot be told. Adds the joined source to `placed`."""
    side, kind = (join.args.get("side") or "").upper(), (join.args.get("kind") or "").upper()
    if side not in ("", "LEFT") or kind not in ("", "INNER", "CROSS", "OUTER") or join.args.get("method"):
        return None
    if isinstance(join.this, exp.Lateral):
        return 1 if _one_row(join.this) else None
    source = _table(join.this, source_of)
    name = join.this.alias_or_name
    if source is None or name in placed:
        return None
    conditions = _conjuncts(join.args.get("on")) if side == "LEFT" else inner
    determined = _determined(name, source, placed, conditions)
    placed[name] = source
    return 1 if determined else max(source.rows, 1)


def _determined(name: str, source: Source, placed: dict[str, Source], conditions: list[exp.Expression]) -> bool:
    """Whether `conditions` fix every column of one of the source's unique sets to a column of an
    earlier source of the same type (a cast could make two distinct keys equal: then not)."""
    fixed = set()
    for condition in conditions:
        if not isinstance(condition, (exp.EQ, exp.NullSafeEQ)):
            continue
        for mine, other in ((condition.this, condition.expression), (condition.expression, condition.this)):
            if not (isinstance(mine, exp.Column) and isinstance(other, exp.Column) and mine.table == name
                    and other.table in placed and other.table != name):
                continue
            kind = source.types.get(mine.name.lower())
            if kind is not None and kind == placed[other.table].types.get(other.name.lower()):
                fixed.add(mine.name.lower())
    return any(unique and set(unique) <= fixed for unique in source.unique)


def _table(node: exp.Expression, source_of) -> Source | None:
    """A plain table's Source: not a subquery or table function, no PIVOT/UNPIVOT, sample or other
    clause on it, no column list in its alias (which would rename the columns the Source names)."""
    if not isinstance(node, exp.Table) or not isinstance(node.this, exp.Identifier):
        return None
    if any(value for key, value in node.args.items() if key not in ("this", "db", "catalog", "alias")):
        return None
    alias = node.args.get("alias")
    if alias is not None and alias.args.get("columns"):
        return None
    return source_of(node)


def _one_row(lateral: exp.Lateral) -> bool:
    """A LATERAL (SELECT expressions) without FROM: one row per row it is joined to."""
    inner = lateral.this.this if isinstance(lateral.this, exp.Subquery) else lateral.this
    return (isinstance(inner, exp.Select) and not any(inner.args.get(k) for k in ("from_", "from", "joins", "with"))
            and not any(isinstance(n, (exp.Query, exp.Subquery)) for n in inner.walk() if n is not inner))


def _nested_query(node: exp.Expression, laterals: list[exp.Lateral]) -> bool:
    """A query within the query, other than a one-row LATERAL's own: its steps could be large."""
    if not isinstance(node, (exp.Query, exp.Subquery, exp.Lateral)) or node.parent is None:
        return False
    ancestor = node
    while ancestor is not None:
        if any(ancestor is lateral for lateral in laterals):
            return False
        ancestor = ancestor.parent
    return True


def _makes_rows(select: exp.Select) -> bool:
    """Whether an expression may return several rows per row (UNNEST and its kin, ROLLUP, CUBE,
    GROUPING SETS: a row per grouping set)."""
    for node in select.walk():
        if isinstance(node, (exp.Unnest, exp.Explode, exp.Rollup, exp.Cube, exp.GroupingSets)):
            return True
        if isinstance(node, exp.Anonymous) and str(node.this).lower() in _ROW_MAKERS:
            return True
    return False


def _conjuncts(condition: exp.Expression | None) -> list[exp.Expression]:
    if condition is None:
        return []
    if isinstance(condition, exp.Paren):
        return _conjuncts(condition.this)
    if isinstance(condition, exp.And):
        return _conjuncts(condition.this) + _conjuncts(condition.expression)
    return [condition]
