"""`sql.heads_within`: a rule body narrowed, inside, to some heads (what a batch of demand
grounding runs, relsql/ground/demand.py). Against a naive reference: the whole body run by
DuckDB, then its rows kept in Python where the head keys are among the demanded ones (None
equal to None, as the key table's join compares), as multisets. And the bodies a filter
inside would change are left to the caller (None)."""

from __future__ import annotations

from collections import Counter

import duckdb
import pytest
import sqlglot
import sqlglot.expressions as exp

from relsql import sql as q

SETUP = """
CREATE TABLE a(id INT, grp VARCHAR, x DOUBLE);
INSERT INTO a VALUES (1, 'p', 1.0), (2, 'p', 2.0), (3, 'q', 3.0), (4, NULL, 4.0), (5, NULL, 5.0), (6, 'r', 6.0),
                     (7, 'q', 7.0), (8, 'p', 8.0);
CREATE TABLE b(id INT, a_id INT, y DOUBLE);
INSERT INTO b VALUES (10, 1, 0.5), (11, 1, 0.25), (12, 3, 1.5), (13, 4, 2.5), (14, NULL, 9.0), (15, 7, 1.0),
                     (16, 8, 0.0), (17, 8, 0.0);
CREATE TABLE demanded(k0 VARCHAR, k1 INT);
INSERT INTO demanded VALUES ('p', 1), (NULL, 4), ('q', 7), ('p', 8), (NULL, NULL);
CREATE TABLE demanded_one(k0 VARCHAR);
INSERT INTO demanded_one VALUES ('p'), (NULL);
"""

# (body, number of head keys, the demanded table)
BODIES = [
    ('SELECT a.grp AS "_h0", a.id AS "_h1", b.y AS "_c0" FROM a JOIN b ON b.a_id = a.id', 2, "demanded"),
    ('SELECT a.grp AS "_h0", b.a_id AS "_h1", b.y AS "_c0" FROM b LEFT JOIN a ON b.a_id = a.id', 2, "demanded"),
    ('SELECT a.grp AS "_h0", a.id AS "_h1", a.x AS "_c0" FROM a WHERE a.x > 1.5', 2, "demanded"),
    ('SELECT DISTINCT a.grp AS "_h0", b.y AS "_c0" FROM a JOIN b ON b.a_id = a.id', 1, "demanded_one"),
    ('SELECT a.grp AS "_h0", a.x * 2 AS "_c0" FROM a, b WHERE b.a_id = a.id AND b.y >= 0', 1, "demanded_one"),
    ('WITH c AS (SELECT * FROM a WHERE x < 7) SELECT c.grp AS "_h0", c.x AS "_c0" FROM c', 1, "demanded_one"),
    ('SELECT upper(a.grp) AS "_h0", a.x AS "_c0" FROM a', 1, "demanded_one"),
]


@pytest.fixture(scope="module")
def con():
    con = duckdb.connect()
    con.execute(SETUP)
    yield con
    con.close()


def _keys(n: int) -> list[str]:
    return ["k0", "k1"][:n]


@pytest.mark.parametrize("body, n, table", BODIES)
def test_a_narrowed_body_has_the_rows_of_the_whole_body_with_those_heads(con, body, n, table):
    select = sqlglot.parse_one(body, read="duckdb")
    narrowed = q.heads_within(select, exp.Table(this=q.ident(table)), _keys(n))
    assert narrowed is not None
    assert select.sql("duckdb") == sqlglot.parse_one(body, read="duckdb").sql("duckdb")  # the body itself unchanged
    columns = [d[0] for d in con.execute(body).description]
    demanded = {tuple(row) for row in con.execute(f"SELECT * FROM {table}").fetchall()}
    every = con.execute(body).fetchall()
    expected = Counter(row for row in every if tuple(row[columns.index(f"_h{i}")] for i in range(n)) in demanded)
    got = con.execute(narrowed.sql("duckdb")).fetchall()
    assert Counter(got) == expected
    assert 0 < len(got) < len(every)  # the case narrows something and keeps something


@pytest.mark.parametrize("body", [
    'SELECT a.grp AS "_h0", sum(a.x) AS "_c0" FROM a GROUP BY a.grp',
    'SELECT a.grp AS "_h0", row_number() OVER () AS "_c0" FROM a',
    'SELECT a.grp AS "_h0", count(*) OVER (PARTITION BY a.grp) AS "_c0" FROM a',
    'SELECT a.grp AS "_h0", a.x AS "_c0" FROM a LIMIT 3',
    'SELECT a.grp AS "_h0", a.x AS "_c0" FROM a ORDER BY a.x',
    'SELECT DISTINCT ON (a.grp) a.grp AS "_h0", a.x AS "_c0" FROM a',
    'SELECT a.grp AS "_h0", a.x AS "_c0" FROM a QUALIFY a.x > 1',
    'SELECT \'p\' AS "_h0", 1 AS "_c0"',
    'SELECT a.grp AS "grp", a.x AS "_c0" FROM a',
    'SELECT a.grp AS "_h0", a.x AS "_c0" FROM a UNION ALL SELECT a.grp, a.x FROM a',
])
def test_bodies_a_filter_inside_would_change_are_left_alone(body):
    select = sqlglot.parse_one(body, read="duckdb")
    assert q.heads_within(select, exp.Table(this=q.ident("demanded_one")), ["k0"]) is None


def test_no_keys_no_narrowing():
    select = sqlglot.parse_one('SELECT a.x AS "_c0" FROM a', read="duckdb")
    assert q.heads_within(select, exp.Table(this=q.ident("demanded")), []) is None
