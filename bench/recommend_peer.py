"""The PyG peer of bench/recommend.py: an RDL-style two-tower GNN for ranking (issue #30, item 6).

Built from a bench/recommend_data.py Dataset (its DuckDB file read as bench/rdl_peer.py reads one):
one node type per table but the task table and the event table, encoded per column as rdl_peer
encodes them (standardized numbers with NULL indicators, code embeddings, dates), plus a learned
embedding per candidate row (RelBench's "shallow" candidate side). Edges: every single-column
foreign key between node tables in both directions, and the events (purchases, or the kept graph
edges) as query <-> candidate edges. In a temporal dataset a task row at snapshot s sees only the
events dated before s: the graph is rebuilt per snapshot (full batch), so no future leaks in.
`layers` HeteroConv layers of SAGEConv (mean), each with a residual and LayerNorm; the query tower
and the candidate tower are MLPs on a row's final and initial states; score = their dot product.

Trained on the split's training rows with relsql's default negatives (relsql/train/task/ranking.py):
sampled softmax, each positive (row, item) of a step against the same `negatives` candidates drawn
uniformly with replacement (seeded; uniform draws need no logQ correction); AdamW; the epoch of the best
validation MAP@k kept; the test rows' top-k over every candidate returned.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from torch import nn

from bench import rdl_peer
from bench.recommend_data import Dataset


@dataclass
class Graph:
    """Node inputs per type, static edges, and the events as (query row, candidate row) positions."""
    tables: dict[str, rdl_peer.Encoded]
    static: dict[tuple, torch.Tensor]
    event_type: tuple[str, str, str]
    event_query: torch.Tensor  # positions in the query table, events sorted by day
    event_item: torch.Tensor  # positions in the candidate table
    event_day: np.ndarray | None  # sorted
    query_rows: np.ndarray  # per task row: its position in the query table
    candidate_rows: np.ndarray  # per candidate key (Dataset.candidates order): its position in the candidate table


def _positions(frame: pd.DataFrame, key: str, values: np.ndarray) -> np.ndarray:
    found = pd.Index(frame[key]).get_indexer(values)
    if (found < 0).any():
        raise ValueError(f"{int((found < 0).sum())} keys not found in column {key}")
    return found


def build_graph(ds: Dataset) -> Graph:
    """The peer's graph of `ds` (see the module's docstring)."""
    read = rdl_peer.read(ds.path)
    nodes = {name: t for name, t in read.items() if name not in (ds.task_table, ds.event_table)}
    tables, static = {}, {}
    for name, table in nodes.items():
        encoded = rdl_peer.encode(table.frame, {table.key, *table.foreign})
        ones = torch.ones(len(table.frame), 1)  # a table of keys only still gets an input
        tables[name] = rdl_peer.Encoded(torch.cat([encoded.numbers, ones], 1), encoded.codes, encoded.sizes)
        for column, (parent, parent_column) in table.foreign.items():
            if parent not in nodes:
                continue
            found = pd.Index(nodes[parent].frame[parent_column]).get_indexer(table.frame[column])
            child = torch.as_tensor(np.flatnonzero(found >= 0), dtype=torch.long)
            parent_rows = torch.as_tensor(found[found >= 0], dtype=torch.long)
            static[(name, column, parent)] = torch.stack([child, parent_rows])
            static[(parent, f"rev_{name}_{column}", name)] = torch.stack([parent_rows, child])
    query_frame, candidate_frame = nodes[ds.query_table], nodes[ds.candidate_table]
    order = np.argsort(ds.event_day, kind="stable") if ds.event_day is not None else np.arange(len(ds.event_query))
    event_query = _positions(query_frame.frame, query_frame.key, ds.event_query[order])
    event_item = _positions(candidate_frame.frame, candidate_frame.key, ds.event_item[order])
    return Graph(tables, static, (ds.query_table, ds.event_table, ds.candidate_table),
                 torch.as_tensor(event_query, dtype=torch.long), torch.as_tensor(event_item, dtype=torch.long),
                 ds.event_day[order] if ds.event_day is not None else None,
                 _positions(query_frame.frame, query_frame.key, ds.task_query),
                 _positions(candidate_frame.frame, candidate_frame.key, ds.candidates))


def edges_before(graph: Graph, day: int | None) -> dict[tuple, torch.Tensor]:
    """Static edges plus the events dated before `day` (all of them when not temporal), both ways."""
    count = len(graph.event_query) if day is None or graph.event_day is None else int(
        np.searchsorted(graph.event_day, day, side="left"))
    q, c = graph.event_query[:count], graph.event_item[:count]
    src, relation, dst = graph.event_type
    edges = dict(graph.static)
    if src == dst:  # links: the events already hold both directions
        edges[graph.event_type] = torch.stack([q, c])
    else:
        edges[graph.event_type] = torch.stack([q, c])
        edges[(dst, f"rev_{relation}", src)] = torch.stack([c, q])
    return edges


class TwoTower(nn.Module):
    def __init__(self, tables: dict[str, rdl_peer.Encoded], edge_types: list[tuple], query: str, candidate: str,
                 width: int, layers: int, dropout: float):
        from torch_geometric.nn import HeteroConv, SAGEConv

        super().__init__()
        self.query, self.candidate = query, candidate
        self.numbers = nn.ModuleDict({t: nn.Linear(e.numbers.shape[1], width) for t, e in tables.items()})
        self.codes = nn.ModuleDict({t: nn.ModuleList([nn.Embedding(s, width) for s in e.sizes]) for t, e in tables.items()})
        self.shallow = nn.Embedding(len(tables[candidate].numbers), width)
        nn.init.normal_(self.shallow.weight, std=0.1)
        self.encoders = nn.ModuleDict({t: nn.Sequential(nn.LayerNorm(width), nn.ReLU(), nn.Linear(width, width)) for t in tables})
        self.convs = nn.ModuleList([HeteroConv({e: SAGEConv((width, width), width, aggr="mean") for e in edge_types}, aggr="sum")
                                    for _ in range(layers)])
        self.norms = nn.ModuleList([nn.ModuleDict({t: nn.LayerNorm(width) for t in tables}) for _ in range(layers)])
        self.dropout = nn.Dropout(dropout)
        self.query_tower = nn.Sequential(nn.Linear(2 * width, width), nn.ReLU(), nn.Linear(width, width))
        self.candidate_tower = nn.Sequential(nn.Linear(2 * width, width), nn.ReLU(), nn.Linear(width, width))

    def forward(self, tables: dict[str, rdl_peer.Encoded], edges: dict[tuple, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """(query-tower rows of the query table, candidate-tower rows of the candidate table)."""
        h = {}
        for t, e in tables.items():
            x = self.numbers[t](e.numbers)
            for embedding, code in zip(self.codes[t], e.codes):
                x = x + embedding(code)
            if t == self.candidate:
                x = x + self.shallow.weight
            h[t] = self.encoders[t](x)
        first = dict(h)
        for conv, norms in zip(self.convs, self.norms):
            new = conv(h, edges)
            h = {t: self.dropout(F.relu(norms[t](h[t] + new[t]))) if t in new else h[t] for t in h}
        query = self.query_tower(torch.cat([h[self.query], first[self.query]], 1))
        candidate = self.candidate_tower(torch.cat([h[self.candidate], first[self.candidate]], 1))
        return query, candidate


def _groups(ds: Dataset, rows: np.ndarray) -> list[tuple[int | None, np.ndarray]]:
    """Task rows by snapshot (one group when not temporal)."""
    if ds.task_day is None:
        return [(None, rows)]
    days = ds.task_day[rows]
    return [(int(d), rows[days == d]) for d in np.unique(days)]


def _truth_pairs(ds: Dataset, rows: np.ndarray, candidate_index: dict) -> tuple[np.ndarray, np.ndarray]:
    """(position of the row within `rows`, candidate index) for every positive of `rows`."""
    starts, ends = ds.truth_offsets[rows], ds.truth_offsets[rows + 1]
    owner = np.repeat(np.arange(len(rows)), ends - starts)
    ids = np.concatenate([ds.truth_ids[s:e] for s, e in zip(starts, ends)]) if len(rows) else np.zeros(0, np.int64)
    return owner, np.searchsorted(ds.candidates, ids)


def top_k(net: TwoTower, graph: Graph, ds: Dataset, rows: np.ndarray, k: int) -> np.ndarray:
    """[rows, k] candidate keys of the highest scores, per snapshot's graph."""
    out = np.zeros((len(rows), k), dtype=np.int64)
    net.eval()
    with torch.no_grad():
        for day, group in _groups(ds, rows):
            query, candidate = net(graph.tables, edges_before(graph, day))
            scores = query[torch.as_tensor(graph.query_rows[group])] @ candidate[torch.as_tensor(graph.candidate_rows)].T
            best = torch.topk(scores, min(k, scores.shape[1]), dim=1).indices.numpy()
            out[np.searchsorted(rows, group)] = ds.candidates[best]
    return out


