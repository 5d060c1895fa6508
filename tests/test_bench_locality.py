"""A smoke run of `python -m bench.locality --quick`: the renumbered plans agree with the plain one
and the CSV has its columns and one row per (graph, model); no timing is asserted."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import numpy as np

from bench.locality import COLUMNS, grid

ROOT = Path(__file__).resolve().parent.parent


def test_scattered_grid_is_the_natural_grid_renumbered():
    natural, scattered = grid(5, scattered=False), grid(5, scattered=True)
    assert natural.edges.shape == scattered.edges.shape == (4 * 5 * 4, 2)
    assert sorted(map(tuple, natural.edges.tolist())) != sorted(map(tuple, scattered.edges.tolist()))
    assert sorted(np.bincount(natural.edges[:, 0])[1:]) == sorted(np.bincount(scattered.edges[:, 0])[1:])  # same degrees


def test_bench_quick_writes_csv(tmp_path):
    done = subprocess.run([sys.executable, "-m", "bench.locality", "--quick", "--models", "sage", "--reps", "1",
                           "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "off/forced" in done.stdout and "load average" in done.stdout
    with open(tmp_path / "locality.csv", newline="") as f:
        reader = csv.DictReader(f)
        assert reader.fieldnames == COLUMNS
        rows = list(reader)
    assert [(r["model"], r["graph"]) for r in rows] == [("sage", "grid_scattered"), ("sage", "grid_natural"), ("sage", "random")]
    for r in rows:
        assert int(r["edges"]) == 6240 and int(r["nodes"]) == 1600
        assert float(r["max_rel_diff"]) < 1e-4
        assert r["fired"] == "0" and "fewer than" in r["decision"]  # a 6k-edge graph is too small to time
        for key in ("off_ms", "on_ms", "forced_ms", "off_over_on", "off_over_forced"):
            assert float(r[key]) > 0, key
    assert (tmp_path / "locality.png").stat().st_size > 0
