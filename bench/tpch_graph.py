"""The PyG side of the TPC-H benchmarks (bench/loader.py, bench/time_to_accuracy.py).

The same four TPC-H tables relsql's templates read, as a PyG `HeteroData`: node types `order`,
`lineitem`, `part`, `customer`; features from the same numeric columns, standardized (the
mean and population standard deviation over the table, as relsql's `features()`), `p_brand` as
an integer code (an embedding or one-hot in the model); edges from the foreign keys
lineitem.l_orderkey → orders, lineitem.l_partkey → part, orders.o_custkey → customer.

Edge sets (`edges=`):
  "template"  only the directions relsql's template aggregates over, toward the target:
              lineitem → order, part → lineitem, customer → order. A 2-hop NeighborLoader from
              orders then samples exactly relsql's computation tree (order ← lineitem ← part,
              order ← customer).
  "both"      every foreign key in both directions (RDL / RelBench style): a 2-hop sample also
              holds, e.g., every order of each order's customer (customer → order at hop 2).

Sampling: PyG's `NeighborSampler` needs pyg-lib or torch-sparse. `sampler_backend()` says which
is importable; with neither, `neighbor_loader` falls back to `TorchNeighborSampler` below (the
same hop-by-hop, per-edge-type uniform sampling without replacement, vectorized in torch; not
PyG's C++ sampler), and says so.
"""

from __future__ import annotations

import time

import numpy as np
import torch

NODE_TYPES = ("order", "lineitem", "part", "customer")
# (source, relation, destination): messages flow source -> destination; the template set is the
# directions relsql aggregates over toward the orders.
TEMPLATE_EDGES = [("lineitem", "of", "order"), ("part", "in", "lineitem"), ("customer", "places", "order")]
REVERSE_EDGES = [("order", "has", "lineitem"), ("lineitem", "uses", "part"), ("order", "placed_by", "customer")]


def sampler_backend() -> str:
    """Which sampling library PyG can use here: 'pyg-lib', 'torch-sparse' or 'none'."""
    import torch_geometric.typing as t

    if t.WITH_PYG_LIB:
        return "pyg-lib"
    if t.WITH_TORCH_SPARSE:
        return "torch-sparse"
    return "none"


def read_tables(path: str, con=None, orders_table: str = "orders", extra_order_columns: tuple[str, ...] = ()) -> dict:
    """The columns both sides use, read from the DuckDB file `path` (read-only) into numpy,
    each table sorted by its key."""
    import duckdb

    own = con is None
    con = con or duckdb.connect(path, read_only=True)
    try:
        extra = "".join(f", {c}" for c in extra_order_columns)
        tables = {
            "order": con.execute(f"SELECT o_orderkey, o_custkey, o_totalprice::DOUBLE AS o_totalprice{extra} "
                                 f"FROM {orders_table} ORDER BY o_orderkey").fetchnumpy(),
            "lineitem": con.execute("SELECT l_orderkey, l_partkey, l_quantity::DOUBLE AS q, l_extendedprice::DOUBLE AS p, "
                                    "l_discount::DOUBLE AS d FROM lineitem ORDER BY l_orderkey, l_linenumber").fetchnumpy(),
            "part": con.execute("SELECT p_partkey, p_size::DOUBLE AS s, p_retailprice::DOUBLE AS r, "
                                "dense_rank() OVER (ORDER BY p_brand) - 1 AS brand FROM part ORDER BY p_partkey").fetchnumpy(),
            "customer": con.execute("SELECT c_custkey, c_acctbal::DOUBLE AS a FROM customer ORDER BY c_custkey").fetchnumpy(),
        }
    finally:
        if own:
            con.close()
    return {name: {k: np.asarray(v) for k, v in cols.items()} for name, cols in tables.items()}


def _standardized(*columns: np.ndarray) -> torch.Tensor:
    x = np.stack([np.asarray(c, dtype=np.float64) for c in columns], axis=1)
    std = x.std(axis=0)
    x = (x - x.mean(axis=0)) / np.where(std > 0, std, 1.0)
    return torch.from_numpy(x.astype(np.float32))


