"""Per-batch loading time: relsql's grounding store vs PyG's NeighborLoader, same TPC-H graph.

    python -m bench.loader [--scales 0.1 1] [--batch-size 512] [--fanout 128 64] [--batches 20] [--interleaved]
                           [--data out/tpch] [--out out/bench]

Target rows: orders. The neighbourhood, 2 hops: order ← lineitem ← part, and order ← customer.

relsql: `relsql.Model(db, TEMPLATE, target="orders.o_orderstatus", batch_size=B, fanout=...)`
builds the grounding store (every relation grounded once in bulk into CSR arrays); then, per
batch of B random output rows (global row ids 0..output_rows-1, a fresh permutation cut into
batches, as a shuffling loader does), `model.batched.source.ground(rids)` (the store read: the
demand closure, values included) and `model.batched.prepare(rids)` (that read + make_plan, the
batch's vectorized op plan) are timed.

PyG: `HeteroData` from the same columns (bench/tpch_graph.py), `NeighborLoader(data,
num_neighbors=[f1, f2], batch_size=B, input_nodes=("order", None), shuffle=True)`, time per
`next(it)` (sampling + building the sub-HeteroData with its x). Two edge sets, each its own
row: "template" (only the directions the template aggregates over: exactly relsql's computation
tree) and "both" (every foreign key both ways, RDL style: hop 2 also reaches every order of the
batch's customers, more work than relsql does).

How the fan-outs correspond. relsql's `fanout` caps the groundings per head of a grouped rule
(per relation): `{"items_h": f1}` caps the line items averaged per order: hop 1. The hop-2
relation part_h and customer_h are one grounding per head (a line item has one part, an order
one customer): nothing to cap, the same as PyG's hop-2 fan-out f2 ≥ 1 on part ← lineitem. PyG's
num_neighbors=[f1, f2] caps in-edges per destination node per edge type at hop 1 and hop 2.
In TPC-H an order has 1..7 line items, so with f1 ≥ 7 both sides load the full neighbourhood
(no sampling happens); with the "both" edge set, f2 also caps the orders per customer (~10–20).

Each side runs in a fresh subprocess (peak RSS per run); 3 warm-up batches, then the median of
`--batches` (≥ 20). One-time costs: relsql's `model.timings` (grounding = key tables + bulk
grounding into the store; bulk_grounding alone; planning the probe batch) and the whole
`Model(...)` call; PyG's reading of the tables from DuckDB into numpy, building HeteroData, and
constructing the NeighborLoader (its CSC). Writes out/bench/loader.csv. `prepare` is timed
before the store read alone on each batch (a read of the same rows just before warms its pages).

`--interleaved`: only the ratio, robust to other processes' load: one process alternates
relsql's `prepare` and PyG's `next(loader)` (template edges) batch by batch and prints the
medians of wall and thread CPU time with the load average. `--keep-mapped` (with
`--interleaved`): relsql keeps its store's pages mapped between batches whatever the store's size
(by default a store of at most 512 MiB stays mapped whole, as PyG keeps its graph in memory; a
larger one's pages past 128 MiB are handed back and re-faulted); the peak RSS of the process (both
sides) is printed with it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench import peak_rss_mib, write_csv

ROOT = Path(__file__).resolve().parent.parent
THREADS = 2  # torch threads per subprocess (--threads)
WARMUP = 3

# Width 32 everywhere; the hop-1 relation items_h averages an order's line items (each with its
# part's state); the output reads the order's own price and its customer's balance.
TEMPLATE = """
CREATE TABLE part_h AS
SELECT p.p_partkey, tanh(embed(p.p_brand, 32) + linear(features(p.p_size, p.p_retailprice), 32, 'w_part')) AS h
FROM part p;

CREATE TABLE customer_h AS
SELECT c.c_custkey, tanh(linear(features(c.c_acctbal), 32, 'w_customer')) AS h
FROM customer c;

CREATE TABLE items_h AS
SELECT l.l_orderkey AS o_orderkey,
       relu(avg(linear(ph.h, 32, 'w_item_part')
                + linear(features(l.l_quantity, l.l_extendedprice, l.l_discount), 32, 'w_item'))) AS h
FROM lineitem l
JOIN part_h ph ON ph.p_partkey = l.l_partkey
GROUP BY l.l_orderkey;

CREATE TABLE predict AS
SELECT o.o_orderkey,
       linear(relu(linear(ih.h, 32, 'w_o_items') + linear(ch.h, 32, 'w_o_customer')
                   + linear(features(o.o_totalprice), 32, 'w_o')),
              3, 'w_out') AS h
