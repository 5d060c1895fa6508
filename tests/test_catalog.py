"""Schema introspection from every source's own catalog: tables, columns, types, nullability,
primary and foreign keys, row counts; and the `relsql inspect` listing."""

from __future__ import annotations

import pytest

import relsql
from relsql.cli.output import format_catalog
from relsql.data.catalog import Catalog, Column, ForeignKey

ROWS = {"customer": 6, "product": 5, "orders": 15, "review": 8}
COLUMNS = {
    "customer": ["id", "name", "age", "vip", "joined"],
    "product": ["id", "price", "category"],
    "orders": ["id", "customer_id", "product_id", "qty", "day"],
    "review": ["customer_id", "product_id", "stars"],
}
PRIMARY = {"customer": ("id",), "product": ("id",), "orders": ("id",), "review": ("customer_id", "product_id")}
FOREIGN = {
    "customer": set(),
    "product": set(),
    "orders": {ForeignKey(("customer_id",), "customer", ("id",)), ForeignKey(("product_id",), "product", ("id",))},
    "review": {ForeignKey(("customer_id",), "customer", ("id",)), ForeignKey(("product_id",), "product", ("id",))},
}
NOT_NULL = {"customer": {"id", "name"}, "product": {"id", "price"}, "orders": {"id", "customer_id", "product_id", "qty"},
            "review": {"customer_id", "product_id"}}
KEYED = ("duckdb", "sqlite", "postgres")
INTEGER = {"INTEGER", "BIGINT"}


def _catalog(sources, kind) -> Catalog:
    if kind not in sources:
        pytest.skip(f"no {kind} source on this machine")
    db = relsql.connect(sources[kind])
    try:
        return db.catalog()
    finally:
        db.close()


@pytest.mark.parametrize("kind", ["duckdb", "sqlite", "parquet", "csv", "postgres", "frames"])
def test_tables_columns_rows(shop_sources, kind):
    catalog = _catalog(shop_sources, kind)
    assert catalog.names == sorted(ROWS)
    for table in catalog:
        assert table.column_names == COLUMNS[table.name]
        assert table.rows == ROWS[table.name]
    # types as the grounder sees them (SQLite has no BOOLEAN: its scanner reads 0/1 as BIGINT)
    assert catalog["customer"].column("id").type in INTEGER
    assert catalog["customer"].column("age").type == "DOUBLE"
    assert catalog["customer"].column("name").type == "VARCHAR"
    assert catalog["customer"].column("joined").type == "DATE"
    assert catalog["customer"].column("vip").type == ("BIGINT" if kind == "sqlite" else "BOOLEAN")
    assert catalog["orders"].column("qty").type == "DOUBLE"
    assert catalog.kind == {"duckdb": "duckdb-file"}.get(kind, {"parquet": "folder", "csv": "folder"}.get(kind, kind))


@pytest.mark.parametrize("kind", KEYED)
def test_keys_from_each_source_agree(shop_sources, kind):
    catalog = _catalog(shop_sources, kind)
    for table in catalog:
        assert table.primary_key == PRIMARY[table.name], (kind, table.name)
        assert set(table.foreign_keys) == FOREIGN[table.name], (kind, table.name)
        assert {c.name for c in table.columns if not c.nullable} == NOT_NULL[table.name], (kind, table.name)
        assert table.kind == "table"


@pytest.mark.parametrize("kind", ["parquet", "csv", "frames"])
def test_files_and_frames_have_no_keys(shop_sources, kind):
    catalog = _catalog(shop_sources, kind)
    for table in catalog:
        assert table.primary_key == () and table.foreign_keys == ()
        assert all(c.nullable for c in table.columns)
    assert {t.kind for t in catalog} == ({"view"} if kind in ("parquet", "csv") else {"table"})


