"""Templates that read the label they are trained to predict.

A statement that feeds the target column (or a column of the target table that equals it on
every labelled row) into a neural value, or filters groundings by it, lets training reach any
accuracy without learning anything. `Model` refuses such templates unless told to allow them.

One read is accepted in a temporal model: an earlier row's label, read only in the THEN branch
of `CASE WHEN a.<time_column> < <head key> THEN ...` where `a` is the target table's alias the
label is read from and the head key is one the statement selects for its relation (in
Template.auto's node relations, r_time: the target row's time). Rows at the same or a later time
never pass the strict `<`, the target row itself included. The check reads one statement: it
trusts that the head key compared with carries the target row's time, as Template.auto's
relations do; a template that keys its relations by another time is not caught.
"""

from __future__ import annotations

import duckdb
import sqlglot.expressions as exp

from relsql import sql as q
from relsql.data.engine import Database
from relsql.template import ir


def target_reads(template: ir.Template, db: Database, table: str, column: str,
                 time_column: str | None = None) -> list[str]:
    """Each place a rule reads `table.column`, or a copy of it from the same table: "relation,
    origin: <sql>". Value columns, join/filter conditions and joined subqueries count; head keys
    do not, nor (with `time_column`) an earlier row's label (the module docstring)."""
    copies = None
    found = []
    for relation in template.relations.values():
        for rule in relation.rules:
            select = rule.query  # Datalog rules (built later, from predicates) never read a query table
            if not isinstance(select, exp.Select):
                continue
            tables = _aliases(select)
            if table.casefold() not in tables.values():
                continue
            heads = {item.this.sql("duckdb") for item in select.expressions
                     if isinstance(item, exp.Alias) and item.alias.startswith("_h")}
            for node in _inputs(select):
                for reference in node.find_all(exp.Column):
                    source = tables.get(reference.table.casefold()) if reference.table else table.casefold()
                    if source != table.casefold():
                        continue
                    name = reference.name
                    if name.casefold() != column.casefold():
                        if copies is None:
                            copies = copies_of(db, table, column)
                        if name.casefold() not in copies:
                            continue
                    if time_column is not None and _earlier(reference, heads, time_column):
                        continue
                    found.append(f"{relation.name}, {rule.origin}: {reference.sql('duckdb')}"
                                 + ("" if name.casefold() == column.casefold()
                                    else f" (equal to {column} on every labelled row)"))
    return sorted(set(found))


def _aliases(select: exp.Select) -> dict[str, str]:
    """alias (or name) → table name, both folded, for every table the query reads."""
    return {t.alias_or_name.casefold(): t.name.casefold() for t in select.find_all(exp.Table)}


def _inputs(select: exp.Select) -> list[exp.Expression]:
    """The parts of a rule's query whose values reach the network or choose its groundings:
    value columns `_c<k>`, WHERE, join conditions, and subqueries in FROM and JOIN (a lateral
    row's columns become value columns) (not head keys `_h<i>` or row ids)."""
    parts = [item for item in select.expressions if item.alias_or_name.startswith("_c")]
    if select.args.get("where") is not None:
        parts.append(select.args["where"])
    joins = select.args.get("joins") or []
    parts += [join.args["on"] for join in joins if join.args.get("on") is not None]
    sources = [select.args["from"].this] if select.args.get("from") is not None else []
    parts += [source for source in sources + [join.this for join in joins]
              if source.find(exp.Select) is not None]
    return parts


def _earlier(reference: exp.Column, heads: set[str], time_column: str) -> bool:
    """Whether `reference` is read only in the THEN branch of `CASE WHEN a.<time_column> < <a head
    key>`, `a` its own table alias: an earlier row's value (the module docstring)."""
    node = reference
    while node.parent is not None:
        parent = node.parent
        if isinstance(parent, exp.If) and node.arg_key == "true":
            cut = parent.this
            if (isinstance(cut, exp.LT) and isinstance(cut.this, exp.Column)
                    and cut.this.name.casefold() == time_column.casefold()
                    and cut.this.table.casefold() == reference.table.casefold() and reference.table
                    and cut.expression.sql("duckdb") in heads):
                return True
        node = parent
    return False


def copies_of(db: Database, table: str, column: str) -> set[str]:
    """Columns of `table` equal to `column` on every row where it is not NULL (folded names): one
    query counting every candidate's differing rows (a query per column was a tenth of a small
    database's construction statements); where it fails, a query per column, as each may."""
    target = q.col(column)
    columns = db.columns(table)
    kind = _kind(next((t for n, t in columns if n.casefold() == column.casefold()), ""))
    # a column of another kind of type is no copy; comparing would fail (and Spark logs every failure)
    names = [name for name, sql_type in columns if name.casefold() != column.casefold() and _kind(sql_type) == kind]
    rows = exp.Table(this=q.ident(table))
    known = exp.Not(this=exp.Is(this=target.copy(), expression=exp.Null()))
    if not names:
        return set()
    together = exp.select(*[exp.Count(this=exp.Case(ifs=[exp.If(this=_differs(name, target), true=q.integer(1))]))
                            for name in names]).from_(rows.copy()).where(known.copy())
    try:
        counts = [c[0].as_py() for c in db.arrow(together).columns]
        return {name.casefold() for name, count in zip(names, counts, strict=True) if count == 0}
    except duckdb.Error:  # a pair that cannot be compared: each column alone
        pass
    copies = set()
    for name in names:
        differ = exp.select(exp.Count(this=exp.Star())).from_(rows.copy()).where(exp.and_(known.copy(), _differs(name, target)))
        try:
            if db.arrow(differ).column(0)[0].as_py() == 0:
                copies.add(name.casefold())
        except duckdb.Error:  # types that cannot be compared are not copies
            continue
    return copies


def _differs(name: str, target: exp.Expression) -> exp.Expression:
    return exp.NullSafeEQ(this=q.col(name), expression=target.copy()).not_()


_NUMBERS = ("TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "UTINYINT", "USMALLINT", "UINTEGER", "UBIGINT",
            "UHUGEINT", "FLOAT", "DOUBLE", "REAL", "DECIMAL", "BOOLEAN", "INT", "INT4", "INT8")


def _kind(sql_type: str) -> str:
    """Numbers (and booleans, 0/1), or the type itself: values of one kind can be compared."""
    base = sql_type.upper().split("(")[0].strip()
    return "number" if base in _NUMBERS else base
