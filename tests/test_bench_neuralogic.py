"""bench/neuralogic.py in --quick mode: runs, writes its CSV and chart, identical numbers hold (no timing checks);
every shipped dataset it knows imports with its query heads."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from bench.neuralogic import COLUMNS, DATASETS, EXTRA, SHIPPED, TOL, dataset_files, load_dataset, skip_reason, widen

REPO = Path(__file__).resolve().parent.parent


def test_widen_rewrites_every_dimension_above_one():
    text = "{3,3} a(X) :- b(X). {3,1} c(X) :- d(X). {1,3} p :- c(X). {4,3} e(A) :- f(A). p/0 {1} x/1 {3,1} <-7>"
    assert widen(text, 32) == ("{32,32} a(X) :- b(X). {32,1} c(X) :- d(X). {1,32} p :- c(X). "
                               "{32,32} e(A) :- f(A). p/0 {1} x/1 {32,1} <-7>")
    assert widen(text, 3) == text == widen(text, SHIPPED)
    assert skip_reason("template_crosssum.txt", 32) and not skip_reason("template_crosssum.txt", 3)


def test_small_datasets_import_with_their_heads_and_samples():
    """The small ones (Mutagenesis runs in the quick test; Nations' import takes seconds)."""
    heads = {"xor": ("xor",), "xor_vectorized": ("xor",), "family": ("foal", "negFoal"), "trains": ("direction",),
             "xor_generalized": ("xor_at",), "xor_solution": ("xor",)}
    samples = {"xor": 4, "xor_vectorized": 4, "family": 1, "trains": 1, "xor_generalized": 4, "xor_solution": 4}
    assert set(heads) | {"mutagenesis", "nations"} == set(DATASETS) | set(EXTRA)
    for name in heads:
        ds = load_dataset(duckdb.connect(), name)
        assert (ds.heads, ds.n_examples) == (heads[name], samples[name]), name
        assert all(p.parent == ds.template.parent for p in ds.templates), name
    nations = dataset_files("nations")
    assert [p.name for p in nations.templates] == ["template.txt", "embeddings.txt"]


@pytest.mark.slow
@pytest.mark.oracle  # PyNeuraLogic's numbers
def test_quick_benchmark_writes_csv_with_identical_numbers(tmp_path):
    had_target = (REPO / "target").exists()  # PyNeuraLogic writes ./target: the bench keeps it in a temp dir
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-m", "bench.neuralogic", "--quick", "--out", str(tmp_path)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert had_target or not (REPO / "target").exists()
    with open(tmp_path / "neuralogic.csv") as fp:
        reader = csv.DictReader(fp)
        assert tuple(reader.fieldnames) == COLUMNS
        rows = list(reader)
    assert [(r["dataset"], r["template"], r["width"]) for r in rows] == [("mutagenesis", "template.txt", "3")]
    row = rows[0]
    assert float(row["max_abs_dev"]) < TOL
    assert int(row["n_outputs"]) == 188
    for col in ("nl_build_s", "relsql_build_s", "build_ratio", "nl_epoch_ms", "relsql_epoch_ms_f64",
                "relsql_epoch_ms_f32", "epoch_ratio_f64", "nl_peak_rss_mib", "relsql_peak_rss_mib"):
        assert float(row[col]) > 0, col
    assert (tmp_path / "neuralogic.png").stat().st_size > 0
    assert "template.txt" in proc.stdout and "max|Δ|" in proc.stdout
