"""Small Arrow tables as SQL rows of typed literals, so that DuckDB reads them without a scan of a
Python object: its Python client imports pandas (1-1.5 s of CPU, most of a cold predict(keys=)
after Model.load) on the first Python object it scans, and each registered table costs a scan's
setup (Lahman's loaded model registered 115 embedding dictionaries and the asked keys)."""

from __future__ import annotations

import pyarrow as pa
import sqlglot.expressions as exp

from relsql import sql as q

MAX_ROWS = 5_000  # beyond it the SQL text costs more than a registered table's scan

_T = exp.DataType.Type
_INTEGERS = {pa.int8(): _T.TINYINT, pa.int16(): _T.SMALLINT, pa.int32(): _T.INT, pa.int64(): _T.BIGINT,
             pa.uint8(): _T.UTINYINT, pa.uint16(): _T.USMALLINT, pa.uint32(): _T.UINT, pa.uint64(): _T.UBIGINT}


def _kind(kind: pa.DataType) -> exp.DataType.Type | None:
    """The DuckDB type a registered Arrow column of `kind` reads as, for the kinds written here."""
    if pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind):
        return _T.VARCHAR
    if pa.types.is_boolean(kind):
        return _T.BOOLEAN
    return _INTEGERS.get(kind)


def _literal(value: object, kind: exp.DataType.Type) -> exp.Expression | None:
    """`value` as a literal cast to `kind`; None where it cannot be written exactly (a NUL in text)."""
    if value is None:
        literal: exp.Expression = exp.Null()
    elif kind is _T.VARCHAR:
        if "\x00" in value:
            return None
        literal = exp.Literal.string(value)
    elif kind is _T.BOOLEAN:
        literal = exp.Boolean(this=bool(value))
    else:
        literal = q.integer(value)
    return exp.Cast(this=literal, to=exp.DataType(this=kind))


def rows_query(table: pa.Table, limit: int | None = None) -> exp.Select | None:
    """`SELECT * FROM (VALUES ...) AS "v"(<its columns>)`: `table`'s rows, in order, each column
    typed as DuckDB reads a registered Arrow column of its type. None (register it instead) for
    an empty table, one of more than `limit` rows (default MAX_ROWS), or a column of another type."""
    if table.num_rows == 0 or table.num_rows > (MAX_ROWS if limit is None else limit):
        return None
    kinds = [_kind(field.type) for field in table.schema]
    if any(kind is None for kind in kinds):
        return None
    columns = [column.to_pylist() for column in table.columns]
    rows = []
    for values in zip(*columns):
        literals = [_literal(value, kind) for value, kind in zip(values, kinds)]
        if any(literal is None for literal in literals):
            return None
        rows.append(exp.Tuple(expressions=literals))
    alias = exp.TableAlias(this=q.ident("v"), columns=[q.ident(name) for name in table.column_names])
    return exp.select(exp.Star()).from_(exp.Values(expressions=rows, alias=alias), copy=False)
