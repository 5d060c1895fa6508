"""Mutagenesis as a keyed relational database: the data of the relsql demo.

188 molecules (125 mutagenic), 4,893 atoms, 5,243 undirected bonds, converted once from the
files shipped with PyNeuraLogic by ``demos/mutagenesis/build_data.py`` (in the repository) and kept
in ``data/`` (package data, installed with relsql) as Parquet plus
``schema.sql`` (the CREATE TABLE statements with their PRIMARY and FOREIGN KEYs)::

    import duckdb
    from relsql.datasets.mutagenesis import load
    con = duckdb.connect()
    load(con)     # {'molecule': 188, 'atom': 4893, 'bond': 5243}

The template for it is ``relsql/sql_templates/mutagenesis.sql`` (``relsql.sql_templates.path("mutagenesis")``).
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import sqlglot
import sqlglot.expressions as exp

from relsql.errors import SourceError

__all__ = ["DATA", "TABLES", "load"]

DATA = Path(__file__).resolve().parent / "data"
TABLES = ("molecule", "atom", "bond")  # in foreign-key order


def _schema(folder: Path) -> list[exp.Create]:
    """The CREATE TABLE statements of schema.sql, checked to be exactly the demo's tables."""
    path = folder / "schema.sql"
    try:
        statements = sqlglot.parse(path.read_text(), read="duckdb")
    except (OSError, sqlglot.errors.ParseError) as err:
        raise SourceError(f"cannot read the Mutagenesis schema {path}: {err}") from err
    creates = [s for s in statements if s is not None]
    names = [c.this.this.name if isinstance(c, exp.Create) and isinstance(c.this, exp.Schema) else None for c in creates]
    if not all(isinstance(c, exp.Create) and c.args.get("kind") == "TABLE" for c in creates) or names != list(TABLES):
        raise SourceError(
            f"{path} must hold exactly CREATE TABLE {', '.join(TABLES)} (in this order); "
            "regenerate it with python demos/mutagenesis/build_data.py"
        )
    return creates


def _existing(con: duckdb.DuckDBPyConnection) -> list[str]:
    query = (exp.select("table_name").from_("information_schema.tables")
             .where("table_catalog = current_database() AND table_schema = current_schema()")
             .where(exp.column("table_name").isin(*(exp.Literal.string(t) for t in TABLES))))
    rows = con.execute(query.sql("duckdb")).fetchall()
    return sorted(r[0] for r in rows)


def load(con: duckdb.DuckDBPyConnection, folder: str | Path = DATA) -> dict[str, int]:
    """Create the keyed tables ``molecule``, ``atom`` and ``bond`` in ``con`` and fill them.

    ``con`` is a DuckDB connection (a ``relsql.Database`` is accepted too: its ``.con``).
    Tables are created from ``schema.sql`` (so DuckDB enforces the keys while inserting) and
    filled from ``<table>.parquet`` in ``folder``. Returns the row count of each table. Tables
    of these names that already exist are never overwritten (a ``SourceError``); on any
    failure nothing is left behind.
    """
    con = getattr(con, "con", con)
    folder = Path(folder)
    creates = _schema(folder)
    clash = _existing(con)
    if clash:
        raise SourceError(
            f"table(s) {', '.join(clash)} already exist in this database; Mutagenesis is not "
            "loaded over them: drop them or load into another connection or schema"
        )
    counts: dict[str, int] = {}
    con.execute("BEGIN TRANSACTION")
    try:
        for name, create in zip(TABLES, creates):
            con.execute(create.sql("duckdb"))
            parquet = folder / f"{name}.parquet"
            if not parquet.is_file():
                raise SourceError(f"missing data file {parquet}; regenerate it with python demos/mutagenesis/build_data.py")
            columns = [c.this.name for c in create.this.expressions if isinstance(c, exp.ColumnDef)]
            insert = exp.insert(
                exp.select(*columns).from_(exp.func("read_parquet", exp.Literal.string(str(parquet)))),
                exp.to_table(name),
                columns=columns,
            )
            con.execute(insert.sql("duckdb"))
            counts[name] = con.execute(exp.select("count(*)").from_(exp.to_table(name)).sql("duckdb")).fetchone()[0]
        con.execute("COMMIT")
    except duckdb.Error as err:
        con.execute("ROLLBACK")
        raise SourceError(f"loading Mutagenesis from {folder} failed: {err}") from err
    except BaseException:
        con.execute("ROLLBACK")
        raise
    return counts
