"""Memory bounded by the batch, not by the database: one training epoch on TPC-H at two scale factors.

    python -m bench.tpch_memory [--scales 1 10] [--template auto|customer] [--no-store]
                                [--batch-size 16384] [--memory-limit 256MB] [--out out/bench]

For each scale factor the TPC-H tables are generated once with DuckDB's tpch extension into
`out/tpch/sf<N>.duckdb` (kept for later runs). Then, in a fresh process per scale factor, a
`relsql.Model` with `batch_size` trains one epoch on the file opened read-only, with DuckDB's
memory capped by `relsql.connect(..., memory_limit=...)`. Templates:

- `auto` (default): `Template.auto(db, "orders.o_orderpriority")`, an orders-level target
  (5 classes; dbgen draws it at random, so accuracy is chance and is not the point), 2 hops:
  line items, their parts and suppliers, the customer and its nation, keyed per target order.
- `customer`: the hand-written customer-level template below (`customer.c_mktsegment`).

With the grounding store (default) every relation is grounded once in bulk and each batch reads
its rows' groundings from the store; `--no-store` grounds every batch in DuckDB instead (the
earlier way, for comparison). Reported per scale factor: rows, the peak resident memory of the
process (VmHWM), also per phase (setup; the epoch, with the batch process's own pages:
bench.TreeMemory), the setup time (key tables; bulk grounding into the store), the epoch's wall
time and the part of it spent waiting on the database (store reads and batch planning run in the
background worker and count there only when training waits for them). Targets: epoch time and
peak RSS at the largest scale / the smallest <= 12 and <= 1.5 for 10x the data.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from bench import TreeMemory, peak_rss_mib, write_csv

ROOT = Path(__file__).resolve().parent.parent
GENERATE_MEMORY = os.environ.get("RELSQL_BENCH_GENERATE_MEMORY", "8GB")  # DuckDB memory_limit while generating TPC-H

TEMPLATE = """
-- an order: its line items (averaged) and its own total price
CREATE TABLE order_h AS
SELECT l.l_orderkey AS o_orderkey,
       avg(linear(features(l.l_quantity, l.l_extendedprice, l.l_discount, l.l_tax), 8, 'w_item')) AS h
FROM lineitem l
GROUP BY l.l_orderkey;

CREATE TABLE order_h AS
SELECT o.o_orderkey, linear(features(o.o_totalprice), 8, 'w_order') AS h
FROM orders o;

-- a customer: its orders (averaged) and its own account balance
CREATE TABLE customer_h AS
SELECT o.o_custkey AS c_custkey, avg(linear(tanh(oh.h), 8, 'w_orders')) AS h
FROM orders o
JOIN order_h oh ON oh.o_orderkey = o.o_orderkey
GROUP BY o.o_custkey;

CREATE TABLE customer_h AS
SELECT c.c_custkey, linear(features(c.c_acctbal), 8, 'w_customer') AS h
FROM customer c;

