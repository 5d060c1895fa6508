"""relsql vs PyTorch Geometric on heterogeneous graphs: RGCN (vs RGCNConv and FastRGCNConv), GAT,
RGAT (vs RGATConv) and HGT (vs HGTConv).

    python -m bench.hetero [--quick] [--out out/bench] [--hidden 64] [--layers 1 2]
                           [--models rgcn,gat,rgat,hgt] [--datasets aifb,mutag_rdf,bgs,am] [--heads 1]
                           [--am-scale 0.125] [--budget 60] [--threads 2] [--no-memory]

Graphs: seeded synthetic graphs with the sizes of the RGCN paper's entity-classification
datasets (Schlichtkrull et al. 2018, Table 4 of Pigeon): AIFB (8,285 nodes, 29,043 edges, 45
relation types), MUTAG-RDF (23,644 nodes, 74,227 edges, 23 types), BGS (333,845 nodes,
916,199 edges, 103 types) and AM (1,666,764 nodes, 5,988,321 edges, 133 types), AM SCALED DOWN
by --am-scale (default 1/8: 208,346 nodes, 748,540 edges, still 133 types): PyG's RGCNConv
(without pyg-lib, as here) multiplies every node's aggregate by every relation's matrix, so a
full-size AM step would take minutes per repetition on 2 cores and the whole run would not fit
the ~20 minute budget of a 2-core, 24 GiB machine. Edges are uniformly random (src, dst) pairs
(self loops and repeated pairs possible, as in RDF graphs); their types follow a power law,
P(type t) ~ 1 / (t + 1)^1.5 (a few frequent types, many rare ones), every type used at least
once. Node features are N(0, 1) of width --hidden. The tables are DuckDB tables
node(node_id BIGINT PRIMARY KEY, x FLOAT[], type BIGINT) and edge(src BIGINT, dst BIGINT, type BIGINT),
node ids 0..N-1 (PyG's indices).

Models, width --hidden (64) everywhere, 1 or 2 layers (--layers), ReLU between layers:
  rgcn  relsql: h_i' = W_root h_i + b + sum_r 1/|N_r(i)| sum_{j -r-> i} W_r h_j, a typed linear
        per edge type with 1/|N_r(i)| counted in SQL (as relsql/sql_templates/rgcn.sql); PyG: RGCNConv (aggr
        'mean', root weight, bias) and FastRGCNConv (the same function; it gathers one matrix
        per edge, E x 64 x 64 floats, so it runs only where that tensor stays under
        --fast-limit-gb: AIFB and MUTAG-RDF; elsewhere its row says skipped).
  gat   relsql: the layered GAT of relsql/sql_templates/gat.sql (W h once per node, attention(leaky_relu(src +
        dst, 0.2), W h) per destination, bias), --heads heads of width hidden/heads
        concatenated; PyG: GATConv(hidden, hidden / heads, heads, add_self_loops=False).
  rgat  relsql: relsql/sql_templates/rgat.sql's layer (W_r h per edge, attention(leaky_relu(q . W_r h_dst + k . W_r
        h_src, 0.2), W_r h_src) per destination, bias); PyG: RGATConv with its defaults (one head,
        additive self-attention across relations). RGATConv gathers one matrix per edge, as
        FastRGCNConv: it runs only under --fast-limit-gb (AIFB, MUTAG-RDF).
  hgt   relsql: relsql/sql_templates/hgt.sql's layer, 2 heads (typed linears per node type for K, Q, V and A, per
        relation for W_att and W_msg, embeddings of the type for biases, p_r and skip); PyG:
        HGTConv(hidden, hidden, metadata, heads=2) on dicts per node and edge type. HGT needs
        node types: node n has type n % 3, and relation r links type r % 3 to type (r // 3) % 3
        (so PyG's edge types are the dataset's R relations): each edge's ends are moved to the
        nearest node of those types (table typed_edge; the other models read edge). A node
        without in-edges gets PyG's zero aggregate. HGTConv transforms keys and values per
        (relation, source node), R x N/3 rows: it runs only where one such tensor stays under
        --fast-limit-gb (AIFB, MUTAG-RDF).
The edge types are ignored by GAT (it is the homogeneous baseline on the same graph). Where the
PyG baseline is skipped (RGAT, HGT on BGS and AM) relsql is timed alone, its output unchecked
(the same template is checked on the small graphs).

Before timing, relsql's weights (biases set to random values) are copied into the PyG modules,
and every layer's node embeddings and every weight's gradient of the loss must agree in float32
to a relative 1e-4 (|relsql - PyG| / max(1, max |PyG|), gradients relative to max |PyG's|);
otherwise the script stops. On the big graphs (>= 500,000 edges: BGS, AM) only the layers'
outputs are compared (a PyG RGCNConv step there takes about a minute; the gradients are the same
code on the small graphs). Timed in one process, alternately (as bench/gnn.py): forward under
torch.no_grad and a training step (zero grads, forward, cross entropy of the last layer's node
embeddings, read as `hidden` logits, against fixed random labels of every node, backward; no
optimizer update). After one calibrating call of each, 2 warm-up repetitions (none where 5
repetitions would not fit --budget) and up to 7 timed ones, as many as fit --budget seconds (at
least one); medians are reported, a sample looping a task for ~50 ms. Where one repetition
alone exceeds the budget (RGCNConv on BGS and AM) the calibrating calls, made after the check
has run every model once, are the one sample (`reps` says how many). RGCNConv's training step
keeps layers x types x nodes x hidden floats for its backward (16.4 GiB for 2 layers on BGS);
where that exceeds 80% of the available memory the step is not run and its row says so (the
forward still is). relsql's grounding + compile time is reported separately (ground_s), not in
the timings.

Peak memory: each framework's training step runs again in a fresh subprocess, as in
bench/gnn.py (glibc told to hand freed memory back, peak-RSS mark reset after a warm-up step;
no warm-up on the big graphs, whose first step is measured): the extra peak RSS of one step, MB.

Timings are only meaningful on an otherwise idle machine (torch.set_num_threads(2) here, as
bench/gnn.py; --threads changes it). With other processes on the 2 cores, torch's OpenMP
threads wait on each other and single calls become up to 10x slower, erratically.
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import os
import re
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch
import torch.nn.functional as F
from torch import nn

from bench import plot_ratios, write_csv
from bench.gnn import _fmt, _status_mb, git_commit

ROOT = Path(__file__).resolve().parent.parent
THREADS = 2
TARGET = 0.5
TOLERANCE = 1e-4  # float32, relative to max(1, max |PyG|)
SAMPLE_S = 0.05
TYPE_EXPONENT = 1.5  # P(type t) ~ 1 / (t + 1)^TYPE_EXPONENT
AM_SCALE = 0.125
BIG = 500_000  # edges: gradients not compared (the small graphs compare them), no warm-up step in the memory probe

# name: (nodes, edges, relation types); the RGCN paper's entity datasets (Pigeon, Table 4)
DATASETS = {
    "aifb": (8_285, 29_043, 45),
    "mutag_rdf": (23_644, 74_227, 23),
    "bgs": (333_845, 916_199, 103),
    "am": (1_666_764, 5_988_321, 133),
    "tiny": (300, 1_500, 7),  # a smoke test's graph
}
FULL = ["aifb", "mutag_rdf", "bgs", "am"]

# what each relsql model is compared with
BASELINES = {"rgcn": ["RGCNConv", "FastRGCNConv"], "gat": ["GATConv"], "rgat": ["RGATConv"], "hgt": ["HGTConv"]}
FRAMEWORK = {"RGCNConv": "pyg", "FastRGCNConv": "pyg_fast", "GATConv": "pyg", "RGATConv": "pyg", "HGTConv": "pyg"}
NODE_TYPES = 3  # HGT: node n has type n % 3; relation r links type r % 3 to type (r // 3) % 3
HGT_HEADS = 2  # as relsql/sql_templates/hgt.sql
# RGATConv's parameters of its `mod` variants: unused with the default mod=None
RGAT_UNUSED = ("w", "l1", "b1", "l2", "b2")
# each layer's relsql weights, {model}{layer}_{suffix}
WEIGHTS = {"rgcn": ("w", "root", "b"), "gat": ("w", "att_src", "att_dst", "b"), "rgat": ("w", "q", "k", "b"),
           "hgt": ("k", "q", "v", "kb", "qb", "vb", "a", "ab", "skip", "att", "msg", "p")}

COLUMNS = ["model", "baseline", "dataset", "layers", "nodes", "edges", "types", "hidden", "heads", "ground_s",
           "relsql_fwd_ms", "pyg_fwd_ms", "fwd_ratio", "relsql_step_ms", "pyg_step_ms", "step_ratio",
           "relsql_mb", "pyg_mb", "max_rel_diff", "max_rel_grad_diff", "ops", "reps", "note"]


# --------------------------------------------------------------------------- data


@dataclass
class Graph:
    name: str
    x: np.ndarray  # (N, F) float32
    src: np.ndarray  # (E,) int64, 0-based
    dst: np.ndarray
    type: np.ndarray  # (E,) int64 in 0..R-1, every value used
    types: int
    scale: float = 1.0

    @property
    def node_type(self) -> np.ndarray:
        return np.arange(self.nodes) % NODE_TYPES

    def typed_ends(self) -> tuple[np.ndarray, np.ndarray]:
        """HGT's edges: each end moved to the nearest node of its relation's node type (HGTConv's
        edge types are (source type, relation, destination type) triples; one triple per relation
        keeps the dataset's R edge types)."""
        def move(end: np.ndarray, wanted: np.ndarray) -> np.ndarray:
            moved = end - end % NODE_TYPES + wanted
            return np.where(moved >= self.nodes, moved - NODE_TYPES, moved)

        return move(self.src, self.type % NODE_TYPES), move(self.dst, self.type // NODE_TYPES % NODE_TYPES)

    @property
    def nodes(self) -> int:
        return int(self.x.shape[0])

    @property
    def edges(self) -> int:
        return int(self.src.shape[0])


def synthetic(name: str, features: int, am_scale: float = AM_SCALE, seed: int = 0) -> Graph:
    nodes, edges, types = DATASETS[name]
    scale = am_scale if name == "am" else 1.0
    nodes, edges = max(types, round(nodes * scale)), max(types, round(edges * scale))
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, types + 1) ** TYPE_EXPONENT
    kind = rng.choice(types, size=edges, p=p / p.sum())
    kind[:types] = np.arange(types)  # every type at least once
    kind = rng.permutation(kind)
    return Graph(name=name, x=rng.standard_normal((nodes, features), dtype=np.float32),
                 src=rng.integers(0, nodes, edges), dst=rng.integers(0, nodes, edges),
                 type=kind.astype(np.int64), types=types, scale=scale)


def load_graph(con, graph: Graph) -> None:
    n, width = graph.x.shape
    offsets = pa.array(np.arange(n + 1, dtype=np.int32) * width, type=pa.int32())
    x = pa.ListArray.from_arrays(offsets, pa.array(graph.x.reshape(-1), type=pa.float32()))
    src, dst = graph.typed_ends()
    tables = {
        "node": ("node_id BIGINT PRIMARY KEY, x FLOAT[], type BIGINT",
                 pa.table({"node_id": np.arange(n), "x": x, "type": graph.node_type})),
        "edge": ("src BIGINT, dst BIGINT, type BIGINT", pa.table({"src": graph.src, "dst": graph.dst, "type": graph.type})),
        "typed_edge": ("src BIGINT, dst BIGINT, type BIGINT", pa.table({"src": src, "dst": dst, "type": graph.type})),
    }
    for table, (schema, arrow) in tables.items():
        view = f"__bench_{table}"
        con.register(view, arrow)
        con.execute(f"CREATE TABLE {table} ({schema})")
        con.execute(f"INSERT INTO {table} SELECT * FROM {view}")
        con.unregister(view)


def database(graph: Graph):
    import relsql

    db = relsql.connect()
    load_graph(db.con, graph)
    return db


# --------------------------------------------------------------------------- templates


def template_text(model: str, layers: int, hidden: int, heads: int) -> str:
    """node_x, then `layers` layers named {model}1..{model}L; ReLU between, none after the last."""
    lines = ["CREATE TABLE node_x AS SELECT n.node_id, n.x AS h FROM node n;"]
    previous = "node_x"
    for layer in range(1, layers + 1):
        name = f"{model}{layer}"
        pre = name if layer == layers else f"{name}_pre"
        if model == "rgcn":
            lines += [
                f"CREATE TABLE {pre} AS\n"
                f"SELECT e.dst AS node_id, sum(linear(p.h, {hidden}, '{name}_w', e.type) * e.inverse_degree) AS h\n"
                f"FROM (SELECT src, dst, type, 1.0 / count(*) OVER (PARTITION BY dst, type) AS inverse_degree FROM edge) e\n"
                f"JOIN {previous} p ON p.node_id = e.src\nGROUP BY e.dst;",
                f"CREATE TABLE {pre} AS\n"
                f"SELECT p.node_id, linear(p.h, {hidden}, '{name}_root') + bias({hidden}, '{name}_b') AS h\n"
                f"FROM {previous} p;",
            ]
        elif model == "gat":
            lines += [
                f"CREATE TABLE {name}_wx AS SELECT p.node_id, linear(p.h, {hidden}, '{name}_w') AS h FROM {previous} p;",
                f"CREATE TABLE {name}_src AS SELECT w.node_id, linear(w.h, {heads}, '{name}_att_src') AS h FROM {name}_wx w;",
                f"CREATE TABLE {name}_dst AS SELECT w.node_id, linear(w.h, {heads}, '{name}_att_dst') AS h FROM {name}_wx w;",
                f"CREATE TABLE {pre} AS\n"
                f"SELECT e.dst AS node_id, attention(leaky_relu(s.h + d.h, 0.2), w.h) AS h\n"
                f"FROM edge e\nJOIN {name}_src s ON s.node_id = e.src\nJOIN {name}_dst d ON d.node_id = e.dst\n"
                f"JOIN {name}_wx w ON w.node_id = e.src\nGROUP BY e.dst;",
                f"CREATE TABLE {pre} AS SELECT n.node_id, bias({hidden}, '{name}_b') AS h FROM node n;",
            ]
        elif model == "rgat":  # relsql/sql_templates/rgat.sql's layer: W_r h computed once per edge (common subexpressions)
            w = f"linear({{}}.h, {hidden}, '{name}_w', e.type)"
            lines += [
                f"CREATE TABLE {pre} AS\n"
                f"SELECT e.dst AS node_id,\n"
                f"       attention(leaky_relu(linear({w.format('d')}, 1, '{name}_q') "
                f"+ linear({w.format('s')}, 1, '{name}_k'), 0.2),\n"
                f"                 {w.format('s')}) AS h\n"
                f"FROM edge e\nJOIN {previous} s ON s.node_id = e.src\nJOIN {previous} d ON d.node_id = e.dst\nGROUP BY e.dst;",
                f"CREATE TABLE {pre} AS SELECT n.node_id, bias({hidden}, '{name}_b') AS h FROM node n;",
            ]
        elif model == "hgt":  # relsql/sql_templates/hgt.sql's layer over typed_edge, HGT_HEADS heads
            lines += [
                f"CREATE TABLE {name}_{c} AS\n"
                f"SELECT n.node_id, linear(p.h, {hidden}, '{name}_{c}', n.type) + embed(n.type, {hidden}, '{name}_{c}b') AS h\n"
                f"FROM node n JOIN {previous} p ON p.node_id = n.node_id;" for c in "kqv"]
            skip, scale = f"sigmoid(embed(n.type, 1, '{name}_skip'))", (hidden // HGT_HEADS) ** -0.5
            lines += [
                f"CREATE TABLE {name}_m AS\n"
                f"SELECT e.dst AS node_id,\n"
                f"       attention(sum_per_head(q.h * linear(k.h, {hidden}, '{name}_att', e.type), {HGT_HEADS})"
                f" * embed(e.type, {HGT_HEADS}, '{name}_p') * {scale!r},\n"
                f"                 linear(v.h, {hidden}, '{name}_msg', e.type)) AS h\n"
                f"FROM typed_edge e\nJOIN {name}_k k ON k.node_id = e.src\nJOIN {name}_q q ON q.node_id = e.dst\n"
                f"JOIN {name}_v v ON v.node_id = e.src\nGROUP BY e.dst;",
                # a node without in-edges: PyG's aggregate is 0 (n.x only gives the width; folded to a constant)
                f"CREATE TABLE {name}_m AS SELECT n.node_id, 0 * n.x AS h FROM node n;",
                f"CREATE TABLE {pre} AS\n"
                f"SELECT n.node_id, {skip} * (linear(gelu(m.h), {hidden}, '{name}_a', n.type) "
                f"+ embed(n.type, {hidden}, '{name}_ab'))\n"
                f"       + (1 - {skip}) * p.h AS h\n"
                f"FROM node n\nJOIN {name}_m m ON m.node_id = n.node_id\nJOIN {previous} p ON p.node_id = n.node_id;",
            ]
        else:
            raise ValueError(f"unknown model {model}")
        if layer < layers:
            lines.append(f"CREATE TABLE {name} AS SELECT p.node_id, relu(p.h) AS h FROM {pre} p;")
        previous = name
    return "\n\n".join(lines) + "\n"


def by_value(name: str, ours: torch.Tensor, dictionaries: dict) -> torch.Tensor:
    """A typed weight's rows (one per dictionary code) reordered so that row t is type value t."""
    dictionary = dictionaries[name]
    values = torch.tensor(dictionary.column("value").to_pylist())
    codes = torch.tensor(dictionary.column("code").to_pylist())
    out = ours.new_zeros((int(values.max()) + 1, *ours.shape[1:]))
    out[values] = ours[codes]
    return out


def hgt_metadata(types: int) -> tuple[list[str], list[tuple[str, str, str]]]:
    """HGTConv's node types and one (source type, relation, destination type) per relation."""
    return ([f"t{t}" for t in range(NODE_TYPES)],
            [(f"t{r % NODE_TYPES}", f"r{r}", f"t{r // NODE_TYPES % NODE_TYPES}") for r in range(types)])


def to_pyg(model: str, ours: dict[str, torch.Tensor], dictionaries: dict, layers: int, heads: int,
           types: int) -> dict[str, torch.Tensor]:
    """relsql weights (or their gradients) by name -> the PyG parameters they are, in PyG's layout
    (PyG parameter name -> tensor). Of a per-head block-diagonal PyG weight only the diagonal blocks."""
    out = {}
    for layer in range(1, layers + 1):
        name, conv = f"{model}{layer}", f"convs.{layer - 1}"
        if model in ("rgcn", "rgat"):  # typed (R, out, in) -> PyG's (R, in, out)
            out[f"{conv}.weight"] = by_value(f"{name}_w", ours[f"{name}_w"], dictionaries).transpose(1, 2)
            out[f"{conv}.bias"] = ours[f"{name}_b"]
            if model == "rgcn":
                out[f"{conv}.root"] = ours[f"{name}_root"].t()
            else:
                out[f"{conv}.q"], out[f"{conv}.k"] = ours[f"{name}_q"].t(), ours[f"{name}_k"].t()
        elif model == "gat":
            out |= {f"{conv}.lin.weight": ours[f"{name}_w"], f"{conv}.bias": ours[f"{name}_b"],
                    f"{conv}.att_src": diagonal_blocks(ours[f"{name}_att_src"], heads),
                    f"{conv}.att_dst": diagonal_blocks(ours[f"{name}_att_dst"], heads)}
        elif model == "hgt":
            typed = {key: by_value(f"{name}_{key}", ours[f"{name}_{key}"], dictionaries) for key in WEIGHTS["hgt"]}
            node_types, edge_types = hgt_metadata(types)
            for t, node_type in enumerate(node_types):
                out[f"{conv}.kqv_lin.lins.{node_type}.weight"] = torch.cat([typed[c][t] for c in "kqv"])
                out[f"{conv}.kqv_lin.lins.{node_type}.bias"] = torch.cat([typed[f"{c}b"][t] for c in "kqv"])
                out[f"{conv}.out_lin.lins.{node_type}.weight"] = typed["a"][t]
                out[f"{conv}.out_lin.lins.{node_type}.bias"] = typed["ab"][t]
                out[f"{conv}.skip.{node_type}"] = typed["skip"][t]
            width = typed["att"].shape[1] // HGT_HEADS
            for key, ours_key in (("k_rel", "att"), ("v_rel", "msg")):  # block h * R + r: head h of relation r, (in, out)
                out[f"{conv}.{key}.weight"] = torch.stack([
                    typed[ours_key][r, h * width:(h + 1) * width, h * width:(h + 1) * width].t()
                    for h in range(HGT_HEADS) for r in range(types)])
            for r, edge_type in enumerate(edge_types):
                out[f"{conv}.p_rel.{'__'.join(edge_type)}"] = typed["p"][r].unsqueeze(0)
        else:
            raise ValueError(f"unknown model {model}")
    return out


def block_diagonal(att: torch.Tensor) -> torch.Tensor:
    """PyG's per-head attention vectors (1, H, C) as the (H, H*C) matrix of the template's linear."""
    heads, width = att.shape[1], att.shape[2]
    out = att.new_zeros(heads, heads * width)
    for h in range(heads):
        out[h, h * width:(h + 1) * width] = att[0, h]
    return out


def diagonal_blocks(matrix: torch.Tensor, heads: int) -> torch.Tensor:
    width = matrix.shape[1] // heads
    return torch.stack([matrix[h, h * width:(h + 1) * width] for h in range(heads)]).unsqueeze(0)


def head_mask(shape: tuple[int, ...], heads: int) -> torch.Tensor:
    """1 on the per-head diagonal blocks of (..., H*C, H*C) typed matrices (HGT's W_att, W_msg)."""
    width = shape[-1] // heads
    block = torch.block_diag(*[torch.ones(width, width)] * heads)
    return block.expand(shape)


class PygNet(nn.Module):
    def __init__(self, baseline: str, layers: int, hidden: int, types: int, heads: int):
        super().__init__()
        from torch_geometric.nn import FastRGCNConv, GATConv, HGTConv, RGATConv, RGCNConv

        def conv() -> nn.Module:
            if baseline == "RGCNConv":
                return RGCNConv(hidden, hidden, types)
            if baseline == "FastRGCNConv":
                return FastRGCNConv(hidden, hidden, types)
            if baseline == "RGATConv":  # its defaults: one head, additive self-attention across relations
                return RGATConv(hidden, hidden, types)
            if baseline == "HGTConv":
                return HGTConv(hidden, hidden, hgt_metadata(types), heads=HGT_HEADS)
            return GATConv(hidden, hidden // heads, heads=heads, add_self_loops=False)

        self.hetero = baseline == "HGTConv"
        self.convs = nn.ModuleList(conv() for _ in range(layers))

    def forward(self, *inputs) -> list:
        """Each layer's output (a tensor, or for HGTConv a dict per node type); `inputs` are the
        conv's arguments, the node features first."""
        x, rest, outs = inputs[0], inputs[1:], []
        for i, conv in enumerate(self.convs):
            x = conv(x, *rest)
            if i < len(self.convs) - 1:
                x = {k: torch.relu(v) for k, v in x.items()} if self.hetero else torch.relu(x)
            outs.append(x)  # as the template's relation {model}{i + 1}: after the ReLU, but the last
        return outs


# --------------------------------------------------------------------------- the compared models


class Case:
    """One (model, dataset, layers): the relsql net and its PyG baselines, with shared weights."""

    def __init__(self, model: str, graph: Graph, layers: int, hidden: int, heads: int, db=None,
                 frameworks: tuple[str, ...] = ("relsql", "pyg", "pyg_fast")):
        import relsql

        self.model, self.graph, self.layers, self.hidden, self.heads = model, graph, layers, hidden, heads
        self.last = f"{model}{layers}"
        self.template = relsql.Template.from_sql(template_text(model, layers, hidden, heads))
        self.net = None
        self.ground_s = float("nan")
        self.baselines: dict[str, PygNet] = {}
        if "relsql" in frameworks:
            start = time.perf_counter()
            self.net = relsql.compile(self.template, db, dtype=torch.float32, seed=0, outputs=[self.last])
            self.ground_s = time.perf_counter() - start
            keys = self.net.grounding.relations[self.last].keys.column("node_id").to_numpy()
            if not np.array_equal(keys, np.arange(graph.nodes)):
                raise RuntimeError(f"{self.last}: rows are not the nodes 0..{graph.nodes - 1} in order")
            self.net_params = list(self.net.parameters())
        for baseline in BASELINES[model]:
            if FRAMEWORK[baseline] in frameworks:
                self.baselines[baseline] = PygNet(baseline, layers, hidden, graph.types, heads)
        self.x = torch.as_tensor(graph.x)
        self.y = torch.as_tensor(np.random.default_rng(1).integers(0, hidden, graph.nodes))
        if model == "hgt":  # per node type t: the nodes t, t + 3, ...; local index = node id // 3
            node_types, edge_types = hgt_metadata(graph.types)
            src, dst = (torch.as_tensor(end) // NODE_TYPES for end in graph.typed_ends())
            kind = torch.as_tensor(graph.type)
            self.inputs = ({t: self.x[i::NODE_TYPES] for i, t in enumerate(node_types)},
                           {e: torch.stack([src[kind == r], dst[kind == r]]) for r, e in enumerate(edge_types)})
            self.pyg_y = torch.cat([self.y[i::NODE_TYPES] for i in range(NODE_TYPES)])
        else:
            edge_index = torch.as_tensor(np.stack([graph.src, graph.dst]))
            self.inputs = (self.x, edge_index) if model == "gat" else (self.x, edge_index, torch.as_tensor(graph.type))
            self.pyg_y = self.y
        if self.net is not None:
            self._share_weights()

    def to_pyg(self, ours: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return to_pyg(self.model, ours, self.net.grounding.dictionaries, self.layers, self.heads, self.graph.types)

    def _share_weights(self) -> None:
        ours = self.net.weights_by_name()
        expected = {f"{self.model}{layer}_{w}" for layer in range(1, self.layers + 1) for w in WEIGHTS[self.model]}
        if set(ours) != expected:
            raise RuntimeError(f"relsql weights {sorted(ours)}, expected {sorted(expected)}")
        generator = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for name, weight in ours.items():
                if name.endswith("_b"):  # relsql starts biases at 0: make them count
                    weight.copy_(torch.randn(weight.shape, generator=generator) * 0.1)
                if "_att_" in name:  # only PyG's per-head vectors: keep the diagonal blocks
                    weight.copy_(block_diagonal(diagonal_blocks(weight, self.heads)))
                if name.endswith(("_att", "_msg")) and self.model == "hgt":  # PyG's per-head matrices
                    weight.mul_(head_mask(weight.shape, HGT_HEADS))
            values = self.to_pyg(ours)
            for baseline, pyg in self.baselines.items():
                theirs = {k: v for k, v in pyg.named_parameters() if k.rsplit(".", 1)[-1] not in RGAT_UNUSED
                          or baseline != "RGATConv"}
                if set(theirs) != set(values):
                    raise RuntimeError(f"{baseline} parameters {sorted(set(theirs) ^ set(values))} unmatched")
                for target, value in values.items():
                    if tuple(value.shape) != tuple(theirs[target].shape):
                        raise RuntimeError(f"{baseline} {target}: {tuple(value.shape)} vs {tuple(theirs[target].shape)}")
                    theirs[target].copy_(value)

    def pyg_rows(self, out) -> torch.Tensor:
        """A PyG layer's output as one (nodes, hidden) tensor in node id order."""
        if not isinstance(out, dict):
            return out
        rows = next(iter(out.values())).new_empty(self.graph.nodes, self.hidden)
        for i, value in enumerate(out.values()):
            rows[i::NODE_TYPES] = value
        return rows

    def pyg_loss(self, out) -> torch.Tensor:
        """The step's loss of PyG's last layer (HGT: its node types one after another, labels alike)."""
        logits = torch.cat(list(out.values())) if isinstance(out, dict) else out
        return F.cross_entropy(logits, self.pyg_y)

    def to(self, device: torch.device) -> None:
        """Move the nets and their inputs to `device` (after the CPU agreement check)."""
        def moved(value):
            if isinstance(value, dict):
                return {k: moved(v) for k, v in value.items()}
            if isinstance(value, tuple):
                return tuple(moved(v) for v in value)
            return value.to(device)

        if self.net is not None:
            self.net.to(device)
            self.net_params = list(self.net.parameters())
        for pyg in self.baselines.values():
            pyg.to(device)
        self.x, self.y, self.pyg_y, self.inputs = moved(self.x), moved(self.y), moved(self.pyg_y), moved(self.inputs)

    # timed tasks
    def relsql_forward(self):
        return self.net()[self.last]

    def pyg_forward(self, baseline: str):
        return self.baselines[baseline](*self.inputs)[-1]

    def relsql_step(self) -> float:
        for p in self.net_params:
            p.grad = None
        loss = F.cross_entropy(self.net()[self.last], self.y)
        loss.backward()
        return loss.item()

    def pyg_step(self, baseline: str) -> float:
        pyg = self.baselines[baseline]
        pyg.zero_grad(set_to_none=True)
        loss = self.pyg_loss(pyg(*self.inputs)[-1])
        loss.backward()
        return loss.item()

    def tasks(self, no_step: frozenset[str] = frozenset()) -> dict:
        """The timed calls: relsql and each baseline, forward (no_grad) then training step (but
        for the baselines in `no_step`)."""
        def no_grad(f, *args):
            def run():
                with torch.no_grad():
                    f(*args)
            return run

        tasks = {"relsql_fwd": no_grad(self.relsql_forward)}
        tasks |= {f"{b}_fwd": no_grad(self.pyg_forward, b) for b in self.baselines}
        tasks["relsql_step"] = self.relsql_step
        tasks |= {f"{b}_step": functools.partial(self.pyg_step, b) for b in self.baselines if b not in no_step}
        return tasks

    def check(self, gradients: bool = True) -> dict[str, tuple[float, float]]:
        """Per baseline: (largest relative difference of any layer's output, of any weight's
        gradient of the step's loss, nan without `gradients`), relative to max(1, max |PyG|)
        and max |PyG gradient|."""
        from relsql.compile import make_plan
        from relsql.compile.module import CompiledNet

        full = CompiledNet(make_plan(self.template, self.net.grounding, torch.float32), self.net.grounding)
        with torch.no_grad():
            mine = full.weights_by_name()
            for name, weight in self.net.weights_by_name().items():
                mine[name].copy_(weight)
            ours = full()
            if not torch.allclose(ours[self.last], self.relsql_forward(), rtol=1e-5, atol=1e-5):
                raise RuntimeError(f"{self.model}: the timed net (last layer only) disagrees with the full net")
        if gradients:
            self.relsql_step()
            grads = self.to_pyg({name: w.grad for name, w in self.net.weights_by_name().items()})
        result = {}
        for baseline, pyg in self.baselines.items():
            pyg.zero_grad(set_to_none=True)
            with torch.set_grad_enabled(gradients):  # one call: the outputs, then (if asked) the step's gradients
                theirs = pyg(*self.inputs)
                if gradients:
                    self.pyg_loss(theirs[-1]).backward()
            worst = 0.0
            for layer, b in enumerate(theirs, 1):
                a, b = ours[f"{self.model}{layer}"], self.pyg_rows(b).detach()
                if a.shape != b.shape:
                    raise RuntimeError(f"layer {layer}: relsql {tuple(a.shape)} vs {baseline} {tuple(b.shape)}")
                worst = max(worst, ((a - b).abs().max() / b.abs().max().clamp(min=1)).item())
            params = dict(pyg.named_parameters())
            worst_grad = 0.0 if gradients else float("nan")
            # HGTConv's per-type parameters compared per family (all types): a relation seen on one
            # edge whose destination has no other in-edge leaves its p_rel without gradient
            families: dict[str, list[float]] = {}
            for target, a in grads.items() if gradients else ():
                b = params[target].grad
                if b is None:
                    raise RuntimeError(f"{baseline} {target}: no gradient; the check would be vacuous")
                family = families.setdefault(re.sub(r"\.t\d+(__r\d+__t\d+)?(?=\.|$)", ".*", target), [0.0, 0.0])
                family[0] = max(family[0], (a - b).abs().max().item())
                family[1] = max(family[1], b.abs().max().item())
            for family, (diff, size) in families.items():
                if size == 0:
                    raise RuntimeError(f"{baseline} {family}: zero gradient; the check would be vacuous")
                worst_grad = max(worst_grad, diff / size)
            pyg.zero_grad(set_to_none=True)
            result[baseline] = (worst, worst_grad)
        for p in self.net_params:
            p.grad = None
        return result

    def summary(self) -> str:
        return self.net.explain().splitlines()[-1]


def fast_rgcn_gb(graph: Graph, hidden: int) -> float:
    """FastRGCNConv's per-edge matrices, one layer's forward: E x in x out float32."""
    return graph.edges * hidden * hidden * 4 / 2**30


def hgt_rows_gb(graph: Graph, hidden: int) -> float:
    """HGTConv transforms keys and values per (edge type, source node), not per edge: one such
    tensor is R x N/3 x hidden float32 (it keeps several)."""
    return graph.types * -(-graph.nodes // NODE_TYPES) * hidden * 4 / 2**30


def rgcn_step_gb(graph: Graph, layers: int, hidden: int) -> float:
    """What RGCNConv's training step keeps for the backward (without pyg-lib): per layer and
    relation one aggregate of every node, N x hidden float32 (measured: 8.7 GB for one BGS layer)."""
    return layers * graph.types * graph.nodes * hidden * 4 / 2**30


def available_gb() -> float:
    text = Path("/proc/meminfo").read_text()
    return int(text.split("MemAvailable:")[1].split()[0]) / 2**20


# --------------------------------------------------------------------------- timing


def synchronized(task, device: str):
    """`task` followed by waiting for the device, so a call's time includes its kernels."""
    def run():
        task()
        torch.cuda.synchronize(device)
    return run


def time_alternately(tasks: dict, warmup: int, max_reps: int, budget_s: float) -> tuple[dict[str, float], int]:
    """Medians (ms per call) of the tasks run in turn each repetition, as bench/gnn.py, and the
    number of repetitions. Like timeit, a sample loops a task for ~SAMPLE_S, the loop length
    calibrated on one call of each task. Repetitions: `warmup` + up to `max_reps`, as many as fit
    `budget_s`, at least one; where even one repetition exceeds the budget (PyG's RGCNConv on
    BGS and AM: tens of seconds a call) the calibration calls, made after the agreement check
    has called every model, are the only sample."""
    loops, first = {}, {}
    gc.collect()
    for key, task in tasks.items():
        start = time.perf_counter()
        task()
        first[key] = (time.perf_counter() - start) * 1000
        loops[key] = max(1, int(SAMPLE_S * 1000 / max(first[key], 1e-3)))
    per_rep = sum(max(t / 1000, SAMPLE_S) for t in first.values())
    if per_rep > budget_s:
        return first, 1
    if per_rep * (warmup + 3) > budget_s:  # slow calls: the check and the calibration calls warmed them up
        warmup = 0
    reps = int(min(max_reps, max(1, budget_s // per_rep - warmup)))
    times: dict[str, list[float]] = {k: [] for k in tasks}
    gc.collect()
    gc.freeze()  # the objects alive now (imports, models) are not scanned by each sample's gc.collect
    try:
        for rep in range(warmup + reps):
            for key, task in tasks.items():
                gc.collect()
                start = time.perf_counter()
                for _ in range(loops[key]):
                    task()
                elapsed = (time.perf_counter() - start) * 1000 / loops[key]
                if rep >= warmup:
                    times[key].append(elapsed)
    finally:
        gc.unfreeze()
    return {k: statistics.median(v) for k, v in times.items()}, reps


# --------------------------------------------------------------------------- memory


def memory_probe(framework: str, model: str, name: str, layers: int, hidden: int, heads: int, am_scale: float) -> dict:
    """In this (fresh) process: the extra peak RSS (MB) of one training step after a warm-up step
    (none on big graphs, where PyG's RGCNConv takes a minute per step: the step measured is the
    first, lazy initialisation included, a few MB against GBs)."""
    import ctypes

    graph = synthetic(name, hidden, am_scale)
    db = database(graph) if framework == "relsql" else None
    case = Case(model, graph, layers, hidden, heads, db=db, frameworks=(framework,))
    if framework == "relsql":
        step = case.relsql_step
    else:
        baseline = next(b for b in BASELINES[model] if FRAMEWORK[b] == framework)
        def step():
            return case.pyg_step(baseline)
    if graph.edges < BIG:
        step()
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass
    try:
        Path("/proc/self/clear_refs").write_text("5")
        reset = True
    except OSError:
        reset = False
    before = _status_mb("VmRSS")
    step()
    peak = _status_mb("VmHWM")
    return {"baseline_mb": before, "peak_mb": peak, "step_mb": peak - before if reset else float("nan")}


def measure_memory(framework: str, model: str, name: str, layers: int, args) -> float:
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="131072", MALLOC_TRIM_THRESHOLD_="131072",
               OMP_NUM_THREADS=str(args.threads))
    command = [sys.executable, "-m", "bench.hetero", "--memory-probe", framework, model, name, str(layers),
               "--hidden", str(args.hidden), "--heads", str(args.heads), "--am-scale", str(args.am_scale),
               "--threads", str(args.threads)]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    if done.returncode != 0:
        print(f"  memory probe {framework} {model} {name} {layers} failed:\n{done.stderr[-2000:]}", file=sys.stderr)
        return float("nan")
    return json.loads(done.stdout.strip().splitlines()[-1])["step_mb"]


# --------------------------------------------------------------------------- output


def print_table(rows: list[dict]) -> None:
    head = ["model", "vs", "dataset", "L", "nodes", "edges", "relsql fwd ms", "PyG fwd ms", "ratio",
            "relsql step ms", "PyG step ms", "ratio", "relsql MB", "PyG MB", "max diff"]
    keys = ["model", "baseline", "dataset", "layers", "nodes", "edges", "relsql_fwd_ms", "pyg_fwd_ms", "fwd_ratio",
            "relsql_step_ms", "pyg_step_ms", "step_ratio", "relsql_mb", "pyg_mb", "max_rel_diff"]

    def cell(row, key):
        value = row[key]
        if key == "max_rel_diff":
            return "-" if value != value else f"{value:.0e}"
        return _fmt(value, 2 if key.endswith("ratio") else 1)

    cells = [[cell(r, k) for k in keys] for r in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(head)]
    print("  ".join(h.rjust(w) for h, w in zip(head, widths)))
    for c in cells:
        print("  ".join(v.rjust(w) for v, w in zip(c, widths)))


def plot(rows: list[dict], path: Path, title: str) -> None:
    rows = [r for r in rows if r["fwd_ratio"] == r["fwd_ratio"]]
    if rows:
        labels = [f"{r['model']} {r['layers']}L\nvs {r['baseline']}\n{r['dataset']}" for r in rows]
        plot_ratios(rows, labels, path, title, TARGET)


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(prog="python -m bench.hetero", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="AIFB only, few repetitions (a smoke test)")
    parser.add_argument("--out", default="out/bench", help="folder for hetero.csv and hetero.png")
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--heads", type=int, default=1, help="GAT heads (hidden / heads wide each, concatenated)")
    parser.add_argument("--layers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--models", default="rgcn,gat")
    parser.add_argument("--datasets", default=None, help=f"comma separated, from {list(DATASETS)}")
    parser.add_argument("--am-scale", type=float, default=AM_SCALE, help="fraction of AM's nodes and edges")
    parser.add_argument("--fast-limit-gb", type=float, default=2.0,
                        help="run FastRGCNConv and RGATConv only where their per-edge matrices (one layer), "
                             "HGTConv only where its per-(relation, source node) keys stay under this")
    parser.add_argument("--budget", type=float, default=60.0,
                        help="seconds of timed repetitions per (model, dataset, layers), at least one repetition")
    parser.add_argument("--threads", type=int, default=THREADS, help="torch.set_num_threads (2 as bench/gnn.py)")
    parser.add_argument("--no-memory", action="store_true", help="skip the memory subprocesses")
    parser.add_argument("--device", default="cpu",
                        help="cpu or cuda: timed there after the agreement check on the CPU (each call synchronizes the "
                             "device; memory probes are CPU only, so cuda implies --no-memory)")
    parser.add_argument("--memory-probe", nargs=4, metavar=("FRAMEWORK", "MODEL", "DATASET", "LAYERS"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    args.no_memory = args.no_memory or args.device != "cpu"  # the probes read the CPU peak RSS
    if args.hidden % args.heads:
        parser.error(f"--hidden {args.hidden} does not split into --heads {args.heads}")
    if args.memory_probe:
        framework, model, name, layers = args.memory_probe
        print(json.dumps(memory_probe(framework, model, name, int(layers), args.hidden, args.heads, args.am_scale)))
        return []

    models = args.models.split(",")
    names = args.datasets.split(",") if args.datasets else (["aifb"] if args.quick else FULL)
    unknown = [n for n in names if n not in DATASETS] + [m for m in models if m not in BASELINES]
    if unknown:
        parser.error(f"unknown datasets/models {unknown}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    commit = git_commit()
    import torch_geometric

    print(f"relsql vs PyG {torch_geometric.__version__} on synthetic heterogeneous graphs, hidden width {args.hidden}, "
          f"GAT heads {args.heads}, float32, {args.device}, torch {torch.__version__}, "
          f"torch.set_num_threads({args.threads}), commit {commit}")
    print(f"PyG extensions: pyg-lib {torch_geometric.typing.WITH_PYG_LIB} (segment_matmul {torch_geometric.typing.WITH_SEGMM}), "
          f"torch-scatter {torch_geometric.typing.WITH_TORCH_SCATTER}, torch-sparse {torch_geometric.typing.WITH_TORCH_SPARSE}")
    if "am" in names and args.am_scale != 1:
        print(f"AM is scaled down to {args.am_scale:g} of its nodes and edges (all 133 types kept): see the docstring")
    print("fwd = forward under no_grad; step = zero grads + forward + cross entropy + backward; medians of "
          "alternating repetitions; MB = extra peak RSS of one step, fresh subprocess.")
    print("Timings are only meaningful on an otherwise idle machine.")
    print("load average at start: {:.2f} {:.2f} {:.2f} (1, 5, 15 min; ~0 means idle); {:.1f} GiB of memory available\n".format(
        *os.getloadavg(), available_gb()))

    rows = []
    for name in names:
        start = time.perf_counter()
        graph = synthetic(name, args.hidden, args.am_scale)
        db = database(graph)
        counts = np.bincount(graph.type, minlength=graph.types)
        print(f"[{name}{f' x{graph.scale:g}' if graph.scale != 1 else ''}] {graph.nodes} nodes, {graph.edges} edges, "
              f"{graph.types} types (largest {counts.max()} edges, median {int(np.median(counts))}, smallest {counts.min()}), "
              f"built in {time.perf_counter() - start:.1f} s; load average {os.getloadavg()[0]:.2f}")
        big = graph.edges >= BIG
        warmup, max_reps = (1, 2) if args.quick else (2, 7)
        for model in models:
            for layers in args.layers:
                frameworks = ["relsql", "pyg"]
                skipped, no_step = {}, {}
                if model == "rgcn":
                    gb = fast_rgcn_gb(graph, args.hidden)
                    if gb <= args.fast_limit_gb:
                        frameworks.append("pyg_fast")
                    else:
                        skipped["FastRGCNConv"] = (f"skipped: its per-edge matrices take {gb:.1f} GiB per layer "
                                                   f"(> --fast-limit-gb {args.fast_limit_gb:g})")
                    gb, free = rgcn_step_gb(graph, layers, args.hidden), available_gb()
                    if gb > 0.8 * free:
                        no_step["RGCNConv"] = (f"training step not run: it would keep ~{gb:.1f} GiB for the backward, "
                                               f"{free:.1f} GiB available")
                elif model in ("rgat", "hgt"):
                    baseline, gb = BASELINES[model][0], (fast_rgcn_gb if model == "rgat" else hgt_rows_gb)(graph, args.hidden)
                    what = "per-edge matrices" if model == "rgat" else "keys per (relation, source node)"
                    if gb > args.fast_limit_gb:
                        frameworks.remove("pyg")
                        skipped[baseline] = (f"skipped: its {what} take {gb:.1f} GiB per layer (> --fast-limit-gb "
                                             f"{args.fast_limit_gb:g}); relsql not checked here")
                case = Case(model, graph, layers, args.hidden, args.heads, db=db, frameworks=tuple(frameworks))
                diffs = case.check(gradients=not big)
                for baseline, (diff, grad_diff) in diffs.items():
                    if not diff <= TOLERANCE or (not big and not grad_diff <= TOLERANCE):
                        raise RuntimeError(f"{model} {layers}L on {name}: relsql and {baseline} disagree by {diff:.2e} "
                                           f"(outputs) / {grad_diff:.2e} (gradients), relative; not timing")
                print(f"  {model} {layers} layer(s): grounding + compile {case.ground_s:.2f} s; plan: {case.summary()}; "
                      + "; ".join(f"max rel |relsql - {b}| {d:.1e}, gradients {g:.1e}" for b, (d, g) in diffs.items()))
                tasks = case.tasks(frozenset(no_step))
                if args.device != "cpu":
                    case.to(torch.device(args.device))
                    tasks = {key: synchronized(task, args.device) for key, task in tasks.items()}
                times, reps = time_alternately(tasks, warmup, max_reps, args.budget)
                ops = int(case.summary().split()[0])
                ground_s = case.ground_s
                del case
                gc.collect()
                relsql_mb = float("nan")
                if not args.no_memory:
                    relsql_mb = round(measure_memory("relsql", model, name, layers, args), 1)
                for baseline in BASELINES[model]:
                    row = {"model": model, "baseline": baseline, "dataset": name, "layers": layers, "nodes": graph.nodes,
                           "edges": graph.edges, "types": graph.types, "hidden": args.hidden,
                           "heads": {"gat": args.heads, "rgat": 1, "hgt": HGT_HEADS}.get(model, ""),
                           "ground_s": round(ground_s, 3),
                           "relsql_fwd_ms": round(times["relsql_fwd"], 2), "relsql_step_ms": round(times["relsql_step"], 2),
                           "relsql_mb": relsql_mb, "ops": ops, "reps": reps,
                           "note": f"AM x{graph.scale:g}" if graph.scale != 1 else ""}
                    if baseline in skipped:
                        row |= {"pyg_fwd_ms": float("nan"), "pyg_step_ms": float("nan"), "fwd_ratio": float("nan"),
                                "step_ratio": float("nan"), "pyg_mb": float("nan"), "max_rel_diff": float("nan"),
                                "max_rel_grad_diff": float("nan"),
                                "note": "; ".join(filter(None, [row["note"], skipped[baseline]]))}
                        print(f"    vs {baseline}: {skipped[baseline]}")
                    else:
                        pyg_fwd, pyg_step = times[f"{baseline}_fwd"], times.get(f"{baseline}_step", float("nan"))
                        row |= {"pyg_fwd_ms": round(pyg_fwd, 2), "pyg_step_ms": round(pyg_step, 2),
                                "fwd_ratio": round(times["relsql_fwd"] / pyg_fwd, 3),
                                "step_ratio": round(times["relsql_step"] / pyg_step, 3),
                                "max_rel_diff": float(f"{diffs[baseline][0]:.2e}"),
                                "max_rel_grad_diff": float(f"{diffs[baseline][1]:.2e}"),
                                "pyg_mb": float("nan") if args.no_memory or baseline in no_step else
                                round(measure_memory(FRAMEWORK[baseline], model, name, layers, args), 1)}
                        if baseline in no_step:
                            row["note"] = "; ".join(filter(None, [row["note"], no_step[baseline]]))
                            print(f"    vs {baseline}: {no_step[baseline]}")
                        print(f"    vs {baseline}: fwd {row['relsql_fwd_ms']:.1f} vs {row['pyg_fwd_ms']:.1f} ms "
                              f"(ratio {row['fwd_ratio']:.2f}), step {row['relsql_step_ms']:.1f} vs {row['pyg_step_ms']:.1f} ms "
                              f"(ratio {row['step_ratio']:.2f}), MB {row['relsql_mb']} vs {row['pyg_mb']}, {reps} reps")
                    rows.append(row)
        db.con.close()
        del db, graph
        gc.collect()

    print()
    print_table(rows)
    timed = [r for r in rows if r["fwd_ratio"] == r["fwd_ratio"]]
    met = sum(r["fwd_ratio"] <= TARGET and r["step_ratio"] <= TARGET for r in timed)
    print("load average at end: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
    print(f"\ntarget relsql/PyG <= {TARGET} for fwd and step: met in {met} of {len(timed)} timed rows (commit {commit})")
    write_csv(out / "hetero.csv", [{k: r[k] for k in COLUMNS} for r in rows])
    plot(rows, out / "hetero.png", f"relsql / PyG time, hidden {args.hidden}, {args.threads} threads, commit {commit}")
    print(f"wrote {out / 'hetero.png'}")
    return rows


if __name__ == "__main__":
    main()
