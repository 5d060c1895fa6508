"""Which relations have the same heads, known from their rules' SQL before anything runs.

A relation's key table numbers its distinct heads 0..n-1 in key order. Many relations of a
template have exactly the heads of one before them: Template.auto's `h_x` reads `p_x` row for row,
`p_x` has a self term reading every row of `x_x` plus terms that only narrow `x_x`'s rows, and
`p_teams` has the self term over every row of `enc_teams` (every row of Teams) plus terms whose
heads are Teams' key columns under inner joins. Such a relation's key table would be a copy of
the earlier one, so the grounder reuses that one instead of building it again (Lahman: 26 of 70
key tables).

A rule's heads *cover* a domain when they are exactly its rows, and lie *within* it when they are
some of them. The domain of a rule is read from its body:

- FROM a relation S (no joins that can add rows without S) with heads S's keys in key order:
  S's domain;
- FROM a base table T with heads columns of T: the distinct values of those columns of T.

Its heads cover the domain when the body has nothing but that FROM (no join, WHERE, GROUP BY,
HAVING, QUALIFY, LIMIT, OFFSET, DISTINCT ON, sampling); they lie within it under inner, left, semi,
anti, natural and as-of joins, filters, grouping by plain expressions and limits, since each of
those keeps or drops the FROM table's rows and never makes a value of its columns. A relation whose
rules all lie within one domain and one of which covers it has exactly that domain's rows as heads.
Anything else (a set operation, a CTE, a right or full join, ROLLUP, a head computed from columns)
has no domain here, and its relation builds its own key table."""

from __future__ import annotations

import sqlglot.expressions as exp

# ("relation", name) or ("table", qualified name, head column names): all case-folded, as DuckDB
# compares identifiers
Domain = tuple

_WITHIN_ARGS = frozenset({"expressions", "from", "from_", "joins", "where", "group", "having", "qualify", "order",
                          "limit", "offset", "distinct", "windows"})
_COVER_ARGS = frozenset({"expressions", "from", "from_", "order", "distinct"})
_TABLE_ARGS = frozenset({"this", "db", "catalog", "alias"})
_JOIN_KINDS = frozenset({"", "INNER", "CROSS", "SEMI", "ANTI"})


def rule_domain(query: object, n_keys: int, relations: dict[str, tuple[list[str], Domain] | None]) -> tuple[Domain, bool] | None:
    """(the domain the heads of rule body `query` lie within, whether they cover it), or None.
    `relations`: every relation of the template by case-folded name: (its keys, its domain) once
    grounded, None before (a body never reads one before it is grounded; if it did, no domain)."""
    if not isinstance(query, exp.Select) or n_keys == 0:
        return None
    used = {k for k, v in query.args.items() if v}
    if not used <= _WITHIN_ARGS:
        return None
    source = (query.args.get("from_") or query.args.get("from"))
    table = source.this if isinstance(source, exp.From) else None
    if not isinstance(table, exp.Table) or not isinstance(table.this, exp.Identifier) \
            or not {k for k, v in table.args.items() if v} <= _TABLE_ARGS:
        return None
    if not all(_keeps_rows(join) for join in query.args.get("joins") or []):
        return None
    group = query.args.get("group")
    if group is not None and group.find(exp.Rollup, exp.Cube, exp.GroupingSets) is not None:
        return None
    distinct = query.args.get("distinct")
    distinct_on = isinstance(distinct, exp.Distinct) and distinct.args.get("on") is not None
    columns = _head_columns(query, n_keys, table.alias_or_name.casefold())
    if columns is None:
        return None
    covers = used <= _COVER_ARGS and not distinct_on
    name = table.name.casefold()
    if not table.args.get("db") and not table.args.get("catalog") and name in relations:
        if relations[name] is None:
            return None
        keys, domain = relations[name]
        if [k.casefold() for k in keys] != columns:
            return None
        return domain, covers
    qualified = ".".join(p.name.casefold() for p in (table.args.get("catalog"), table.args.get("db"), table.this) if p)
    return ("table", qualified, tuple(columns)), covers


def relation_domain(rules: list[tuple[Domain, bool] | None]) -> Domain | None:
    """The domain of a relation from its grounded rules' (`rule_domain`): the one they all lie
    within where one of them covers it; else None."""
    if not rules or any(r is None for r in rules):
        return None
    domains = {domain for domain, _ in rules}
    if len(domains) != 1 or not any(covers for _, covers in rules):
        return None
    return domains.pop()


def _keeps_rows(join: exp.Join) -> bool:
    """Whether a join keeps or drops the FROM side's rows and never adds one whose columns are NULL."""
    side = (join.args.get("side") or "").upper()
    kind = (join.args.get("kind") or "").upper()
    method = (join.args.get("method") or "").upper()
    if method not in ("", "NATURAL", "ASOF"):  # POSITIONAL pads the shorter side with NULLs
        return False
    if side == "LEFT":
        return kind in ("", "OUTER", "SEMI", "ANTI")
    return side == "" and kind in _JOIN_KINDS


def _head_columns(query: exp.Select, n_keys: int, alias: str) -> list[str] | None:
    """The case-folded column names of the FROM table (`alias`) that heads `_h0`.. select, or None
    where a head is anything else."""
    heads = {item.alias: item.this for item in query.expressions if isinstance(item, exp.Alias)}
    columns = []
    for i in range(n_keys):
        head = heads.get(f"_h{i}")
        if not isinstance(head, exp.Column) or not isinstance(head.this, exp.Identifier) \
                or head.table.casefold() != alias or head.args.get("db") or head.args.get("catalog"):
            return None
        columns.append(head.name.casefold())
    return columns
