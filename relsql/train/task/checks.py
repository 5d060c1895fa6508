"""What `Model` checks before it trains: which relation is the output, and that its keys are the
target table's (of the same type)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import sqlglot.expressions as exp

from relsql.errors import SchemaError
from relsql.template.ir import Template

if TYPE_CHECKING:
    from relsql.data.engine import Database


def default_output(template: Template, table: str) -> str:
    """The relation a target table asks for: NeuraLogic's query tables (`query_<p>`, written by the
    importer) ask for `p`; otherwise the template's last relation."""
    if template.language == "datalog" and table.startswith("query_") and table[len("query_"):] in template.relations:
        return table[len("query_"):]
    return template.output


def _type_kind(sql_type: str) -> str:
    """A database type's family for comparing keys: integers of any width match, and so on."""
    name = sql_type.upper()
    for kind, markers in (("integer", ("INT",)), ("number", ("DOUBLE", "FLOAT", "REAL", "DECIMAL", "NUMERIC")),
                          ("text", ("VARCHAR", "CHAR", "TEXT", "STRING", "UUID")), ("time", ("DATE", "TIME")),
                          ("boolean", ("BOOL",))):
        if any(m in name for m in markers):
            return kind
    return name


def key_types(db: Database, output: str, table: str, keys: list[str]) -> None:
    """The output's head keys and the target table's key columns must be of one kind: DuckDB
    would compare '1' with 1 by casting, silently matching rows that are not the same key."""
    produced = dict(db.result_columns(exp.select(exp.Star()).from_(db.temp_table("k", output)).limit(0)))
    columns = dict(db.columns(table))
    for key in keys:
        mine, theirs = _type_kind(produced.get(key, "")), _type_kind(columns.get(key, ""))
        if mine != theirs:
            raise SchemaError(f"output relation `{output}` has key `{key}` of type {produced.get(key)}, but "
                              f"`{table}.{key}` is {columns.get(key)}; select the target table's own key column "
                              f"as the head (or CAST it to {columns.get(key)})")

