"""A PostgreSQL database, attached to DuckDB with the postgres scanner (`ATTACH ... (TYPE postgres)`).

`relsql.connect("postgresql://user:password@host:port/database")`. The attached database becomes
DuckDB's default catalog (schema `public`, or what the server's search path gives), so
templates name its tables without a prefix. Keys come from `pg_constraint` through
`postgres_query`; writes run inside one transaction of the attached database. Passwords never
appear in descriptions or error messages.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit, urlunsplit

import duckdb
import sqlglot.expressions as exp

from relsql.connectors import extensions
from relsql.data.catalog import ForeignKey, Keys
from relsql.data.duckdb import DuckDBDatabase, DuckDBSource
from relsql.data.engine import WRITTEN_BY, Database, first_line, ident, marked_kind
from relsql.errors import SourceError

__all__ = ["ALIAS", "Postgres", "is_url", "open_postgres", "redact"]

ALIAS = "src"
SCHEMES = ("postgresql://", "postgres://")

# Fixed catalog query (no user text): primary and foreign keys with their columns in key order.
KEYS_SQL = """
SELECT n.nspname AS schema_name, c.relname AS table_name, con.contype::text AS kind, con.conname::text AS name,
       array_to_string(ARRAY(SELECT a.attname::text FROM unnest(con.conkey) WITH ORDINALITY AS k(attnum, ord)
                              JOIN pg_attribute a ON a.attrelid = con.conrelid AND a.attnum = k.attnum
                              ORDER BY k.ord), chr(31)) AS columns,
       fc.relname::text AS ref_table,
       array_to_string(ARRAY(SELECT a.attname::text FROM unnest(con.confkey) WITH ORDINALITY AS k(attnum, ord)
                              JOIN pg_attribute a ON a.attrelid = con.confrelid AND a.attnum = k.attnum
                              ORDER BY k.ord), chr(31)) AS ref_columns
FROM pg_constraint con
JOIN pg_class c ON c.oid = con.conrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
LEFT JOIN pg_class fc ON fc.oid = con.confrelid
WHERE con.contype IN ('p', 'f') AND n.nspname NOT IN ('pg_catalog', 'information_schema')
ORDER BY n.nspname, c.relname, con.contype DESC, con.conname
"""


def is_url(source: str) -> bool:
    return source.lower().startswith(SCHEMES)


def redact(url: str) -> str:
    """The URL with its password replaced by ***."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return re.sub(r"://([^:/@]*):[^@]*@", r"://\1:***@", url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)
    user = netloc[0].split(":", 1)[0]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc[1]}"))


