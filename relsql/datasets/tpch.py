"""TPC-H data generated inside DuckDB (the tpch extension, loaded offline from its wheel).

    import duckdb
    from relsql.datasets import tpch
    con = duckdb.connect()
    tpch.generate(con, sf=0.1)                       # region, nation, supplier, customer, part, partsupp, orders, lineitem
    tpch.copy_to_postgres(con, "postgresql://user@host:5432/db")

`generate` runs `CALL dbgen(sf=...)` into the connection's default catalog and schema (dbgen
declares no primary or foreign keys). `copy_to_postgres` attaches a PostgreSQL database with
DuckDB's postgres scanner and copies the tables into its `public` schema in one transaction.
Neither ever overwrites an existing table: that is a SourceError and nothing is written.
"""

from __future__ import annotations

import itertools
import math

import duckdb
import sqlglot.expressions as exp

from relsql.connectors import extensions
from relsql.connectors.postgres import is_url, redact
from relsql.errors import SourceError

__all__ = ["TABLES", "copy_to_postgres", "expected_rows", "generate"]

TABLES = ("region", "nation", "supplier", "customer", "part", "partsupp", "orders", "lineitem")
PG_SCHEMA = "public"
_aliases = itertools.count()


def expected_rows(sf: float) -> dict[str, int]:
    """TPC-H's row counts for scale factor `sf` (lineitem varies: about 6,000,000 × sf)."""
    return {"region": 5, "nation": 25, "supplier": round(10_000 * sf), "customer": round(150_000 * sf),
            "part": round(200_000 * sf), "partsupp": round(800_000 * sf), "orders": round(1_500_000 * sf),
            "lineitem": round(6_000_000 * sf)}


def _ident(name: str) -> exp.Identifier:
    return exp.to_identifier(name, quoted=True)


def _table(name: str, catalog: str, schema: str) -> exp.Table:
    return exp.Table(this=_ident(name), db=_ident(schema), catalog=_ident(catalog))


def _existing(con: duckdb.DuckDBPyConnection, catalog: str, schema: str, names) -> list[str]:
    rows = con.execute(
        "SELECT table_name FROM information_schema.tables WHERE table_catalog = ? AND table_schema = ? "
        "AND table_name IN (SELECT unnest(?::VARCHAR[]))", [catalog, schema, list(names)]).fetchall()
    return sorted(r[0] for r in rows)


def _count(con: duckdb.DuckDBPyConnection, table: exp.Table) -> int:
    return con.execute(exp.select(exp.func("count", exp.Star())).from_(table).sql("duckdb")).fetchone()[0]


def _first_line(err: BaseException, url: str | None = None) -> str:
    text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return text.replace(url, redact(url)) if url else text


def generate(con, sf: float = 0.1) -> dict[str, int]:
    """Generate the 8 TPC-H tables at scale factor `sf` into `con`'s default catalog; return row counts.

    `con` is a DuckDB connection or a `relsql.Database` (its `.con`). Refuses (SourceError)
    if any of the 8 tables already exists; runs in one transaction, so a failure leaves nothing.
    """
    con = getattr(con, "con", con)
    if isinstance(sf, bool) or not isinstance(sf, int | float) or not math.isfinite(sf) or sf <= 0:
        raise SourceError(f"TPC-H scale factor must be a positive number, got {sf!r}")
    extensions.load(con, "tpch", purpose="generate TPC-H data")
    catalog, schema = con.execute("SELECT current_database(), current_schema()").fetchone()
    clash = _existing(con, catalog, schema, TABLES)
    if clash:
        raise SourceError(f"TPC-H table(s) {', '.join(clash)} already exist in {catalog}.{schema}; TPC-H is not generated "
                          "over them: drop them or generate into another connection or schema")
    con.execute("BEGIN TRANSACTION")
    try:
        con.execute("CALL dbgen(sf = ?, catalog = ?, schema = ?)", [float(sf), catalog, schema])
        counts = {name: _count(con, _table(name, catalog, schema)) for name in TABLES}
        con.execute("COMMIT")
    except duckdb.Error as err:
        con.execute("ROLLBACK")
        raise SourceError(f"TPC-H generation at sf={sf} failed (nothing was written): {_first_line(err)}") from None
    except BaseException:
        con.execute("ROLLBACK")
        raise
    return counts


def copy_to_postgres(con, url: str, tables=None) -> dict[str, int]:
    """Copy `tables` (default: the 8 TPC-H tables) of `con`'s default catalog into PostgreSQL `url`.

    The database is attached through DuckDB's postgres scanner (loaded offline from its wheel)
    and each table is created in its `public` schema as `CREATE TABLE ... AS SELECT * FROM ...`,
    all inside one transaction: every table or none. An existing table of the same name there
    is a SourceError. Returns the row counts read back from PostgreSQL.
    """
    con = getattr(con, "con", con)
    if not isinstance(url, str) or not is_url(url):
        raise SourceError(f"copy_to_postgres needs a postgresql:// URL, got {redact(url) if isinstance(url, str) else url!r}")
    names = list(TABLES if tables is None else ([tables] if isinstance(tables, str) else tables))
    if not names or not all(isinstance(n, str) and n for n in names) or len(set(names)) != len(names):
        raise SourceError(f"copy_to_postgres needs distinct, non-empty table names, got {tables!r}")
    shown = redact(url)
    catalog, schema = con.execute("SELECT current_database(), current_schema()").fetchone()
    missing = sorted(set(names) - set(_existing(con, catalog, schema, names)))
    if missing:
        raise SourceError(f"table(s) {', '.join(missing)} do not exist in {catalog}.{schema}; nothing was copied to {shown}")
    extensions.load(con, "postgres_scanner", purpose=f"write to PostgreSQL {shown}")
    alias = f"__relsql_pg_{next(_aliases)}"
    attach = exp.Attach(this=exp.Alias(this=exp.Literal.string(url), alias=_ident(alias)),
                        expressions=[exp.AttachOption(this=exp.var("TYPE"), expression=exp.var("postgres"))])
    try:
        con.execute(attach.sql("duckdb"))
    except duckdb.Error as err:
        raise SourceError(f"cannot attach PostgreSQL {shown}: {_first_line(err, url)}") from None
    try:
        clash = _existing(con, alias, PG_SCHEMA, names)
        if clash:
            raise SourceError(f"table(s) {', '.join(clash)} already exist in {shown} (schema {PG_SCHEMA}); nothing was copied: "
                              "drop them or copy into another database")
        con.execute("BEGIN TRANSACTION")
        try:
            for name in names:
                create = exp.Create(this=_table(name, alias, PG_SCHEMA), kind="TABLE",
                                    expression=exp.select(exp.Star()).from_(_table(name, catalog, schema)))
                con.execute(create.sql("duckdb"))
            con.execute("COMMIT")
        except duckdb.Error as err:
            con.execute("ROLLBACK")
            raise SourceError(f"copying {', '.join(names)} to PostgreSQL {shown} failed (nothing was written): "
                              f"{_first_line(err, url)}") from None
        except BaseException:
            con.execute("ROLLBACK")
            raise
        return {name: _count(con, _table(name, alias, PG_SCHEMA)) for name in names}
    finally:
        try:
            con.execute(exp.Detach(this=exp.Table(this=_ident(alias))).sql("duckdb"))
        except duckdb.Error:
            pass