def run(ds: Dataset, seed: int, score, *, k: int = 10, width: int = 64, layers: int = 2, dropout: float = 0.1,
        lr: float = 0.003, weight_decay: float = 1e-4, negatives: int = 512, epochs: int = 150, patience: int = 15) -> dict:
    """Train on ds.split["train"], select on "val" by MAP@k (`score(predicted, rows)` -> metrics dict),
    return {"predicted": test top-k keys, "seconds": graph + training, "best_epoch", "epochs"}."""
    started = time.perf_counter()
    graph = build_graph(ds)
    index = {key: i for i, key in enumerate(ds.candidates)}
    rows = {name: np.sort(r) for name, r in ds.split.items()}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        generator = torch.Generator().manual_seed(seed)
        edge_types = list(edges_before(graph, None))
        net = TwoTower(graph.tables, edge_types, ds.query_table, ds.candidate_table, width, layers, dropout)
        optimizer = torch.optim.AdamW(net.parameters(), lr=lr, weight_decay=weight_decay)
        candidate_rows = torch.as_tensor(graph.candidate_rows)
        groups = [(day, group, *_truth_pairs(ds, group, index)) for day, group in _groups(ds, rows["train"])]
        best, best_state, best_epoch, epoch = -1.0, copy.deepcopy(net.state_dict()), 0, 0
        for epoch in range(epochs):
            net.train()
            for day, group, owner, positive in groups:
                optimizer.zero_grad()
                query, candidate = net(graph.tables, edges_before(graph, day))
                q = query[torch.as_tensor(graph.query_rows[group][owner])]
                c = candidate[candidate_rows]
                drawn = torch.randint(0, len(ds.candidates), (negatives,), generator=generator)
                pos = (q * c[torch.as_tensor(positive)]).sum(1, keepdim=True)
                neg = q @ c[drawn].T
                loss = F.cross_entropy(torch.cat([pos, neg], 1), torch.zeros(len(owner), dtype=torch.long))
                loss.backward()
                nn.utils.clip_grad_norm_(net.parameters(), 1.0)
                optimizer.step()
            value = score(top_k(net, graph, ds, rows["val"], k), rows["val"])[f"map@{k}"]
            if value > best:
                best, best_state, best_epoch = value, copy.deepcopy(net.state_dict()), epoch
            elif epoch - best_epoch >= patience:
                break
        net.load_state_dict(best_state)
        seconds = time.perf_counter() - started
        predicted = top_k(net, graph, ds, rows["test"], k)
    return {"predicted": predicted, "seconds": seconds, "best_epoch": best_epoch, "epochs": epoch + 1,
            "val_map": best}
