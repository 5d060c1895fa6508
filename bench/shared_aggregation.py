"""Shared partial aggregation (HAG) before/after: stored entries and epoch time, in one run.

    python -m bench.shared_aggregation [--quick] [--scale 1.0] [--rounds 7]

Seeded graphs (self loops added, edges deduplicated, both directions):
  bipartite     users of a user-item graph with power-law item popularity, projected (two users
                are neighbours when they rated the same item: every item is a clique of its raters)
  hubs          preferential attachment (Barabási-Albert, 5 links per new node): hubs many heads read
  collaboration papers of 2-10 authors (power-law productivity), each paper a clique of its authors
  no_overlap    a random tree: no two nodes have two common neighbours

Per graph and aggregation (sage-style avg, GCN-normalized sum), a 2-layer template is compiled
three times: without the pass (`off`), with RULES as they are (`on`: the pass decides by timing
and may decline), and with the pass forced (`forced`: it factors wherever its greedy saves
entries). For each plan it prints the stored entries of the sparse products the plan runs (one
per row added: the aggregations), the greedy's time, and the median epoch time (forward +
backward, float32) over alternating rounds, with ratios off/on and off/forced side by side.
Values of the three plans are checked to agree. Timings are only meaningful on an otherwise
idle machine; the load average is printed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import numpy as np
import pyarrow as pa
import torch

from relsql.datasets.tu_format import list_column

THREADS = 2
FEATURES = 32
HIDDEN = 32

Graph = tuple[str, int, np.ndarray, np.ndarray]  # name, nodes, src, dst (0-based, undirected once)


def _cliques(groups: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Every pair of members of each group, once per direction."""
    src, dst = [], []
    for g in groups:
        i, j = np.triu_indices(len(g), 1)
        src.append(g[i])
        dst.append(g[j])
    return (np.concatenate(src), np.concatenate(dst)) if src else (np.zeros(0, np.int64), np.zeros(0, np.int64))


def bipartite(scale: float, seed: int = 0) -> Graph:
    rng = np.random.default_rng(seed)
    users, items = int(20_000 * scale) + 40, int(3_000 * scale) + 10
    popularity = 1.0 / (np.arange(items) + 5.0)
    rated = [rng.choice(items, 3, replace=False, p=popularity / popularity.sum()) for _ in range(users)]
    raters: dict[int, list[int]] = {}
    for user, its in enumerate(rated):
        for item in its:
            raters.setdefault(int(item), []).append(user)
    groups = [np.array(r[:40]) for r in raters.values() if len(r) >= 2]  # the 40 first raters of an item
    return ("bipartite", users, *_cliques(groups))


def hubs(scale: float, seed: int = 0) -> Graph:
    rng = np.random.default_rng(seed)
    n, m = int(50_000 * scale) + 20, 5
    targets = list(range(m))
    ends: list[int] = []
    src, dst = [], []
    for node in range(m, n):
        chosen = set(targets) if node == m else set()
        while len(chosen) < m:
            chosen.add(ends[rng.integers(len(ends))])
        for t in chosen:
            src.append(node)
            dst.append(t)
            ends += [node, t]
    return ("hubs", n, np.array(src), np.array(dst))


def collaboration(scale: float, seed: int = 0) -> Graph:
    rng = np.random.default_rng(seed)
    authors, papers = int(30_000 * scale) + 20, int(15_000 * scale) + 5
    productivity = 1.0 / (np.arange(authors) + 20.0) ** 0.8
    p = productivity / productivity.sum()
    groups = [rng.choice(authors, int(rng.integers(2, 11)), replace=False, p=p) for _ in range(papers)]
    return ("collaboration", authors, *_cliques(groups))


def no_overlap(scale: float, seed: int = 0) -> Graph:
    rng = np.random.default_rng(seed)
    n = int(50_000 * scale) + 20
    child = np.arange(1, n)
    return ("no_overlap", n, (rng.random(n - 1) * child).astype(np.int64), child)


GRAPHS: dict[str, Callable[..., Graph]] = {"bipartite": bipartite, "hubs": hubs, "collaboration": collaboration,
                                           "no_overlap": no_overlap}


def load(graph: Graph, features: int | None = None, seed: int = 0):
    """A relsql database with node(node_id, x) and edge(src, dst, w): both directions, one self loop
    per node, duplicates dropped; w = 1/sqrt(deg(src)·deg(dst)) (GCN's normalization)."""
    import relsql

    _, n, src, dst = graph
    both = np.unique(np.stack([np.r_[src, dst, np.arange(n)], np.r_[dst, src, np.arange(n)]], 1), axis=0)
    degree = np.bincount(both[:, 1], minlength=n).astype(np.float64)
    w = 1.0 / np.sqrt(degree[both[:, 0]] * degree[both[:, 1]])
    width = features or 6
    x = np.random.default_rng(seed).standard_normal((n, width))
    db = relsql.connect()
    node = pa.table({"node_id": np.arange(n), "x": list_column(x)})
    edge = pa.table({"src": both[:, 0], "dst": both[:, 1], "w": w})
    for name, table in (("node", node), ("edge", edge)):
        db.con.register(f"__{name}", table)
        db.con.execute(f"CREATE TABLE {name} AS SELECT * FROM __{name}")
        db.con.unregister(f"__{name}")
    return db


