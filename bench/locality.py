"""Row renumbering (the reorder_rows pass, reverse Cuthill–McKee) on and off, on large sparse graphs.

    python -m bench.locality [--quick] [--out out/bench] [--models sage,gcn] [--reps 5]

Graphs (one graph in bench.gnn's graph / node / edge tables, features of width 32, edges stored
both ways): a road-like grid lattice (side x side nodes, 4 neighbours) whose node ids are a random
permutation (keys that say nothing about the graph, as hashes or load order), the same grid with
ids row by row (already banded: the pass should decline), and a random graph with as many nodes
and edges. Default side 512: 262,144 nodes, 1,046,528 directed edges each.

For every (model, graph) the template (relsql/sql_templates/sage.sql or relsql/sql_templates/gcn.sql, hidden width 32, the last
conv layer's node embeddings as the output) is grounded once and planned three times: `off`
(RULES without reorder_rows), `on` (RULES: the pass decides by timing) and `forced` (renumbered
whatever the timing says). The outputs of `on` and `forced` are checked against `off`, then one
epoch (forward + backward of a full-graph loss) of each is timed, alternately, `--reps` times;
medians and the ratios off/on and off/forced are printed side by side (above 1: the renumbered
plan is faster), with the machine's load average. CSV + PNG in --out.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import warnings
from pathlib import Path

import numpy as np
import torch

from bench import write_csv
from bench.gnn import Graphs, load_graphs, template_text

THREADS = 2
FEATURES = 32
HIDDEN = 32
OUTPUT = {"sage": "sage2", "gcn": "gcn2"}
COLUMNS = ["model", "graph", "nodes", "edges", "plan_on_s", "fired", "off_ms", "on_ms", "forced_ms",
           "off_over_on", "off_over_forced", "max_rel_diff", "decision", "reps", "loadavg"]


def grid(side: int, scattered: bool, seed: int = 0) -> Graphs:
    """A side x side lattice, each node joined to its 4 neighbours (both directions stored); node ids
    row by row, or a random permutation of them when `scattered`."""
    rng = np.random.default_rng(seed)
    n = side * side
    row, col = np.divmod(np.arange(n), side)
    right, down = np.flatnonzero(col + 1 < side), np.flatnonzero(row + 1 < side)
    src = np.concatenate([right, right + 1, down, down + side])
    dst = np.concatenate([right + 1, right, down + side, down])
    ids = rng.permutation(n) if scattered else np.arange(n)
    return _one_graph(f"grid_{'scattered' if scattered else 'natural'}", rng, ids[src], ids[dst], n)


def random_graph(nodes: int, edges: int, seed: int = 0) -> Graphs:
    """`edges` directed edges between uniformly drawn nodes (no self loops)."""
    rng = np.random.default_rng(seed)
    src = rng.integers(0, nodes, edges)
    dst = (src + 1 + rng.integers(0, nodes - 1, edges)) % nodes
    return _one_graph("random", rng, src, dst, nodes)


def _one_graph(name: str, rng: np.random.Generator, src: np.ndarray, dst: np.ndarray, n: int) -> Graphs:
    return Graphs(name, rng.standard_normal((n, FEATURES)), np.ones(n, dtype=np.int64),
                  np.stack([src + 1, dst + 1], 1).astype(np.int64), np.array([1]))


def graphs(quick: bool) -> list[Graphs]:
    side = 40 if quick else 512
    return [grid(side, True), grid(side, False), random_graph(side * side, 4 * side * (side - 1))]


def _nets(model: str, db, device: str):
    """(off, on, forced) nets from one grounding, and the seconds planning `on` took."""
    from relsql import Template
    from relsql.compile import CompiledNet, make_plan
    from relsql.compile.passes import RULES, reorder_rows
    from relsql.ground.execute import ground

    template = Template.from_sql(template_text(model, HIDDEN))
    grounding = ground(template, db)

    def forced(plan):
        return reorder_rows(plan, force=True)

    variants = {"off": tuple(r for r in RULES if r is not reorder_rows), "on": RULES,
                "forced": tuple(forced if r is reorder_rows else r for r in RULES)}
    nets, plan_on_s = {}, 0.0
    for name, passes in variants.items():
        started = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            plan = make_plan(template, grounding, torch.float32, passes, outputs=[OUTPUT[model]], device=device)
        if name == "on":
            plan_on_s = time.perf_counter() - started
        nets[name] = CompiledNet(plan, grounding, dtype=torch.float32, seed=0).to(device)
    return nets, plan_on_s


def _epoch(net, output: str, device: str) -> float:
    started = time.perf_counter()
    net.zero_grad(set_to_none=True)
    net()[output].square().mean().backward()
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - started


def _log_line(net) -> str:
    return next(line for line in net.plan.log if line.startswith("reorder_rows"))


def run(model: str, data: Graphs, reps: int, device: str) -> dict:
    import relsql

    db = relsql.connect()
    load_graphs(db.con, data)
    nets, plan_on_s = _nets(model, db, device)
    output = OUTPUT[model]
    with torch.no_grad():
        values = {name: net()[output] for name, net in nets.items()}
    scale = values["off"].abs().max().clamp_min(1e-12)
    diff = max(float((values[name] - values["off"]).abs().max() / scale) for name in ("on", "forced"))
    times: dict[str, list[float]] = {name: [] for name in nets}
    for net in nets.values():  # warm-up
        _epoch(net, output, device)
    for _ in range(reps):
        for name, net in nets.items():  # alternated: a busy moment on the machine hits every variant
            times[name].append(_epoch(net, output, device))
    med = {name: statistics.median(t) * 1e3 for name, t in times.items()}
    decision = _log_line(nets["on"])
    return {"model": model, "graph": data.name, "nodes": data.x.shape[0], "edges": data.edges.shape[0],
            "plan_on_s": round(plan_on_s, 2), "fired": int(decision.startswith("reorder_rows: 1 ")),
            "off_ms": round(med["off"], 2), "on_ms": round(med["on"], 2), "forced_ms": round(med["forced"], 2),
            "off_over_on": round(med["off"] / med["on"], 3), "off_over_forced": round(med["off"] / med["forced"], 3),
            "max_rel_diff": diff, "decision": decision.removeprefix("reorder_rows: "), "reps": reps,
            "loadavg": " ".join(Path("/proc/loadavg").read_text().split()[:3]) if Path("/proc/loadavg").exists() else ""}


def plot(rows: list[dict], path: Path) -> None:
    """Bars of off/on and off/forced epoch time per row (above 1: renumbering is faster)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = np.arange(len(rows))
    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(rows) + 2), 5))
    ax.bar(xs - 0.2, [r["off_over_on"] for r in rows], 0.4, label="pass on (decided by timing)")
    ax.bar(xs + 0.2, [r["off_over_forced"] for r in rows], 0.4, label="forced on")
    ax.axhline(1.0, color="gray", linewidth=0.8)
    ax.set_ylabel("epoch time without / with renumbering (higher is better)")
    ax.set_xticks(xs, [f"{r['model']}\n{r['graph']}" for r in rows], fontsize=8)
    ax.set_title("reorder_rows (RCM): forward + backward epoch", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a 40 x 40 grid and a random graph of its size")
    parser.add_argument("--out", default="out/bench")
    parser.add_argument("--models", default="sage,gcn")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    torch.set_num_threads(THREADS)
    print(f"torch.set_num_threads({THREADS}); device {args.device}; load average before: "
          f"{open('/proc/loadavg').read().strip() if os.path.exists('/proc/loadavg') else 'n/a'}")
    rows = []
    header = (f"{'model':<6}{'graph':<16}{'edges':>10}{'off ms':>10}{'on ms':>10}{'forced ms':>11}{'off/on':>8}"
              f"{'off/forced':>11}  decision")
    print(header)
    for data in graphs(args.quick):
        for model in args.models.split(","):
            row = run(model, data, args.reps, args.device)
            rows.append(row)
            print(f"{row['model']:<6}{row['graph']:<16}{row['edges']:>10}{row['off_ms']:>10.1f}{row['on_ms']:>10.1f}"
                  f"{row['forced_ms']:>11.1f}{row['off_over_on']:>8.2f}{row['off_over_forced']:>11.2f}  {row['decision']}",
                  flush=True)
            if row["max_rel_diff"] > 1e-4:
                raise SystemExit(f"{model} on {data.name}: the renumbered plan deviates by {row['max_rel_diff']:.2e}")
    out = Path(args.out)
    write_csv(out / "locality.csv", rows)
    plot(rows, out / "locality.png")
    print(f"load average after: {open('/proc/loadavg').read().strip() if os.path.exists('/proc/loadavg') else 'n/a'}")


if __name__ == "__main__":
    main()
