"""relsql/sql_templates/gcn.sql and relsql/sql_templates/sage.sql against torch_geometric (float64, shared weights).

MUTAG is loaded from the grakel wheel into a DuckDB file with relsql.datasets.tu_format; PyG reads
the same raw files with its own TUDataset parser, so both the loader and the templates are
checked against an independent implementation. All weights (biases included) are set to
random values in relsql and copied into the PyG model; node embeddings after each layer, the
pooled graph vectors, the graph logits and the gradients of a cross-entropy loss must agree
within 1e-6. A small handmade TU dataset adds the cases MUTAG lacks (a self loop, a repeated
edge, a node without in-edges, an isolated node, label gaps).
"""

from __future__ import annotations

import shutil
import time

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import relsql
from bench.hetero import block_diagonal, diagonal_blocks
from relsql.datasets.tu_format import load_tu, mutag_folder

torch_geometric = pytest.importorskip("torch_geometric")
from torch_geometric.data import Batch, Data  # noqa: E402
from torch_geometric.datasets import TUDataset  # noqa: E402
from torch_geometric.nn import GATConv, GCNConv, RGATConv, RGCNConv, SAGEConv, global_mean_pool  # noqa: E402

pytestmark = pytest.mark.oracle  # PyTorch Geometric as the reference

SQL = relsql.sql_templates.FOLDER
TOL = 1e-6
HIDDEN = 16

# RECIPES.md, "MUTAG in TU format, offline"
MUTAG_GRAPHS, MUTAG_NODES, MUTAG_EDGES, MUTAG_NODE_LABELS, MUTAG_CLASSES = 188, 3371, 7442, 7, [63, 125]


# --------------------------------------------------------------------------- PyG models


class PygGCN(nn.Module):
    def __init__(self, d_in: int, relations: int):
        super().__init__()
        self.conv1 = GCNConv(d_in, HIDDEN)
        self.conv2 = GCNConv(HIDDEN, HIDDEN)
        self.lin = nn.Linear(HIDDEN, 2)

    def forward(self, x, edge_index, batch, edge_type):
        h1 = torch.relu(self.conv1(x, edge_index))
        h2 = self.conv2(h1, edge_index)
        pool = global_mean_pool(h2, batch)
        return {"layer1": h1, "layer2": h2, "pool": pool, "out": self.lin(pool)}


class PygSAGE(nn.Module):
    def __init__(self, d_in: int, relations: int):
        super().__init__()
        self.conv1 = SAGEConv(d_in, HIDDEN)
        self.conv2 = SAGEConv(HIDDEN, HIDDEN)
        self.lin = nn.Linear(HIDDEN, 2)

    def forward(self, x, edge_index, batch, edge_type):
        h1 = torch.relu(self.conv1(x, edge_index))
        h2 = self.conv2(h1, edge_index)
        pool = global_mean_pool(h2, batch)
        return {"layer1": h1, "layer2": h2, "pool": pool, "out": self.lin(pool)}


class PygGAT(nn.Module):
    def __init__(self, d_in: int, relations: int):
        super().__init__()
        self.conv1 = GATConv(d_in, 8, heads=4, add_self_loops=False)  # 4 heads of 8, concatenated
        self.conv2 = GATConv(32, HIDDEN, heads=1, add_self_loops=False)
        self.lin = nn.Linear(HIDDEN, 2)

    def forward(self, x, edge_index, batch, edge_type):
        h1 = torch.relu(self.conv1(x, edge_index))
        h2 = self.conv2(h1, edge_index)
        pool = global_mean_pool(h2, batch)
        return {"layer1": h1, "layer2": h2, "pool": pool, "out": self.lin(pool)}


