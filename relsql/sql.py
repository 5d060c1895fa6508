"""sqlglot builders for relsql's SQL (literals, identifiers, the grounding queries): every statement
is an AST, never pasted text. A leaf: it imports nothing of relsql's but its errors, so the lowest
layers (relsql.data.duckdb, relsql.data.spark, the connectors) build their SQL here."""

from __future__ import annotations

import functools
import math
import numbers

import sqlglot
import sqlglot.expressions as exp

from relsql.errors import RelsqlError


@functools.cache
def _constant(text: str) -> exp.Expression:
    return sqlglot.parse_one(text, read="duckdb")


def bound(text: str, **values: str | int | float) -> str:
    """relsql's own constant query `text` with each `:name` placeholder a typed literal of
    `values[name]`, as DuckDB SQL. relsql passes no parameters to DuckDB's execute: its Python client
    imports pandas on a process's first query with parameters (0.4-0.7 s on an idle machine, 2-4 s on
    a loaded one), most of a cold Model.load. `text` is parsed once per process."""
    return exp.replace_placeholders(_constant(text).copy(), **values).sql("duckdb")


def integer(value: int) -> exp.Literal:
    """A typed integer literal. Only an int (or numpy integer) passes, never text or a bool, so no
    value a user or a saved file supplies can reach SQL as anything but a number."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise RelsqlError(f"expected an integer to use in SQL, got {value!r} ({type(value).__name__})")
    return exp.Literal.number(str(int(value)))


def real(value: float) -> exp.Expression:
    """A typed, finite DOUBLE literal (`CAST(<repr> AS DOUBLE)`); text, bools and NaN/inf are refused."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise RelsqlError(f"expected a number to use in SQL, got {value!r} ({type(value).__name__})")
    value = float(value)
    if not math.isfinite(value):
        raise RelsqlError(f"expected a finite number to use in SQL, got {value!r}")
    # built directly: exp.cast() re-checks and copies its type, 5x the cost, and templates make ~10^5 of these
    return exp.Cast(this=exp.Literal.number(repr(value)), to=exp.DataType(this=exp.DataType.Type.DOUBLE))


def ident(name: str) -> exp.Identifier:
    return exp.to_identifier(name, quoted=True)


def col(name: str, table: str | None = None) -> exp.Column:
    return exp.Column(this=ident(name), table=ident(table) if table else None)


def alias(expression: exp.Expression, name: str, table: bool = False) -> exp.Expression:
    """`expression AS "name"`, taking `expression` over without a copy (builders pass fresh nodes)."""
    return exp.alias_(expression, name, table=table, quoted=True, copy=False)


def create_temp(table: exp.Table, query: exp.Expression) -> exp.Create:
    return exp.Create(this=table, kind="TABLE", expression=query, replace=True,
                      properties=exp.Properties(expressions=[exp.TemporaryProperty()]))


def substitute_relations(query: exp.Select, key_tables: dict[str, exp.Table]) -> exp.Select:
    """Point table references that name a neural relation at that relation's key table (in place)."""

    local = {cte.alias.casefold() for cte in query.find_all(exp.CTE)}  # a CTE shadows a relation's name
    folded = {name.casefold(): table for name, table in key_tables.items()}  # the database ignores case, so does this

    def swap(node: exp.Expression) -> exp.Expression:
        name = node.name.casefold() if isinstance(node, exp.Table) else ""
        if name in folded and not node.args.get("db") and name not in local:
            return alias(folded[name].copy(), node.alias or node.name, table=True)
        return node

    return query.transform(swap, copy=False)


def rule_column(index: int, k: int) -> str:
    """Rule `index`'s value column `k` in a relation's grounding table (rules differ in column types)."""
    return f"_s{index}_c{k}"


