"""Which output rows `predict(keys=..., where=...)` scores.

`keys`: a frame of the target table's key columns; the rows come back in the frame's order.
`where`: a SQL condition on the target table's columns, checked and evaluated by relsql/where.py
(never pasted into SQL).
"""

from __future__ import annotations

import numpy as np
import polars as pl

from relsql.data.engine import Database, to_arrow
from relsql.errors import RelsqlError, SchemaError
from relsql.where import where_keys


def _as_frame(keys: object, names: list[str], table: str) -> pl.DataFrame:
    """`keys` (a polars or pandas frame, an Arrow table or a dict of lists) as a polars frame of the key columns."""
    if isinstance(keys, dict):
        try:
            frame = pl.DataFrame(keys)
        except (TypeError, ValueError, pl.exceptions.PolarsError) as err:
            raise RelsqlError(f"keys: cannot read the dict as columns of equal length ({err}); pass "
                              f"{{{', '.join(repr(k) + ': [...]' for k in names)}}}") from None
    else:
        frame = pl.from_arrow(to_arrow(keys, "keys"))
    if not isinstance(frame, pl.DataFrame):
        raise RelsqlError(f"keys must be a frame of {table}'s key columns {names}, got {type(keys).__name__}")
    if sorted(frame.columns) != sorted(names):
        raise RelsqlError(f"keys must have exactly the key columns of `{table}`: {names}; got {frame.columns}")
    return frame.select(names)


def typed_keys(keys: object, names: list[str], table: str, schema: pl.Schema) -> pl.DataFrame:
    """`keys` as a frame of the key columns `names`, cast to the output rows' types `schema`; a
    value or column that does not fit is a RelsqlError."""
    frame = _as_frame(keys, names, table)
    for k in names:  # polars casts a one-field struct "strictly" to a number, and its join then fails
        given, wanted = frame.schema[k], schema[k]
        if given.is_nested() != wanted.is_nested() or given == pl.Object:
            raise RelsqlError(f"keys: column `{k}` holds {given} values, but `{table}`'s key column `{k}` is {wanted}; "
                              f"pass plain {wanted} values, one key per row (e.g. {{{k!r}: [1, 2]}})")
    try:
        return frame.with_columns([pl.col(k).cast(schema[k], strict=True) for k in names])
    except pl.exceptions.PolarsError as err:
        raise RelsqlError(f"keys: a value does not fit the type of `{table}`'s key column(s) "
                          f"{ {k: str(schema[k]) for k in names} } ({' '.join(str(err).split())[:200]})") from None


def of_keys(known: pl.DataFrame, keys: object, names: list[str], table: str) -> np.ndarray:
    """The `_rid` of each row of `keys`, in its order; `known` holds every output row's keys and `_rid`."""
    frame = typed_keys(keys, names, table, known.schema)
    try:
        ordered = frame.with_row_index("_order").join(known, on=names, how="left", nulls_equal=True).sort("_order")
    except pl.exceptions.PolarsError as err:
        raise RelsqlError(f"keys: a value does not fit the type of `{table}`'s key column(s) "
                          f"{ {k: str(known.schema[k]) for k in names} } ({' '.join(str(err).split())[:200]})") from None
    unknown = ordered.filter(pl.col("_rid").is_null())
    if unknown.height:
        shown = unknown.select(names).head(3).rows()
        raise RelsqlError(f"keys: {unknown.height} key(s) are not rows the model predicts on `{table}`, e.g. "
                          f"{dict(zip(names, shown[0]))}{'' if unknown.height == 1 else f' (first {len(shown)}: {shown})'}; "
                          "pass keys of existing rows of the target table")
    return ordered["_rid"].to_numpy()


def of_where(db: Database, known: pl.DataFrame, text: object, names: list[str], table: str) -> np.ndarray:
    """The `_rid` of the output rows whose target-table row satisfies `text`, in row-id order."""
    found = where_keys(db, table, names, text)
    try:
        found = found.with_columns([pl.col(k).cast(known.schema[k], strict=True) for k in names])
    except pl.exceptions.PolarsError as err:
        raise SchemaError(f"the key columns of `{table}` no longer have the model's types: {err}") from None
    return known.join(found.unique(), on=names, how="semi", nulls_equal=True).sort("_rid")["_rid"].to_numpy()
