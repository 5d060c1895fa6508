"""A RelBench dataset folder given to `relsql.connect`: its tables with their keys and time
columns as if declared, and its tasks as task tables (relsql/relbench.py says what they hold).

Two layouts. RelBench 3: `manifest.yaml` (each table's `pkey`, `fkeys` {column: table},
`time_col`), `db/<table>.parquet`, `tasks/<task>/manifest.yaml` beside `{train,val,test}.parquet`.
Older releases: no manifest; every Parquet file's footer holds JSON under `pkey_col`,
`fkey_col_to_pkey_table` and `time_col` (relbench's `Table.save`), for the tables in `db/` and the
task tables in `tasks/<task>/`. The tables are views of the files (nothing copied); a task's
three files become one view numbered train, val, test. Nothing in the folder is written.

A dataset folder is a download: every byte of it is untrusted. A manifest is read bounded
(MANIFEST_LIMIT bytes, a regular file: a FIFO, folder or dangling link named `manifest.yaml` is
refused, not skipped), parsed as plain data (safe loader: no tags, no code) after a pass over its
YAML events that refuses anchors and aliases (one alias can stand for billions of values: the
"billion laughs") and nesting deeper than YAML_DEPTH, and every field is type-checked before use.
Footer JSON is bounded the same way. A link inside the folder is followed only to a file inside it
(relsql/connectors/files.py, `inside`).
"""

from __future__ import annotations

import json
import os
import reprlib
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import sqlglot.expressions as exp

from relsql import relbench, textfile
from relsql import sql as q
from relsql.connectors import files
from relsql.data.catalog import ForeignKey, Keys
from relsql.data.duckdb import DuckDBDatabase, free_name
from relsql.data.engine import Database, first_line, ident
from relsql.errors import SourceError

__all__ = ["is_relbench_folder", "open_relbench_folder"]

MANIFEST = "manifest.yaml"
METADATA_KEYS = (b"pkey_col", b"fkey_col_to_pkey_table", b"time_col")  # relbench's Table.save before manifests
MANIFEST_LIMIT = 1 << 20  # bytes: RelBench's manifests are a few kB, its largest (a forecast's SQL) far below
YAML_DEPTH = 16  # nested mappings/lists: a manifest uses 3 (tables -> table -> fkeys)
YAML_EVENTS = 100_000  # scalars, mappings and lists in one manifest
_shown = reprlib.Repr()  # a value in an error: short, whatever the file holds
_shown.maxstring = _shown.maxother = 60
_shown.maxlist = _shown.maxdict = 4
_shown.maxlevel = 2


class RelbenchFolder(files.Folder):
    """The `db/` folder's files as tables, with RelBench's keys declared, and task views."""

    kind = "folder"

    def __init__(self, path: Path, *, read_only: bool):
        super().__init__(path, read_only=read_only)
        self.task_views: set[str] = set()

    def keys(self, db: Database, scope: tuple[str, str]) -> dict[str, Keys]:
        return {name: key for name, key in self.declared.items() if name in self.files or name in self.task_views}

    def refuse_read_only(self, name: str) -> None:
        """The folder is the user's dataset: a table written there would be read back as one of its
        tables (`relsql inspect` would list it). Every write is refused, before any work."""
        raise SourceError(f"cannot write table `{name}`: {self.path.parent} is a RelBench dataset, which relsql reads "
                          "and never writes into. Write to a file instead: `--out preds.parquet` on the command line "
                          "(relsql predict / recommend; relsql train prints the command), model.predict() or "
                          "model.recommend() and .write_parquet(path) in Python; or copy the dataset into a database "
                          "of your own with relsql.from_relbench(relbench_db, relsql.connect('shop.duckdb'), tasks=...)")


def is_relbench_folder(path: Path) -> bool:
    """A folder with `manifest.yaml` and `db/`, or a `db/` whose Parquet files carry relbench's keys.
    A `manifest.yaml` that is not a file (a FIFO, a folder, a dangling link) still marks the folder
    as a dataset, so that opening it refuses the manifest instead of showing a folder of no tables."""
    db_dir = path / "db"
    if not db_dir.is_dir():
        return False
    if os.path.lexists(path / MANIFEST):
        return True
    return any(_footer(file) is not None for file in sorted(db_dir.glob("*.parquet"))[:1])


def _footer(file: Path) -> dict[str, Any] | None:
    """The relbench keys in a Parquet file's footer, checked, or None when it has none."""
    try:
        metadata = pq.read_schema(file).metadata or {}
    except (OSError, pa.ArrowException):
        return None
    if not all(key in metadata for key in METADATA_KEYS):
        return None
    where = f"{file}: its relbench keys (Parquet metadata)"
    try:
        if any(len(metadata[key]) > MANIFEST_LIMIT for key in METADATA_KEYS):
            raise ValueError("too long")
        footer = {key.decode(): json.loads(metadata[key]) for key in METADATA_KEYS}
    except (ValueError, UnicodeDecodeError, RecursionError):  # RecursionError: JSON nested thousands deep
        raise SourceError(f"{where} are not short, plain JSON; rewrite the file with relbench") from None
    fix = "rewrite the file with relbench"
    return {"pkey_col": _text(footer["pkey_col"], f"{where}: pkey_col", fix),
            "time_col": _text(footer["time_col"], f"{where}: time_col", fix),
            "fkey_col_to_pkey_table": _names(footer["fkey_col_to_pkey_table"], f"{where}: fkey_col_to_pkey_table", fix)}


