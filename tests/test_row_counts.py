"""`relsql.sql.row_counts` (one UNION ALL of tagged COUNT(*)s) as the catalog's row counts and as a
query of its own: each source's count, in the sources' order, against counts made by hand."""

from __future__ import annotations

from sqlglot import exp

import relsql
from relsql import sql as q


def test_the_catalog_counts_every_table_and_view_of_the_scope():
    db = relsql.connect()
    sizes = {"empty": 0, "one": 1, "many": 5003, "zeta": 7, "alpha": 2}
    for name, n in sizes.items():
        db.con.execute(f"CREATE TABLE {name} AS SELECT range AS id FROM range({n})")
    db.con.execute("CREATE VIEW odd AS SELECT * FROM many WHERE id % 2 = 1")
    found = {name: table.rows for name, table in db.catalog().tables.items()}
    assert found == {**sizes, "odd": 2501}
    db.close()


def test_row_counts_keep_the_order_of_many_sources():
    db = relsql.connect()
    db.con.execute("CREATE TABLE t AS SELECT range AS id FROM range(300)")
    sources = [exp.select("id").from_("t").where(exp.LT(this=exp.column("id"), expression=q.integer(i)))
               .subquery("s") for i in range(0, 300, 7)]
    rows = db.arrow(q.row_counts(sources)).to_pylist()
    assert sorted((r["_i"], r["_n"]) for r in rows) == [(k, 7 * k) for k in range(len(sources))]
    db.close()
