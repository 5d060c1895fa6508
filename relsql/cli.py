"""`relsql` command line: explain a template's compiled plan, run the embedded demo."""

from __future__ import annotations

import argparse
import sys
import time
import warnings

import torch

import relsql
from relsql.errors import RelsqlError


def _explain(args: argparse.Namespace) -> int:
    db = relsql.connect(args.db, read_only=True)
    template = relsql.Template.from_file(args.template)
    started = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        net = relsql.compile(template, db)
    print(f"-- grounded and compiled in {time.perf_counter() - started:.2f}s")
    print(net.explain())
    return 0


def _demo(args: argparse.Namespace) -> int:
    """Mutagenesis on the embedded DuckDB: import, ground, compile, explain, a few steps."""
    from connectors.neuralogic_files import load_builtin

    db = relsql.connect(args.db) if args.db else relsql.connect()
    started = time.perf_counter()
    dataset = load_builtin(db.con, "mutagenesis")
    counts = ", ".join(f"{t} {n}" for t, n in sorted(dataset.tables.items()) if t in ("bond", "query_predict", "c", "o"))
    print(f"imported Mutagenesis from the neuralogic wheel into {db.description} ({counts}) in {time.perf_counter() - started:.2f}s")
    template = relsql.Template.from_file(dataset.template)
    started = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        net = relsql.compile(template, db, seed=0)
    print(f"grounded in DuckDB and compiled in {time.perf_counter() - started:.2f}s; the plan:")
    print(net.explain())
    targets = db.arrow('SELECT sample, target FROM "query_predict" ORDER BY sample')
    target = torch.tensor(targets.column("target").to_pylist(), dtype=torch.float32).reshape(-1, 1)
    rows = torch.tensor(targets.column("sample").to_pylist())
    optimizer = torch.optim.Adam(net.parameters(), lr=args.lr)
    started = time.perf_counter()
    for step in range(args.steps):
        optimizer.zero_grad()
        output = net()["predict"].index_select(0, rows)
        loss = ((output - target) ** 2).mean()
        loss.backward()
        optimizer.step()
        if step % max(args.steps // 5, 1) == 0 or step == args.steps - 1:
            accuracy = ((output.detach() > 0.5) == (target > 0.5)).float().mean().item()
            print(f"step {step:3d}  mse {loss.item():.4f}  training accuracy {accuracy:.3f}")
    print(f"{args.steps} full-batch steps in {time.perf_counter() - started:.2f}s")
    print(net.values("predict").head(5))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="relsql", description="Deep relational learning on a relational database.")
    commands = parser.add_subparsers(dest="command", required=True)
    explain = commands.add_parser("explain", help="ground a template and print its compiled plan with sizes")
    explain.add_argument("db", help="a .duckdb file")
    explain.add_argument("--template", required=True, help="a .sql template or a NeuraLogic Datalog file")
    explain.set_defaults(run=_explain)
    demo = commands.add_parser("demo", help="Mutagenesis on the embedded DuckDB: ground, compile, train a few steps")
    demo.add_argument("--db", help="write the demo database to this .duckdb file instead of memory")
    demo.add_argument("--steps", type=int, default=300, help="training steps (default 300)")
    demo.add_argument("--lr", type=float, default=0.05, help="Adam learning rate (default 0.05)")
    demo.set_defaults(run=_demo)
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except RelsqlError as err:
        print(f"relsql: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
