"""A folder of Parquet and CSV files: one table per file, named after the file's stem.

Each file becomes a view in an in-memory DuckDB (`read_parquet` / `read_csv` with type
auto-detection), so nothing is loaded until a query reads it. Files carry no keys. Writing a
table writes `<name>.parquet` to a temporary file in the folder and renames it into place
(`os.replace`, atomic on one file system), then registers the view.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import sqlglot.expressions as exp

from relsql.catalog import Keys
from relsql.db import Database, Source, first_line, ident
from relsql.errors import SchemaError, SourceError

__all__ = ["Folder", "SUFFIXES", "open_folder"]

SUFFIXES = {".parquet": "read_parquet", ".csv": "read_csv"}


class Folder(Source):
    kind = "folder"

    def __init__(self, path: Path, *, read_only: bool):
        super().__init__(f"folder {path} (Parquet/CSV){' (read-only)' if read_only else ''}", read_only=read_only)
        self.path = path
        self.files: dict[str, Path] = {}

    def keys(self, db: Database, scope: tuple[str, str]) -> dict[str, Keys]:
        return {}

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
        if not file.is_file() or file.name.startswith(".") or file.suffix.lower() not in SUFFIXES:
            continue
        if file.stem in found:
            raise SourceError(f"folder {path} has two files for table `{file.stem}` ({found[file.stem].name} and "
                              f"{file.name}); keep one of them")
        found[file.stem] = file
    source = Folder(path, read_only=read_only)
    db = Database(duckdb.connect(), source.description, source=source)
    try:
        for name, file in found.items():
            source.register(db, name, file)
    except BaseException:
        db.con.close()
        raise
    return db
