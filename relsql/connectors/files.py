"""A folder of Parquet and CSV files: one table per file, named after the file's stem.

Each file becomes a view in an in-memory DuckDB (`read_parquet` / `read_csv` with type
auto-detection), so nothing is loaded until a query reads it. Files carry no keys, but a
`schema.sql` beside them (what DuckDB's `EXPORT DATABASE` writes, or one a user writes) is read
for its PRIMARY KEY / FOREIGN KEY / REFERENCES constraints: they become the folder's declared
keys (only parsed, never run; `load.sql`'s COPY statements map exported table names to file
names). Writing a
table writes `<name>.parquet` to a temporary file in the folder and renames it into place
(`os.replace`, atomic on one file system), then registers the view.

A folder may come from anyone (a download, an archive), so a link in it is followed only when it
leads to a file inside the folder: `orders.parquet -> /etc/passwd` would otherwise make a file
outside it a table (`inside` refuses it, naming the link).
"""

from __future__ import annotations

import os
import tempfile
import warnings
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import sqlglot
import sqlglot.errors
import sqlglot.expressions as exp

from relsql import textfile
from relsql.data import keyfile
from relsql.data.catalog import ForeignKey, Keys
from relsql.data.duckdb import DuckDBDatabase, DuckDBSource, parquet_mark
from relsql.data.engine import Database, first_line, ident
from relsql.errors import RelsqlError, SchemaError, SourceError

__all__ = ["Folder", "SUFFIXES", "inside", "open_folder"]

SUFFIXES = {".parquet": "read_parquet", ".csv": "read_csv"}


class Folder(DuckDBSource):
    kind = "folder"

    def __init__(self, path: Path, *, read_only: bool):
        super().__init__(f"folder {path} (Parquet/CSV){' (read-only)' if read_only else ''}", read_only=read_only)
        self.path = path
        self.files: dict[str, Path] = {}
        self.declared: dict[str, Keys] = {}  # from schema.sql
        self.keys_origin = ""

    def keys(self, db: Database, scope: tuple[str, str]) -> dict[str, Keys]:
        return {name: key for name, key in self.declared.items() if name in self.files}

    def read_schema_sql(self, db: Database) -> None:
        """Declared keys from the folder's schema.sql, leniently: DuckDB writes other statements
        there too, and a broken line must not make the data unreadable (it is warned about)."""
        file = self.path / "schema.sql"
        if not file.is_file():
            return
        try:
            inside(self.path, file)
            text = textfile.read_text(file, "schema file")
        except RelsqlError as err:
            warnings.warn(f"{err}; its keys are not used", stacklevel=3)
            return
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            given = keyfile.parse(text, "schema.sql", strict=False)
            columns = {name: [c for c, _ in db.columns(name)] for name in self.files}
            given = keyfile.resolve(given, columns, strict=False, rename=_exported_names(self.path, self.files))
        self.declared = _as_keys(given)
        self.keys_origin = "schema.sql" if self.declared else ""

    def register(self, db: Database, name: str, file: Path, *, replace: bool = False) -> None:
        reader = exp.func(SUFFIXES[file.suffix.lower()], exp.Literal.string(str(file)))
        view = exp.Create(this=exp.Table(this=ident(name)), kind="VIEW", replace=replace,
                          expression=exp.select(exp.Star()).from_(reader))
        try:
            db.execute(view)
            # read the header now, so that a broken file fails at connect time, not mid-grounding
            db.con.execute(exp.select(exp.Star()).from_(exp.Table(this=ident(name))).limit(0).sql("duckdb"))
        except duckdb.Error as err:
            raise SourceError(f"cannot read {file} as a {file.suffix[1:]} table: {first_line(err)}; "
                              "fix or remove the file") from None
        self.files[name] = file

    def written_kind(self, db: Database, scope: tuple[str, str], name: str) -> str | None:
        """A folder has no table comments: relsql's mark sits in its Parquet file's footer."""
        return parquet_mark(self.files[name]) if name in self.files else None

    def write_table(self, db: Database, name: str, data: pa.Table, replace: bool) -> None:
        self.refuse_read_only(name)
        existing = self.files.get(name)
        if existing is not None and not replace:
            raise SchemaError(f"table `{name}` already exists in {db.description} ({existing.name}); "
                              "choose another name or pass replace=True")
        if existing is not None and existing.suffix.lower() != ".parquet":
            raise SourceError(f"cannot replace `{name}`: it is the CSV file {existing}; relsql writes Parquet and "
                              "will not delete your CSV. Remove or rename the file first, or choose another name")
        target = self.path / f"{name}.parquet"
        if Path(name).name != name or name in (".", ".."):
            raise SchemaError(f"cannot write table {name!r} to a folder: the name must be a plain file name")
        handle, temporary = tempfile.mkstemp(prefix=f".{name}.", suffix=".parquet.tmp", dir=self.path)
        os.close(handle)
        try:
            pq.write_table(data, temporary)
            os.replace(temporary, target)
        except BaseException as err:
            Path(temporary).unlink(missing_ok=True)
            if isinstance(err, OSError | pa.ArrowException):
                raise SourceError(f"could not write {target} (nothing was written): {err}") from None
            raise
        self.register(db, name, target, replace=True)


