"""A table's columns as a PyTorch Frame `TensorFrame`, so RelBench's own encoders read an export.

RelBench's `HeteroEncoder` reads each node type's `tf` (a TensorFrame: columns grouped by
semantic type) and its column statistics; `make_pkey_fkey_graph` builds them from pandas frames
and a {column: stype} map. `to_heterodata(db)` builds the same from the database's tables here:
numbers are numerical, booleans and strings with few distinct values categorical, dates and
timestamps timestamps; other strings are text, which needs an embedder (`text_embedder=`, a
torch_frame `TextEmbedderConfig`) and is otherwise left out and named in `dropped_columns`.
A user's `stypes` ({table: {column: stype or its name}}) overrides the guess.

Keys never become features (RelBench leaves primary and foreign keys out too), and neither does
anything of a task table but its keys and time: its other columns are labels.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from relsql.errors import RelsqlError, SchemaError

# A string column is categorical when it has at most this many distinct values (and at most
# half as many as rows): names, codes and flags; longer-tailed strings are free text.
CATEGORIES = 1000
CONSTANT = "__const__"  # RelBench's name for the one column a table without features gets


def torch_frame_or_none():
    """torch_frame, or None when PyTorch Frame is not installed (the export then carries `x` only)."""
    try:
        import torch_frame
    except ImportError:
        return None
    return torch_frame


def guess_stype(column: pa.ChunkedArray, rows: int) -> str | None:
    """The stype name a column's values suggest; None for what no stype holds (lists, structs, blobs)."""
    kind = column.type
    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    if pa.types.is_boolean(kind):
        return "categorical"
    if pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_decimal(kind):
        return "numerical"
    if pa.types.is_timestamp(kind) or pa.types.is_date(kind):
        return "timestamp"
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        distinct = pc.count_distinct(column).as_py()
        return "categorical" if distinct <= CATEGORIES and distinct <= max(rows // 2, 1) else "text_embedded"
    return None


def checked_stypes(stypes: object, tables: list[str], torch_frame) -> dict[str, dict[str, Any]]:
    """`stypes` as {table: {column: torch_frame.stype}}, refused with the form it takes when wrong."""
    if stypes is None:
        return {}
    if torch_frame is None:
        raise RelsqlError("stypes= describes PyTorch Frame columns, and PyTorch Frame is not installed: "
                          "pip install pytorch-frame, or drop stypes=")
    if not isinstance(stypes, Mapping) or not all(isinstance(t, str) and isinstance(m, Mapping)
                                                   for t, m in stypes.items()):
        raise SchemaError(f"stypes must map tables to {{column: stype}}, e.g. {{'orders': {{'amount': 'numerical'}}}}; "
                          f"got {type(stypes).__name__} {str(stypes)[:60]!r}")
    out: dict[str, dict[str, Any]] = {}
    for table, columns in stypes.items():
        if table not in tables:
            raise SchemaError(f"stypes names table `{table}`, which is not exported; exported: {', '.join(tables)}")
        out[table] = {}
        for column, kind in columns.items():
            try:
                out[table][column] = torch_frame.stype(getattr(kind, "value", kind))
            except ValueError:
                known = ", ".join(s.value for s in torch_frame.stype)
                raise SchemaError(f"stypes[{table!r}][{column!r}] = {kind!r} is no PyTorch Frame stype; "
                                  f"known: {known}") from None
    return out


def table_frame(store, frame: pa.Table, features: list[str], chosen: Mapping[str, Any], torch_frame,
                text_embedder: object = None) -> None:
    """Put `tf` (the TensorFrame of `features`), `col_stats` and `dropped_columns` on a node store."""
    stype = torch_frame.stype
    col_to_stype: dict[str, Any] = {}
    dropped: list[str] = []
    for name in features:
        kind = chosen.get(name)
        if kind is None:
            guess = guess_stype(frame.column(name), frame.num_rows)
            kind = None if guess is None else stype(guess)
        if kind is None or (kind.is_text_stype and text_embedder is None) or kind == stype.image_embedded:
            dropped.append(name)
            continue
        col_to_stype[name] = kind
    if not col_to_stype:  # a table without features: one constant column, as RelBench gives it
        frame = pa.table({CONSTANT: pa.array([1.0] * frame.num_rows, pa.float64())})
        col_to_stype = {CONSTANT: stype.numerical}
    df = frame.select(list(col_to_stype)).to_pandas()
    embedder = text_embedder if any(k.is_text_stype for k in col_to_stype.values()) else None
    dataset = torch_frame.data.Dataset(df, col_to_stype, col_to_text_embedder_cfg=embedder).materialize()
    store.tf = dataset.tensor_frame
    store.col_stats = dataset.col_stats
    store.dropped_columns = dropped


def task_columns(db: object) -> dict[str, set[str]]:
    """{task table: the columns an export may carry} — its keys and time; the rest are labels."""
    kept: dict[str, set[str]] = {}
    for name, task in getattr(db, "relbench_tasks", {}).items():
        kept[name] = {task.key, *task.entities, *([task.time_column] if task.time_column else [])}
    return kept


def hidden_columns(db: object) -> set[tuple[str, str]]:
    """(table, column) pairs a RelBench task of `db` hides from its inputs (autocomplete tasks' targets)."""
    return {tuple(pair) for task in getattr(db, "relbench_tasks", {}).values() for pair in task.hidden}
