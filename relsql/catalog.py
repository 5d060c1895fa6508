"""Schema introspection: tables, columns and types, primary and foreign keys, row counts.

Columns and types come from DuckDB's `information_schema` (so types read the same way the
grounder sees them, whatever the source); keys come from each source's own catalog: DuckDB's
`duckdb_constraints()`, SQLite's `PRAGMA table_info` / `foreign_key_list` (read with Python's
sqlite3 from the file), PostgreSQL's `pg_constraint` (through `postgres_query`). A folder of
Parquet/CSV files and data frames have no keys.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import duckdb
import sqlglot.expressions as exp

if TYPE_CHECKING:
    from relsql.db import Database
    from relsql.keys import Schema

from relsql.errors import SourceError

__all__ = ["Catalog", "Column", "ForeignKey", "Keys", "Table", "check_values", "duckdb_keys", "format_catalog", "read_catalog"]


@dataclass(frozen=True)
class Column:
    name: str
    type: str  # DuckDB's name of the type as the grounder sees it (BIGINT, DOUBLE, VARCHAR, DATE, ...)
    nullable: bool


@dataclass(frozen=True)
class ForeignKey:
    columns: tuple[str, ...]
    table: str  # the referenced table
    references: tuple[str, ...]  # the referenced columns, in the order of `columns`

    def __str__(self) -> str:
        return f"({', '.join(self.columns)}) -> {self.table}({', '.join(self.references)})"


@dataclass(frozen=True)
class Keys:
    """What a source's own catalog says about one table's keys."""

    primary_key: tuple[str, ...] = ()
    foreign_keys: tuple[ForeignKey, ...] = ()
    not_null: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Table:
    name: str
    columns: tuple[Column, ...]
    primary_key: tuple[str, ...] = ()
    foreign_keys: tuple[ForeignKey, ...] = ()
    rows: int = 0
    kind: str = "table"  # "table" or "view"

    def column(self, name: str) -> Column:
        for column in self.columns:
            if column.name == name:
                return column
        raise KeyError(name)

    @property
    def column_names(self) -> list[str]:
        return [c.name for c in self.columns]


@dataclass
class Catalog:
    source: str  # the Database's description
    kind: str  # duckdb, duckdb-file, folder, sqlite, postgres, frames
    tables: dict[str, Table] = field(default_factory=dict)
    keys_origin: str = ""  # where declared keys came from when not the database itself ("schema.sql")

    def __getitem__(self, name: str) -> Table:
        return self.tables[name]

    def __contains__(self, name: object) -> bool:
        return name in self.tables

    def __iter__(self):
        return iter(self.tables.values())

    @property
    def names(self) -> list[str]:
        return list(self.tables)


def duckdb_keys(con: duckdb.DuckDBPyConnection, scope: tuple[str, str]) -> dict[str, Keys]:
    """Primary keys, foreign keys and NOT NULL columns of one DuckDB (catalog, schema)."""
    rows = con.execute(
        "SELECT table_name, constraint_type, constraint_column_names, referenced_table, referenced_column_names "
        "FROM duckdb_constraints() WHERE database_name = ? AND schema_name = ? "
        "AND constraint_type IN ('PRIMARY KEY', 'FOREIGN KEY', 'NOT NULL') ORDER BY table_name, constraint_index",
        list(scope)).fetchall()
    found: dict[str, dict] = {}
    for table, kind, columns, ref_table, ref_columns in rows:
        entry = found.setdefault(table, {"pk": (), "fks": [], "nn": set()})
        if kind == "PRIMARY KEY":
            entry["pk"] = tuple(columns)
        elif kind == "FOREIGN KEY" and ref_table:
            fk = ForeignKey(tuple(columns), ref_table, tuple(ref_columns or ()))
            if fk not in entry["fks"]:
                entry["fks"].append(fk)
        elif kind == "NOT NULL":
            entry["nn"].update(columns)
    return {t: Keys(e["pk"], tuple(e["fks"]), frozenset(e["nn"])) for t, e in found.items()}


def read_catalog(db: Database) -> Catalog:
    """The catalog of the user's tables of `db` (see `Database.catalog`)."""
    catalog = Catalog(db.description, db.source.kind, keys_origin=db.source.keys_origin)
    scopes = db.scopes()
    placement = db.table_scopes()
    for index, scope in enumerate(scopes):
        names = [n for n, s in placement.items() if s == scope]
        if not names:
            continue
        keys = db.source.keys(db, scope) if index == 0 else duckdb_keys(db.con, scope)
        kinds = dict(db.con.execute(
            "SELECT table_name, table_type FROM information_schema.tables WHERE table_catalog = ? AND table_schema = ?",
            list(scope)).fetchall())
        columns: dict[str, list[tuple[str, str, str]]] = {}
        for table, name, dtype, nullable in db.con.execute(
                "SELECT table_name, column_name, data_type, is_nullable FROM information_schema.columns "
                "WHERE table_catalog = ? AND table_schema = ? ORDER BY table_name, ordinal_position", list(scope)).fetchall():
            columns.setdefault(table, []).append((name, dtype, nullable))
        for table in names:
            key = keys.get(table, Keys())
            not_null = set(key.not_null) | set(key.primary_key)
            count = exp.select(exp.Count(this=exp.Star())).from_(_table(table, scope))
            rows = db.con.execute(count.sql("duckdb")).fetchone()[0]
            catalog.tables[table] = Table(
                name=table,
                columns=tuple(Column(n, t, nullable == "YES" and n not in not_null) for n, t, nullable in columns.get(table, [])),
                primary_key=key.primary_key,
                foreign_keys=key.foreign_keys,
                rows=int(rows),
                kind="view" if "VIEW" in str(kinds.get(table, "")).upper() else "table",
            )
    catalog.tables = dict(sorted(catalog.tables.items()))
    return catalog


