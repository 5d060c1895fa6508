"""What a target column asks to predict: binary, multi-class or regression, read from its type
and values. A leaf (it imports only relsql.errors), so that template generation (the output
width of an automatic template) and training (relsql.train.task, the loss and metrics) decide
it by one rule without the template layer importing training."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from relsql.errors import SchemaError

MAX_CLASSES = 20  # integer targets with at most this many distinct values are classes
MAX_TIMES = 1024  # a ranking target's timed relation: one tower column per distinct time, beyond this wider than useful


def check_scalar(kind: pa.DataType, where: str) -> None:
    """A label is one value per row. A list of keys is a ranking target (relsql/data/references.py finds
    the table it references before this is asked); a struct, map or other list is not a label."""
    if pa.types.is_nested(kind) or (pa.types.is_dictionary(kind) and pa.types.is_nested(kind.value_type)):
        raise SchemaError(f"target {where} has type {kind}: a list, struct or map is not one value per row. A list of "
                          "keys ranks the table they reference when it is named after that table's one-column primary "
                          "key (docs/recommendation.md); otherwise predict a column with one value per row (a class, a "
                          "number or a boolean)")


def _guess(column: pa.ChunkedArray, distinct: list, numeric: bool, where: str) -> str:
    """The task a column's type and distinct values ask for, when none is given."""
    if numeric and len(distinct) == 2:
        return "binary"  # a 0/1 (or any two-valued) number column is a class label
    if pa.types.is_floating(column.type) or pa.types.is_decimal(column.type):
        return "regression"
    if numeric and len(distinct) > MAX_CLASSES:
        return "regression"
    if numeric or pa.types.is_boolean(column.type) or pa.types.is_string(column.type) or pa.types.is_large_string(column.type) \
            or pa.types.is_dictionary(column.type):
        return "binary" if len(distinct) <= 2 else "multiclass"
    raise SchemaError(f"target {where} has type {column.type}, which relsql cannot predict; "
                      "use a boolean, categorical, integer or numeric column")


def task_kind(column: pa.ChunkedArray, where: str, kind: str | None = None) -> tuple[str, list]:
    """(kind, classes) for the target column (non-NULL rows only): classes are its distinct
    values in label order for a classifier, [] for regression. `kind` forces the task."""
    check_scalar(column.type, where)
    present = column.drop_null()
    distinct = sorted(pc.unique(present).to_pylist(), key=lambda v: (str(type(v)), v))  # distinct values only, not rows
    if not len(present):
        raise SchemaError(f"target {where} has no non-NULL values to learn from")
    numeric = pa.types.is_integer(column.type) or pa.types.is_floating(column.type) or pa.types.is_decimal(column.type)
    kind = _guess(column, distinct, numeric, where) if kind is None else kind
    if kind in ("binary", "multiclass"):
        if len(distinct) < 2:
            raise SchemaError(f"target {where} has a single class ({distinct[0]!r}); a classifier needs at least two")
        if kind == "binary" and len(distinct) > 2:
            raise SchemaError(f"target {where} has {len(distinct)} classes; use task='multiclass'")
        return kind, distinct
    if kind != "regression":
        raise SchemaError(f"unknown task {kind!r}; use 'binary', 'multiclass' or 'regression'")
    if not numeric:
        raise SchemaError(f"target {where} has type {column.type}; regression needs a numeric column")
    return "regression", []


def output_units(column: pa.ChunkedArray, where: str) -> int:
    """How many outputs a model of this target has: one per class of a multi-class target, else one."""
    kind, classes = task_kind(column, where)
    return len(classes) if kind == "multiclass" else 1