def _positions(keys_sorted: np.ndarray, wanted: np.ndarray, what: str) -> torch.Tensor:
    at = np.searchsorted(keys_sorted, wanted)
    if len(wanted) and (at.max() >= len(keys_sorted) or (keys_sorted[at] != wanted).any()):
        raise SystemExit(f"{what}: a foreign key without its row")
    return torch.from_numpy(at.astype(np.int64))


def hetero_data(tables: dict, edges: str = "both"):
    """HeteroData of the tables: x per node type, edge_index per foreign key (and direction)."""
    from torch_geometric.data import HeteroData

    o, li, p, c = tables["order"], tables["lineitem"], tables["part"], tables["customer"]
    data = HeteroData()
    data["order"].x = _standardized(o["o_totalprice"])
    data["lineitem"].x = _standardized(li["q"], li["p"], li["d"])
    data["part"].x = _standardized(p["s"], p["r"])
    data["part"].brand = torch.from_numpy(p["brand"].astype(np.int64))
    data["customer"].x = _standardized(c["a"])
    item_order = _positions(o["o_orderkey"], li["l_orderkey"], "lineitem.l_orderkey")
    item_part = _positions(p["p_partkey"], li["l_partkey"], "lineitem.l_partkey")
    order_customer = _positions(c["c_custkey"], o["o_custkey"], "orders.o_custkey")
    items = torch.arange(len(li["l_orderkey"]), dtype=torch.int64)
    orders = torch.arange(len(o["o_orderkey"]), dtype=torch.int64)
    forward = {("lineitem", "of", "order"): (items, item_order), ("part", "in", "lineitem"): (item_part, items),
               ("customer", "places", "order"): (order_customer, orders)}
    for (src, rel, dst), (s, d) in forward.items():
        data[src, rel, dst].edge_index = torch.stack([s, d])
    if edges == "both":
        for (src, rel, dst), back in zip(TEMPLATE_EDGES, REVERSE_EDGES):
            s, d = forward[(src, rel, dst)]
            data[back].edge_index = torch.stack([d, s])
    elif edges != "template":
        raise SystemExit(f"edges must be 'both' or 'template', got {edges!r}")
    return data


def build(path: str, edges: str, **read) -> tuple[object, dict, dict[str, float]]:
    """(HeteroData, tables, one-time seconds: read from DuckDB, build HeteroData)."""
    started = time.perf_counter()
    tables = read_tables(path, **read)
    read_s = time.perf_counter() - started
    started = time.perf_counter()
    data = hetero_data(tables, edges)
    return data, tables, {"read_s": read_s, "build_s": time.perf_counter() - started}


def neighbor_loader(data, num_neighbors: list[int], batch_size: int, input_nodes, shuffle: bool = True, seed: int = 0):
    """PyG's NeighborLoader; with neither pyg-lib nor torch-sparse, the same loader class with
    `TorchNeighborSampler` as its sampler."""
    from torch_geometric.loader import NeighborLoader

    torch.manual_seed(seed)
    if sampler_backend() != "none":
        return NeighborLoader(data, num_neighbors=num_neighbors, batch_size=batch_size, input_nodes=input_nodes,
                              shuffle=shuffle)
    sampler = _torch_sampler_class()(data, num_neighbors=num_neighbors)
    return NeighborLoader(data, num_neighbors=num_neighbors, batch_size=batch_size, input_nodes=input_nodes,
                          shuffle=shuffle, neighbor_sampler=sampler)