class Postgres(DuckDBSource):
    kind = "postgres"

    def __init__(self, url: str, *, read_only: bool):
        super().__init__(f"PostgreSQL {redact(url)}{' (read-only)' if read_only else ''}", read_only=read_only)
        self.url = url

    def keys(self, db: Database, scope: tuple[str, str]) -> dict[str, Keys]:
        query = exp.select(exp.Star()).from_(exp.func("postgres_query", exp.Literal.string(scope[0]),
                                                      exp.Literal.string(KEYS_SQL)))
        try:
            rows = db.con.execute(query.sql("duckdb")).fetchall()
        except duckdb.Error as err:
            raise SourceError(f"cannot read the keys of {self.description}: {_clean(first_line(err), self.url)}") from None
        found: dict[str, dict] = {}
        for schema, table, kind, _, columns, ref_table, ref_columns in rows:
            if schema != scope[1]:
                continue
            entry = found.setdefault(table, {"pk": (), "fks": []})
            cols = tuple(columns.split("\x1f")) if columns else ()
            if kind == "p":
                entry["pk"] = cols
            else:
                entry["fks"].append(ForeignKey(cols, ref_table, tuple(ref_columns.split("\x1f")) if ref_columns else ()))
        return {t: Keys(e["pk"], tuple(e["fks"])) for t, e in found.items()}

    def mark(self, db: Database, scope: tuple[str, str], name: str, kind: str) -> None:
        """A PostgreSQL table comment, set through `postgres_execute` in the open transaction
        (DuckDB 1.5.5 has no COMMENT ON for attached PostgreSQL tables): the server keeps it with
        the table and drops it with it."""
        comment = exp.Comment(this=exp.Table(this=ident(name), db=ident(scope[1])), kind="TABLE",
                              expression=exp.Literal.string(WRITTEN_BY + kind)).sql("postgres")
        call = exp.func("postgres_execute", exp.Literal.string(scope[0]), exp.Literal.string(comment))
        db.execute(exp.Command(this="CALL", expression=call.sql("duckdb")))

    def written_kind(self, db: Database, scope: tuple[str, str], name: str) -> str | None:
        """The table's comment, read from the server (DuckDB's catalog cache may predate it)."""
        pg_class = exp.select(exp.func("obj_description", exp.column("oid", "c"), exp.Literal.string("pg_class"))).from_(
            exp.alias_(exp.table_("pg_class", db="pg_catalog"), "c", table=True)).join(
            exp.alias_(exp.table_("pg_namespace", db="pg_catalog"), "n", table=True),
            on=exp.EQ(this=exp.column("oid", "n"), expression=exp.column("relnamespace", "c"))).where(exp.and_(
                exp.EQ(this=exp.column("nspname", "n"), expression=exp.Literal.string(scope[1])),
                exp.EQ(this=exp.column("relname", "c"), expression=exp.Literal.string(name))))
        query = exp.select(exp.Star()).from_(exp.func("postgres_query", exp.Literal.string(scope[0]),
                                                      exp.Literal.string(pg_class.sql("postgres"))))
        try:
            row = db.con.execute(query.sql("duckdb")).fetchone()
        except duckdb.Error as err:
            raise SourceError(f"cannot read the comment of table `{name}` in {self.description}: "
                              f"{_clean(first_line(err), self.url)}") from None
        return marked_kind(row[0] if row else None)

    def after_rollback(self, db: Database) -> None:
        try:  # DuckDB caches the Postgres catalog; a rolled-back CREATE would linger there
            db.con.execute(exp.select(exp.Star()).from_(exp.func("pg_clear_cache")).sql("duckdb")).fetchall()
        except duckdb.Error:
            pass


def _clean(text: str, url: str) -> str:
    return text.replace(url, redact(url))


def open_postgres(url: str, *, read_only: bool = False) -> Database:
    shown = redact(url)
    con = duckdb.connect()
    try:
        extensions.load(con, "postgres_scanner", purpose=f"read PostgreSQL {shown}")
        options = [exp.AttachOption(this=exp.var("TYPE"), expression=exp.var("postgres"))]
        if read_only:
            options.append(exp.AttachOption(this=exp.var("READ_ONLY")))
        attach = exp.Attach(this=exp.Alias(this=exp.Literal.string(url), alias=ident(ALIAS)), expressions=options)
        con.execute(attach.sql("duckdb"))
        con.execute(exp.Use(this=exp.Table(this=ident(ALIAS))).sql("duckdb"))
    except duckdb.Error as err:
        con.close()
        raise _explain(shown, _clean(str(err), url)) from None
    except BaseException:
        con.close()
        raise
    source = Postgres(url, read_only=read_only)
    return DuckDBDatabase(con, source.description, source=source)


def _explain(shown: str, text: str) -> SourceError:
    detail = " ".join(line.strip() for line in text.splitlines() if line.strip())
    detail = re.sub(r"^IO Error: Unable to connect to Postgres at \"[^\"]*\": ", "", detail)
    if "Connection refused" in detail or "could not connect" in detail or "No such file or directory" in detail:
        fix = "is the server running and listening on that host and port? Check the URL (postgresql://user:password@host:port/database)"
    elif "password authentication failed" in detail or "role" in detail and "does not exist" in detail \
            or "no password supplied" in detail:
        fix = "check the user name and password in the URL"
    elif "database" in detail and "does not exist" in detail:
        fix = "check the database name in the URL (create it with createdb)"
    elif "timeout" in detail.lower() or "could not translate host name" in detail:
        fix = "check the host name and the network path to the server"
    else:
        fix = "check the URL and the server"
    return SourceError(f"cannot connect to PostgreSQL at {shown}: {detail}; {fix}")