class PygRGCN(nn.Module):
    def __init__(self, d_in: int, relations: int):
        super().__init__()
        self.conv1 = RGCNConv(d_in, HIDDEN, relations)  # aggr='mean', root weight, bias
        self.conv2 = RGCNConv(HIDDEN, HIDDEN, relations)
        self.lin = nn.Linear(HIDDEN, 2)

    def forward(self, x, edge_index, batch, edge_type):
        h1 = torch.relu(self.conv1(x, edge_index, edge_type))
        h2 = self.conv2(h1, edge_index, edge_type)
        pool = global_mean_pool(h2, batch)
        return {"layer1": h1, "layer2": h2, "pool": pool, "out": self.lin(pool)}


class PygRGAT(nn.Module):
    def __init__(self, d_in: int, relations: int):
        super().__init__()
        self.conv1 = RGATConv(d_in, HIDDEN, relations)  # one head, additive, across relations, bias
        self.conv2 = RGATConv(HIDDEN, HIDDEN, relations)
        self.lin = nn.Linear(HIDDEN, 2)

    def forward(self, x, edge_index, batch, edge_type):
        h1 = torch.relu(self.conv1(x, edge_index, edge_type))
        h2 = self.conv2(h1, edge_index, edge_type)
        pool = global_mean_pool(h2, batch)
        return {"layer1": h1, "layer2": h2, "pool": pool, "out": self.lin(pool)}


# template file, PyG model, {relsql relation: PyG output}, {relsql weight: PyG parameter}
MODELS = {
    "gcn": ("gcn.sql", PygGCN,
            {"gcn1": "layer1", "gcn2": "layer2", "gcn_pool": "pool", "gcn_out": "out"},
            {"gcn1_w": "conv1.lin.weight", "gcn1_b": "conv1.bias", "gcn2_w": "conv2.lin.weight",
             "gcn2_b": "conv2.bias", "gcn_out_w": "lin.weight", "gcn_out_b": "lin.bias"}),
    "sage": ("sage.sql", PygSAGE,
             {"sage1": "layer1", "sage2": "layer2", "sage_pool": "pool", "sage_out": "out"},
             {"sage1_wl": "conv1.lin_l.weight", "sage1_bl": "conv1.lin_l.bias", "sage1_wr": "conv1.lin_r.weight",
              "sage2_wl": "conv2.lin_l.weight", "sage2_bl": "conv2.lin_l.bias", "sage2_wr": "conv2.lin_r.weight",
              "sage_out_w": "lin.weight", "sage_out_b": "lin.bias"}),
    "gat": ("gat.sql", PygGAT,
            {"gat1": "layer1", "gat2": "layer2", "gat_pool": "pool", "gat_out": "out"},
            {"gat1_w": "conv1.lin.weight", "gat1_att_src": "conv1.att_src", "gat1_att_dst": "conv1.att_dst",
             "gat1_b": "conv1.bias", "gat2_w": "conv2.lin.weight", "gat2_att_src": "conv2.att_src",
             "gat2_att_dst": "conv2.att_dst", "gat2_b": "conv2.bias", "gat_out_w": "lin.weight", "gat_out_b": "lin.bias"}),
    "rgcn": ("rgcn.sql", PygRGCN,
             {"rgcn1": "layer1", "rgcn2": "layer2", "rgcn_pool": "pool", "rgcn_out": "out"},
             {"rgcn1_w": "conv1.weight", "rgcn1_root": "conv1.root", "rgcn1_b": "conv1.bias", "rgcn2_w": "conv2.weight",
              "rgcn2_root": "conv2.root", "rgcn2_b": "conv2.bias", "rgcn_out_w": "lin.weight", "rgcn_out_b": "lin.bias"}),
    "rgat": ("rgat.sql", PygRGAT,
             {"rgat1": "layer1", "rgat2": "layer2", "rgat_pool": "pool", "rgat_out": "out"},
             {"rgat1_w": "conv1.weight", "rgat1_q": "conv1.q", "rgat1_k": "conv1.k", "rgat1_b": "conv1.bias",
              "rgat2_w": "conv2.weight", "rgat2_q": "conv2.q", "rgat2_k": "conv2.k", "rgat2_b": "conv2.bias",
              "rgat_out_w": "lin.weight", "rgat_out_b": "lin.bias"}),
}
# PyG's (in, out) matrices of RGCNConv and RGATConv, relsql's (out, in): transposed
TRANSPOSED = {"rgcn1_root", "rgcn2_root", "rgat1_q", "rgat1_k", "rgat2_q", "rgat2_k"}
# typed linears: relsql's matrix per dictionary code, PyG's (in, out) per edge type (the label)
TYPED = {"rgcn1_w", "rgcn2_w", "rgat1_w", "rgat2_w"}
# RGATConv's parameters of its `mod` variants, unused with the default mod=None (checked: no gradient)
UNUSED = {f"conv{i}.{name}" for i in (1, 2) for name in ("w", "l1", "b1", "l2", "b2")}
# template weights holding PyG's per-head attention vectors as block-diagonal matrices: the
# template's linears are the general case, so only their diagonal blocks have a PyG counterpart
BLOCK_DIAGONAL = {"gat1_att_src", "gat1_att_dst", "gat2_att_src", "gat2_att_dst"}