def relation_groundings(rules: list[tuple[int, exp.Select, int, int, int]], limit: int | None = None) -> exp.Query:
    """Every rule's groundings of one relation in one query, tagged `_rule`: one statement
    materializes them all. `rules` holds (rule index, body query, #keys, #refs, #columns). The
    parts are aligned by position, NULL where a rule lacks another's column (a UNION BY NAME
    took DuckDB a third longer to plan). `limit`: at most this many rows of each rule (the
    run-time bound on a rule whose size the planner misjudged)."""
    n_refs = max(n for _, _, _, n, _ in rules)
    value_columns = [(index, k) for index, *_, n_columns in rules for k in range(n_columns)]
    parts = []
    for index, select, n_keys, refs, _ in rules:
        parts.append(exp.select(
            alias(integer(index), "_rule"),
            *[col(f"_h{i}", "s") for i in range(n_keys)],
            *[alias(col(f"_r{j}", "s") if j < refs else exp.Null(), f"_r{j}") for j in range(n_refs)],
            *[alias(col(f"_c{k}", "s") if i == index else exp.Null(), rule_column(i, k)) for i, k in value_columns],
        ).from_(alias(exp.Subquery(this=select), "s", table=True), copy=False))
        if limit is not None:
            parts[-1] = exp.select(exp.Star()).from_(alias(exp.Subquery(this=parts[-1]), "b", table=True)).limit(
                integer(limit), copy=False)  # copy=False: a copy would be of the rule's whole query
    return _union(parts, distinct=False)


def rule_slice(groundings: exp.Table, index: int, n_keys: int, n_refs: int, n_columns: int) -> exp.Subquery:
    """One rule's groundings out of its relation's grounding table, with the rule's own column names."""
    return exp.Subquery(this=exp.select(
        *[col(f"_h{i}") for i in range(n_keys)], *[col(f"_r{j}") for j in range(n_refs)],
        *[alias(col(rule_column(index, k)), f"_c{k}") for k in range(n_columns)],
    ).from_(groundings.copy()).where(exp.EQ(this=col("_rule"), expression=integer(index))))


def _union(parts: list[exp.Query], distinct: bool) -> exp.Query:
    """A balanced tree of UNIONs: hundreds of rules stay within sqlglot's recursion limit."""
    while len(parts) > 1:
        paired = [exp.Union(this=a, expression=b, distinct=distinct)
                  for a, b in zip(parts[::2], parts[1::2])]
        parts = paired + ([parts[-1]] if len(parts) % 2 else [])
    return parts[0]


def row_counts(sources: list[exp.Expression]) -> exp.Query:
    """One query counting each of `sources`' rows (at least one): rows (`_i` its position, `_n` its
    COUNT(*)), a UNION ALL of tagged counts. One scalar subquery per source cost DuckDB 1.5 ~2 ms
    each to plan, the union ~0.05 ms (docs/performance.md)."""
    return _union([exp.select(alias(integer(i), "_i"), alias(exp.Count(this=exp.Star()), "_n")).from_(s.copy())
                   for i, s in enumerate(sources)], distinct=False)


def distinct_keys(grounding_tables: list[exp.Expression], keys: list[str], copy: bool = True) -> exp.Query:
    """Distinct head keys (`keys`, at least one) over all rules of a relation, unordered;
    `copy=False` takes `grounding_tables` into the query (fresh ones: a copy of a body is costly)."""
    parts = [
        exp.select(*[alias(col(f"_h{i}"), k) for i, k in enumerate(keys)]).from_(t.copy() if copy else t)
        for t in grounding_tables
    ]
    return _union(parts, distinct=True) if len(parts) > 1 else parts[0].distinct(copy=False)


def numbered_keys(distinct: exp.Query, keys: list[str]) -> exp.Select:
    """`distinct`'s rows numbered 0..n-1 (`_rid`, BIGINT) in key order, ascending with NULLs
    first: one window over all rows (DuckDB's way; `Database.create_key_table`)."""
    order = exp.Order(expressions=[exp.Ordered(this=col(k), nulls_first=True) for k in keys])
    rid = exp.Sub(
        this=exp.Window(this=exp.RowNumber(), order=order),
        expression=integer(1),
    )
    return exp.select(*[col(k) for k in keys], alias(rid, "_rid")).from_(
        alias(exp.Subquery(this=distinct), "d", table=True))


def keyless_table(keys: list[str], grounded: bool) -> exp.Select:
    """A key table that needs no numbering: a relation without keys has one row (`_rid` 0) if it
    has groundings; one without groundings has no rows (typeless NULL keys)."""
    if grounded and not keys:
        return exp.select(alias(integer(0), "_rid"))
    return exp.select(*[alias(exp.Null(), k) for k in keys], alias(integer(0), "_rid")).where(exp.false())


