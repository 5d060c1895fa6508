"""Files `relsql` writes besides tables: predictions (`predict --out`) and the automatic template
(`train` without --template). Each is written to a temporary file in the same folder and renamed
into place, so a reader never sees half a file and an interrupted run leaves the old one whole;
each bears relsql's mark, and only a file bearing it is ever replaced (relsql/ownfiles.py)."""

from __future__ import annotations

import os
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq

from relsql import ownfiles
from relsql.data.catalog import Catalog, Table
from relsql.data.engine import with_mark
from relsql.data.keys import Schema
from relsql.errors import RelsqlError


def write_text_atomically(path: Path, text: str, fix: str = "choose another file, or move that one away") -> None:
    """`text` as `path` (UTF-8), whole, as a template relsql wrote (relsql/ownfiles.py): a file there
    that relsql did not write, or that was edited since, is refused, never replaced."""
    ownfiles.write_text(path, text, "template", fix)


def _for_csv(frame: pl.DataFrame) -> pl.DataFrame:
    """A CSV cell holds no list: class probabilities become JSON arrays as text."""
    lists = [c for c, t in frame.schema.items() if isinstance(t, pl.List)]
    return frame.with_columns([
        (pl.lit("[") + pl.col(c).list.eval(pl.element().cast(pl.String)).list.join(",") + pl.lit("]")).alias(c)
        for c in lists])


def write_predictions(frame: pl.DataFrame, path: Path, replace: bool, kind: str = "predictions") -> None:
    """`frame` as a Parquet file or a CSV file, by `path`'s suffix, atomically, bearing relsql's
    mark of `kind` (relsql/ownfiles.py) so a later --replace knows it. Without `replace` an existing
    file is never replaced; with it, only a file of `kind` relsql wrote."""
    if not replace and os.path.lexists(path):
        raise RelsqlError(f"{path} already exists; nothing was replaced: choose another file, or pass --replace to "
                          f"replace {kind} relsql wrote")
    fix = "choose another --out file" if replace else "choose another file"

    def fill(temporary: Path) -> None:
        if path.suffix.lower() == ".parquet":
            pq.write_table(with_mark(frame.to_arrow(), kind), temporary)
        else:
            _for_csv(frame).write_csv(temporary)

    ownfiles.write_marked(path, kind, fix, fill)


def summary(frame: pl.DataFrame, task, path: str, where: str | None) -> str:
    """A few lines on what was written: rows, their splits and the predictions' spread."""
    chosen = f" (rows where {where})" if where else ""
    lines = [f"wrote {frame.height:,} predictions{chosen} to {path}; columns: {', '.join(frame.columns)}"]
    if frame.height == 0:
        return lines[0] + "\nnote: no row matched"
    split = frame.columns[-1]
    counts = frame[split].fill_null("none (unlabelled)").value_counts(sort=True)
    lines.append("rows by split: " + ", ".join(f"{name} {n:,}" for name, n in counts.iter_rows()))
    prediction = frame.columns[-2 if task.kind == "regression" else -3]  # keys, prediction[, probabilities], split
    values = frame[prediction]
    if task.kind == "regression":
        lines.append(f"{prediction}: mean {values.mean():.4g}, min {values.min():.4g}, max {values.max():.4g}")
    else:
        tally = values.value_counts(sort=True)
        lines.append(f"{prediction}: " + ", ".join(f"{v} {n:,}" for v, n in tally.iter_rows()))
    return "\n".join(lines)


def format_catalog(catalog: Catalog, keys: Schema | None = None) -> str:
    """A readable listing for `relsql inspect`: tables with row counts, columns, keys. With `keys`
    (relsql.data.keys.schema), each key is marked declared, given or inferred, and an inferred
    one is followed by its evidence."""
    count = len(catalog.tables)
    lines = [f"{catalog.source}: {count} table{'s' if count != 1 else ''}"]
    for table in catalog:
        kind = " (view)" if table.kind == "view" else ""
        lines.append("")
        lines.append(f"{table.name}{kind}: {table.rows:,} row{'s' if table.rows != 1 else ''}")
        lines.extend(_table_lines(table, keys))
    return "\n".join(lines)


def _table_lines(table: Table, keys: Schema | None) -> list[str]:
    """Column lines (`PK`, `FK -> t.c` notes), then multi-column and inferred keys on lines of their own."""
    primary = keys.primary_keys.get(table.name, ()) if keys else table.primary_key
    foreign = [fk for child, fk in keys.foreign_keys if child == table.name] if keys else list(table.foreign_keys)
    if keys:  # a list of keys (a RelBench link task's destinations): shown as the reference it is, never joined
        foreign += [fk for child, fk in keys.list_references if child == table.name]
    pk_note = keys.primary_note(table.name) if keys and primary else ""
    fk_notes = {fk: keys.foreign_note(table.name, fk) for fk in foreign} if keys else {}
    tag = (lambda note: f" ({note.split(':')[0]})") if keys else (lambda note: "")  # noqa: E731
    width = max((len(c.name) for c in table.columns), default=0)
    type_width = max((len(c.type) for c in table.columns), default=0)
    lines = []
    for column in table.columns:
        notes = []
        if column.name in primary:
            notes.append("PK" + tag(pk_note))
        notes.extend(f"FK -> {fk.table}.{fk.references[fk.columns.index(column.name)] if fk.references else '?'}"
                     + tag(fk_notes.get(fk, "")) for fk in foreign if column.name in fk.columns)
        notes.append("NULL" if column.nullable else "NOT NULL")
        lines.append(f"  {column.name:<{width}}  {column.type:<{type_width}}  {'  '.join(notes)}".rstrip())
    if len(primary) > 1 or ":" in pk_note:
        lines.append(f"  primary key ({', '.join(primary)})" + (f", {pk_note}" if pk_note else ""))
    for fk in foreign:
        note = fk_notes.get(fk, "")
        if len(fk.columns) > 1 or ":" in note:
            lines.append(f"  foreign key {fk}" + (f", {note}" if note else ""))
    return lines
