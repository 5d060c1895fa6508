"""Primary and foreign keys for automatic templates: declared ones, else inferred and checked.

Inference proposes candidates from names and types, and the database confirms them: a
primary key must be unique and never NULL, a foreign key's values must all be contained in
the referenced key. Whatever was inferred is reported so the template can say so.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import sqlglot.expressions as exp

from relsql.catalog import Catalog, ForeignKey, Table
from relsql.db import Database

_NUMERIC = ("INT", "DECIMAL", "NUMERIC", "DOUBLE", "FLOAT", "REAL")


@dataclass
class Schema:
    """The key structure the template generator walks."""

    tables: dict[str, Table]
    primary_keys: dict[str, tuple[str, ...]]
    foreign_keys: list[tuple[str, ForeignKey]]  # (child table, key)
    inferred_primary: set[str] = field(default_factory=set)
    inferred_foreign: list[tuple[str, ForeignKey]] = field(default_factory=list)


def _q(name: str) -> exp.Identifier:
    return exp.to_identifier(name, quoted=True)


def _bare(column: str) -> str:
    """`o_custkey` → `custkey`: drop a short table prefix, as TPC-H-like schemas use."""
    head, _, tail = column.lower().partition("_")
    return tail if tail and len(head) <= 3 else column.lower()


def _family(sql_type: str) -> str:
    upper = sql_type.upper()
    if any(n in upper for n in _NUMERIC):
        return "number"
    if "CHAR" in upper or "TEXT" in upper or "STRING" in upper:
        return "text"
    return upper


def _is_unique_key(db: Database, table: str, column: str) -> bool:
    col = exp.column(_q(column))
    row = db.con.execute(exp.select(
        exp.Count(this=exp.Star()), exp.Count(this=exp.Distinct(expressions=[col.copy()])), exp.Count(this=col.copy()),
    ).from_(exp.Table(this=_q(table))).sql("duckdb")).fetchone()
    return row[0] > 0 and row[0] == row[1] == row[2]


def _contained(db: Database, child: str, column: str, parent: str, key: str) -> bool:
    """Every non-NULL child value occurs in the parent's key, and there is at least one."""
    c = exp.column(_q(column), table=_q("c"))
    missing = exp.select(exp.Count(this=exp.Star())).from_(exp.alias_(exp.Table(this=_q(child)), _q("c"), table=True)).where(
        exp.and_(exp.Not(this=exp.Is(this=c.copy(), expression=exp.Null())),
                 exp.Not(this=exp.In(this=c.copy(), query=exp.Subquery(this=exp.select(exp.column(_q(key))).from_(exp.Table(this=_q(parent))))))))
    present = exp.select(exp.Count(this=exp.column(_q(column)))).from_(exp.Table(this=_q(child)))
    return db.con.execute(missing.sql("duckdb")).fetchone()[0] == 0 and db.con.execute(present.sql("duckdb")).fetchone()[0] > 0


def schema(db: Database, catalog: Catalog, infer: bool = True) -> Schema:
    tables = dict(catalog.tables)
    primary = {name: tuple(t.primary_key) for name, t in tables.items()}
    result = Schema(tables, primary, [(name, fk) for name, t in tables.items() for fk in t.foreign_keys])
    if not infer:
        return result
    for name, table in tables.items():
        if primary[name]:
            continue
        lowered = name.lower().rstrip("s")
        named = ("id", f"{name.lower()}_id", f"{lowered}_id", f"{name.lower()}id", f"{lowered}id", f"{lowered}key")
        candidates = [c.name for c in table.columns if c.name.lower() in named or _bare(c.name) in named]
        candidates += [c.name for c in table.columns if c.name not in candidates
                       and (_bare(c.name).endswith(("key", "_id")) or _bare(c.name) == "id")]
        for column in candidates:
            if _is_unique_key(db, name, column):
                primary[name] = (column,)
                result.inferred_primary.add(name)
                break
    declared = {child for child, _ in result.foreign_keys}
    for child, table in tables.items():
        if child in declared:
            continue  # a table that declares foreign keys is trusted as it is
        for column in table.columns:
            if primary[child] == (column.name,):
                continue
            for parent, ptable in tables.items():
                key = primary[parent]
                if len(key) != 1 or (parent == child and column.name == key[0]):
                    continue
                pcol = next(c for c in ptable.columns if c.name == key[0])
                names_match = (column.name.lower() == key[0].lower() or _bare(column.name) == _bare(key[0])
                               or column.name.lower() in (f"{parent.lower()}_id", f"{parent.lower().rstrip('s')}_id"))
                if not names_match or _family(column.type) != _family(pcol.type):
                    continue
                if _contained(db, child, column.name, parent, key[0]):
                    fk = ForeignKey((column.name,), parent, key)
                    result.foreign_keys.append((child, fk))
                    result.inferred_foreign.append((child, fk))
                    break
    for name, table in tables.items():
        # A table without a key but with foreign keys: its foreign key columns if unique together
        # (a link table), else those plus one integer column (TPC-H lineitem: + l_linenumber).
        columns = tuple(dict.fromkeys(c for child, fk in result.foreign_keys if child == name for c in fk.columns))
        if primary[name] or not columns:
            continue
        extra = [c.name for c in table.columns if c.name not in columns and "INT" in c.type.upper()]
        for candidate in ([columns] if len(columns) >= 2 else []) + [(*columns, c) for c in extra]:
            if _unique_together(db, name, candidate):
                primary[name] = candidate
                result.inferred_primary.add(name)
                break
    return result


def _unique_together(db: Database, table: str, columns: tuple[str, ...]) -> bool:
    source = exp.Table(this=_q(table))
    total = db.con.execute(exp.select(exp.Count(this=exp.Star())).from_(source.copy()).sql("duckdb")).fetchone()[0]
    distinct = exp.select(*[exp.column(_q(c)) for c in columns]).distinct().from_(source.copy())
    count = db.con.execute(exp.select(exp.Count(this=exp.Star())).from_(exp.alias_(exp.Subquery(this=distinct), _q("d"), table=True)).sql("duckdb")).fetchone()[0]
    return total > 0 and total == count
