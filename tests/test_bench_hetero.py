"""bench/hetero.py: a smoke run on a tiny heterogeneous graph (correctness only; no timing is
asserted), the synthetic graphs' shapes, and that the agreement check is not vacuous."""

from __future__ import annotations

import csv
import math

import numpy as np
import pytest
import torch

from bench import hetero

TOLERANCE = 1e-4  # float32 agreement asked of the benchmark (relative)


@pytest.fixture
def pyg():
    """PyG for the tests that run it (they skip without it). Imported here, not by the module: under
    --fast only the three shape tests run, and collecting the file imported PyG (~2 CPU-s a worker)."""
    return pytest.importorskip("torch_geometric")


@pytest.mark.oracle
def test_quick_run_writes_one_checked_row_per_model_baseline_and_layers(pyg, tmp_path, capsys):
    hetero.main(["--quick", "--out", str(tmp_path), "--datasets", "tiny", "--no-memory", "--threads", "1"])
    printed = capsys.readouterr().out
    assert "load average at start" in printed and "set_num_threads(1)" in printed
    with open(tmp_path / "hetero.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    keys = [(r["model"], r["baseline"], r["layers"]) for r in rows]
    assert sorted(keys) == sorted([
        ("rgcn", "RGCNConv", "1"), ("rgcn", "FastRGCNConv", "1"), ("rgcn", "RGCNConv", "2"),
        ("rgcn", "FastRGCNConv", "2"), ("gat", "GATConv", "1"), ("gat", "GATConv", "2")])
    for r in rows:
        assert r["dataset"] == "tiny" and int(r["hidden"]) == 64
        # the graph in the tables is the one asked for: 300 nodes, 1,500 edges, 7 types
        assert (int(r["nodes"]), int(r["edges"]), int(r["types"])) == (300, 1500, 7)
        diff, grad_diff = float(r["max_rel_diff"]), float(r["max_rel_grad_diff"])
        assert math.isfinite(diff) and 0 <= diff < TOLERANCE, r
        assert math.isfinite(grad_diff) and 0 <= grad_diff < TOLERANCE, r
        for key in ("relsql_fwd_ms", "pyg_fwd_ms", "relsql_step_ms", "pyg_step_ms", "ground_s"):
            assert float(r[key]) > 0, (key, r)
        assert_ratio_of_rounded(r["fwd_ratio"], r["relsql_fwd_ms"], r["pyg_fwd_ms"])
        assert_ratio_of_rounded(r["step_ratio"], r["relsql_step_ms"], r["pyg_step_ms"])
        assert math.isnan(float(r["relsql_mb"])) and math.isnan(float(r["pyg_mb"]))  # --no-memory
    # the two RGCN baselines were timed in the same alternating loop as one relsql net
    by_layers = {}
    for r in rows:
        if r["model"] == "rgcn":
            by_layers.setdefault(r["layers"], set()).add(r["relsql_step_ms"])
    assert all(len(v) == 1 for v in by_layers.values())
    assert (tmp_path / "hetero.png").stat().st_size > 0


@pytest.mark.oracle
def test_quick_run_covers_rgat_and_hgt(pyg, tmp_path):
    """The RGAT and HGT rows, checked against RGATConv and HGTConv (outputs and gradients) before
    one short timing, on the smoke test's graph (AIFB's takes minutes: PyG's HGTConv step loops
    over its 45 relation types in Python)."""
    hetero.main(["--quick", "--out", str(tmp_path), "--datasets", "tiny", "--models", "rgat,hgt", "--no-memory",
                 "--threads", "1", "--budget", "1"])
    with open(tmp_path / "hetero.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert sorted((r["model"], r["baseline"], r["layers"]) for r in rows) == [
        ("hgt", "HGTConv", "1"), ("hgt", "HGTConv", "2"), ("rgat", "RGATConv", "1"), ("rgat", "RGATConv", "2")]
    for r in rows:
        assert (r["dataset"], int(r["nodes"]), int(r["edges"]), int(r["types"])) == ("tiny", 300, 1_500, 7)
        assert int(r["heads"]) == (2 if r["model"] == "hgt" else 1)
        assert 0 <= float(r["max_rel_diff"]) < TOLERANCE and 0 <= float(r["max_rel_grad_diff"]) < TOLERANCE, r
        assert float(r["relsql_step_ms"]) > 0 and float(r["pyg_step_ms"]) > 0


def test_hgt_edges_link_their_relations_node_types():
    graph = hetero.synthetic("aifb", 4)
    src, dst = graph.typed_ends()
    assert src.min() >= 0 and max(src.max(), dst.max()) < graph.nodes
    assert np.array_equal(graph.node_type[src], graph.type % 3)
    assert np.array_equal(graph.node_type[dst], graph.type // 3 % 3)
    assert np.abs(src - graph.src).max() <= 3  # the nearest node of the type: still a uniform graph
    assert set(graph.node_type[dst].tolist()) == {0, 1, 2}  # every node type receives messages


def test_synthetic_graphs_have_the_datasets_shapes_and_a_skewed_type_distribution():
    graph = hetero.synthetic("aifb", 8)
    assert (graph.nodes, graph.edges, graph.types) == (8_285, 29_043, 45)
    assert graph.x.shape == (8_285, 8) and graph.x.dtype == np.float32
    counts = np.bincount(graph.type, minlength=45)
    assert counts.min() >= 1 and counts.shape == (45,)  # every relation type used
    assert counts.max() > 20 * np.median(counts)  # a few frequent types, many rare ones
    assert graph.src.min() >= 0 and graph.dst.max() < graph.nodes
    again = hetero.synthetic("aifb", 8)
    assert np.array_equal(again.src, graph.src) and np.array_equal(again.type, graph.type)  # seeded
    am = hetero.synthetic("am", 2, am_scale=0.125)
    assert (am.nodes, am.edges, am.types) == (round(1_666_764 / 8), round(5_988_321 / 8), 133)


def test_tables_hold_the_graph():
    graph = hetero.synthetic("tiny", 4)
    db = hetero.database(graph)
    con = db.con
    assert con.execute("SELECT count(*), min(node_id), max(node_id) FROM node").fetchone() == (300, 0, 299)
    x = np.array([r[0] for r in con.execute("SELECT x FROM node ORDER BY node_id").fetchall()], dtype=np.float32)
    assert np.array_equal(x, graph.x)
    edges = con.execute("SELECT src, dst, type FROM edge").fetchall()
    assert sorted(edges) == sorted(zip(graph.src.tolist(), graph.dst.tolist(), graph.type.tolist()))
    db.con.close()


@pytest.mark.oracle
@pytest.mark.parametrize("model", ["rgcn", "gat", "rgat", "hgt"])
def test_the_agreement_check_sees_a_wrong_weight(pyg, model):
    """A check that passes whatever the weights would prove nothing: change one PyG weight after
    the sharing and the reported difference must exceed the tolerance."""
    torch.manual_seed(0)
    graph = hetero.synthetic("tiny", 16)
    db = hetero.database(graph)
    case = hetero.Case(model, graph, 2, 16, 1, db=db)
    before = case.check()
    assert all(max(d) < TOLERANCE for d in before.values()), before
    baseline = next(iter(case.baselines))
    bias = next(p for name, p in case.baselines[baseline].convs[1].named_parameters() if name.endswith("bias"))
    with torch.no_grad():
        bias.add_(0.5)
    after = case.check()
    assert after[baseline][0] > 100 * TOLERANCE, after
    db.con.close()


def assert_ratio_of_rounded(ratio: str, ours: str, theirs: str) -> None:
    """The ratio (rounded to 3 places) was taken of the times before they were rounded to 0.01 ms:
    it lies between the ratios of the rounded times' bounds (sub-ms times make that wider than 2%)."""
    a, b = float(ours), float(theirs)
    assert (a - 0.005) / (b + 0.005) - 5e-4 <= float(ratio) <= (a + 0.005) / max(b - 0.005, 1e-9) + 5e-4, (ratio, ours, theirs)