def as_pyg(name: str, ours: torch.Tensor, net) -> torch.Tensor:
    """A relsql weight (or gradient) in the PyG parameter's layout."""
    if name in TRANSPOSED:
        return ours.t()
    if name in TYPED:  # row code -> the type value it encodes
        dictionary = net.grounding.dictionaries[name]
        values = torch.tensor(dictionary.column("value").to_pylist())
        codes = torch.tensor(dictionary.column("code").to_pylist())
        out = ours.new_zeros((int(values.max()) + 1, ours.shape[2], ours.shape[1]))
        out[values] = ours[codes].transpose(1, 2)
        return out
    return ours


def compare_with_pyg(db: relsql.Database, model: str, x, edge_index, batch, y, num_graphs: int,
                     edge_type: torch.Tensor) -> dict[str, float]:
    """Compile the template, share random weights with the PyG model, return max deviations."""
    sql_file, pyg_class, relations, weights = MODELS[model]
    timings = {}
    start = time.perf_counter()
    template = relsql.Template.from_sql((SQL / sql_file).read_text())
    net = relsql.compile(template, db, dtype=torch.float64, seed=0)
    timings["compile_s"] = time.perf_counter() - start

    pyg = pyg_class(x.shape[1], int(edge_type.max()) + 1).double()
    relsql_weights = net.weights_by_name()  # typed linears whole: as_pyg lays them out per edge type
    pyg_params = dict(pyg.named_parameters())
    assert set(relsql_weights) == set(weights), f"template weights {sorted(relsql_weights)}"
    unused = set(pyg_params) - set(weights.values())
    assert set(weights.values()) <= set(pyg_params) and unused <= UNUSED, f"PyG parameters {sorted(pyg_params)}"
    generator = torch.Generator().manual_seed(1234)
    with torch.no_grad():
        for name, target in weights.items():
            ours, theirs = relsql_weights[name], pyg_params[target]
            if name in BLOCK_DIAGONAL:
                theirs.copy_(torch.randn(theirs.shape, dtype=torch.float64, generator=generator) * 0.5)
                assert tuple(ours.shape) == tuple(block_diagonal(theirs).shape), (name, ours.shape, theirs.shape)
                ours.copy_(block_diagonal(theirs))
                continue
            ours.copy_(torch.randn(ours.shape, dtype=torch.float64, generator=generator) * 0.5)  # biases too
            assert tuple(as_pyg(name, ours, net).shape) == tuple(theirs.shape), (name, ours.shape, theirs.shape)
            theirs.copy_(as_pyg(name, ours, net))

    num_nodes = x.shape[0]
    outputs = net()
    expected = pyg(x, edge_index, batch, edge_type)

    deviations: dict[str, float] = {}
    for relation, key in relations.items():
        keys = net.values(relation, outputs).drop("value")
        id_column = keys.columns[0]
        rows = num_graphs if id_column == "graph_id" else num_nodes
        # row i of a relsql relation must be node / graph i + 1 (PyG's order is the files' order)
        assert keys[id_column].to_list() == list(range(1, rows + 1)), relation
        assert outputs[relation].shape == expected[key].shape, (relation, outputs[relation].shape, expected[key].shape)
        deviations[relation] = (outputs[relation] - expected[key]).abs().max().item()

    # the comparison must not be vacuous: ReLU both active and inactive, embeddings not constant
    layer1 = outputs[next(iter(relations))]
    assert (layer1 == 0).any() and (layer1 > 0).any()
    assert outputs[list(relations)[-1]].std().item() > 1e-3

    loss = F.cross_entropy(outputs[list(relations)[-1]], y)
    loss.backward()
    F.cross_entropy(expected["out"], y).backward()
    deviations["loss"] = abs(loss.item() - F.cross_entropy(expected["out"], y).item())
    assert all(pyg_params[name].grad is None for name in unused), "a PyG parameter left out of the comparison is used"
    for name, target in weights.items():
        ours, theirs = relsql_weights[name].grad, pyg_params[target].grad
        assert ours is not None and theirs is not None, name
        if name in BLOCK_DIAGONAL:
            ours = diagonal_blocks(ours, theirs.shape[1])
        ours = as_pyg(name, ours, net)
        assert theirs.abs().max().item() > 0, f"PyG gradient of {target} is zero; the check would be vacuous"
        deviations[f"grad {name}"] = (ours - theirs).abs().max().item()
    timings["relsql_fwd+bwd_s"] = _median_time(lambda: F.cross_entropy(net()[list(relations)[-1]], y).backward())
    timings["pyg_fwd+bwd_s"] = _median_time(lambda: F.cross_entropy(pyg(x, edge_index, batch, edge_type)["out"], y).backward())
    print(f"\n{model}: max |relsql - PyG| per output / gradient:")
    for what, value in deviations.items():
        print(f"  {what:16s} {value:.3e}")
    print("  timings: " + ", ".join(f"{k}={v * 1000:.1f} ms" for k, v in timings.items()))
    return deviations


