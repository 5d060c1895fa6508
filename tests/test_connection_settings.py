"""Settings relsql gives a DuckDB instance: only one it opened itself; a user's connection keeps its own."""

from __future__ import annotations

import duckdb
import pytest

import relsql


def _threshold(con: duckdb.DuckDBPyConnection) -> str:
    return con.execute("SELECT current_setting('allocator_flush_threshold')").fetchone()[0]


@pytest.mark.parametrize("read_only", [False, True])
def test_a_database_relsql_opens_caches_at_most_32mb_of_freed_memory(tmp_path, read_only):
    path = tmp_path / "x.duckdb"
    duckdb.connect(str(path)).close()
    with relsql.connect(path, read_only=read_only) as db:
        assert _threshold(db.con) == _threshold(duckdb.connect(config={"allocator_flush_threshold": "32MB"}))


def test_a_users_connection_keeps_duckdbs_default():
    con = duckdb.connect()
    before = _threshold(con)
    with relsql.connect(con):
        pass
    assert _threshold(con) == before == _threshold(duckdb.connect())
