"""A rule joined by equalities whose planner estimate is far above its true size is counted, not
refused: DuckDB estimates a join on two-column keys as if the keys were independent (TPC-H sf 1's
Template.auto tree: 253,788,036 estimated for 6,001,215 line items), which refused templates that
ground a few million rows. Cross and inequality joins are still refused on their estimate, and a
rule whose true count is over `max_groundings` is still refused.

Real DuckDB files; the naive counts come from plain SQL on the same tables."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

import relsql
from relsql.data.duckdb import duckdb_plan_rows
from relsql.errors import GroundingError
from relsql.ground.demand import BatchGrounder

ROWS = 20_000
# a limit the planner's estimate of this join passes on duckdb 1.5 (2.8 x 10^8) and on 2.0 (8.4 x 10^7),
# 500 times the true count
LIMIT = 10_000_000
# Three tables on a two-column key (k1, k2): one match per row, and DuckDB's estimate is far larger.
TEMPLATE = """
CREATE TABLE h AS
SELECT a.id, sum(linear(c.x, 2, 'w')) AS v
FROM a JOIN b ON a.k1 = b.k1 AND a.k2 = b.k2 JOIN c ON c.k1 = b.k1 AND c.k2 = a.k2
GROUP BY a.id;
"""
BODY = "SELECT a.id, c.x FROM a JOIN b ON a.k1 = b.k1 AND a.k2 = b.k2 JOIN c ON c.k1 = b.k1 AND c.k2 = a.k2"


@pytest.fixture
def keyed(tmp_path: Path) -> Path:
    path = tmp_path / "keyed.duckdb"
    con = duckdb.connect(str(path))
    for name in ("a", "b", "c"):
        con.execute(f"CREATE TABLE {name} AS SELECT range AS id, range % 100 AS k1, range // 100 AS k2, "
                    f"(range % 7) / 7.0 AS x, range % 2 = 0 AS label FROM range({ROWS})")
    con.close()
    return path


def naive_count(con: duckdb.DuckDBPyConnection) -> int:
    return con.execute(f"SELECT count(*) FROM ({BODY})").fetchone()[0]


def planner_estimate(path: Path) -> int:
    con = duckdb.connect(str(path), read_only=True)
    try:
        return duckdb_plan_rows(con, BODY)
    finally:
        con.close()


def test_the_planner_overestimates_this_join_past_the_default_limit(keyed):
    """The premise: without counting, LIMIT would refuse this rule."""
    con = duckdb.connect(str(keyed), read_only=True)
    assert naive_count(con) == ROWS
    con.close()
    assert planner_estimate(keyed) > LIMIT


def test_an_equality_join_estimated_over_the_limit_is_counted_and_grounded(keyed):
    db = relsql.connect(keyed)
    net = relsql.compile(relsql.Template.from_sql(TEMPLATE), db, max_groundings=LIMIT)
    rule = net.grounding.relations["h"].rules[0]
    assert rule.size == naive_count(db.con) == ROWS
    assert rule.segment_heads.numel() == ROWS
    db.close()


def test_the_batch_grounder_counts_it_too(keyed):
    db = relsql.connect(keyed)
    grounder = BatchGrounder(relsql.Template.from_sql(TEMPLATE), db, "h", progress=False, max_groundings=LIMIT)
    assert "h" in grounder.order
    db.close()


def test_a_true_count_over_the_limit_is_still_refused(keyed):
    db = relsql.connect(keyed)
    with pytest.raises(GroundingError, match="max_groundings=19,999"):
        relsql.compile(relsql.Template.from_sql(TEMPLATE), db, max_groundings=ROWS - 1)
    net = relsql.compile(relsql.Template.from_sql(TEMPLATE), db, max_groundings=ROWS)
    assert net.grounding.relations["h"].rules[0].size == ROWS
    db.close()


def test_a_cross_join_is_refused_on_its_estimate_without_counting(tmp_path):
    """A cross product (20,000 x 20,000 rows) is not joined by an equality: still refused."""
    path = tmp_path / "pairs.duckdb"
    con = duckdb.connect(str(path))
    con.execute(f"CREATE TABLE a AS SELECT range AS id, range % 2 = 0 AS label FROM range({ROWS})")
    con.execute(f"CREATE TABLE b AS SELECT range AS id, (range % 5) / 5.0 AS x FROM range({ROWS})")
    con.close()
    db = relsql.connect(path)
    with pytest.raises(GroundingError, match="groundings for this rule"):
        relsql.compile(relsql.Template.from_sql(
            "CREATE TABLE h AS SELECT a.id, sum(linear(b.x, 2, 'w')) AS v FROM a, b GROUP BY a.id;"), db)
    db.close()