def _median_time(step, repeats: int = 7) -> float:
    """Median wall time of `step` after one warm-up call (gradients accumulate; not compared again)."""
    step()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


# --------------------------------------------------------------------------- MUTAG


@pytest.fixture(scope="module")
def mutag_db(tmp_path_factory):
    path = tmp_path_factory.mktemp("mutag") / "mutag.duckdb"
    db = relsql.connect(path)
    start = time.perf_counter()
    counts = load_tu(db, mutag_folder(), "MUTAG")
    print(f"\nload_tu MUTAG into {path.name}: {counts} in {(time.perf_counter() - start) * 1000:.1f} ms")
    yield db, counts
    db.con.close()


@pytest.fixture(scope="module")
def mutag_pyg(tmp_path_factory):
    """PyG's own parse of the same raw files, all graphs in one batch (global node ids)."""
    root = tmp_path_factory.mktemp("pyg")
    raw = root / "MUTAG" / "raw"
    raw.mkdir(parents=True)
    for file in mutag_folder().glob("MUTAG_*.txt"):
        shutil.copy(file, raw / file.name)
    dataset = TUDataset(str(root), "MUTAG")
    batch = Batch.from_data_list(list(dataset))
    return batch


def _raw_lines(name: str) -> list[str]:
    return [line for line in (mutag_folder() / f"MUTAG_{name}.txt").read_text().splitlines() if line.strip()]