def check_values(db: Database, catalog: Catalog) -> None:
    """SQLite stores any value in any column, and DuckDB reads a column by its declared type: text
    in an INTEGER column fails every query that reads it. Read each table's columns once (one
    count per table) and name the first column DuckDB cannot read, before a template or a key
    inference trips over it. Other sources enforce their types: nothing to check."""
    if catalog.kind != "sqlite":
        return
    for table in catalog:
        problem = _unreadable(db, table.name, table.column_names) if table.columns else ""
        if not problem:
            continue
        shown = f"table {table.name}"
        for column in table.columns:
            found = _unreadable(db, table.name, [column.name])
            if found:
                shown, problem = f"column {table.name}.{column.name} (declared {column.type})", found
                break
        raise SourceError(f"{catalog.source}: {shown} holds values DuckDB cannot read as that type ({problem}); SQLite "
                          "does not enforce column types: store values of the declared type there (or NULL), or give "
                          "relsql a copy whose column has the type of its values")


def _unreadable(db: Database, table: str, columns: list[str]) -> str:
    """DuckDB's complaint reading `columns` of `table` (one count each), or "" when they read."""
    scope = db.table_scopes().get(table)
    source = _table(table, scope) if scope else exp.Table(this=exp.to_identifier(table, quoted=True))
    query = exp.select(*[exp.Count(this=exp.column(exp.to_identifier(c, quoted=True))) for c in columns]).from_(source)
    try:
        db.con.execute(query.sql("duckdb")).fetchall()
    except duckdb.Error as err:
        return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return ""


def _table(name: str, scope: tuple[str, str]) -> exp.Table:
    quoted = lambda s: exp.to_identifier(s, quoted=True)  # noqa: E731
    return exp.Table(this=quoted(name), db=quoted(scope[1]), catalog=quoted(scope[0]))


def format_catalog(catalog: Catalog, keys: Schema | None = None) -> str:
    """A readable listing for `relsql inspect`: tables with row counts, columns, keys. With `keys`
    (relsql.keys.schema), each key is marked declared, given or inferred, and an inferred
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