def _torch_sampler_class():
    from torch_geometric.sampler import HeteroSamplerOutput, NeighborSampler

    class TorchNeighborSampler(NeighborSampler):
        """PyG's NeighborSampler (its CSC, its loader plumbing) with the sampling step done in
        torch when neither pyg-lib nor torch-sparse is installed: per hop, per edge type, for
        every destination node reached at the previous hop, at most k of its in-edges uniformly
        without replacement (all of them with k = -1), new source nodes appended — what
        torch-sparse's hetero_neighbor_sample does (non-disjoint, no time)."""

        def __init__(self, data, num_neighbors):
            super().__init__(data, num_neighbors=num_neighbors)
            self._local = {t: torch.full((data[t].num_nodes,), -1, dtype=torch.int64) for t in self.node_types}

        def _sample(self, seed, seed_time=None, **kwargs):
            if not isinstance(seed, dict) or seed_time is not None:
                raise NotImplementedError("TorchNeighborSampler: heterogeneous, non-temporal sampling only")
            hops = self.num_neighbors.num_hops
            fanouts = self.num_neighbors.get_mapped_values(self.edge_types)
            nodes = {t: [] for t in self.node_types}
            count = dict.fromkeys(self.node_types, 0)
            frontier = {}
            for t in self.node_types:
                ids = seed[t] if t in seed else torch.zeros(0, dtype=torch.int64)  # seeds first, in order
                self._local[t][ids] = torch.arange(len(ids))
                nodes[t].append(ids)
                count[t] = len(ids)
                frontier[t] = ids
            rows, cols, edges = ({r: [] for r in self.to_edge_type} for _ in range(3))
            for hop in range(hops):
                reached = {t: [] for t in self.node_types}
                for rel, edge_type in self.to_edge_type.items():
                    src, _, dst = edge_type
                    k = fanouts[rel][hop] if hop < len(fanouts[rel]) else 0
                    targets = frontier[dst]
                    if k == 0 or not len(targets):
                        continue
                    colptr, row = self.colptr_dict[rel], self.row_dict[rel]
                    starts, counts = colptr[targets], colptr[targets + 1] - colptr[targets]
                    total = int(counts.sum())
                    if not total:
                        continue
                    first = torch.cumsum(counts, 0) - counts
                    owner = torch.repeat_interleave(torch.arange(len(targets)), counts)
                    position = torch.arange(total) - first[owner] + starts[owner]
                    if k > 0 and int(counts.max()) > k:  # k per destination, a uniform random subset
                        order = torch.argsort(owner.double() + torch.rand(total))  # by owner, shuffled within
                        keep = order[torch.arange(total) - first[owner] < k]
                        owner, position = owner[keep], position[keep]
                    src_ids = row[position]
                    new = self._local[src][src_ids] < 0
                    fresh = torch.unique(src_ids[new])
                    self._local[src][fresh] = torch.arange(count[src], count[src] + len(fresh))
                    count[src] += len(fresh)
                    nodes[src].append(fresh)
                    reached[src].append(fresh)
                    rows[rel].append(self._local[src][src_ids])
                    cols[rel].append(self._local[dst][targets[owner]])
                    edges[rel].append(position)
                frontier = {t: torch.cat(v) if v else torch.zeros(0, dtype=torch.int64) for t, v in reached.items()}
            node = {t: torch.cat(v) if v else torch.zeros(0, dtype=torch.int64) for t, v in nodes.items()}
            for t, ids in node.items():
                self._local[t][ids] = -1  # O(batch) reset
            empty = torch.zeros(0, dtype=torch.int64)
            cat = {rel: (torch.cat(v) if v else empty) for rel, v in rows.items()}
            col = {rel: (torch.cat(v) if v else empty) for rel, v in cols.items()}
            edge = {rel: (torch.cat(v) if v else empty) for rel, v in edges.items()}
            remap = self.to_edge_type
            return HeteroSamplerOutput(node=node, row={remap[r]: v for r, v in cat.items()},
                                       col={remap[r]: v for r, v in col.items()},
                                       edge={remap[r]: v for r, v in edge.items()}, batch=None)

    return TorchNeighborSampler


def __getattr__(name):  # the sampler class is made on first use (torch_geometric imported late)
    if name == "TorchNeighborSampler":
        return _torch_sampler_class()
    raise AttributeError(name)


def batch_sizes(batch) -> dict[str, int]:
    """Nodes per type and edges in a sampled HeteroData batch."""
    sizes = {f"pyg_{t}_nodes": int(batch[t].num_nodes) for t in batch.node_types}
    sizes["pyg_edges"] = int(sum(batch[e].edge_index.shape[1] for e in batch.edge_types))
    return sizes