def test_mutag_tables_match_raw_files_and_recipes(mutag_db):
    db, counts = mutag_db
    # independent of the loader: count straight from the files
    edges = [tuple(int(v) for v in line.split(",")) for line in _raw_lines("A")]
    node_labels = [int(v) for v in _raw_lines("node_labels")]
    indicator = [int(v) for v in _raw_lines("graph_indicator")]
    graph_labels = [int(v) for v in _raw_lines("graph_labels")]
    raw = {"graphs": len(set(indicator)), "nodes": len(node_labels), "edges": len(edges),
           "node_labels": len(set(node_labels)),
           "classes": sorted(graph_labels.count(v) for v in set(graph_labels))}
    print(f"\nraw MUTAG files: {raw}")
    assert raw == {"graphs": MUTAG_GRAPHS, "nodes": MUTAG_NODES, "edges": MUTAG_EDGES,
                   "node_labels": MUTAG_NODE_LABELS, "classes": MUTAG_CLASSES}
    assert len(graph_labels) == MUTAG_GRAPHS and len(indicator) == MUTAG_NODES

    con = db.con
    assert counts == {"graph": MUTAG_GRAPHS, "node": MUTAG_NODES, "edge": MUTAG_EDGES}
    assert con.execute("SELECT count(*) FROM graph").fetchone()[0] == MUTAG_GRAPHS
    assert con.execute("SELECT count(*) FROM node").fetchone()[0] == MUTAG_NODES
    assert con.execute("SELECT count(*) FROM edge").fetchone()[0] == MUTAG_EDGES
    assert con.execute("SELECT count(DISTINCT label) FROM node").fetchone()[0] == MUTAG_NODE_LABELS
    assert con.execute("SELECT count(DISTINCT graph_id) FROM node").fetchone()[0] == MUTAG_GRAPHS
    assert [r[0] for r in con.execute("SELECT count(*) FROM graph GROUP BY label ORDER BY 1").fetchall()] == MUTAG_CLASSES
    # contents, not just sizes
    assert con.execute("SELECT src, dst FROM edge ORDER BY rowid").fetchall() == edges
    assert [r[0] for r in con.execute("SELECT label FROM node ORDER BY node_id").fetchall()] == node_labels
    assert [r[0] for r in con.execute("SELECT graph_id FROM node ORDER BY node_id").fetchall()] == indicator
    assert [r[0] for r in con.execute("SELECT label FROM graph ORDER BY graph_id").fetchall()] == graph_labels
    lowest = min(node_labels)
    for node_id, label, x in con.execute("SELECT node_id, label, x FROM node ORDER BY node_id").fetchall():
        assert len(x) == MUTAG_NODE_LABELS and x[label - lowest] == 1.0 and sum(x) == 1.0, node_id
    types = dict(con.execute("SELECT column_name, data_type FROM information_schema.columns "
                             "WHERE table_name = 'node'").fetchall())
    assert types == {"node_id": "BIGINT", "graph_id": "BIGINT", "label": "BIGINT", "x": "DOUBLE[]"}
    assert con.execute("SELECT count(*) FROM duckdb_constraints() WHERE constraint_type = 'PRIMARY KEY'").fetchone()[0] == 2


def test_load_tu_refuses_to_overwrite(mutag_db):
    db, _ = mutag_db
    with pytest.raises(relsql.SourceError, match="already exist"):
        load_tu(db.con, mutag_folder(), "MUTAG")
    assert db.con.execute("SELECT count(*) FROM edge").fetchone()[0] == MUTAG_EDGES


def test_pyg_parse_agrees_with_tables(mutag_db, mutag_pyg):
    db, _ = mutag_db
    batch = mutag_pyg
    assert batch.num_graphs == MUTAG_GRAPHS and batch.num_nodes == MUTAG_NODES
    assert batch.edge_index.shape[1] == MUTAG_EDGES
    x = db.con.execute("SELECT x FROM node ORDER BY node_id").fetchall()
    assert torch.equal(torch.tensor([r[0] for r in x], dtype=torch.float64), batch.x.double())
    ours = {(s - 1, d - 1) for s, d in db.con.execute("SELECT src, dst FROM edge").fetchall()}
    assert ours == set(map(tuple, batch.edge_index.t().tolist()))


