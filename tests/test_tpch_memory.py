"""bench.tpch_memory's one epoch, on a tiny TPC-H: what it reports is what happened (rows, the
store on disk, and a peak per phase whose maximum is the process's peak)."""

from __future__ import annotations

import duckdb

from bench import tpch_memory
from relsql.datasets import tpch


def test_one_epoch_reports_each_phases_peak(tmp_path):
    path = tmp_path / "sf0.01.duckdb"
    con = duckdb.connect(str(path))
    tpch.generate(con, sf=0.01)
    con.close()
    row = tpch_memory.one_epoch(str(path), 512, "256MB", "customer", store=True, threads=1)
    assert row["rows"] == 1500  # customers at sf 0.01
    assert row["store_mib"] > 0
    assert 0 < row["peak_setup_mib"] and 0 < row["peak_epoch_mib"]
    assert row["peak_rss_mib"] == max(row["peak_setup_mib"], row["peak_epoch_mib"])
    assert row["rss_anon_mib_end"] > 0 and row["rss_file_mib_end"] > 0
