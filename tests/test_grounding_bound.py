"""A rule proved within max_groundings by its AST and its tables' row counts is not EXPLAINed
(relsql/ground/bound.py, Grounder.bounded): the planner's estimate could not refuse it. The bound
is checked against DuckDB's own count of each query on real tables; a cross join beyond the
limit is still estimated and refused, and a bounded template grounds exactly as an estimated one."""

from __future__ import annotations

import duckdb
import pytest
import sqlglot

import relsql
from relsql.data.duckdb import DuckDBDatabase
from relsql.errors import GroundingError
from relsql.ground import execute
from relsql.ground.bound import Source, row_bound


@pytest.fixture
def con():
    con = duckdb.connect()
    con.execute("CREATE TABLE a AS SELECT range AS id, range % 7 AS g, (range % 5) / 5.0 AS x FROM range(50)")
    con.execute("CREATE TABLE b AS SELECT range AS id, range % 50 AS a_id, range % 3 AS g, [range, 1] AS l FROM range(200)")
    # a key table as relsql makes one: distinct keys numbered by _rid (here keyed by a's id)
    con.execute("CREATE TABLE k AS SELECT id, row_number() OVER (ORDER BY id) - 1 AS _rid FROM (SELECT DISTINCT id FROM a)")
    con.execute("CREATE TABLE kd AS SELECT CAST(id AS DOUBLE) AS id, range AS _rid FROM a, range(1)")
    yield con
    con.close()


def sources(con):
    types = {t: {c.lower(): kind.upper() for c, kind in con.execute(
        f"SELECT column_name, data_type FROM information_schema.columns WHERE table_name = '{t}'").fetchall()}
        for t in ("a", "b", "k", "kd")}
    rows = {t: con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in types}
    known = {"a": Source(rows["a"], types=types["a"]), "b": Source(rows["b"], types=types["b"]),
             "k": Source(rows["k"], [("id",), ("_rid",)], types["k"]),
             "kd": Source(rows["kd"], [("id",)], types["kd"])}
    return lambda table: known.get(table.name)


BOUNDED = [  # (query, its bound)
    ("SELECT a.id FROM a", 50),
    ("SELECT a.id, b.id FROM a JOIN b ON b.a_id = a.id", 50 * 200),
    ("SELECT a.id FROM a, b WHERE a.g < b.g", 50 * 200),  # an inequality join: the product
    ("SELECT b.id, k._rid FROM b JOIN k ON k.id = b.a_id", 200),  # k's key: one row per b row
    ("SELECT b.id, k._rid FROM b LEFT JOIN k ON k.id = b.a_id", 200),
    ("SELECT b.id, k._rid FROM b, k WHERE b.a_id = k.id AND b.g = 1", 200),
    ("SELECT b.id, k._rid FROM b JOIN k ON k._rid = b.id", 200),  # _rid is unique too
    ("SELECT b.id, k._rid FROM k JOIN b ON k.id = b.a_id", 50 * 200),  # the key table first: not determined
    ("SELECT b.id FROM b JOIN kd ON kd.id = b.a_id", 200 * 50),  # DOUBLE key against BIGINT: a cast, not used
    ("SELECT b.id FROM b LEFT JOIN k ON k._rid = b.g + 1", 200 * 50),  # not a plain column of an earlier table
    ("SELECT DISTINCT b.g FROM b JOIN a ON a.id = b.a_id GROUP BY b.g", 200 * 50),
    ("SELECT a.id, s.y FROM a CROSS JOIN LATERAL (SELECT a.x * 2 AS y) AS s", 50),
]

UNBOUNDED = [
    "SELECT unnest(b.l) FROM b",
    "SELECT b.id FROM b, LATERAL (SELECT unnest(b.l) AS v) AS s",
    "SELECT a.id FROM a RIGHT JOIN b ON a.id = b.a_id",
    "SELECT a.id FROM a FULL JOIN b ON a.id = b.a_id",
    "SELECT a.id FROM (SELECT * FROM a) AS a",
    "SELECT a.id FROM a WHERE a.id IN (SELECT a_id FROM b)",
    "SELECT a.g FROM a GROUP BY ROLLUP (a.g, a.id)",
    "SELECT x.id FROM range(10) AS x(id)",
    "SELECT a.id FROM a JOIN nope ON nope.id = a.id",
    "WITH c AS (SELECT * FROM a) SELECT c.id FROM c",
    "SELECT a.id FROM a, LATERAL (SELECT b.id FROM b WHERE b.a_id = a.id) AS s",
    "SELECT a.id FROM a UNION ALL SELECT b.id FROM b",
    "SELECT u.id FROM a UNPIVOT (v FOR c IN (g, x)) AS u",  # a row per unpivoted column
    "SELECT b.id FROM b JOIN k AS kk(_rid, id) ON kk.id = b.a_id",  # renamed columns: k's key is not kk.id
    "SELECT a.id FROM a TABLESAMPLE 10 ROWS",
]