def rule_index_query(
    grounding: exp.Expression, keys_table: exp.Table, keys: list[str], n_refs: int,
    columns: list[exp.Expression], demand: exp.Table | None = None, per_head: tuple[int, int] | None = None,
) -> exp.Select:
    """Per grounding: head row id, body row ids and columns, ordered by head.

    Ties are broken by the body row ids and columns, so the groundings of a head always come in
    the same order (and float sums over them give the same bits) whatever the source's scan order.
    `demand` (a table of `_rid`s) keeps only the groundings of those heads: a semi-join.
    `per_head` = (n, seed) keeps at most n groundings per head, picked by a seeded hash.
    """
    select = exp.select(
        alias(col("_rid", "k") if keys else integer(0), "_head"),
        *[col(f"_r{j}", "g") for j in range(n_refs)],
        *[alias(c.copy(), f"_c{i}") for i, c in enumerate(columns)],
    ).from_(alias(grounding.copy(), "g", table=True), copy=False)
    select = _join_keys(select, keys_table, keys)
    if demand is not None:
        head = col("_rid", "k") if keys else integer(0)
        select = select.join(alias(demand.copy(), "d", table=True),
                             on=exp.EQ(this=col("_rid", "d"), expression=head), copy=False)
    if per_head is not None:
        limit, seed = per_head
        tie = exp.Anonymous(this="hash", expressions=[integer(seed), *[col(f"_r{j}", "g") for j in range(n_refs)],
                                                      *[col(f"_h{i}", "g") for i in range(len(keys))]])
        rank = exp.Window(this=exp.RowNumber(), partition_by=[col("_rid", "k") if keys else integer(0)],
                          order=exp.Order(expressions=[exp.Ordered(this=tie)]))
        select = select.qualify(exp.LTE(this=rank, expression=integer(limit)), copy=False)
    order = ["_head", *[f"_r{j}" for j in range(n_refs)], *[f"_c{i}" for i in range(len(columns))]]
    return select.order_by(*[exp.Ordered(this=col(name), nulls_first=True) for name in order], copy=False)


def heads_within(select: exp.Expression, demanded: exp.Table, keys: list[str]) -> exp.Select | None:
    """A rule body `select` (head keys as columns `_h0`, `_h1`, ...) keeping only the groundings
    whose heads are rows of `demanded` (columns `keys`, each key row once): an inner join inside
    the body, on the heads' expressions (NULL matches NULL, as the key table's join does), which
    the database can order before the body's other joins, so that a few heads' groundings cost
    what those heads reach, not what the whole body does. It joins each grounding to at most one
    row, so the body's rows (and DISTINCT's) are the same ones, only fewer. None where a filter
    inside would change the rows kept (aggregates or windows over the body's rows, GROUP BY,
    LIMIT, DISTINCT ON), or where the body has no FROM or no heads: the caller filters outside."""
    if not keys or not isinstance(select, exp.Select) or select.args.get("from_") is None:
        return None
    if any(select.args.get(arg) for arg in ("group", "having", "qualify", "windows", "order", "limit", "offset")):
        return None
    if isinstance(select.args.get("distinct"), exp.Distinct) and select.args["distinct"].args.get("on"):
        return None
    heads = {item.alias: item.this for item in select.expressions if isinstance(item, exp.Alias)}
    if len([h for h in heads if h.startswith("_h")]) != len(keys) or any(f"_h{i}" not in heads for i in range(len(keys))):
        return None
    if any(item.find(exp.AggFunc, exp.Window) is not None for item in select.expressions):
        return None
    name = demanded.name  # the table's own (unique) name: an alias could be one the body already uses
    condition = exp.and_(*[exp.NullSafeEQ(this=col(k, name), expression=heads[f"_h{i}"].copy()) for i, k in enumerate(keys)],
                         copy=False)
    return select.copy().join(demanded.copy(), on=condition, copy=False)


def _join_keys(select: exp.Select, keys_table: exp.Table, keys: list[str]) -> exp.Select:
    """Join groundings `g` to the relation's key table `k` on the head keys (NULL matches NULL)."""
    if not keys:
        return select
    condition = exp.and_(*[
        exp.NullSafeEQ(this=col(k, "k"), expression=col(f"_h{i}", "g")) for i, k in enumerate(keys)
    ], copy=False)
    return select.join(alias(keys_table.copy(), "k", table=True), on=condition, copy=False)


