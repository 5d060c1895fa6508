"""A smoke run of `python -m bench.shared_aggregation --quick` on two graphs: the plans agree and
the printed aggregation counts fall where the neighbour sets overlap (no timing is asserted)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_bench_quick_prints_counts_and_agreement():
    done = subprocess.run([sys.executable, "-m", "bench.shared_aggregation", "--quick", "--graphs", "collaboration",
                           "no_overlap", "--kinds", "avg"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "load average before" in done.stdout and "load average after" in done.stdout
    rows = {line.split()[0]: line for line in done.stdout.splitlines() if line.split()[:1] in (["collaboration"], ["no_overlap"])}
    assert set(rows) == {"collaboration", "no_overlap"}, done.stdout
    for graph, line in rows.items():
        entries, diff = _parts(line)
        off, on, forced = (int(v) for v in entries[:3])
        # the timed pass decides product by product (and its greedy stops at MAX_WORK), so it keeps
        # between none and all of the forced factoring's savings
        assert forced <= on <= off, line
        if graph == "collaboration":
            assert forced < 0.8 * off, line  # cliques of authors share partial sums
        else:
            assert forced == off == on, line  # a tree shares nothing
        assert float(diff[0]) < 1e-4, line


def _parts(line: str) -> tuple[list[str], list[str]]:
    """(entries off, on, forced, ratio; max diff) of a row: graph | entries | pass s | epoch ms | ratios | max diff."""
    cells = [part.split() for part in line.split("|")]
    return cells[1], cells[5]