@pytest.mark.parametrize("query,expected", BOUNDED)
def test_the_bound_holds_against_duckdbs_count(con, query, expected):
    found = row_bound(sqlglot.parse_one(query, read="duckdb"), sources(con))
    assert found == expected
    assert con.execute(f"SELECT count(*) FROM ({query})").fetchone()[0] <= found


@pytest.mark.parametrize("query", UNBOUNDED)
def test_what_the_ast_cannot_bound_gets_no_bound(con, query):
    assert row_bound(sqlglot.parse_one(query, read="duckdb"), sources(con)) is None


@pytest.fixture
def small(tmp_path):
    path = tmp_path / "small.duckdb"
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE a AS SELECT range AS id, range % 2 = 0 AS label, (range % 7) / 7.0 AS x FROM range(300)")
    con.execute("CREATE TABLE b AS SELECT range AS id, range % 300 AS a_id, (range % 5) / 5.0 AS x FROM range(1000)")
    con.execute("CREATE VIEW bv AS SELECT * FROM b")
    con.close()
    return path


JOINED = """
CREATE TABLE be AS SELECT b.id, linear(b.x, 2, 'w1') AS h FROM b;
CREATE TABLE h AS SELECT a.id, sum(linear(r.h, 2, 'w2')) AS h
FROM a JOIN b ON b.a_id = a.id JOIN be r ON r.id = b.id GROUP BY a.id;
"""
CROSS = "CREATE TABLE h AS SELECT a.id, sum(linear(b.x, 2, 'w')) AS v FROM a, b GROUP BY a.id;"


@pytest.fixture
def explained(monkeypatch):
    """The queries DuckDB was asked to estimate (EXPLAIN)."""
    asked = []
    original = DuckDBDatabase.estimate_rows

    def estimate_rows(self, query):
        asked.append(query.sql("duckdb"))
        return original(self, query)

    monkeypatch.setattr(DuckDBDatabase, "estimate_rows", estimate_rows)
    return asked


def test_a_bounded_template_is_not_explained_and_grounds_as_an_estimated_one(small, explained, monkeypatch):
    db = relsql.connect(small)
    net = relsql.compile(relsql.Template.from_sql(JOINED), db)
    assert explained == []  # be: b's 1,000 rows; h: 300 x 1,000, be's key table fixed by r.id = b.id
    rule = net.grounding.relations["h"].rules[0]
    assert rule.size == db.con.execute("SELECT count(*) FROM a JOIN b ON b.a_id = a.id").fetchone()[0] == 1000
    monkeypatch.setattr(execute.Grounder, "bounded", lambda self, select: False)  # as before: every rule estimated
    again = relsql.compile(relsql.Template.from_sql(JOINED), db)
    assert len(explained) == 2
    for name in ("be", "h"):
        for mine, theirs in zip(net.grounding.relations[name].rules, again.grounding.relations[name].rules, strict=True):
            for t1, t2 in zip([mine.head, *mine.refs, mine.offsets], [theirs.head, *theirs.refs, theirs.offsets], strict=True):
                assert t1.equal(t2)
    db.close()


def test_a_cross_join_beyond_the_limit_is_still_estimated_and_refused(small, explained):
    db = relsql.connect(small)
    with pytest.raises(GroundingError, match="estimates about 300,000 groundings"):
        relsql.compile(relsql.Template.from_sql(CROSS), db, max_groundings=299_999)
    assert len(explained) == 1
    net = relsql.compile(relsql.Template.from_sql(CROSS), db, max_groundings=300_000)  # the product is within: no EXPLAIN
    assert len(explained) == 1 and net.grounding.relations["h"].rules[0].size == 300_000
    db.close()


def test_a_view_is_not_counted_and_its_rule_is_estimated(small, explained):
    db = relsql.connect(small)
    assert db.table_rows(["a", "B", "bv", "missing"]) == {"a": 300, "b": 1000}
    relsql.compile(relsql.Template.from_sql(CROSS.replace("FROM a, b", "FROM a, bv").replace("b.x", "bv.x")), db)
    assert len(explained) == 1
    db.close()


def test_the_grounder_counts_each_table_once(small, monkeypatch):
    db = relsql.connect(small)
    asked = []
    original = DuckDBDatabase.table_rows
    monkeypatch.setattr(DuckDBDatabase, "table_rows", lambda self, names: asked.append(sorted(names)) or original(self, names))
    relsql.compile(relsql.Template.from_sql(JOINED), db)
    assert sorted(n.lower() for names in asked for n in names) == ["a", "b"]
    db.close()