def relation_index_query(groundings: exp.Table, keys_table: exp.Table, keys: list[str],
                         rules: list[tuple[int, int, list[exp.Expression]]], only: int | None = None,
                         one_per_head: bool = False) -> exp.Select:
    """`rule_index_query` for every rule of a relation in one statement, ordered by `_rule` first
    so that each rule's rows come as one slice. `rules` holds (rule index, #refs, encoded columns
    over alias `g` of `rule_slice`); an encoded column is computed on its own rule's rows only.
    `only` keeps the rows of that one rule. `one_per_head`: no rule has two groundings of one head
    (none aggregates, and the reader refuses such a head), so (_rule, _head) orders the rows
    totally and the sort leaves out the ids and columns that would only break ties (its keys were
    every column: strings and all)."""
    n_refs = max((n for _, n, _ in rules), default=0)
    columns = []
    for index, _, encoded in rules:
        for k, column in enumerate(encoded):
            own = column.transform(lambda n, i=index: col(rule_column(i, int(n.name[2:])), "g")
                                   if isinstance(n, exp.Column) and n.table == "g" and n.name.startswith("_c") else n,
                                   copy=False)  # `rules`' columns are the caller's, made for this query
            if not isinstance(column, exp.Column):  # encoded: skip the other rules' rows (dictionary lookups)
                own = exp.Case(ifs=[exp.If(this=exp.EQ(this=col("_rule", "g"), expression=integer(index)), true=own)])
            columns.append(alias(own, rule_column(index, k)))
    select = exp.select(
        col("_rule", "g"), alias(col("_rid", "k") if keys else integer(0), "_head"),
        *[col(f"_r{j}", "g") for j in range(n_refs)], *columns,
    ).from_(alias(groundings.copy(), "g", table=True), copy=False)
    select = _join_keys(select, keys_table, keys)
    if only is not None:
        select = select.where(exp.EQ(this=col("_rule", "g"), expression=integer(only)), copy=False)
    order = ["_rule", "_head"] if one_per_head else ["_rule", "_head", *[f"_r{j}" for j in range(n_refs)],
                                                     *[c.alias for c in columns]]
    return select.order_by(*[exp.Ordered(this=col(name), nulls_first=True) for name in order], copy=False)


def new_dictionary_values(dictionary: exp.Table, source: exp.Expression, column: str) -> exp.Select:
    """The distinct values of `column` (as `v`) that the dictionary has no code for yet."""
    seen = exp.select(integer(1)).from_(alias(dictionary.copy(), "d", table=True)).where(
        exp.NullSafeEQ(this=col("value", "d"), expression=col("v", "n")))
    new_values = exp.select(alias(col(column), "v")).distinct().from_(source.copy())
    return exp.select(col("v", "n")).from_(alias(exp.Subquery(this=new_values), "n", table=True)).where(
        exp.Not(this=exp.Exists(this=seen)))


def dictionary_insert(dictionary: exp.Table, source: exp.Table, column: str) -> exp.Insert:
    """Append values of `column` not yet in the dictionary, with the next free codes."""
    seen = exp.select(integer(1)).from_(alias(dictionary.copy(), "d", table=True)).where(
        exp.NullSafeEQ(this=col("value", "d"), expression=col("v", "n")))
    offset = exp.select(exp.Count(this=exp.Star())).from_(dictionary.copy())
    new_values = exp.select(alias(col(column), "v")).distinct().from_(source.copy())
    code = exp.Add(
        this=exp.Subquery(this=offset),
        expression=exp.Sub(this=exp.Window(this=exp.RowNumber(),
                                           order=exp.Order(expressions=[exp.Ordered(this=col("v", "n"), nulls_first=True)])),
                           expression=integer(1)),
    )
    body = exp.select(col("v", "n"), alias(code, "code")).from_(
        alias(exp.Subquery(this=new_values), "n", table=True)
    ).where(exp.Not(this=exp.Exists(this=seen)))
    return exp.Insert(this=dictionary.copy(), expression=body)