def open_folder(path: Path, *, read_only: bool = False) -> Database:
    path = Path(path)
    if not os.access(path, os.R_OK | os.X_OK):
        raise SourceError(f"cannot read folder {path}: permission denied; fix its permissions")
    found: dict[str, Path] = {}
    for file in sorted(path.iterdir()):
        if file.name.startswith(".") or file.suffix.lower() not in SUFFIXES:
            continue
        inside(path, file)
        if not file.is_file():
            continue
        if file.stem in found:
            raise SourceError(f"folder {path} has two files for table `{file.stem}` ({found[file.stem].name} and "
                              f"{file.name}); keep one of them")
        found[file.stem] = file
    source = Folder(path, read_only=read_only)
    db = DuckDBDatabase(duckdb.connect(), source.description, source=source)
    try:
        for name, file in found.items():
            source.register(db, name, file)
        source.read_schema_sql(db)
    except BaseException:
        db.con.close()
        raise
    return db


def inside(root: Path, path: Path) -> Path:
    """`path`, checked to stay inside folder `root` once links are followed: a link (or a linked
    folder on the way) that leads elsewhere is a SourceError naming it, never read."""
    try:
        resolved, base = path.resolve(), root.resolve()
    except (OSError, RuntimeError) as err:  # a loop of links
        raise SourceError(f"cannot follow {path}: {err}; remove the link") from None
    if resolved != base and not resolved.is_relative_to(base):
        raise SourceError(f"{path} is a link to {resolved}, outside the folder {root}; relsql reads only the "
                          "folder's own files: copy the file into the folder instead of linking it")
    return path


def _exported_names(path: Path, files: dict[str, Path]) -> dict[str, str]:
    """Table name → this folder's table (file stem), from load.sql's `COPY "Odd Name" FROM
    '.../odd_name.parquet'`: EXPORT DATABASE names files after tables, but not always alike."""
    load = path / "load.sql"
    if not load.is_file():
        return {}
    try:
        inside(path, load)
        statements = sqlglot.parse(textfile.read_text(load, "load file"), read="duckdb")
    except (RelsqlError, sqlglot.errors.SqlglotError):
        return {}
    names = {}
    for statement in statements:
        if isinstance(statement, exp.Copy) and isinstance(statement.this, exp.Table):
            source = next((f for f in statement.args.get("files") or () if isinstance(f, exp.Literal)), None)
            stem = Path(source.this).stem if source is not None else ""
            if stem in files:
                names[statement.this.name] = stem
    return names


def _as_keys(given: keyfile.GivenKeys) -> dict[str, Keys]:
    """Per table: its primary key and foreign keys (`REFERENCES t` alone: t's primary key)."""
    primary = {key.table: key.columns for key in given.primary}
    foreign: dict[str, list[ForeignKey]] = {}
    for key in given.foreign:
        references = key.references or primary.get(key.parent, ())
        if len(references) != len(key.columns):
            warnings.warn(f"{given.where(key)}: `{key.parent}` has no matching primary key to reference; "
                          "the foreign key is not used", stacklevel=4)
            continue
        foreign.setdefault(key.table, []).append(ForeignKey(key.columns, key.parent, references))
    return {name: Keys(primary.get(name, ()), tuple(dict.fromkeys(foreign.get(name, ()))))
            for name in set(primary) | set(foreign)}