CREATE TABLE predict AS
SELECT c.c_custkey, linear(tanh(ch.h), 5, 'w_out') AS h
FROM customer c
JOIN customer_h ch ON ch.c_custkey = c.c_custkey;
"""


def database_file(sf: float, folder: Path) -> Path:
    """The TPC-H DuckDB file of scale factor `sf`, generated on first use."""
    import duckdb

    from relsql.datasets import tpch

    path = folder / f"sf{sf:g}.duckdb"
    if path.exists():
        return path
    folder.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    partial.unlink(missing_ok=True)
    started = time.perf_counter()
    # dbgen holds the whole scale factor in one transaction: cap DuckDB's memory so that sf 10 spills
    # to disk instead of taking the shared machine's RAM (DuckDB's default is 80 % of it).
    con = duckdb.connect(str(partial), config={"memory_limit": GENERATE_MEMORY, "threads": 2})
    try:
        rows = tpch.generate(con, sf=sf)
    finally:
        con.close()
    os.replace(partial, path)
    print(f"  generated TPC-H sf={sf:g} in {time.perf_counter() - started:.0f} s: {rows}", flush=True)
    return path


TARGETS = {"auto": "orders.o_orderpriority", "customer": "customer.c_mktsegment"}
# DuckDB's plan estimate for the auto template's lineitem <- part/supplier rules (two equalities per
# join) is about 40x the true count (253,788,036 at sf 1 for 6,001,215 groundings), past relsql's
# default max_groundings (10^8): the limit is raised here so that the estimate does not refuse them.
MAX_GROUNDINGS = 10**11


def one_epoch(path: str, batch_size: int, memory_limit: str, template: str = "customer", store: bool = True,
              threads: int = 2) -> dict:
    """In this (fresh) process: set up a batched model on `path` and train one epoch."""
    import warnings

    import torch

    import relsql

    torch.set_num_threads(threads)
    warnings.simplefilter("ignore")
    db = relsql.connect(path, read_only=True, memory_limit=memory_limit)
    phases = {}
    reset_peak()
    started = time.perf_counter()
    target = TARGETS[template]
    chosen = relsql.Template.auto(db, target) if template == "auto" else relsql.Template.from_sql(TEMPLATE)
    model = relsql.Model(db, chosen, target=target, seed=0, batch_size=batch_size, progress=False, store=store,
                         max_groundings=MAX_GROUNDINGS)
    setup = time.perf_counter() - started
    phases["peak_setup_mib"] = round(peak_rss_mib(), 1)
    reset_peak()
    store_mib = (sum(f.stat().st_size for f in model.batched.grounding_store.folder.rglob("*") if f.is_file()) / 2**20
                 if store else 0.0)  # the store's files sit in a build folder below its own
    started = time.perf_counter()
    memory = TreeMemory()  # the epoch's batch process counts too
    model.fit(epochs=1)
    epoch = time.perf_counter() - started
    phases["peak_epoch_mib"] = round(memory.stop(), 1)
    return {"rows": model.output_rows, "setup_s": round(setup, 1),
            "bulk_grounding_s": round(model.timings.get("bulk_grounding", 0.0), 1),
            "store_mib": round(store_mib, 1), "epoch_s": round(epoch, 1),
            "waiting_on_database_s": round(model.timings["waiting_on_database"], 1),
            "val_accuracy": round(model.history[-1].get("val_accuracy", float("nan")), 3),
            "peak_rss_mib": max(phases.values()), **phases, **resident_split_mib()}


def reset_peak() -> None:
    """Start VmHWM afresh (Linux: /proc/self/clear_refs, "5"), so each phase's peak is its own:
    the setup (key tables and the store's bulk grounding) and the epoch peak at different times,
    and for different reasons. Elsewhere the phases share one peak."""
    try:
        with open("/proc/self/clear_refs", "w") as clear:
            clear.write("5")
    except OSError:
        pass


def resident_split_mib() -> dict[str, float]:
    """Resident memory now, anonymous (the process's own) vs file-backed (mapped store files and
    libraries: page cache the kernel can drop), from /proc/self/status; VmHWM counts both."""
    wanted = {"RssAnon:": "rss_anon_mib_end", "RssFile:": "rss_file_mib_end"}
    found = {}
    with open("/proc/self/status") as status:
        for line in status:
            name = line.split()[0] if line.strip() else ""
            if name in wanted:
                found[wanted[name]] = round(int(line.split()[1]) / 1024, 1)
    return found


def _load() -> str:
    """The 1, 5 and 15 minute load averages (the machine is shared: printed with every figure)."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(prog="python -m bench.tpch_memory", description=__doc__.split("\n\n")[0])
    parser.add_argument("--scales", nargs="*", type=float, default=[1, 10])
    parser.add_argument("--batch-size", type=int, default=16384)
    parser.add_argument("--memory-limit", default="256MB", help="DuckDB's memory_limit for the training process")
    parser.add_argument("--template", choices=sorted(TARGETS), default="auto", help="auto (orders-level, default) or customer")
    parser.add_argument("--threads", type=int, default=2,
                        help="torch threads in the training process (1 on a machine shared with other jobs: 2 threads on "
                             "2 busy cores wait on each other)")
    parser.add_argument("--no-store", action="store_true",
                        help="ground every batch in DuckDB instead of reading a grounding store")
    parser.add_argument("--data", default=str(ROOT / "out" / "tpch"), help="where the generated DuckDB files are kept")
    parser.add_argument("--out", default="out/bench")
    parser.add_argument("--one-epoch", nargs=6, metavar=("PATH", "BATCH", "LIMIT", "TEMPLATE", "STORE", "THREADS"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one_epoch:
        path, batch, limit, template, store, threads = args.one_epoch
        print(json.dumps(one_epoch(path, int(batch), limit, template, store == "store", int(threads))))
        return []

    rows = []
    mode = "per-batch grounding in DuckDB" if args.no_store else "grounding store"
    print(f"one epoch of the {args.template} template ({TARGETS[args.template]}), {mode}, batch_size {args.batch_size}, "
          f"DuckDB memory_limit {args.memory_limit}, {args.threads} torch threads; load average {_load()}")
    for sf in args.scales:
        path = database_file(sf, Path(args.data))
        command = [sys.executable, "-m", "bench.tpch_memory", "--one-epoch", str(path), str(args.batch_size), args.memory_limit,
                   args.template, "none" if args.no_store else "store", str(args.threads)]
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
        if done.returncode != 0:
            raise SystemExit(f"sf={sf:g} failed:\n{done.stderr[-3000:]}")
        row = {"sf": sf, "file_mib": round(path.stat().st_size / 2**20, 1), **json.loads(done.stdout.strip().splitlines()[-1])}
        rows.append(row)
        print(f"  sf={sf:g}: {row['rows']:,} target rows, file {row['file_mib']:,} MiB, setup {row['setup_s']} s "
              f"(bulk grounding {row['bulk_grounding_s']} s, store {row['store_mib']:,} MiB), "
              f"epoch {row['epoch_s']} s (waiting on the database {row['waiting_on_database_s']} s), "
              f"peak RSS {row['peak_rss_mib']:,} MiB (setup {row['peak_setup_mib']:,}, epoch {row['peak_epoch_mib']:,}; "
              f"after the epoch: anonymous {row.get('rss_anon_mib_end', '?')} MiB, "
              f"file-backed {row.get('rss_file_mib_end', '?')} MiB); load average {_load()}", flush=True)
    if len(rows) > 1:
        data = rows[-1]["file_mib"] / rows[0]["file_mib"]
        print(f"sf={rows[-1]['sf']:g} / sf={rows[0]['sf']:g} for {data:.1f}x the data: "
              f"epoch time {rows[-1]['epoch_s'] / rows[0]['epoch_s']:.2f} (target <= 12), "
              f"peak RSS {rows[-1]['peak_rss_mib'] / rows[0]['peak_rss_mib']:.2f} (target <= 1.5)")
    write_csv(Path(args.out) / f"tpch_memory_{args.template}{'_nostore' if args.no_store else ''}.csv", rows)
    return rows


if __name__ == "__main__":
    main()
