"""Stopping rules against the GBM peer, read off fit()'s default runs (issue #41's cost target).

With the plateau schedule at its default 25 epochs, any patience up to 100 stops the default's own
run sooner: the same weights epoch by epoch. So one default fit per (target, seed) answers every such
rule: the epoch it stops at comes from replaying the run's history through the Trainer's own
EarlyStopping (ties and all), and its CPU seconds from the run's CPU clock at that epoch plus the
run's fixed part (the best epoch put back, the blend, predict). The GBM peer (bench.outside) is timed
beside it in CPU and wall seconds.

    python -m bench.stopping MANIFEST.json [...] --seeds 0,1,2 --out runs.jsonl
    python -m bench.stopping --summary runs.jsonl

The summary reads `patience 100 under N validation rows, else P` for a few N and P."""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from relsql.train.learner.defaults import PATIENCE

PATIENCES = (25, 30, 40, PATIENCE)  # the last: the default; the default's plateau (100 // 4 = 25) under every one
SMALL_ROWS = (0, 30, 100)  # 100: relsql.train.task.task.SELECTION_ROWS, below which the loss selects


def replay(learner, history: list[dict], metric: str, patience: int) -> tuple[int, int]:
    """(epochs run, best epoch) of `patience` on the recorded `history`, by the Trainer's own rule."""
    from relsql.train.loop.callbacks import EarlyStopping

    stopping = EarlyStopping(learner, patience, metric)
    for epoch, record in enumerate(history):
        if stopping.update(epoch, record)[1]:
            return epoch + 1, stopping.best_epoch
    return len(history), stopping.best_epoch


def one(manifest: dict, seed: int, work: Path) -> dict:
    """fit()'s defaults on the manifest's first target with `seed`: the run, each patience's stop, the GBM."""
    import relsql
    from bench.outside import gbm_peer

    entry = manifest["targets"][0]
    target, time_column = entry["target"], entry.get("time_column")
    db = relsql.connect(str(work / Path(manifest["path"]).name), **({"keys": manifest["keys"]} if manifest.get("keys") else {}))
    options = {"time_column": time_column} if time_column else {}
    model = relsql.Model(db, relsql.Template.auto(db, target=target, **options), target=target, seed=seed, progress=False,
                         **options)
    clock: dict[int, float] = {}
    started, wall = time.process_time(), time.perf_counter()
    model.fit(callback=lambda info: clock.__setitem__(info["epoch"], time.process_time() - started))  # each epoch's last step
    model.predict()
    cpu, wall = time.process_time() - started, time.perf_counter() - wall
    history, metric = model.history, model.monitor.split("_", 1)[1]
    fixed = cpu - clock[len(history) - 1]  # the last validation, the best epoch put back, the blend, predict
    t, w = time.process_time(), time.perf_counter()
    gbm = gbm_peer(model.learner)
    gbm_cpu, gbm_wall = time.process_time() - t, time.perf_counter() - w
    if replay(model.learner, history, metric, PATIENCE) != (len(history), model.best_epoch):  # the rule replayed is the Trainer's
        raise AssertionError(f"replaying {target}'s history with patience {PATIENCE} did not give the run's own stop")
    stops = {}
    for patience in PATIENCES:
        epochs, best = replay(model.learner, history, metric, patience)
        stops[patience] = {"epochs": epochs, "best_epoch": best, "cpu_s": clock[epochs - 1] + fixed}
    return {"database": manifest["name"], "target": target, "seed": seed, "val_rows": len(model.learner.rows["val"]),
            "monitor": model.monitor, "epochs": len(history), "best_epoch": model.best_epoch,
            "metric": model.task.metric, "score": float(model.evaluate()[model.task.metric]), "cpu_s": cpu, "wall_s": wall,
            "gbm_cpu_s": gbm_cpu, "gbm_wall_s": gbm_wall, "gbm_score": gbm.get("gbm_score"), "stops": stops}


def summary(runs: list[dict]) -> str:
    """Median fit + predict / GBM (CPU) and the default's epoch kept, for each rule."""
    lines = []
    for small in SMALL_ROWS:
        for patience in PATIENCES[:-1]:
            chosen = [run["stops"][str(PATIENCE if run["val_rows"] < small else patience)] for run in runs]
            ratios = [stop["cpu_s"] / run["gbm_cpu_s"] for stop, run in zip(chosen, runs, strict=True)]
            kept = sum(stop["best_epoch"] == run["best_epoch"] for stop, run in zip(chosen, runs, strict=True))
            lines.append(f"patience {PATIENCE} under {small} validation rows, else {patience}: median CPU ratio "
                         f"{statistics.median(ratios):.2f}, <= 5 on {sum(r <= 5 for r in ratios)} of {len(runs)}, "
                         f"default's epoch kept on {kept}")
    ratios = [run["cpu_s"] / run["gbm_cpu_s"] for run in runs]
    lines.append(f"default (measured): median CPU ratio {statistics.median(ratios):.2f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("manifests", nargs="*", type=Path, help="bench.outside manifests (their first target)")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--out", type=Path, default=Path("stopping.jsonl"))
    parser.add_argument("--summary", type=Path, help="only summarize this file of runs")
    args = parser.parse_args(argv)
    if args.summary:
        print(summary([json.loads(line) for line in args.summary.read_text().splitlines() if line.strip()]))
        return
    import lightgbm  # noqa: F401 - imported before any clock runs: lightgbm imports scikit-learn and scipy
    import torch
    import torch._dynamo  # noqa: F401 - torch's optimizer imports it on first use, ~1.5-6 s once per process

    torch.set_num_threads(1)
    for path in args.manifests:
        manifest = json.loads(path.read_text())
        with tempfile.TemporaryDirectory(prefix="stopping-") as tmp:
            shutil.copy(manifest["path"], Path(tmp) / Path(manifest["path"]).name)
            for seed in (int(s) for s in args.seeds.split(",")):
                run = one(manifest, seed, Path(tmp))
                with open(args.out, "a") as f:
                    f.write(json.dumps(run) + "\n")
                print(run["database"], seed, run["epochs"], {p: s["epochs"] for p, s in run["stops"].items()}, flush=True)
    print(summary([json.loads(line) for line in args.out.read_text().splitlines() if line.strip()]))


if __name__ == "__main__":
    main()