@pytest.mark.parametrize("model", sorted(MODELS))
def test_mutag_matches_pyg(model, mutag_db, mutag_pyg):
    db, _ = mutag_db
    batch = mutag_pyg
    labels = db.con.execute("SELECT label FROM graph ORDER BY graph_id").fetchall()
    y = torch.tensor([int(r[0] == 1) for r in labels])
    assert torch.equal(y, batch.y)  # PyG maps labels -1/1 to classes 0/1
    edge_type = batch.edge_attr.argmax(1)  # PyG one-hot encodes the edge labels (0..3), edges in its own order
    labels = {(s, d): t for s, d, t in db.con.execute("SELECT src, dst, label FROM edge").fetchall()}
    assert len(labels) == batch.edge_index.shape[1] and {  # MUTAG has no repeated edges
        (s + 1, d + 1): t for (s, d), t in zip(batch.edge_index.t().tolist(), edge_type.tolist())} == labels
    deviations = compare_with_pyg(db, model, batch.x.double(), batch.edge_index, batch.batch, y, batch.num_graphs, edge_type)
    worst = max(deviations, key=deviations.get)
    assert deviations[worst] < TOL, f"{model}: {worst} deviates by {deviations[worst]:.3e}"


# --------------------------------------------------------------------------- corner cases

TINY = {
    # graph 1: nodes 1-4; 1<->2 with 1->2 twice, 2->3, a self loop on 3, node 4 isolated
    # graph 2: nodes 5-7; 5->6, 6->7 only (5 has no in-edges), 7->5
    "A": ["1, 2", "2, 1", "1, 2", "2, 3", "3, 3", "5, 6", "6, 7", "7, 5"],
    "graph_indicator": ["1", "1", "1", "1", "2", "2", "2"],
    "graph_labels": ["1", "-1"],
    "node_labels": ["2", "5", "2", "4", "3", "5", "2"],  # labels 2..5, width 4
    "edge_labels": ["0", "0", "1", "0", "2", "0", "1", "0"],
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny_tu")
    for kind, lines in TINY.items():
        (folder / f"TINY_{kind}.txt").write_text("\n".join(lines) + "\n")
    db = relsql.connect(folder / "tiny.duckdb")
    load_tu(db, folder, "TINY")
    yield db
    db.con.close()


def test_tiny_tables(tiny):
    con = tiny.con
    assert con.execute("SELECT src, dst, label FROM edge ORDER BY rowid").fetchall() == [
        (1, 2, 0), (2, 1, 0), (1, 2, 1), (2, 3, 0), (3, 3, 2), (5, 6, 0), (6, 7, 1), (7, 5, 0)]
    assert con.execute("SELECT x FROM node WHERE node_id = 2").fetchone()[0] == [0.0, 0.0, 0.0, 1.0]
    assert con.execute("SELECT x FROM node WHERE node_id = 4").fetchone()[0] == [0.0, 0.0, 1.0, 0.0]


@pytest.mark.parametrize("model", sorted(MODELS))
def test_tiny_corner_cases_match_pyg(model, tiny):
    labels = torch.tensor([int(v) for v in TINY["node_labels"]])
    x = F.one_hot(labels - labels.min()).double()
    edge_index = torch.tensor([[int(v) - 1 for v in line.split(",")] for line in TINY["A"]]).t().contiguous()
    batch = torch.tensor([int(v) - 1 for v in TINY["graph_indicator"]])
    y = torch.tensor([1, 0])
    data = Data(x=x, edge_index=edge_index)
    assert data.has_self_loops() and data.has_isolated_nodes()
    edge_type = torch.tensor([int(v) for v in TINY["edge_labels"]])
    deviations = compare_with_pyg(tiny, model, x, edge_index, batch, y, 2, edge_type)
    worst = max(deviations, key=deviations.get)
    assert deviations[worst] < TOL, f"{model}: {worst} deviates by {deviations[worst]:.3e}"