def test_catalogs_agree_across_sources(shop_sources):
    catalogs = {kind: _catalog(shop_sources, kind) for kind in shop_sources}
    shape = {k: {t.name: (t.column_names, t.rows) for t in c} for k, c in catalogs.items()}
    assert all(s == shape["duckdb"] for s in shape.values()), shape
    keyed = {k: {t.name: (t.primary_key, set(t.foreign_keys), [c.nullable for c in t.columns]) for t in catalogs[k]}
             for k in KEYED if k in catalogs}
    assert all(v == keyed["duckdb"] for v in keyed.values())


def test_duckdb_keys_and_composite_foreign_key(tmp_path):
    db = relsql.connect(tmp_path / "keys.duckdb")
    db.execute("""
        CREATE TABLE a (x INTEGER, y VARCHAR, z DOUBLE NOT NULL, PRIMARY KEY (x, y));
        CREATE TABLE b (id BIGINT PRIMARY KEY, ax INTEGER, ay VARCHAR, FOREIGN KEY (ax, ay) REFERENCES a (x, y));
        INSERT INTO a VALUES (1, 'p', 0.5), (2, 'q', 1.5);
        INSERT INTO b VALUES (7, 1, 'p');
        CREATE VIEW v AS SELECT * FROM b;
    """)
    db.execute('CREATE TEMPORARY TABLE "temp"."main"."__relsql_scratch" AS SELECT 1 AS q')
    catalog = db.catalog()
    db.close()
    assert catalog.names == ["a", "b", "v"]
    assert catalog["a"].primary_key == ("x", "y") and catalog["a"].rows == 2
    assert catalog["a"].columns == (Column("x", "INTEGER", False), Column("y", "VARCHAR", False), Column("z", "DOUBLE", False))
    assert catalog["b"].foreign_keys == (ForeignKey(("ax", "ay"), "a", ("x", "y")),)
    assert catalog["v"].kind == "view" and catalog["v"].rows == 1
    text = format_catalog(catalog)
    assert "foreign key (ax, ay) -> a(x, y)" in text and "primary key (x, y)" in text


def test_sqlite_foreign_key_to_implicit_primary_key(tmp_path):
    import sqlite3

    path = tmp_path / "implicit.sqlite"
    con = sqlite3.connect(path)
    con.executescript("""
        CREATE TABLE parent (pid TEXT PRIMARY KEY, label TEXT);
        CREATE TABLE child (cid INTEGER PRIMARY KEY, pid TEXT REFERENCES parent, note TEXT NOT NULL);
        INSERT INTO parent VALUES ('a', 'x');
        INSERT INTO child VALUES (1, 'a', 'n');
        CREATE VIEW both_ AS SELECT * FROM child JOIN parent USING (pid);
    """)
    con.commit()
    con.close()
    db = relsql.connect(path)
    catalog = db.catalog()
    db.close()
    assert catalog["child"].foreign_keys == (ForeignKey(("pid",), "parent", ("pid",)),)
    assert catalog["parent"].primary_key == ("pid",) and not catalog["parent"].column("pid").nullable
    assert not catalog["child"].column("note").nullable
    assert catalog["both_"].rows == 1


def test_postgres_schema_only_user_tables(shop_sources):
    catalog = _catalog(shop_sources, "postgres")
    assert not any(name.startswith("pg_") for name in catalog.names)


def test_format_catalog_lists_everything(shop_sources):
    catalog = _catalog(shop_sources, "sqlite")
    text = format_catalog(catalog)
    assert text.splitlines()[0].startswith("SQLite file") and "4 tables" in text.splitlines()[0]
    assert "orders: 15 rows" in text and "customer: 6 rows" in text
    orders = text[text.index("orders:"):text.index("product:")]
    assert "FK -> customer.id" in orders and "FK -> product.id" in orders
    assert "primary key (customer_id, product_id)" in text
    line = next(ln for ln in text.splitlines() if ln.strip().startswith("age"))
    assert "DOUBLE" in line and "NULL" in line and "NOT NULL" not in line
    empty = relsql.connect()
    assert format_catalog(empty.catalog()).startswith("in-memory DuckDB: 0 tables")
    empty.close()
