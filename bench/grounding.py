"""Grounding throughput in DuckDB, and where an epoch's time goes (database vs torch).

    python -m bench.grounding [--groundings 10000000] [--nodes 1000000] [--width 16] [--out out/bench]

A seeded random graph is written to an in-memory DuckDB: `node(node_id, x DOUBLE[4])` and
`edge(src, dst)` with --groundings rows. The template's message-passing rule

    CREATE TABLE agg AS SELECT e.dst AS node_id, avg(linear(n.h, W)) ... FROM edge e JOIN node_h n ...

has one grounding per edge row. Reported:

* grounding: wall time of each relation's grounding (the SQL joins, the key table, the index
  columns to Arrow and torch), and the groundings per second of the big rule;
* planning: building and optimizing the plan from those index tensors (torch, no database);
* one epoch from scratch = grounding + planning + one full-batch training step (forward,
  backward, Adam), and the share of it spent in the database vs in torch; later epochs reuse
  the grounding, so their database share is 0 in full-batch training.

Results: a printed table and `grounding.csv` in --out.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch

from bench import write_csv

TEMPLATE = """
CREATE TABLE node_h AS
SELECT n.node_id, tanh(linear(n.x, {width}, 'w_in')) AS h
FROM node n;

CREATE TABLE agg AS
SELECT e.dst AS node_id, relu(avg(linear(n.h, {width}, 'w_msg'))) AS h
FROM edge e
JOIN node_h n ON n.node_id = e.src
GROUP BY e.dst;

CREATE TABLE score AS
SELECT a.node_id, linear(a.h, 1, 'w_out') AS h
FROM agg a;
"""


def build(con, nodes: int, groundings: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((nodes, 4))
    offsets = pa.array(np.arange(nodes + 1, dtype=np.int32) * 4, type=pa.int32())
    node = pa.table({"node_id": np.arange(nodes, dtype=np.int64),
                     "x": pa.ListArray.from_arrays(offsets, pa.array(x.reshape(-1)))})
    edge = pa.table({"src": rng.integers(0, nodes, groundings), "dst": rng.integers(0, nodes, groundings)})
    for name, table in (("node", node), ("edge", edge)):
        con.register(f"_bench_{name}", table)
        con.execute(f"CREATE TABLE {name} AS SELECT * FROM _bench_{name}")
        con.unregister(f"_bench_{name}")


def main(argv: list[str] | None = None) -> dict:
    import relsql
    from relsql.compile import make_plan
    from relsql.compile.module import CompiledNet
    from relsql.ground.execute import ground

    parser = argparse.ArgumentParser(prog="python -m bench.grounding", description=__doc__.split("\n\n")[0])
    parser.add_argument("--groundings", type=int, default=10_000_000)
    parser.add_argument("--nodes", type=int, default=1_000_000)
    parser.add_argument("--width", type=int, default=16)
    parser.add_argument("--out", default="out/bench")
    args = parser.parse_args(argv)
    torch.set_num_threads(2)

    db = relsql.connect()
    started = time.perf_counter()
    build(db.con, args.nodes, args.groundings)
    print(f"data: {args.nodes:,} nodes, {args.groundings:,} edges (= groundings of `agg`), "
          f"written in {time.perf_counter() - started:.1f} s; load average {os.getloadavg()[0]:.2f}")

    template = relsql.Template.from_sql(TEMPLATE.format(width=args.width))
    started = time.perf_counter()
    grounding = ground(template, db, progress=False)
    db_s = time.perf_counter() - started
    started = time.perf_counter()
    net = CompiledNet(make_plan(template, grounding, torch.float32), grounding, dtype=torch.float32, seed=0)
    plan_s = time.perf_counter() - started
    optimizer = torch.optim.Adam(net.parameters(), lr=0.01)
    target = torch.zeros(grounding.relations["score"].size, 1)
    started = time.perf_counter()
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(net()["score"], target)
    loss.backward()
    optimizer.step()
    step_s = time.perf_counter() - started

    big = grounding.relations["agg"].rules[0].size
    rate = big / grounding.seconds["agg"]
    epoch = db_s + plan_s + step_s
    row = {
        "groundings": big, "nodes": args.nodes, "width": args.width,
        "ground_node_h_s": round(grounding.seconds["node_h"], 3), "ground_agg_s": round(grounding.seconds["agg"], 3),
        "ground_score_s": round(grounding.seconds["score"], 3), "ground_total_s": round(db_s, 3),
        "groundings_per_s": round(rate), "plan_s": round(plan_s, 3), "step_s": round(step_s, 3),
        "db_share": round(db_s / epoch, 3), "torch_share": round((plan_s + step_s) / epoch, 3),
    }
    print(f"grounding: node_h {row['ground_node_h_s']} s, agg {row['ground_agg_s']} s "
          f"({big:,} groundings: {rate / 1e6:.2f} M groundings/s), score {row['ground_score_s']} s")
    print(f"plan + optimizer passes (torch): {plan_s:.2f} s; one full-batch training step (torch): {step_s:.2f} s")
    print(f"first epoch {epoch:.2f} s: database {100 * row['db_share']:.0f}%, torch {100 * row['torch_share']:.0f}% "
          "(later full-batch epochs: torch only)")
    print(net.explain().splitlines()[-1])
    write_csv(Path(args.out) / "grounding.csv", [row])
    return row


if __name__ == "__main__":
    main()
