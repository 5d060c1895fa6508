"""Diagnostic: relsql's ranking with the towers' dot product scaled by alpha beside the timed relation (issue #30).

    python -m bench.recommend_blend [--datasets tpcds shop] [--seeds 0 1 2] [--fit '{}'] [--alphas 0 0.25 0.5 1]

For each fitted model, validation and test MAP@10 when the query tower's own columns (not the timed
relation's one-hot columns) are multiplied by alpha, on top of the share a `-- relsql: blend` line
picked (printed as "alpha"): alpha 0 ranks by the timed relation alone, 1 is the model as fitted. Also
prints the epochs run, the best epoch, why training stopped, wall and CPU seconds and the load average:
whether a low score is an early stop or the towers' noise.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch

from bench import recommend_data
from bench.recommend import fitted_model
from relsql.train.ranking.metrics import ranking_scores


def scaled_map(learner, split: str, alpha: float) -> float:
    """MAP@k of `split` with the query tower's own columns times alpha."""
    with torch.no_grad():
        query, candidate, pair = learner.computed()
        width = learner.outputs().shape[1]
        query = query.clone()
        query[:, :width] *= alpha
        _, index = learner.rank(learner.labelled[learner.rows[split]], learner.task.k, (query, candidate, pair))
    offsets, ids = learner.goal.truth(split)
    return float(ranking_scores(index.cpu().numpy(), offsets, ids, learner.task.k)["map@10"])


def run(ds, seed: int, fit: dict, alphas: list[float]) -> dict:
    import relsql

    con = relsql.connect(str(ds.path), read_only=True)
    try:
        model, wall, cpu = fitted_model(con, ds, seed, fit)
        learner = model.learner
        out = {"dataset": ds.name, "seed": seed, "wall": round(wall, 1), "cpu": round(cpu, 1),
               "load": round(os.getloadavg()[0], 2), "epochs": len(model.history),
               "best_epoch": model.best_epoch, "stopped": model.stopped}
        out["alpha"] = float(getattr(learner.head, "alpha", 1.0))
        for a in alphas:
            out[f"val@{a}"] = round(scaled_map(learner, "val", a), 4)
            out[f"test@{a}"] = round(scaled_map(learner, "test", a), 4)
        return out
    finally:
        con.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--datasets", nargs="*", default=["tpcds", "shop"])
    parser.add_argument("--seeds", nargs="*", type=int, default=[0, 1, 2])
    parser.add_argument("--fit", default="{}")
    parser.add_argument("--alphas", nargs="*", type=float, default=[0.0, 0.25, 0.5, 1.0])
    parser.add_argument("--out", default="out/bench/recommend")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    for name in args.datasets:
        path = Path(args.out) / f"{name}.duckdb"
        ds = recommend_data.WRITERS[name](path)
        for seed in args.seeds:
            print(json.dumps(run(ds, seed, json.loads(args.fit), args.alphas)), flush=True)


if __name__ == "__main__":
    main()
