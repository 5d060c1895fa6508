"""Evidence for automatic templates, printed as tables (issue 4).

    python demos/auto_evidence.py [--seeds 0 1 2 3 4] [--sf 0.1]

1. Mutagenesis: the auto-template vs the hand-written relsql/sql_templates/mutagenesis.sql, same seeds and
   splits as `relsql demo`.
2. The synthetic shop (label two foreign-key hops away, keys not declared): auto-template vs a
   model of the target table alone (hops=0) vs the majority class.
3. TPC-H from the duckdb tpch extension at `--sf`, in DuckDB and copied into a throwaway
   PostgreSQL server: template generation, grounding and one training epoch, timed.
4. `--layers`: only the auto-template's layers (`layer="sage" | "rgcn" | "gat" | "hgt"`) on Mutagenesis
   and the synthetic shop, test accuracy per seed and the mean.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import relsql  # noqa: E402


def majority(model: relsql.Model) -> float:
    positive = float(model.y[torch.as_tensor(model.rows["test"])].mean())
    return max(positive, 1 - positive)


def accuracy(db, template, target: str, seed: int, **fit) -> tuple[float, relsql.Model]:
    model = relsql.Model(db, template, target=target, seed=seed, progress=False).fit(**fit)
    return model.evaluate()["accuracy"], model


def mutagenesis(seeds: list[int]) -> None:
    from relsql.datasets.mutagenesis import load

    db = relsql.connect()
    load(db.con)
    auto = relsql.Template.auto(db, "molecule.mutagenic")
    print("Mutagenesis (test accuracy; 28 test molecules per seed)")
    print(f"{'seed':>4}  {'hand-written':>12}  {'auto':>6}  {'majority':>8}")
    hand_all, auto_all = [], []
    for seed in seeds:
        hand, model = accuracy(db, relsql.sql_templates.path("mutagenesis"), "molecule.mutagenic", seed, epochs=400,
                               lr=0.01, patience=100)
        generated, _ = accuracy(db, auto, "molecule.mutagenic", seed, epochs=400, lr=0.01, patience=100)
        hand_all.append(hand)
        auto_all.append(generated)
        print(f"{seed:>4}  {hand:>12.3f}  {generated:>6.3f}  {majority(model):>8.3f}")
    print(f"{'mean':>4}  {statistics.mean(hand_all):>12.3f}  {statistics.mean(auto_all):>6.3f}\n")


def synthetic(seeds: list[int]) -> None:
    from demos.synthetic import build

    print("Synthetic shop, 2000 customers, churn decided by product quality two hops away, keys inferred")
    print(f"{'seed':>4}  {'auto (2 hops)':>13}  {'target table only':>17}  {'majority':>8}")
    for seed in seeds:
        db = relsql.connect()
        build(db.con, seed=seed, foreign_keys=False)
        auto, model = accuracy(db, relsql.Template.auto(db, "customer.churned", hops=2), "customer.churned", seed,
                               epochs=200, patience=30)
        alone, _ = accuracy(db, relsql.Template.auto(db, "customer.churned", hops=0), "customer.churned", seed,
                            epochs=200, patience=30)
        print(f"{seed:>4}  {auto:>13.3f}  {alone:>17.3f}  {majority(model):>8.3f}")
    print()


def layers(seeds: list[int]) -> None:
    from demos.synthetic import build
    from relsql.datasets.mutagenesis import load

    names = ("sage", "rgcn", "gat", "hgt")
    print("Auto-template layers (test accuracy per seed; majority in the last column)")
    print(f"{'dataset':<12}{'seed':>5}" + "".join(f"{n:>8}" for n in names) + f"{'majority':>10}")
    for dataset in ("mutagenesis", "shop"):
        found = {n: [] for n in names}
        for seed in seeds:
            db = relsql.connect()
            if dataset == "mutagenesis":
                load(db.con)
                target, fit = "molecule.mutagenic", dict(epochs=400, lr=0.01, patience=100)
            else:
                build(db.con, seed=seed, foreign_keys=False)
                target, fit = "customer.churned", dict(epochs=200, patience=30)
            for name in names:
                value, model = accuracy(db, relsql.Template.auto(db, target, layer=name), target, seed, **fit)
                found[name].append(value)
            print(f"{dataset:<12}{seed:>5}" + "".join(f"{found[n][-1]:>8.3f}" for n in names) + f"{majority(model):>10.3f}")
        print(f"{dataset:<12}{'mean':>5}" + "".join(f"{statistics.mean(found[n]):>8.3f}" for n in names))
    print()


def tpch(sf: float) -> None:
    from relsql.datasets import tpch as tpch_data
    from tests.pg_server import PostgresServer, find_bin

    local = relsql.connect()
    started = time.perf_counter()
    tpch_data.generate(local.con, sf=sf)
    print(f"TPC-H sf={sf}: dbgen {time.perf_counter() - started:.1f}s")
    sources = [("DuckDB", local)]
    server = None
    if find_bin() is not None:
        server = PostgresServer.start()
        url = server.createdb(f"tpch_{uuid.uuid4().hex[:8]}")
        started = time.perf_counter()
        tpch_data.copy_to_postgres(local.con, url)
        print(f"copied into PostgreSQL in {time.perf_counter() - started:.1f}s")
        sources.append(("PostgreSQL", relsql.connect(url, read_only=True)))
    try:
        print(f"{'source':>10}  {'target':>24}  {'template':>8}  {'ground':>7}  {'epoch':>6}  {'accuracy':>8}")
        for name, db in sources:
            for target in ("customer.c_mktsegment", "orders.o_orderpriority"):
                started = time.perf_counter()
                template = relsql.Template.auto(db, target, hops=2)
                generated = time.perf_counter() - started
                model = relsql.Model(db, template, target=target, seed=0, progress=False)
                grounded = model.timings["grounding"]
                started = time.perf_counter()
                model.fit(epochs=1)
                epoch = time.perf_counter() - started
                print(f"{name:>10}  {target:>24}  {generated:>7.1f}s  {grounded:>6.1f}s  {epoch:>5.1f}s  "
                      f"{model.evaluate()['accuracy']:>8.3f}")
    finally:
        if server is not None:
            server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--sf", type=float, default=0.1)
    parser.add_argument("--layers", action="store_true", help="only the auto-template layers (sage, rgcn, gat, hgt)")
    args = parser.parse_args()
    if args.layers:
        return layers(args.seeds)
    mutagenesis(args.seeds)
    synthetic(args.seeds[:3])
    tpch(args.sf)


if __name__ == "__main__":
    main()