def template(kind: str, hidden: int = HIDDEN, layers: int = 2) -> str:
    """`layers` neighbour aggregations: avg (SAGE's mean), sum, or gcn (sum of w · message)."""
    message = {"avg": "avg(linear({h}, {d}, '{w}'))", "sum": "sum(linear({h}, {d}, '{w}'))",
               "gcn": "sum(e.w * linear({h}, {d}, '{w}'))"}[kind]
    text = ["CREATE TABLE layer0 AS SELECT n.node_id, n.x AS h FROM node n;"]
    for k in range(1, layers + 1):
        body = message.format(h="l.h", d=hidden, w=f"w{k}")
        value = f"relu({body} + bias({hidden}, 'b{k}'))" if k < layers else body
        text.append(f"CREATE TABLE layer{k} AS SELECT e.dst AS node_id, {value} AS h FROM edge e "
                    f"JOIN layer{k - 1} l ON l.node_id = e.src GROUP BY e.dst;")
    return "\n".join(text)


def stored_entries(net) -> int:
    """Entries of every sparse product the plan runs (not the transposes kept for the backward)."""
    plan, total = net.plan, 0
    for op in plan.ops:
        at = {"spmm": 0, "addspmm": 1}.get(op.kind)
        if at is not None and op.args[at] in plan.inputs:
            m = plan.inputs[op.args[at]]
            total += int(m.values().numel()) if m.layout == torch.sparse_csr else int(torch.count_nonzero(m))
    return total


def _epoch(net, weights: torch.Tensor | None) -> Callable[[], None]:
    def step() -> None:
        for p in net.parameters():
            p.grad = None
        out = net()["layer2"]
        (out * weights).sum().backward()
    return step


def _mean_ms(step: Callable[[], None], budget: float = 0.05) -> float:
    """Mean milliseconds of `step` over a short time budget (one round; rounds give the median)."""
    started, runs = time.perf_counter(), 0
    while runs == 0 or time.perf_counter() - started < budget:
        step()
        runs += 1
    return (time.perf_counter() - started) / runs * 1e3


def main(argv: list[str] | None = None) -> list[dict]:
    import relsql
    from relsql.compile.passes import RULES, shared_aggregation

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small graphs, few rounds (a smoke test)")
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--graphs", nargs="*", default=list(GRAPHS))
    parser.add_argument("--kinds", nargs="*", default=["avg", "gcn"])
    args = parser.parse_args(argv)
    scale, rounds = (0.05, 2) if args.quick else (args.scale, args.rounds)
    torch.set_num_threads(THREADS)
    print(f"torch.set_num_threads({THREADS}); load average before: {open('/proc/loadavg').read().split()[:3]}")

    def forced(plan):
        return shared_aggregation(plan, force=True)

    plans = {"off": tuple(r for r in RULES if r is not shared_aggregation), "on": RULES,
             "forced": tuple(forced if r is shared_aggregation else r for r in RULES)}
    rows = []
    header = (f"{'graph':<14}{'agg':<5}{'nodes':>8}{'edges':>9} | {'entries off':>11}{'on':>9}{'forced':>9}{'ratio':>7} | "
              f"{'pass s':>7} | {'epoch ms off':>12}{'on':>8}{'forced':>8} | {'off/on':>6}{'off/forced':>11} | max diff")
    print(header)
    for name in args.graphs:
        graph = GRAPHS[name](scale, seed=0)
        db = load(graph, FEATURES)
        edges = db.con.execute("SELECT count(*) FROM edge").fetchone()[0]
        for kind in args.kinds:
            tpl = relsql.Template.from_sql(template(kind, HIDDEN, 2))
            nets, planned = {}, {}
            for label, passes in plans.items():
                started = time.perf_counter()
                nets[label] = relsql.compile(tpl, db, seed=3, passes=passes, outputs=["layer2"])
                planned[label] = time.perf_counter() - started
            weights = 1 + torch.arange(nets["off"]()["layer2"].numel()).reshape(nets["off"]()["layer2"].shape) % 3
            steps = {label: _epoch(net, weights.float()) for label, net in nets.items()}
            reference = nets["off"]()["layer2"].detach()
            diff = max(float((nets[k]()["layer2"].detach() - reference).abs().max() / reference.abs().max())
                       for k in ("on", "forced"))
            for step in steps.values():
                step()
            times: dict[str, list[float]] = {label: [] for label in nets}
            for r in range(rounds):  # alternating, the order rotated each round
                labels = list(nets)[r % 3:] + list(nets)[: r % 3]
                for label in labels:
                    times[label].append(_mean_ms(steps[label]))
            ms = {label: statistics.median(t) for label, t in times.items()}
            entries = {label: stored_entries(net) for label, net in nets.items()}
            row = {"graph": name, "agg": kind, "nodes": graph[1], "edges": edges,
                   **{f"entries_{k}": v for k, v in entries.items()},
                   "pass_s": planned["forced"] - planned["off"], **{f"ms_{k}": v for k, v in ms.items()}, "max_rel_diff": diff,
                   "fired": "shared_aggregation: 0 " not in nets["on"].explain()}
            rows.append(row)
            print(f"{name:<14}{kind:<5}{graph[1]:>8}{edges:>9} | {entries['off']:>11}{entries['on']:>9}{entries['forced']:>9}"
                  f"{entries['off'] / entries['forced']:>7.2f} | {row['pass_s']:>7.2f} | {ms['off']:>12.2f}{ms['on']:>8.2f}"
                  f"{ms['forced']:>8.2f} | {ms['off'] / ms['on']:>6.2f}{ms['off'] / ms['forced']:>11.2f} | {diff:.1e}",
                  flush=True)
    print(f"load average after: {open('/proc/loadavg').read().split()[:3]} (cores: {os.cpu_count()})")
    return rows


if __name__ == "__main__":
    main()
