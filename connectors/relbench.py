"""A RelBench dataset folder given to `relsql.connect`: its tables with their keys and time
columns as if declared, and its tasks as task tables (relsql/relbench.py says what they hold).

Two layouts. RelBench 3: `manifest.yaml` (each table's `pkey`, `fkeys` {column: table},
`time_col`), `db/<table>.parquet`, `tasks/<task>/manifest.yaml` beside `{train,val,test}.parquet`.
Older releases: no manifest; every Parquet file's footer holds JSON under `pkey_col`,
`fkey_col_to_pkey_table` and `time_col` (relbench's `Table.save`), for the tables in `db/` and the
task tables in `tasks/<task>/`. A manifest is read with `yaml.safe_load` (no tags, no code), and
bounded like every text file relsql reads. The tables are views of the files (nothing copied);
a task's three files become one view numbered train, val, test. Nothing in the folder is written.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import sqlglot.expressions as exp

from connectors import files
from relsql import relbench, textfile
from relsql import sql as q
from relsql.catalog import ForeignKey, Keys
from relsql.db import Database, first_line, free_name, ident
from relsql.errors import SourceError

__all__ = ["is_relbench_folder", "open_relbench_folder"]

MANIFEST = "manifest.yaml"
METADATA_KEYS = (b"pkey_col", b"fkey_col_to_pkey_table", b"time_col")  # relbench's Table.save before manifests


class RelbenchFolder(files.Folder):
    """The `db/` folder's files as tables, with RelBench's keys declared, and task views."""

    kind = "folder"

    def __init__(self, path: Path, *, read_only: bool):
        super().__init__(path, read_only=read_only)
        self.task_views: set[str] = set()

    def keys(self, db: Database, scope: tuple[str, str]) -> dict[str, Keys]:
        return {name: key for name, key in self.declared.items() if name in self.files or name in self.task_views}


def is_relbench_folder(path: Path) -> bool:
    """A folder with `manifest.yaml` and `db/`, or a `db/` whose Parquet files carry relbench's keys."""
    db_dir = path / "db"
    if not db_dir.is_dir():
        return False
    if (path / MANIFEST).is_file():
        return True
    return any(_footer(file) is not None for file in sorted(db_dir.glob("*.parquet"))[:1])


def _footer(file: Path) -> dict[str, Any] | None:
    """The relbench keys in a Parquet file's footer, or None when it has none."""
    try:
        metadata = pq.read_schema(file).metadata or {}
    except (OSError, pa.ArrowException):
        return None
    if not all(key in metadata for key in METADATA_KEYS):
        return None
    try:
        return {key.decode(): json.loads(metadata[key]) for key in METADATA_KEYS}
    except (ValueError, UnicodeDecodeError):
        raise SourceError(f"{file}: its relbench keys (Parquet metadata) are not JSON; rewrite the file with relbench") from None


def _manifest(file: Path) -> dict[str, Any]:
    """A manifest's YAML, safely (plain data only) and bounded."""
    try:
        import yaml
    except ImportError:
        raise SourceError(f"reading {file} needs PyYAML: pip install pyyaml") from None
    text = textfile.read_text(file, "RelBench manifest", SourceError)
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise SourceError(f"{file} is not valid YAML ({first_line(err)}); fix or restore the file") from None
    if not isinstance(data, dict):
        raise SourceError(f"{file} holds no mapping of settings; it is not a RelBench manifest")
    return data