def unjoined_tables(select: exp.Select) -> list[list[exp.Table]] | None:
    """The tables of `select`'s FROM and JOINs in groups that no equality between two of their
    columns connects (ON, USING or WHERE): more than one group is a cross product of the groups.
    None where the AST cannot tell (a subquery or table function among the sources, an outer
    level): an engine's own estimate, if any, decides there."""
    first = select.args.get("from_") or select.args.get("from")  # the key's name differs between sqlglot versions
    sources = [first and first.this, *(j.this for j in select.args.get("joins") or [])]
    if not sources or any(not isinstance(s, exp.Table) or not isinstance(s.this, exp.Identifier) for s in sources):
        return None
    names = [s.alias_or_name for s in sources]
    group = {name: name for name in names}

    def find(name: str) -> str:
        while group[name] != name:
            name = group[name]
        return name

    def connect(a: str, b: str) -> None:
        group[find(a)] = find(b)

    conditions = [j.args.get("on") for j in select.args.get("joins") or []]
    conditions.append(select.args.get("where") and select.args["where"].this)
    for position, join in enumerate(select.args.get("joins") or [], 1):
        if join.args.get("using") or join.args.get("method"):  # USING (...), NATURAL: shared column names
            connect(names[position], names[position - 1])
    for condition in filter(None, conditions):
        for equal in condition.find_all(exp.EQ):
            sides = [equal.this, equal.expression]
            if not all(isinstance(side, exp.Column) for side in sides):
                continue
            tables = [side.table for side in sides]
            if not all(tables):  # an unqualified column: it may join any two tables, so assume it does
                for other in names[1:]:
                    connect(names[0], other)
            elif tables[0] != tables[1] and all(t in group for t in tables):
                connect(tables[0], tables[1])
    groups: dict[str, list[exp.Table]] = {}
    for name, source in zip(names, sources):
        groups.setdefault(find(name), []).append(source)
    return list(groups.values())


_VOLATILE = {"random", "rand", "uuid", "gen_random_uuid", "nextval", "setseed"}  # a value per call, not per row


def inline_laterals(select: exp.Select) -> exp.Select:
    """`select`, in place, with each `CROSS JOIN LATERAL (SELECT e1 AS a1, ...) x` that has no FROM
    (one row per row: Template.auto's event ages) taken out and `x.a1` read as `(e1)` where it is
    used. DuckDB plans such a lateral as a dependent join (a delim join, a hash join and a grouping
    for each), which cost hostile_0's six grounding statements that hold one 7.6 of 48.9 ms. Only
    where the rows are the same: every reference to the lateral's names qualified by its alias (no
    unqualified one, no `x.*`), no other subquery in `select`, and its expressions free of
    aggregates, windows, subqueries and functions with a value per call (random())."""
    for join in list(select.args.get("joins") or []):
        lateral = join.this
        if (not isinstance(lateral, exp.Lateral) or str(join.args.get("kind") or "").upper() != "CROSS"
                or join.args.get("on") or join.args.get("using") or join.args.get("side")):
            continue
        inner = lateral.this.this if isinstance(lateral.this, exp.Subquery) else lateral.this
        named = lateral.args.get("alias")
        if (not isinstance(inner, exp.Select) or named is None or named.args.get("columns") or not named.name
                or any(value for key, value in inner.args.items() if key != "expressions")):
            continue
        if not all(isinstance(e, exp.Alias) and e.alias for e in inner.expressions):
            continue
        if any(isinstance(node, exp.AggFunc | exp.Window | exp.Query | exp.Subquery | exp.Rand | exp.Uuid)
               or (isinstance(node, exp.Func) and node.sql_name().lower() in _VOLATILE)
               for e in inner.expressions for node in e.this.walk()):
            continue
        defined = {e.alias.casefold(): e.this for e in inner.expressions}
        name = named.name.casefold()
        outside = [n for n in select.walk() if not _within(n, lateral)]
        if any(isinstance(n, exp.Query | exp.Subquery) and n is not select for n in outside):
            continue
        columns = [n for n in outside if isinstance(n, exp.Column)]
        if any((c.table.casefold() == name and (isinstance(c.this, exp.Star) or c.name.casefold() not in defined))
               or (not c.table and c.name.casefold() in defined) for c in columns):
            continue
        join.pop()
        for column in columns:
            if column.table.casefold() == name:
                value = exp.Paren(this=defined[column.name.casefold()].copy())
                projected = column.parent is select and any(e is column for e in select.expressions)
                column.replace(alias(value, column.name) if projected else value)  # a projection keeps its name
    return select


def _within(node: exp.Expression, ancestor: exp.Expression) -> bool:
    while node is not None:
        if node is ancestor:
            return True
        node = node.parent
    return False