def _manifest(file: Path) -> dict[str, Any]:
    """A manifest's YAML as plain data: bounded, no anchors or aliases, nested at most YAML_DEPTH."""
    try:
        import yaml
    except ImportError:
        raise SourceError(f"reading {file} needs PyYAML: pip install pyyaml") from None
    text = textfile.read_text(file, "RelBench manifest", SourceError, limit=MANIFEST_LIMIT)
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when present: the pure parser is slow
    try:
        _check_events(yaml, yaml.parse(text, Loader=loader), file)
        data = yaml.load(text, Loader=loader)  # noqa: S506 (a safe loader)
    except yaml.YAMLError as err:
        raise SourceError(f"{file} is not valid YAML ({first_line(err)[:200]}); fix or restore the file") from None
    if not isinstance(data, dict):
        raise SourceError(f"{file} holds no mapping of settings; it is not a RelBench manifest")
    return data


def _check_events(yaml: Any, events: Any, file: Path) -> None:
    """Refuse, before anything is built, what plain manifests never hold: anchors and aliases
    (expanding them is unbounded), deep nesting (the loader recurses), and too many values."""
    depth = count = 0
    for event in events:
        count += 1
        line = f"{file}, line {event.start_mark.line + 1}" if event.start_mark else str(file)
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
            raise SourceError(f"{line}: a YAML anchor or alias (`&name` / `*name`); relsql does not expand them in a "
                              "manifest (one alias can stand for billions of values): write the values out")
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > YAML_DEPTH:
                raise SourceError(f"{line}: YAML nested more than {YAML_DEPTH} deep; a RelBench manifest nests 3 deep: "
                                  "fix or restore the file")
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1
        if count > YAML_EVENTS:
            raise SourceError(f"{line}: more than {YAML_EVENTS:,} YAML values; this is not a RelBench manifest")


FIX = "fix the manifest"


def _text(value: Any, where: str, fix: str = FIX) -> str | None:
    """A name (column, table, task type) or None: anything else is refused, shown short."""
    if value is None or (isinstance(value, str) and value):
        return value
    raise SourceError(f"{where} must be a name (text), got {_shown.repr(value)}; {fix}")


def _name(value: Any, where: str, fix: str = FIX) -> str:
    """A name that must be there."""
    if value is None:
        raise SourceError(f"{where} is missing; {fix}")
    return _text(value, where, fix)


