"""The cost of explaining rows against predicting them (issue #47's target: explaining 1,000 rows
at most 10x predicting them).

    python -m bench.explain_cost [--parents 1000] [--rows N] [--batch-size B] [--reps 3] [--steps auto,8,32]

A synthetic three-table database (parent <- child <- grandchild, the planted signal of
tests/test_explain_counterfactual.py, scaled to --parents target rows), a model trained one epoch
(the cost does not depend on the weights). `--rows N`: the first N target rows only (`id < N`;
every row by default); `--batch-size B`: the model saved and loaded in mini-batches of B rows
(`Model.load(path, db, batch_size=B)`: predict() and explain() ground the rows as batches, from a
grounding store). For each --steps ("auto": the default, as many points as
completeness to 1e-6 needs), `model.explain()` of every target row
and `model.predict()` of the same rows are timed alternately, --reps times, in CPU seconds of this
process (the machine is shared); medians, their ratio, the peak RSS growth and the largest
completeness gap |sum of a row's attributions - (output - baseline)| are printed side by side.
The peak RSS growth is the process's: run one --steps per process to compare memory (e.g. a few
rows of a large database against all of them: it follows the rows explained).
"""

from __future__ import annotations

import argparse
import resource
import statistics
import tempfile
import time
from pathlib import Path

import polars as pl
import torch

import relsql
from tests.test_explain_counterfactual import TABLES, TEMPLATE, _tables


def _database(parents: int) -> relsql.Database:
    rows = _tables(0)
    while len(rows["parent"]) < parents:  # more target rows: the same generator, more seeds, keys shifted
        more = _tables(len(rows["parent"]))
        shift = {t: len(rows[t]) for t in rows}
        rows["parent"] += [(p + shift["parent"], z, y) for p, z, y in more["parent"]]
        rows["child"] += [(c + shift["child"], p + shift["parent"], n) for c, p, n in more["child"]]
        rows["grandchild"] += [(g + shift["grandchild"], c + shift["child"], x, n) for g, c, x, n in more["grandchild"]]
    rows["parent"] = rows["parent"][:parents]
    kept = {p for p, _, _ in rows["parent"]}
    rows["child"] = [r for r in rows["child"] if r[1] in kept]
    children = {c for c, _, _ in rows["child"]}
    rows["grandchild"] = [r for r in rows["grandchild"] if r[1] in children]
    db = relsql.connect()
    for table, columns in TABLES.items():
        db.con.execute(f'CREATE TABLE "{table}" ({columns})')
        db.con.executemany(f'INSERT INTO "{table}" VALUES ({", ".join("?" * len(rows[table][0]))})', rows[table])
    return db


def _cpu(call) -> tuple[float, object]:
    start = time.process_time()
    result = call()
    return time.process_time() - start, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parents", type=int, default=1000)
    parser.add_argument("--epochs", type=int, default=1, help="epochs of training (more: larger weights, more points)")
    parser.add_argument("--rows", type=int, default=None, help="explain and predict the first N target rows only")
    parser.add_argument("--batch-size", type=int, default=None, help="load the model in mini-batches of B rows")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--steps", default="auto,8,32")
    args = parser.parse_args()
    torch.set_num_threads(1)
    db = _database(args.parents)
    model = relsql.Model(db, relsql.Template.from_sql(TEMPLATE), target="parent.y", seed=0, dtype=torch.float64,
                         progress=False).fit(epochs=args.epochs, refit=False)
    if args.batch_size is not None:
        with tempfile.TemporaryDirectory() as folder:
            model.save(Path(folder) / "model.pt")
            model = relsql.Model.load(Path(folder) / "model.pt", db, batch_size=args.batch_size)
    where = None if args.rows is None else f"id < {int(args.rows)}"
    model.predict(where=where)  # warm: the first call builds what both reuse
    asked = args.parents if args.rows is None else min(args.rows, args.parents)
    print(f"{asked} of {args.parents} target rows; CPU seconds, median of {args.reps}")
    print(f"{'steps':>5} {'predict':>9} {'explain':>9} {'ratio':>7} {'rss+MiB':>8} {'max gap':>9}")
    for steps in [None if s == "auto" else int(s) for s in args.steps.split(",")]:
        predicted, explained, gap = [], [], 0.0
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        for _ in range(args.reps):
            predicted.append(_cpu(lambda: model.predict(where=where))[0])
            seconds, frame = _cpu(lambda: model.explain(where=where, steps=steps))  # noqa: B023 - called at once
            explained.append(seconds)
            rows = frame.group_by("id").agg(pl.col("attribution").sum(), pl.col("output").first(), pl.col("baseline").first())
            gap = max(gap, float((rows["attribution"] - (rows["output"] - rows["baseline"])).abs().max()))
        grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss) / 1024
        p, e = statistics.median(predicted), statistics.median(explained)
        print(f"{steps or 'auto':>5} {p:>9.3f} {e:>9.3f} {e / p:>7.1f} {grown:>8.0f} {gap:>9.1e}")


if __name__ == "__main__":
    main()
