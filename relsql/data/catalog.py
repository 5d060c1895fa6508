"""What relsql knows of a database's tables: columns and types, primary and foreign keys, row
counts (the data `Database.catalog` fills in), and DuckDB's own declared keys.

Columns and types come from DuckDB's `information_schema` (so types read the same way the
grounder sees them, whatever the source); keys come from each source's own catalog: DuckDB's
`duckdb_constraints()`, SQLite's `PRAGMA table_info` / `foreign_key_list` (read with Python's
sqlite3 from the file), PostgreSQL's `pg_constraint` (through `postgres_query`). A folder of
Parquet/CSV files and data frames have no keys. This module imports no other part of relsql.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import duckdb
import sqlglot.expressions as exp

from relsql.sql import bound

__all__ = ["Catalog", "Column", "ForeignKey", "Keys", "Table", "duckdb_keys", "scoped_table"]


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
    rows = con.execute(bound(
        "SELECT table_name, constraint_type, constraint_column_names, referenced_table, referenced_column_names "
        "FROM duckdb_constraints() WHERE database_name = :catalog AND schema_name = :schema "
        "AND constraint_type IN ('PRIMARY KEY', 'FOREIGN KEY', 'NOT NULL') ORDER BY table_name, constraint_index",
        catalog=scope[0], schema=scope[1])).fetchall()
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


def scoped_table(name: str, scope: tuple[str, str]) -> exp.Table:
    quoted = lambda s: exp.to_identifier(s, quoted=True)  # noqa: E731
    return exp.Table(this=quoted(name), db=quoted(scope[1]), catalog=quoted(scope[0]))