def _names(value: Any, where: str, fix: str = FIX) -> dict[str, str]:
    """A mapping of names to names ({column: table}); absent is empty."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise SourceError(f"{where} must map names to names ({{column: table}}), got {_shown.repr(value)}; {fix}")
    return {_name(k, f"{where} key", fix): _name(v, f"{where}.{k}", fix) for k, v in value.items()}


def _table_specs(path: Path) -> tuple[dict[str, dict[str, Any]], str]:
    """{table: {pkey, fkeys, time_col}} and where they were read."""
    if os.path.lexists(path / MANIFEST):
        tables = _manifest(files.inside(path, path / MANIFEST)).get("tables") or {}
        if not isinstance(tables, dict):
            raise SourceError(f"{path / MANIFEST}: `tables` must map table names to their pkey, fkeys and time_col, "
                              f"got {_shown.repr(tables)}; fix the manifest")
        specs = {}
        for name, spec in tables.items():
            where = f"{path / MANIFEST}: table {_shown.repr(name)}"
            name = _name(name, f"{path / MANIFEST}: a table's name")
            spec = {} if spec is None else spec
            if not isinstance(spec, dict):
                raise SourceError(f"{where} needs pkey, fkeys {{column: table}} and time_col, got {_shown.repr(spec)}; "
                                  "fix the manifest")
            specs[name] = {"pkey": _text(spec.get("pkey"), f"{where} pkey"),
                           "time_col": _text(spec.get("time_col"), f"{where} time_col"),
                           "fkeys": _names(spec.get("fkeys"), f"{where} fkeys")}
        return specs, MANIFEST
    specs = {}
    for file in sorted((path / "db").glob("*.parquet")):
        footer = _footer(files.inside(path, file))
        if footer is not None:
            specs[file.stem] = {"pkey": footer["pkey_col"], "time_col": footer["time_col"],
                                "fkeys": footer["fkey_col_to_pkey_table"]}
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
    files.inside(path, path / "db")
    specs, origin = _table_specs(path)
    source = RelbenchFolder(path / "db", read_only=read_only)
    db = DuckDBDatabase(duckdb.connect(), f"RelBench dataset {path}{' (read-only)' if read_only else ''}", source=source)
    try:
        for file in sorted((path / "db").iterdir()):
            if not file.name.startswith(".") and file.suffix.lower() in files.SUFFIXES:
                if files.inside(path, file).is_file():
                    source.register(db, file.stem, file)
        columns = {name: [c for c, _ in db.columns(name)] for name in source.files}
        source.declared = _declared(specs, columns, origin)
        source.keys_origin = origin
        db.time_columns = {name: spec["time_col"] for name, spec in specs.items() if spec["time_col"]}
        tasks = path / "tasks"
        for folder in sorted(files.inside(path, tasks).iterdir()) if tasks.is_dir() else ():
            if files.inside(path, folder).is_dir():
                _open_task(db, source, folder, specs, path)
    except BaseException:
        db.con.close()
        raise
    return db


def _task_spec(folder: Path, specs: dict[str, dict[str, Any]], splits: dict[str, Path]) -> relbench.TaskSpec:
    """What a task folder's manifest (or, before manifests, its files' footers) says, every field checked."""
    file = folder / MANIFEST
    if os.path.lexists(file):
        m = _manifest(files.inside(folder.parent.parent, file))

        def name(field: str, needed: bool = False) -> str | None:
            return (_name if needed else _text)(m.get(field), f"{file}: {field}")

        task_type = name("task_type") or ""
        hidden = _hidden(m.get("remove_columns"), file)
        target = name("target_col") or ""
        if m.get("src_entity_col") is not None:
            entities = {name("src_entity_col", True): name("src_entity_table", True),
                        name("dst_entity_col", True): name("dst_entity_table", True)}
            unknown = [t for t in entities.values() if t not in specs]
            if unknown or len(entities) != 2:
                raise SourceError(f"{file}: its source and destination must be two columns, each naming a table of "
                                  f"the dataset ({', '.join(specs)}); fix the manifest")
            destination = name("dst_entity_col", True)
            return relbench.TaskSpec(destination, name("time_col"), task_type, entities, hidden,
                                     eval_k=relbench.eval_k_of(m.get("eval_k"), str(file)))
        table = name("entity_table", True)
        if table not in specs:
            raise SourceError(f"{file}: entity_table {_shown.repr(table)} is not a table of the dataset "
                              f"({', '.join(specs) or 'none'}); fix the manifest")
        entity = name("entity_col") or specs[table]["pkey"]  # autocomplete: the entity table's key
        if entity is None:
            raise SourceError(f"{file}: no entity_col, and entity table `{table}` has no pkey; fix the manifest")
        time = name("time_col") or specs[table]["time_col"]
        if name("kind") == "autocomplete":
            if not target:
                raise SourceError(f"{file}: an autocomplete task needs its target_col; fix the manifest")
            hidden = (*hidden, (table, target))
        return relbench.TaskSpec(target, time, task_type, {entity: table}, hidden)
    footer = _footer(splits["train"])
    if footer is None:
        raise SourceError(f"task folder {folder} has neither {MANIFEST} nor relbench's keys in train.parquet")
    entities = footer["fkey_col_to_pkey_table"]
    arrow_schema = pq.read_schema(splits["train"])
    names = arrow_schema.names
    rest = [c for c in names if c not in entities and c != footer["time_col"]]
    listed = [c for c in entities if c in names and pa.types.is_list(arrow_schema.field(c).type)]
    if not rest and len(listed) == 1:  # a link task: its destination column is a list of keys (eval_k unknown here)
        return relbench.TaskSpec(listed[0], footer["time_col"], "recommendation", entities)
    if len(rest) != 1:
        raise SourceError(f"{splits['train']}: cannot tell the label column among {', '.join(rest) or 'none'}; "
                          f"write a {MANIFEST} for the task naming target_col")
    return relbench.TaskSpec(rest[0], footer["time_col"], "", entities)


def _hidden(value: Any, file: Path) -> tuple[tuple[str, str], ...]:
    """remove_columns: a list of [table, column] pairs."""
    pairs = [] if value is None else value
    if not isinstance(pairs, list) or not all(isinstance(p, list) and len(p) == 2 for p in pairs):
        raise SourceError(f"{file}: remove_columns must list [table, column] pairs, got {_shown.repr(value)}; "
                          "fix the manifest")
    return tuple((_name(t, f"{file}: remove_columns table"), _name(c, f"{file}: remove_columns column"))
                 for t, c in pairs)


def _open_task(db: Database, source: RelbenchFolder, folder: Path, specs: dict[str, dict[str, Any]],
               root: Path) -> None:
    """A view over a task's split files, numbered train, val, test; registered as a RelBench task."""
    splits = {s: folder / f"{s}.parquet" for s in relbench.SPLITS
              if files.inside(root, folder / f"{s}.parquet").is_file()}
    if "train" not in splits:
        return  # a task whose labels are regenerated from SQL (no files): nothing to train on here
    spec = _task_spec(folder, specs, splits)
    name = relbench.table_name(folder.name)
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

