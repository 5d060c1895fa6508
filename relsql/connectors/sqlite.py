"""A SQLite database file, attached to DuckDB with the sqlite scanner (`ATTACH ... (TYPE sqlite)`).

The scanner does not expose foreign keys, so keys are read with Python's sqlite3 from the file
(`pragma_table_info`, `pragma_foreign_key_list`), opened read-only. Writes go through DuckDB
inside one transaction of the attached database (all or nothing).
"""

from __future__ import annotations

import sqlite3
import uuid
from pathlib import Path

import duckdb
import sqlglot.expressions as exp

from relsql.connectors import extensions
from relsql.data.catalog import ForeignKey, Keys
from relsql.data.duckdb import SQLITE_MAGIC, DuckDBDatabase, DuckDBSource, qualified
from relsql.data.engine import TEMP_PREFIX, Database, first_line, ident
from relsql.errors import SourceError
from relsql.sql import bound

__all__ = ["ALIAS", "SQLiteFile", "open_sqlite", "sqlite_keys"]

ALIAS = "src"
MARK_INDEX = f"{TEMP_PREFIX}written_"  # relsql's mark on a table it wrote (see SQLiteFile.mark)


class SQLiteFile(DuckDBSource):
    kind = "sqlite"

    def __init__(self, path: Path, *, read_only: bool):
        super().__init__(f"SQLite file {path}{' (read-only)' if read_only else ''}", read_only=read_only)
        self.path = path

    def keys(self, db: Database, scope: tuple[str, str]) -> dict[str, Keys]:
        return sqlite_keys(self.path)

    def mark(self, db: Database, scope: tuple[str, str], name: str, kind: str) -> None:
        """SQLite has no table comments (nor does DuckDB's scanner write any): the mark is an index
        on the table's first column named `__relsql_written_<kind>_<id>`, created in the open
        transaction. SQLite drops a table's indexes with it, so the mark cannot outlive the table
        (a registry table could: a user's table made later under the same name would inherit it)."""
        first = db.con.execute(bound("SELECT column_name FROM information_schema.columns WHERE table_catalog = :catalog "
                                     "AND table_schema = :schema AND table_name = :name ORDER BY ordinal_position LIMIT 1",
                                     catalog=scope[0], schema=scope[1], name=name)).fetchone()
        index = exp.Index(this=ident(f"{MARK_INDEX}{kind}_{uuid.uuid4().hex[:12]}"), table=qualified(name, scope),
                          params=exp.IndexParameters(columns=[exp.Ordered(this=exp.Column(this=ident(first[0])))]))
        db.execute(exp.Create(this=index, kind="INDEX"))

    def written_kind(self, db: Database, scope: tuple[str, str], name: str) -> str | None:
        rows = db.con.execute(bound("SELECT index_name FROM duckdb_indexes() WHERE database_name = :catalog "
                                    "AND schema_name = :schema AND table_name = :name ORDER BY index_name",
                                    catalog=scope[0], schema=scope[1], name=name)).fetchall()
        kinds = {r[0][len(MARK_INDEX):].rsplit("_", 1)[0] for r in rows if r[0].startswith(MARK_INDEX)}
        return kinds.pop() if len(kinds) == 1 else None


def sqlite_keys(path: Path) -> dict[str, Keys]:
    """Primary keys, foreign keys and NOT NULL columns of every table, from SQLite's own catalog."""
    try:
        con = sqlite3.connect(f"{Path(path).resolve().as_uri()}?mode=ro", uri=True)
    except sqlite3.Error as err:
        raise SourceError(f"cannot read the catalog of SQLite file {path}: {err}") from None
    try:
        tables = [r[0] for r in con.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name")]
        info = {t: con.execute("SELECT name, type, \"notnull\", pk FROM pragma_table_info(?) ORDER BY cid", [t]).fetchall()
                for t in tables}
        keys: dict[str, Keys] = {}
        for table in tables:
            pk = tuple(name for name, _, _, order in sorted((c for c in info[table] if c[3]), key=lambda c: c[3]))
            not_null = frozenset(name for name, _, nn, _ in info[table] if nn)
            groups: dict[int, list[tuple[int, str, str, str | None]]] = {}
            for fid, seq, ref, src, dst in con.execute(
                    "SELECT id, seq, \"table\", \"from\", \"to\" FROM pragma_foreign_key_list(?) ORDER BY id, seq", [table]):
                groups.setdefault(fid, []).append((seq, ref, src, dst))
            fks = []
            for _, parts in sorted(groups.items()):
                ref = parts[0][1]
                targets = [dst for _, _, _, dst in parts]
                if any(t is None for t in targets):  # REFERENCES t without columns: t's primary key
                    ref_pk = [name for name, _, _, order in sorted((c for c in info.get(ref, []) if c[3]), key=lambda c: c[3])]
                    targets = ref_pk if len(ref_pk) == len(parts) else targets
                fks.append(ForeignKey(tuple(src for _, _, src, _ in parts), ref, tuple(t or "?" for t in targets)))
            keys[table] = Keys(pk, tuple(fks), not_null)
        return keys
    except sqlite3.Error as err:
        raise SourceError(f"cannot read the catalog of SQLite file {path}: {err}") from None
    finally:
        con.close()


def open_sqlite(path: Path, *, read_only: bool = False) -> Database:
    path = Path(path)
    if not path.is_file():
        raise SourceError(f"SQLite file {path} does not exist; check the path")
    with open(path, "rb") as handle:
        head = handle.read(16)
    if head and not head.startswith(SQLITE_MAGIC):
        raise SourceError(f"{path} is not a SQLite database (no SQLite header); pass a SQLite file, a .duckdb file, "
                          "a folder of Parquet/CSV files or a postgresql:// URL")
    con = duckdb.connect()
    try:
        extensions.load(con, "sqlite_scanner", purpose=f"read SQLite file {path}")
        options = [exp.AttachOption(this=exp.var("TYPE"), expression=exp.var("sqlite"))]
        if read_only:
            options.append(exp.AttachOption(this=exp.var("READ_ONLY")))
        attach = exp.Attach(this=exp.Alias(this=exp.Literal.string(str(path)), alias=ident(ALIAS)), expressions=options)
        con.execute(attach.sql("duckdb"))
        con.execute(exp.Use(this=exp.Table(this=ident(ALIAS))).sql("duckdb"))
        con.execute(bound("SELECT count(*) FROM information_schema.tables WHERE table_catalog = :catalog",
                          catalog=ALIAS)).fetchone()
    except duckdb.Error as err:
        con.close()
        text = first_line(err)
        if "not a database" in text or "file is encrypted" in text:
            raise SourceError(f"{path} is not a readable SQLite database ({text}); check the file") from None
        if "locked" in text or "busy" in text:
            raise SourceError(f"SQLite file {path} is locked by another connection ({text}); close it and retry") from None
        raise SourceError(f"cannot open SQLite file {path}: {text}") from None
    except BaseException:
        con.close()
        raise
    source = SQLiteFile(path, read_only=read_only)
    return DuckDBDatabase(con, source.description, source=source)