def _text(value: Any, where: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise SourceError(f"{where} must be a name, got {value!r}; fix the manifest")


def _table_specs(path: Path) -> tuple[dict[str, dict[str, Any]], str]:
    """{table: {pkey, fkeys, time_col}} and where they were read."""
    if (path / MANIFEST).is_file():
        tables = _manifest(path / MANIFEST).get("tables") or {}
        if not isinstance(tables, dict):
            raise SourceError(f"{path / MANIFEST}: `tables` must map table names to their pkey, fkeys and time_col")
        specs = {}
        for name, spec in tables.items():
            spec = spec or {}
            fkeys = spec.get("fkeys") or {}
            if not isinstance(spec, dict) or not isinstance(fkeys, dict):
                raise SourceError(f"{path / MANIFEST}: table {name!r} needs pkey, fkeys {{column: table}} and time_col")
            where = f"{path / MANIFEST}: table {name}"
            specs[str(name)] = {"pkey": _text(spec.get("pkey"), f"{where} pkey"),
                                "time_col": _text(spec.get("time_col"), f"{where} time_col"),
                                "fkeys": {str(c): _text(t, f"{where} fkeys.{c}") for c, t in fkeys.items()}}
        return specs, MANIFEST
    specs = {}
    for file in sorted((path / "db").glob("*.parquet")):
        footer = _footer(file)
        if footer is not None:
            specs[file.stem] = {"pkey": footer["pkey_col"], "time_col": footer["time_col"],
                                "fkeys": dict(footer["fkey_col_to_pkey_table"] or {})}
    return specs, "Parquet metadata"


def _declared(specs: dict[str, dict[str, Any]], columns: dict[str, list[str]], origin: str) -> dict[str, Keys]:
    """Keys per table, checked against the files' columns."""
    declared = {}
    for name, spec in specs.items():
        if name not in columns:
            raise SourceError(f"{origin} names table `{name}`, but db/{name}.parquet is missing; restore the file")
        for column in [spec["pkey"], spec["time_col"], *spec["fkeys"]]:
            if column is not None and column not in columns[name]:
                raise SourceError(f"{origin}: table `{name}` has no column `{column}`; columns: {', '.join(columns[name])}")
        foreign = []
        for column, parent in spec["fkeys"].items():
            parent_key = specs.get(parent, {}).get("pkey")
            if not parent_key:
                raise SourceError(f"{origin}: `{name}`.{column} refers to `{parent}`, which has no pkey there")
            foreign.append(ForeignKey((column,), parent, (parent_key,)))
        declared[name] = Keys((spec["pkey"],) if spec["pkey"] else (), tuple(foreign))
    return declared


def open_relbench_folder(path: Path, *, read_only: bool = False) -> Database:
    """The dataset folder as a Database (see the module docstring)."""
    path = Path(path)
    specs, origin = _table_specs(path)
    source = RelbenchFolder(path / "db", read_only=read_only)
    db = Database(duckdb.connect(), f"RelBench dataset {path}{' (read-only)' if read_only else ''}", source=source)
    try:
        for file in sorted((path / "db").iterdir()):
            if file.is_file() and not file.name.startswith(".") and file.suffix.lower() in files.SUFFIXES:
                source.register(db, file.stem, file)
        columns = {name: [c for c, _ in db.columns(name)] for name in source.files}
        source.declared = _declared(specs, columns, origin)
        source.keys_origin = origin
        db.time_columns = {name: spec["time_col"] for name, spec in specs.items() if spec["time_col"]}
        tasks = path / "tasks"
        for folder in sorted(tasks.iterdir()) if tasks.is_dir() else ():
            if folder.is_dir():
                _open_task(db, source, folder, specs)
    except BaseException:
        db.con.close()
        raise
    return db


def _task_spec(folder: Path, specs: dict[str, dict[str, Any]], splits: dict[str, Path]) -> relbench._Spec:
    """What a task folder's manifest (or, before manifests, its files' footers) says."""
    if (folder / MANIFEST).is_file():
        m = _manifest(folder / MANIFEST)
        task_type = str(m.get("task_type") or "")
        hidden = tuple(tuple(pair) for pair in m.get("remove_columns") or ())
        if m.get("src_entity_col"):
            entities = {m["src_entity_col"]: m["src_entity_table"], m["dst_entity_col"]: m["dst_entity_table"]}
            return relbench._Spec(str(m.get("target_col") or ""), m.get("time_col"), task_type, entities, hidden)
        table = m.get("entity_table")
        if table not in specs:
            raise SourceError(f"{folder / MANIFEST}: entity_table {table!r} is not a table of the dataset")
        entity = m.get("entity_col") or specs[table]["pkey"]  # autocomplete: the entity table's key
        time = m.get("time_col") or specs[table]["time_col"]
        if m.get("kind") == "autocomplete":
            hidden = (*hidden, (table, m.get("target_col")))
        return relbench._Spec(str(m.get("target_col") or ""), time, task_type, {entity: table}, hidden)
    footer = _footer(splits["train"])
    if footer is None:
        raise SourceError(f"task folder {folder} has neither {MANIFEST} nor relbench's keys in train.parquet")
    entities = dict(footer["fkey_col_to_pkey_table"] or {})
    names = pq.read_schema(splits["train"]).names
    rest = [c for c in names if c not in entities and c != footer["time_col"]]
    if len(rest) != 1:
        raise SourceError(f"{splits['train']}: cannot tell the label column among {', '.join(rest) or 'none'}; "
                          f"write a {MANIFEST} for the task naming target_col")
    return relbench._Spec(rest[0], footer["time_col"], "", entities)


def _open_task(db: Database, source: RelbenchFolder, folder: Path, specs: dict[str, dict[str, Any]]) -> None:
    """A view over a task's split files, numbered train, val, test; registered as a RelBench task."""
    splits = {s: folder / f"{s}.parquet" for s in relbench.SPLITS if (folder / f"{s}.parquet").is_file()}
    if "train" not in splits:
        return  # a task whose labels are regenerated from SQL (no files): nothing to train on here
    spec = _task_spec(folder, specs, splits)
    name = re.sub(r"\W", "_", folder.name)
    taken = {t.casefold() for t in db.tables()}
    if name.casefold() in taken:
        name = f"task_{name}"
    if name.casefold() in taken:
        raise SourceError(f"task {folder.name}: tables `{name[5:]}` and `{name}` exist already; rename the task folder")
    rows = {s: pq.read_metadata(splits[s]).num_rows if s in splits else 0 for s in relbench.SPLITS}
    key = _task_view(db, name, splits, rows)
    source.task_views.add(name)
    for column in [*spec.entities, *([spec.time_column] if spec.time_column else []), spec.target]:
        if column and column not in [c for c, _ in db.columns(name)]:
            raise SourceError(f"task {folder.name}: its tables have no column `{column}`; fix its {MANIFEST}")
    task = relbench.register_task(db, name, spec, key, rows)
    _declare_task(source, task)


def _task_view(db: Database, name: str, splits: dict[str, Path], rows: dict[str, int]) -> str:
    """CREATE VIEW name AS the split files' rows in order, with a new key column; returns its name."""
    types: dict[str, str] = {}
    for file in splits.values():
        for column, kind in _described(db, file):
            types.setdefault(column, kind)
    key = free_name("id", {c.casefold() for c in types})
    parts, offset = [], 0
    for split in relbench.SPLITS:
        if split not in splits:
            continue
        present = {c for c, _ in _described(db, splits[split])}
        number = exp.cast(exp.Add(this=exp.column("file_row_number"), expression=q.integer(offset)), "BIGINT")
        columns = [exp.alias_(number, ident(key))]
        columns += [exp.column(ident(c)) if c in present else exp.alias_(exp.cast(exp.Null(), kind), ident(c))
                    for c, kind in types.items()]
        parts.append(exp.select(*columns).from_(_reader(splits[split], numbered=True)))
        offset += rows[split]
    query = parts[0]
    for part in parts[1:]:
        query = exp.union(query, part, distinct=False)
    try:
        db.execute(exp.Create(this=exp.Table(this=ident(name)), kind="VIEW", expression=query))
    except duckdb.Error as err:
        raise SourceError(f"cannot read task files {', '.join(map(str, splits.values()))}: {first_line(err)}") from None
    return key


def _reader(file: Path, numbered: bool = False) -> exp.Expression:
    args = [exp.Literal.string(str(file))]
    if numbered:
        args.append(exp.EQ(this=exp.column("file_row_number"), expression=exp.true()))
    return exp.func("read_parquet", *args)


def _described(db: Database, file: Path) -> list[tuple[str, str]]:
    """(column, DuckDB type) of a Parquet file."""
    try:
        rows = db.con.execute(exp.Describe(this=exp.select(exp.Star()).from_(_reader(file))).sql("duckdb")).fetchall()
    except duckdb.Error as err:
        raise SourceError(f"cannot read {file}: {first_line(err)}; fix or remove the file") from None
    return [(r[0], r[1]) for r in rows]


def _declare_task(source: RelbenchFolder, task: relbench.RelbenchTask) -> None:
    """The task view's keys, declared like the tables' (the given keys hold them too)."""
    foreign = tuple(ForeignKey((column,), table, source.declared[table].primary_key)
                    for column, table in task.entities.items() if source.declared.get(table, Keys()).primary_key)
    source.declared[task.table] = Keys((task.key,), foreign)

