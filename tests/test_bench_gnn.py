"""relsql/sql_templates/gin.sql against torch_geometric's GINConv (float64, shared weights) and a smoke run of
`python -m bench.gnn --quick` (correctness only; no timing is asserted).

MUTAG is loaded from the grakel wheel with relsql.datasets.tu_format. Every weight of the template
(biases included) gets a random value that is copied into a PyG model GINConv(Linear, ReLU,
Linear) -> ReLU -> GINConv(...) -> global_mean_pool -> Linear; the aggregated inputs, node
embeddings after each layer, the pooled vectors, the logits and the gradients of a cross
entropy loss must agree within 1e-6.
"""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import relsql
from relsql.datasets.tu_format import load_tu, mutag_folder

ROOT = Path(__file__).resolve().parent.parent
TOL = 1e-6
HIDDEN = 16  # as written in relsql/sql_templates/gin.sql

WEIGHTS = {"gin1_w1": "conv1.nn.0.weight", "gin1_b1": "conv1.nn.0.bias",
           "gin1_w2": "conv1.nn.2.weight", "gin1_b2": "conv1.nn.2.bias",
           "gin2_w1": "conv2.nn.0.weight", "gin2_b1": "conv2.nn.0.bias",
           "gin2_w2": "conv2.nn.2.weight", "gin2_b2": "conv2.nn.2.bias",
           "gin_out_w": "lin.weight", "gin_out_b": "lin.bias"}


def pyg():
    """torch_geometric.nn, imported when a test runs: under --fast both tests here are deselected and
    collecting the file imported PyG (~2 CPU-s in each worker); without PyG the tests skip, as before."""
    return pytest.importorskip("torch_geometric.nn")


class PygGIN(nn.Module):
    def __init__(self, d_in: int):
        super().__init__()

        def mlp(a: int) -> nn.Module:
            return nn.Sequential(nn.Linear(a, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN))

        self.conv1, self.conv2 = pyg().GINConv(mlp(d_in)), pyg().GINConv(mlp(HIDDEN))  # eps = 0, not trained
        self.lin = nn.Linear(HIDDEN, 2)

    def forward(self, x, edge_index, batch):
        h1 = torch.relu(self.conv1(x, edge_index))
        h2 = self.conv2(h1, edge_index)
        pool = pyg().global_mean_pool(h2, batch)
        # GINConv's aggregate (1 + eps) x_i + sum_j x_j, recomputed for the intermediate relations
        agg1 = x.index_add(0, edge_index[1], x[edge_index[0]])
        agg2 = h1.index_add(0, edge_index[1], h1[edge_index[0]])
        return {"gin1_agg": agg1, "gin1": h1, "gin2_agg": agg2, "gin2": h2, "gin_pool": pool, "gin_out": self.lin(pool)}


@pytest.fixture(scope="module")
def mutag():
    db = relsql.connect()
    load_tu(db, mutag_folder(), "MUTAG")
    con = db.con
    x = torch.tensor([r[0] for r in con.execute("SELECT x FROM node ORDER BY node_id").fetchall()], dtype=torch.float64)
    edges = con.execute("SELECT src, dst FROM edge").fetchnumpy()
    edge_index = torch.as_tensor(np.stack([edges["src"], edges["dst"]]) - 1)
    batch = torch.as_tensor(con.execute("SELECT graph_id FROM node ORDER BY node_id").fetchnumpy()["graph_id"] - 1)
    y = torch.tensor([int(r[0] == 1) for r in con.execute("SELECT label FROM graph ORDER BY graph_id").fetchall()])
    yield db, x, edge_index, batch, y
    con.close()


@pytest.mark.oracle
def test_gin_template_matches_pyg_ginconv(mutag):
    db, x, edge_index, batch, y = mutag
    net = relsql.compile(relsql.Template.from_file(relsql.sql_templates.path("gin")), db, dtype=torch.float64, seed=0)
    pyg = PygGIN(x.shape[1]).double()
    ours, theirs = net.named_weights(), dict(pyg.named_parameters())
    assert set(ours) == set(WEIGHTS) and set(theirs) == set(WEIGHTS.values())
    generator = torch.Generator().manual_seed(1234)
    with torch.no_grad():
        for name, target in WEIGHTS.items():
            assert ours[name].shape == theirs[target].shape, name
            ours[name].copy_(torch.randn(ours[name].shape, dtype=torch.float64, generator=generator) * 0.5)
            theirs[target].copy_(ours[name])

    outputs, expected = net(), pyg(x, edge_index, batch)
    for relation, value in expected.items():
        keys = net.values(relation, outputs).drop("value")
        rows = value.shape[0]
        assert keys[keys.columns[0]].to_list() == list(range(1, rows + 1)), relation  # row i = id i + 1
        assert outputs[relation].shape == value.shape, relation
        deviation = (outputs[relation] - value).abs().max().item()
        assert deviation < TOL, f"{relation} deviates by {deviation:.3e}"
    # not vacuous: ReLU both active and inactive, logits not constant
    assert (outputs["gin1"] == 0).any() and (outputs["gin1"] > 0).any()
    assert outputs["gin_out"].std().item() > 1e-3

    F.cross_entropy(outputs["gin_out"], y).backward()
    F.cross_entropy(expected["gin_out"], y).backward()
    for name, target in WEIGHTS.items():
        a, b = ours[name].grad, theirs[target].grad
        assert a is not None and b is not None and b.abs().max().item() > 0, name
        deviation = (a - b).abs().max().item()
        assert deviation < TOL, f"gradient of {name} deviates by {deviation:.3e}"


@pytest.mark.slow
def test_bench_quick_writes_csv(tmp_path):
    pyg()
    from bench.gnn import COLUMNS

    done = subprocess.run([sys.executable, "-m", "bench.gnn", "--quick", "--models", "gcn", "--out", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "set_num_threads(2)" in done.stdout and "idle machine" in done.stdout
    with open(tmp_path / "gnn.csv", newline="") as f:
        reader = csv.DictReader(f)
        assert reader.fieldnames == COLUMNS
        rows = list(reader)
    assert [(r["model"], r["dataset"]) for r in rows] == [("gcn", "mutag")]
    for r in rows:
        assert int(r["nodes"]) == 3371 and int(r["edges"]) == 7442
        for key in ("relsql_fwd_ms", "pyg_fwd_ms", "relsql_step_ms", "pyg_step_ms", "fwd_ratio", "step_ratio"):
            assert float(r[key]) > 0, key
        for key in ("relsql_mb", "pyg_mb"):
            assert float(r[key]) >= 0, key  # measured, not nan
        assert float(r["max_rel_diff"]) < 1e-4
    assert (tmp_path / "gnn.png").stat().st_size > 0
