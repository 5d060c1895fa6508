"""What `Model` checks before it trains: which relation is the output, that its keys are the
target table's (of the same type), and that every split asked for gets rows."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import sqlglot.expressions as exp

from relsql.errors import RelsqlError, SchemaError
from relsql.ground import query as q
from relsql.template.ir import Template

if TYPE_CHECKING:
    from relsql.db import Database
    from relsql.train.target import Target


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


def splits(db: Database, target: Target, split: dict[str, np.ndarray], labelled: int) -> None:
    """Every split asked for gets rows: a model trained on one row, or judged on none, is not a
    result. The message says how many target rows the output relation reaches."""
    empty = [name for name, fraction in zip(("train", "val", "test"), target.fractions) if fraction > 0 and not len(split[name])]
    if not empty:
        return
    total = db.arrow(exp.select(exp.Count(this=q.col(target.column))).from_(exp.Table(this=q.ident(target.table)))).column(0)[0].as_py()
    raise RelsqlError(
        f"the {' and '.join(empty)} split{'s are' if len(empty) > 1 else ' is'} empty: output relation `{target.output}` "
        f"has a row for {labelled} of the {total} labelled rows of `{target.table}`. Check that `{target.output}` is the "
        f"relation that predicts {target.name} (output=...), add labelled rows, or give those splits 0 in split=")
