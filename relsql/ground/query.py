"""sqlglot builders for the grounding queries: every statement here is an AST, never pasted text."""

from __future__ import annotations

import sqlglot.expressions as exp


def ident(name: str) -> exp.Identifier:
    return exp.to_identifier(name, quoted=True)


def col(name: str, table: str | None = None) -> exp.Column:
    return exp.column(ident(name), table=ident(table) if table else None)


def create_temp(table: exp.Table, query: exp.Expression) -> exp.Create:
    return exp.Create(this=table, kind="TABLE", expression=query, replace=True,
                      properties=exp.Properties(expressions=[exp.TemporaryProperty()]))


def substitute_relations(query: exp.Select, key_tables: dict[str, exp.Table]) -> exp.Select:
    """Point table references that name a neural relation at that relation's key table."""

    local = {cte.alias for cte in query.find_all(exp.CTE)}  # a CTE shadows a relation's name

    def swap(node: exp.Expression) -> exp.Expression:
        if isinstance(node, exp.Table) and not node.args.get("db") and node.name in key_tables and node.name not in local:
            alias = node.alias or node.name
            return exp.alias_(key_tables[node.name].copy(), ident(alias), table=True)
        return node

    return query.transform(swap)


def key_table_query(grounding_tables: list[exp.Table], keys: list[str]) -> exp.Select:
    """Distinct head keys over all rules of a relation, numbered 0..n-1 in key order."""
    if not keys:
        return exp.select(exp.alias_(exp.Literal.number(0), ident("_rid")))
    parts = [
        exp.select(*[exp.alias_(col(f"_h{i}"), ident(k)) for i, k in enumerate(keys)]).from_(t.copy())
        for t in grounding_tables
    ]
    union: exp.Expression = parts[0]
    for part in parts[1:]:
        union = exp.union(union, part, distinct=True)
    if len(parts) == 1:
        union = parts[0].distinct()
    order = exp.Order(expressions=[exp.Ordered(this=col(k), nulls_first=True) for k in keys])
    rid = exp.Sub(
        this=exp.Window(this=exp.RowNumber(), order=order),
        expression=exp.Literal.number(1),
    )
    return exp.select(*[col(k) for k in keys], exp.alias_(rid, ident("_rid"))).from_(
        exp.alias_(exp.Subquery(this=union), ident("d"), table=True))


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
        exp.alias_(col("_rid", "k") if keys else exp.Literal.number(0), ident("_head")),
        *[col(f"_r{j}", "g") for j in range(n_refs)],
        *[exp.alias_(c, ident(f"_c{i}")) for i, c in enumerate(columns)],
    ).from_(exp.alias_(grounding.copy(), ident("g"), table=True), copy=False)
    if keys:
        condition = exp.and_(*[
            exp.NullSafeEQ(this=col(k, "k"), expression=col(f"_h{i}", "g")) for i, k in enumerate(keys)
        ], copy=False)
        select = select.join(exp.alias_(keys_table.copy(), ident("k"), table=True), on=condition, copy=False)
    if demand is not None:
        head = col("_rid", "k") if keys else exp.Literal.number(0)
        select = select.join(exp.alias_(demand.copy(), ident("d"), table=True),
                             on=exp.EQ(this=col("_rid", "d"), expression=head), copy=False)
    if per_head is not None:
        limit, seed = per_head
        tie = exp.Anonymous(this="hash", expressions=[exp.Literal.number(seed), *[col(f"_r{j}", "g") for j in range(n_refs)],
                                                      *[col(f"_h{i}", "g") for i in range(len(keys))]])
        rank = exp.Window(this=exp.RowNumber(), partition_by=[col("_rid", "k") if keys else exp.Literal.number(0)],
                          order=exp.Order(expressions=[exp.Ordered(this=tie)]))
        select = select.qualify(exp.LTE(this=rank, expression=exp.Literal.number(limit)), copy=False)
    order = ["_head", *[f"_r{j}" for j in range(n_refs)], *[f"_c{i}" for i in range(len(columns))]]
    return select.order_by(*[exp.Ordered(this=col(name), nulls_first=True) for name in order], copy=False)


def dictionary_insert(dictionary: exp.Table, source: exp.Table, column: str) -> exp.Insert:
    """Append values of `column` not yet in the dictionary, with the next free codes."""
    seen = exp.select(exp.Literal.number(1)).from_(exp.alias_(dictionary.copy(), ident("d"), table=True)).where(
        exp.NullSafeEQ(this=col("value", "d"), expression=col("v", "n")))
    offset = exp.select(exp.Count(this=exp.Star())).from_(dictionary.copy())
    new_values = exp.select(exp.alias_(col(column), ident("v"))).distinct().from_(source.copy())
    code = exp.Add(
        this=exp.Subquery(this=offset),
        expression=exp.Sub(this=exp.Window(this=exp.RowNumber(), order=exp.Order(expressions=[exp.Ordered(this=col("v", "n"), nulls_first=True)])), expression=exp.Literal.number(1)),
    )
    body = exp.select(col("v", "n"), exp.alias_(code, ident("code"))).from_(
        exp.alias_(exp.Subquery(this=new_values), ident("n"), table=True)
    ).where(exp.Not(this=exp.Exists(this=seen)))
    return exp.Insert(this=dictionary.copy(), expression=body)
