"""DuckDB reads a grounding's embedding dictionaries in one statement (`ordered_tables`: each
table as a list of row structs): the same Arrow tables, types and order as a query per table
(the Engine's way, the reference here)."""

from __future__ import annotations

from sqlglot import exp

import relsql
from relsql.data.engine import Engine


class Counting:
    """A DuckDB connection that counts the statements it is given."""

    def __init__(self, con):
        self.con, self.statements = con, 0

    def __getattr__(self, name):
        return getattr(self.con, name)

    def execute(self, *args):
        self.statements += 1
        return self.con.execute(*args)

    def sql(self, *args):
        self.statements += 1
        return self.con.sql(*args)


def test_one_statement_reads_what_a_query_per_table_reads():
    db = relsql.connect()
    db.con.execute("CREATE TABLE s AS SELECT * FROM (VALUES ('b', 2), (NULL, 0), ('a', 1), ('é', 3)) v(value, code)")
    db.con.execute("CREATE TABLE n AS SELECT (10 - range)::BIGINT AS value, range::INTEGER AS code FROM range(5000)")
    db.con.execute("CREATE TABLE d AS SELECT DATE '2020-01-01' + (3 - range)::INTEGER AS value, range::INTEGER AS code "
                   "FROM range(4)")
    db.con.execute("CREATE TABLE e AS SELECT 1.5::DOUBLE AS value, 0 AS code WHERE false")
    db.con.execute("CREATE TABLE l AS SELECT * FROM (VALUES (['x', NULL], 1), (NULL, 0), ([], 2)) v(value, code)")
    tables = [(exp.to_table(name), "code") for name in ("s", "n", "d", "e", "l")]
    reference = Engine.ordered_tables(db, tables)
    db.con = Counting(db.con)
    found = db.ordered_tables(tables)
    assert db.con.statements == 1
    for mine, theirs in zip(found, reference, strict=True):
        assert mine.schema == theirs.schema
        assert mine.to_pydict() == theirs.to_pydict()
    assert found[1].column("code").to_pylist() == list(range(5000))
    assert found[3].num_rows == 0
    db.con = db.con.con
    db.close()
