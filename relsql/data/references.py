"""Which table a target column references: a foreign key (or a list of keys) makes a ranking task.

A scalar column is a reference when the database's keys (declared, given to `connect(keys=...)`
or inferred, relsql.data.keys.schema) say it is a one-column foreign key. A list column (BIGINT[],
VARCHAR[]: the items a row links to) cannot be declared a foreign key in SQL, so it references
the table its given or declared key names (a RelBench link task's destination column; the key
layer keeps such keys out of joins, `Schema.list_references`), else the table whose one-column
primary key has the list's name (`item_id` -> `item(item_id)`), as predictive queries name their
LIST_DISTINCT columns. Template generation and training decide
by this one rule, on every engine (Spark's catalog declares no keys: given and inferred ones
decide there, as they do on DuckDB for a table without declarations).
"""

from __future__ import annotations

from dataclasses import dataclass

from relsql.data.engine import Database
from relsql.errors import SchemaError


@dataclass(frozen=True)
class Reference:
    """The candidate table of a ranking target: `table`'s rows, identified by column `key`."""

    table: str
    key: str
    many: bool  # the target column is a list of keys (several positives per row)


def is_list(sql_type: str) -> bool:
    """Whether a column type (DuckDB's spelling) is a list of values."""
    return sql_type.rstrip().endswith("]") or sql_type.upper().startswith("LIST")


def referenced(db: Database, table: str, column: str, infer: bool = False) -> Reference | None:
    """The table `table.column` references, or None for an ordinary (label) column. Keys are the
    declared and given ones; `infer=True` adds inferred keys (a warehouse without declarations),
    which `Model(task="ranking")` and Template.auto(infer_keys=True) ask for: an inferred foreign
    key alone does not turn a class label such as `store_id` into a ranking. The same keys on
    every engine: Spark's catalog declares none, so there given and inferred keys decide alone."""
    from relsql.data.keys import schema

    columns = dict(db.columns(table))
    if column not in columns:
        return None
    many = is_list(columns[column])
    if not (many or infer or db.key_catalog or _given_foreign_key(db, table, column)):
        return None  # no declared keys (Spark) and none given over it: a label, known without a count of every table
    keys = schema(db, db.catalog(), infer=infer or many)  # a list needs its table's key, declared, given or inferred
    if many:  # a list declared or given as a foreign key (a RelBench link task's) references that key's table
        for child, fk in keys.list_references:
            if child == table and fk.columns == (column,) and len(fk.references) == 1:
                return Reference(fk.table, fk.references[0], True)
    if not many:
        for child, fk in keys.foreign_keys:
            if child == table and fk.columns == (column,) and len(fk.references) == 1:
                return Reference(fk.table, fk.references[0], False)
        return None
    named = [t for t, key in keys.primary_keys.items() if len(key) == 1 and key[0].casefold() == column.casefold() and t != table]
    if len(named) == 1:
        return Reference(named[0], keys.primary_keys[named[0]][0], True)
    if not named:
        raise SchemaError(f"target {table}.{column} is a list ({columns[column]}); a list target ranks the rows of the table "
                          f"whose one-column primary key is named `{column}`, and no table has one. Name the list column "
                          "after the referenced table's key (e.g. item_id for item(item_id)), or declare that key")
    raise SchemaError(f"target {table}.{column} is a list, and several tables have a primary key named `{column}`: "
                      f"{', '.join(sorted(named))}; rename the list column after one of them")


def _given_foreign_key(db: Database, table: str, column: str) -> bool:
    """Whether `connect(keys=...)` gave a one-column foreign key over `table.column` (the keys are
    resolved to the database's spelling when given)."""
    given = db.given_keys
    return given is not None and any(k.table == table and k.columns == (column,) for k in given.foreign)
