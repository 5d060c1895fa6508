"""Test helper: fill a table from Python rows in one statement (fixtures of many test files)."""

from __future__ import annotations

import pyarrow as pa


def insert_rows(con, table: str, rows: list[tuple], columns: list[str] | None = None) -> None:
    """Append `rows` (tuples in the table's column order, or in `columns`' order) through one Arrow
    table: one INSERT, where `executemany` runs a statement a row (~2 ms each, which every fixture
    building thousands of rows paid). The table's column types convert the values as they convert
    executemany's parameters (str to DATE, int to DOUBLE, ...). `con`: a DuckDB connection or a
    relsql.Database."""
    if not rows:
        return
    con = getattr(con, "con", con)
    frame = pa.table({f"c{i}": list(values) for i, values in enumerate(zip(*rows))})
    target = f'"{table}"' if columns is None else f'"{table}" ({", ".join(f"{c!r}".replace(chr(39), chr(34)) for c in columns)})'
    con.register("_insert_rows", frame)
    try:
        con.execute(f"INSERT INTO {target} SELECT * FROM _insert_rows")
    finally:
        con.unregister("_insert_rows")
