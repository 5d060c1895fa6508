"""TPC-H generation (relsql/datasets/tpch.py) and its copy into a real PostgreSQL server."""

from __future__ import annotations

import uuid

import duckdb
import pytest

import relsql
from relsql.datasets import tpch
from relsql.errors import SourceError

SF = 0.01


@pytest.fixture(scope="module")
def con():
    con = duckdb.connect()
    counts = tpch.generate(con, sf=SF)
    yield con, counts
    con.close()


def test_row_counts_follow_tpch_formulas(con):
    con, counts = con
    assert list(counts) == list(tpch.TABLES)
    assert counts["region"] == 5 and counts["nation"] == 25
    assert counts["supplier"] == 10_000 * SF
    assert counts["customer"] == 150_000 * SF
    assert counts["part"] == 200_000 * SF
    assert counts["partsupp"] == 800_000 * SF
    assert counts["orders"] == 1_500_000 * SF
    assert counts["lineitem"] == pytest.approx(6_000_000 * SF, rel=0.02)
    expected = tpch.expected_rows(SF)
    assert {k: v for k, v in counts.items() if k != "lineitem"} == {k: v for k, v in expected.items() if k != "lineitem"}
    for name, n in counts.items():
        assert con.execute(f"SELECT count(*) FROM {name}").fetchone()[0] == n
    # dbgen declares no keys
    assert con.execute("SELECT count(*) FROM duckdb_constraints() "
                       "WHERE constraint_type IN ('PRIMARY KEY', 'FOREIGN KEY')").fetchone()[0] == 0


def test_refuses_to_overwrite(con):
    con, counts = con
    with pytest.raises(SourceError, match="already exist"):
        tpch.generate(con, sf=SF)
    assert con.execute("SELECT count(*) FROM orders").fetchone()[0] == counts["orders"]
    one = duckdb.connect()
    one.execute("CREATE TABLE nation (x INTEGER)")
    with pytest.raises(SourceError, match="nation"):
        tpch.generate(one, sf=SF)
    assert [r[0] for r in one.execute("SELECT table_name FROM information_schema.tables").fetchall()] == ["nation"]


@pytest.mark.parametrize("sf", [0, -1, float("nan"), "0.1", True])
def test_bad_scale_factor(sf):
    with pytest.raises(SourceError, match="scale factor"):
        tpch.generate(duckdb.connect(), sf=sf)


def test_into_relsql_database():
    db = relsql.connect()
    counts = tpch.generate(db, sf=0.001)
    assert sorted(db.tables()) == sorted(tpch.TABLES) and counts["nation"] == 25


def test_copy_to_postgres(con, pg_server):
    con, counts = con
    name = f"tpch_{uuid.uuid4().hex[:12]}"
    url = pg_server.createdb(name)
    copied = tpch.copy_to_postgres(con, url)
    assert copied == counts
    db = relsql.connect(url, read_only=True)
    try:
        assert sorted(db.tables()) == sorted(tpch.TABLES)
        for table, n in counts.items():
            assert db.con.execute(f"SELECT count(*) FROM {table}").fetchone()[0] == n
        # contents survive the trip, not only counts
        here = con.execute("SELECT sum(l_extendedprice), sum(l_quantity), max(l_shipdate), count(DISTINCT l_orderkey) "
                           "FROM lineitem").fetchone()
        there = db.con.execute("SELECT sum(l_extendedprice), sum(l_quantity), max(l_shipdate), count(DISTINCT l_orderkey) "
                               "FROM lineitem").fetchone()
        assert there == here
    finally:
        db.close()
    # the default catalog of `con` is untouched and nothing is left attached
    assert con.execute("SELECT current_database()").fetchone()[0] == "memory"
    assert [r[0] for r in con.execute("SELECT database_name FROM duckdb_databases() WHERE NOT internal").fetchall()] == ["memory"]


def test_copy_to_postgres_refuses_existing_and_writes_nothing(con, pg_server):
    con, counts = con
    name = f"tpch_{uuid.uuid4().hex[:12]}"
    url = pg_server.createdb(name)
    pg_server.psql(name, "CREATE TABLE lineitem (x INTEGER)")
    with pytest.raises(SourceError, match="lineitem"):
        tpch.copy_to_postgres(con, url)
    assert tpch.copy_to_postgres(con, url, ["region", "nation"]) == {"region": 5, "nation": 25}
    db = relsql.connect(url)
    try:
        assert sorted(db.tables()) == ["lineitem", "nation", "region"]
    finally:
        db.close()
    with pytest.raises(SourceError, match="region"):  # all or nothing: supplier must not be left behind
        tpch.copy_to_postgres(con, url, ["supplier", "region"])
    db = relsql.connect(url)
    try:
        assert sorted(db.tables()) == ["lineitem", "nation", "region"]
    finally:
        db.close()


def test_copy_to_postgres_bad_inputs(con, pg_server):
    con, counts = con
    with pytest.raises(SourceError, match="postgresql://"):
        tpch.copy_to_postgres(con, "mysql://x")
    with pytest.raises(SourceError, match="do not exist"):
        tpch.copy_to_postgres(con, pg_server.url(), ["no_such_table"])
    with pytest.raises(SourceError, match=r"\*\*\*") as info:
        tpch.copy_to_postgres(con, pg_server.url("missing_db", user="nobody", password="s3cret"))
    assert "s3cret" not in str(info.value)


def test_copy_to_postgres_failure_inside_transaction_rolls_back(con, pg_server, monkeypatch):
    con, counts = con
    name = f"tpch_{uuid.uuid4().hex[:12]}"
    url = pg_server.createdb(name)
    pg_server.psql(name, "CREATE TABLE region (x INTEGER)")
    real = tpch._existing
    # hide the clash from the up-front check, so the CREATE of `region` fails after `supplier` was created
    monkeypatch.setattr(tpch, "_existing", lambda c, catalog, schema, names: [] if catalog.startswith("__relsql_pg_")
                        else real(c, catalog, schema, names))
    with pytest.raises(SourceError, match="nothing was written"):
        tpch.copy_to_postgres(con, url, ["supplier", "region"])
    assert "supplier" not in pg_server.psql(name, r"\dt")
    db = relsql.connect(url)
    try:
        assert db.tables() == ["region"]
    finally:
        db.close()
