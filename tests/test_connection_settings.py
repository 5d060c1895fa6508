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


def test_freed_memory_duckdb_keeps_goes_back_to_the_system():
    """relsql.data.duckdb.release_freed_memory (called before training forks its batch process): DuckDB's
    allocator keeps pages it freed for seconds; after the call this process's RSS no longer holds them."""
    import resource
    from pathlib import Path

    from relsql.data.duckdb import release_freed_memory

    def rss_mib() -> float:
        return int(Path("/proc/self/statm").read_text().split()[1]) * resource.getpagesize() / 2**20

    con = duckdb.connect()
    con.execute("CREATE TABLE t AS SELECT range AS i, random() AS r FROM range(20000000)")  # ~300 MB, then freed
    con.execute("DROP TABLE t")
    before = rss_mib()
    assert release_freed_memory()  # this machine's DuckDB (Linux) allocates with jemalloc
    assert rss_mib() < before - 100
    assert con.execute("SELECT count(*) FROM range(1000)").fetchone()[0] == 1000  # DuckDB goes on working