FROM orders o
JOIN items_h ih ON ih.o_orderkey = o.o_orderkey
JOIN customer_h ch ON ch.c_custkey = o.o_custkey;
"""
HOP1 = "items_h"  # the grouped relation: line items per order

COLUMNS = ["sf", "side", "batch_size", "fanout", "per_batch_ms", "ground_ms", "plan_ms", "ratio_vs_pyg_template",
           "ratio_vs_pyg_both", "batch_rows", "one_time_s", "one_time_detail", "peak_rss_mib", "sampler", "batches"]


def wait_for(sf: float, folder: Path, minutes: float = 30) -> Path:
    """The TPC-H file of `sf` (bench.tpch_memory.database_file); waits while another process is
    still generating it (its .partial exists), else generates it."""
    from bench.tpch_memory import database_file

    path = folder / f"sf{sf:g}.duckdb"
    deadline = time.time() + minutes * 60
    while not path.exists() and path.with_suffix(".partial").exists() and time.time() < deadline:
        print(f"  waiting for {path} (being generated)", flush=True)
        time.sleep(20)
    return database_file(sf, folder)


def _median_ms(values: list[float]) -> float:
    return round(statistics.median(values) * 1000, 2)


def run_relsql(path: str, batch_size: int, fanout: list[int], batches: int) -> dict:
    """In this (fresh) process: build the model (store included), then time batches."""
    import warnings

    import numpy as np
    import torch

    import relsql

    torch.set_num_threads(THREADS)
    warnings.simplefilter("ignore")
    db = relsql.connect(path, read_only=True)
    started = time.perf_counter()
    model = relsql.Model(db, relsql.Template.from_sql(TEMPLATE), target="orders.o_orderstatus", seed=0,
                         batch_size=batch_size, fanout={HOP1: fanout[0]}, progress=False, threads=THREADS)
    construct = time.perf_counter() - started
    batched = model.batched
    n = model.output_rows
    rng = np.random.default_rng(0)
    order = rng.permutation(n)
    chunks = [order[i:i + batch_size] for i in range(0, n - batch_size + 1, batch_size)]
    ground, prepare, rows, groundings = [], [], [], []
    for b in range(WARMUP + batches):
        rids = chunks[b % len(chunks)]
        started = time.perf_counter()  # first: its store read is not warmed by one of the same rows just before
        batched.prepare(rids)
        p = time.perf_counter() - started
        started = time.perf_counter()
        grounding = batched.source.ground(rids)
        g = time.perf_counter() - started
        if b >= WARMUP:
            ground.append(g)
            prepare.append(p)
            rows.append({name: r.size for name, r in grounding.relations.items()})
            groundings.append(sum(rule.size for r in grounding.relations.values() for rule in r.rules))
    timings = {k: round(v, 2) for k, v in model.timings.items()}
    plans = getattr(batched, "plans", None)  # relsql/compile/reuse.py: plans recorded once per shape, replayed
    if plans is not None:
        timings.update({f"plans_{k}": v for k, v in plans.stats.items()})
    mean_rows = {name: round(float(np.mean([r[name] for r in rows]))) for name in rows[0]}
    return {"side": "relsql", "per_batch_ms": _median_ms(prepare), "ground_ms": _median_ms(ground),
            "plan_ms": round(_median_ms(prepare) - _median_ms(ground), 2),
            "batch_rows": json.dumps({**mean_rows, "groundings": round(float(np.mean(groundings)))}),
            "one_time_s": round(construct, 2),
            "one_time_detail": json.dumps({"Model()": round(construct, 2), **timings, "output_rows": int(n)}),
            "peak_rss_mib": round(peak_rss_mib(), 1), "sampler": "grounding store (numpy over mmapped CSR)",
            "batches": batches}


def run_pyg(path: str, batch_size: int, fanout: list[int], batches: int, edges: str) -> dict:
    """In this (fresh) process: read the tables, build HeteroData and the loader, time next(it)."""
    import warnings

    import numpy as np
    import torch
    import torch_geometric.data  # noqa: F401  (imported before the clock, as relsql is)
    import torch_geometric.loader  # noqa: F401

    from bench import tpch_graph

    torch.set_num_threads(THREADS)
    warnings.simplefilter("ignore")
    data, _, one_time = tpch_graph.build(path, edges)
    started = time.perf_counter()
    loader = tpch_graph.neighbor_loader(data, fanout, batch_size, ("order", None), shuffle=True)
    one_time["loader_s"] = time.perf_counter() - started
    it = iter(loader)
    times, sizes = [], []
    for b in range(WARMUP + batches):
        started = time.perf_counter()
        try:
            batch = next(it)
        except StopIteration:
            it = iter(loader)
            batch = next(it)
        if b >= WARMUP:
            times.append(time.perf_counter() - started)
            sizes.append(tpch_graph.batch_sizes(batch))
    backend = tpch_graph.sampler_backend()
    mean_sizes = {k: round(float(np.mean([s[k] for s in sizes]))) for k in sizes[0]}
    return {"side": f"pyg ({edges})", "per_batch_ms": _median_ms(times), "ground_ms": "", "plan_ms": "",
            "batch_rows": json.dumps(mean_sizes), "one_time_s": round(sum(one_time.values()), 2),
            "one_time_detail": json.dumps({k: round(v, 2) for k, v in one_time.items()}),
            "peak_rss_mib": round(peak_rss_mib(), 1),
            "sampler": {"pyg-lib": "NeighborLoader (pyg-lib)", "torch-sparse": "NeighborLoader (torch-sparse)",
                        "none": "NeighborLoader + TorchNeighborSampler (no pyg-lib/torch-sparse)"}[backend],
            "batches": batches}


def run_interleaved(path: str, batch_size: int, fanout: list[int], batches: int, keep_mapped: bool = False) -> dict:
    """In this (fresh) process: relsql's `prepare` (store read + plan) and PyG's `next(loader)`
    alternated batch by batch (load from other processes reaches both alike); medians of wall
    and thread CPU time, with the load average. `keep_mapped`: the store's pages stay mapped
    between batches whatever their size (relsql's default keeps a store of at most 512 MiB mapped
    whole, a larger one's pages past 128 MiB are handed back and faulted in again)."""
    import warnings

    import numpy as np
    import torch

    import relsql
    from bench import tpch_graph

    torch.set_num_threads(THREADS)
    warnings.simplefilter("ignore")
    model = relsql.Model(relsql.connect(path, read_only=True), relsql.Template.from_sql(TEMPLATE),
                         target="orders.o_orderstatus", seed=0, batch_size=batch_size, fanout={HOP1: fanout[0]},
                         progress=False, threads=THREADS)
    store = model.batched.grounding_store
    if keep_mapped:
        store.resident_budget = max(store.resident_budget, sum(v["bytes"] for v in store.sizes.values()))
    order = np.random.default_rng(0).permutation(model.output_rows)
    chunks = [order[i:i + batch_size] for i in range(0, len(order) - batch_size + 1, batch_size)]
    data, _, _ = tpch_graph.build(path, "template")
    loader = tpch_graph.neighbor_loader(data, fanout, batch_size, ("order", None), shuffle=True)
    it = iter(loader)

    def pyg() -> None:
        nonlocal it
        try:
            next(it)
        except StopIteration:
            it = iter(loader)
            next(it)

    times: dict[str, list[float]] = {"relsql": [], "pyg": [], "relsql_cpu": [], "pyg_cpu": []}
    for b in range(WARMUP + batches):
        rids = chunks[b % len(chunks)]
        for side in ("relsql", "pyg"):
            wall, cpu = time.perf_counter(), time.thread_time()
            model.batched.prepare(rids) if side == "relsql" else pyg()
            if b >= WARMUP:
                times[side].append(time.perf_counter() - wall)
                times[f"{side}_cpu"].append(time.thread_time() - cpu)
    found = {k: _median_ms(v) for k, v in times.items()}
    return {**found, "ratio": round(found["relsql"] / found["pyg"], 3),
            "ratio_cpu": round(found["relsql_cpu"] / found["pyg_cpu"], 3),
            "plans": dict(model.batched.plans.stats), "load_avg": [round(x, 1) for x in os.getloadavg()],
            "resident_budget_mib": round(store.resident_budget / 2**20, 1), "peak_rss_mib": round(peak_rss_mib(), 1)}


def _subprocess(args: list[str]) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in [str(ROOT), os.environ.get("PYTHONPATH", "")] if p))
    done = subprocess.run([sys.executable, "-m", "bench.loader", *args], cwd=ROOT, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(args[:2])} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> list[dict]:
    global THREADS
    parser = argparse.ArgumentParser(prog="python -m bench.loader", description=__doc__.split("\n\n")[0])
    parser.add_argument("--scales", nargs="*", type=float, default=[0.1, 1])
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--fanout", nargs=2, type=int, default=[128, 64], metavar=("HOP1", "HOP2"),
                        help="relsql: fanout={items_h: HOP1}; PyG: num_neighbors=[HOP1, HOP2] (-1: all)")
    parser.add_argument("--batches", type=int, default=20, help="timed batches per side (after 3 warm-up ones)")
    parser.add_argument("--edges", nargs="*", default=["template", "both"], choices=["template", "both"],
                        help="PyG edge sets to time (see bench/tpch_graph.py)")
    parser.add_argument("--threads", type=int, default=THREADS, help="torch threads in each measured subprocess")
    parser.add_argument("--interleaved", action="store_true",
                        help="only the ratio: relsql's prepare and PyG's next(loader) (template edges) alternated "
                             "batch by batch in one process, wall and thread CPU time")
    parser.add_argument("--keep-mapped", action="store_true",
                        help="with --interleaved: relsql keeps the store's pages mapped between batches whatever its size "
                             "(by default only a store of at most 512 MiB stays mapped whole)")
    parser.add_argument("--data", default=str(ROOT / "out" / "tpch"))
    parser.add_argument("--out", default="out/bench")
    parser.add_argument("--worker", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        THREADS = args.threads
        side, path = args.worker[0], args.worker[1]
        if side == "interleaved":
            result = run_interleaved(path, args.batch_size, args.fanout, args.batches, args.keep_mapped)
        elif side == "relsql":
            result = run_relsql(path, args.batch_size, args.fanout, args.batches)
        else:
            result = run_pyg(path, args.batch_size, args.fanout, args.batches, side.split(":")[1])
        print(json.dumps(result))
        return []

    from bench import tpch_graph

    backend = tpch_graph.sampler_backend()
    print(f"PyG sampling backend: {backend}"
          + ("" if backend != "none" else " (neither pyg-lib nor torch-sparse is importable: PyG's NeighborSampler "
             "raises ImportError; NeighborLoader runs with bench/tpch_graph.py's TorchNeighborSampler instead)"))
    print(f"batch_size {args.batch_size}, fan-out hop1={args.fanout[0]} hop2={args.fanout[1]}, {args.threads} torch threads, "
          f"median of {args.batches} batches after {WARMUP} warm-up")
    rows = []
    for sf in args.scales:
        path = str(wait_for(sf, Path(args.data)))
        common = ["--batch-size", str(args.batch_size), "--fanout", *map(str, args.fanout), "--batches", str(args.batches),
                  "--threads", str(args.threads)]
        if args.interleaved:
            r = _subprocess(["--worker", "interleaved", path, *common, *(["--keep-mapped"] if args.keep_mapped else [])])
            print(f"sf={sf:g} interleaved (ms, median of {args.batches}): relsql prepare {r['relsql']:.2f} "
                  f"(cpu {r['relsql_cpu']:.2f}), PyG next(loader) {r['pyg']:.2f} (cpu {r['pyg_cpu']:.2f}): "
                  f"relsql/PyG {r['ratio']:.3f} (cpu {r['ratio_cpu']:.3f}); "
                  f"plans {r['plans']}; store pages kept mapped up to {r['resident_budget_mib']:,} MiB, peak RSS "
                  f"{r['peak_rss_mib']:,} MiB (both sides); load average {r['load_avg']}", flush=True)
            continue
        results = [_subprocess(["--worker", "relsql", path, *common])]
        results += [_subprocess(["--worker", f"pyg:{edges}", path, *common]) for edges in args.edges]
        pyg = {r["side"]: r["per_batch_ms"] for r in results[1:]}
        for r in results:
            r.update(sf=sf, batch_size=args.batch_size, fanout=f"{args.fanout[0]},{args.fanout[1]}")
            for edges in ("template", "both"):
                base = pyg.get(f"pyg ({edges})")
                r[f"ratio_vs_pyg_{edges}"] = "" if base is None else round(r["per_batch_ms"] / base, 3)
            rows.append({k: r.get(k, "") for k in COLUMNS})
        _print(sf, results)
    if rows:
        write_csv(Path(args.out) / "loader.csv", rows)
    return rows


def _print(sf: float, results: list[dict]) -> None:
    print(f"\nsf={sf:g}: per-batch loading (ms, median)")
    print(f"  {'side':<16} {'per batch':>10} {'ground':>8} {'plan':>8} {'relsql/this':>12} {'peak RSS MiB':>13}  "
          "batch contents (mean)")
    relsql_ms = results[0]["per_batch_ms"]
    for r in results:
        ratio = "" if r["side"] == "relsql" else f"{relsql_ms / r['per_batch_ms']:.2f}"
        print(f"  {r['side']:<16} {r['per_batch_ms']:>10.2f} {str(r['ground_ms']):>8} {str(r['plan_ms']):>8} {ratio:>12} "
              f"{r['peak_rss_mib']:>13,.1f}  {r['batch_rows']}")
    print(f"sf={sf:g}: one-time costs (s)")
    for r in results:
        print(f"  {r['side']:<16} {r['one_time_s']:>10.2f}  {r['one_time_detail']}")
    print(f"  relsql per batch = ground (store read) + plan (replayed per padded shape, or make_plan); PyG per batch = next(it); "
          f"sampler: {results[-1]['sampler']}", flush=True)


if __name__ == "__main__":
    main()
