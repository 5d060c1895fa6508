"""Stopping rules against the GBM peer, read off fit()'s default runs (issue #41's cost target).

With the plateau schedule at its default 25 epochs, any patience up to 100 stops the default's own
run sooner: the same weights epoch by epoch. So one default fit per (target, seed) answers every such
rule: the epoch it stops at comes from replaying the run's history through the Trainer's own
EarlyStopping (ties and all), and its CPU seconds from the run's CPU clock at that epoch plus the
run's fixed part (the best epoch put back, the blend, predict). The GBM peer (bench.outside) is timed
beside it in CPU and wall seconds.

    python -m bench.stopping MANIFEST.json [...] --seeds 0,1,2 --out runs.jsonl
    python -m bench.stopping --summary runs.jsonl

The run itself is `fit(overfit=False)` (patience alone), so that every rule is a prefix of it; fit()'s
default, patience 100 with the overfit stop (relsql/train/loop/callbacks.py EarlyStopping), is replayed
as the rule "100+overfit". The summary reads `patience 100 under N validation rows, else P` for a few
N and P, patiences scaled to where the best epoch was (`RELATIVE`: stop after max(k, f x the best
epoch's count) epochs without improvement), and the overfit stop. `--curve` records the net's test
metric after every epoch (a forward per epoch, its CPU taken off the clock), so that a rule keeping
another epoch than the default's is scored too.

    python -m bench.stopping MANIFEST.json [...] --seeds 0,1,2 --curve --out runs.jsonl [--all-targets]"""

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
RELATIVE = ((20, 0.5), (40, 0.5), (25, 1.0))  # (k, f): max(k, f x (best epoch + 1)) epochs without improvement
SMALL_ROWS = (0, 30, 100)  # 100: relsql.train.task.task.SELECTION_ROWS, below which the loss selects


OVERFIT = f"{PATIENCE}+overfit"  # fit()'s default rule


def replay(learner, history: list[dict], metric: str, patience: int | tuple[int, float],
           overfit: bool = False) -> tuple[int, int]:
    """(epochs run, best epoch) of `patience` on the recorded `history`, by the Trainer's own rule;
    `patience` (k, f): max(k, f x (best epoch + 1)) epochs, the best epoch's as it stands; `overfit`:
    the Trainer's overfit stop too (the records' train_loss and val_loss)."""
    from relsql.train.loop.callbacks import EarlyStopping

    fixed = isinstance(patience, int)
    stopping = EarlyStopping(learner, patience if fixed else 10**9, metric, overfit=overfit)
    for epoch, record in enumerate(history):
        improved, stop = stopping.update(epoch, record)
        if not fixed:
            k, f = patience
            stop = not improved and epoch - stopping.best_epoch >= max(k, f * (stopping.best_epoch + 1))
        if stop:
            return epoch + 1, stopping.best_epoch
    return len(history), stopping.best_epoch


def rule_name(patience: int | str | tuple[int, float]) -> str:
    return str(patience) if isinstance(patience, int | str) else f"max({patience[0]}, {patience[1]:g} best)"


def one(manifest: dict, seed: int, work: Path, curve: bool = False, target: int = 0) -> dict:
    """fit()'s defaults on the manifest's `target`-th target with `seed`: the run, each patience's stop, the GBM;
    `curve`: the net's test metric after every epoch too."""
    import relsql
    from bench.outside import gbm_peer

    entry = manifest["targets"][target]
    target, time_column = entry["target"], entry.get("time_column")
    db = relsql.connect(str(work / Path(manifest["path"]).name), **({"keys": manifest["keys"]} if manifest.get("keys") else {}))
    options = {"time_column": time_column} if time_column else {}
    model = relsql.Model(db, relsql.Template.auto(db, target=target, **options), target=target, seed=seed, progress=False,
                         **options)
    clock: dict[int, float] = {}
    tests: list[float] = []
    spent = [0.0]  # the curve's CPU so far, off the clock

    class Curve(relsql.Callback):
        def on_epoch_end(self, trainer, epoch, record):
            t = time.process_time()
            tests.append(float(trainer.learner.evaluate("test")[trainer.learner.task.metric]))  # the net: no blend mid-fit
            spent[0] += time.process_time() - t

    started, wall = time.process_time(), time.perf_counter()
    model.fit(callback=lambda info: clock.__setitem__(info["epoch"], time.process_time() - started - spent[0]),
              callbacks=[Curve()] if curve else None, overfit=False)  # each epoch's last step
    model.predict()
    cpu, wall = time.process_time() - started - spent[0], time.perf_counter() - wall
    history, metric = model.history, model.monitor.split("_", 1)[1]
    fixed = cpu - clock[len(history) - 1]  # the last validation, the best epoch put back, the blend, predict
    t, w = time.process_time(), time.perf_counter()
    gbm = gbm_peer(model.learner)
    gbm_cpu, gbm_wall = time.process_time() - t, time.perf_counter() - w
    if replay(model.learner, history, metric, PATIENCE) != (len(history), model.best_epoch):  # the rule replayed is the Trainer's
        raise AssertionError(f"replaying {target}'s history with patience {PATIENCE} did not give the run's own stop")
    stops = {}
    for patience in (*PATIENCES, *RELATIVE):
        epochs, best = replay(model.learner, history, metric, patience)
        stops[rule_name(patience)] = {"epochs": epochs, "best_epoch": best, "cpu_s": clock[epochs - 1] + fixed,
                                      **({"net_test": tests[best]} if tests else {})}
    epochs, best = replay(model.learner, history, metric, PATIENCE, overfit=True)
    stops[OVERFIT] = {"epochs": epochs, "best_epoch": best, "cpu_s": clock[epochs - 1] + fixed,
                      **({"net_test": tests[best]} if tests else {})}
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
    for patience in (*RELATIVE, OVERFIT):
        chosen = [run["stops"].get(rule_name(patience)) for run in runs]
        pairs = [(stop, run) for stop, run in zip(chosen, runs, strict=True) if stop is not None]
        if not pairs:
            continue
        ratios = [stop["cpu_s"] / run["gbm_cpu_s"] for stop, run in pairs]
        moved = [f"{run.get('database')} seed {run.get('seed')} epoch {stop['best_epoch'] + 1} (net test "
                 f"{run['stops'][str(PATIENCE)].get('net_test', float('nan')):.4f} -> {stop.get('net_test', float('nan')):.4f})"
                 for stop, run in pairs if stop["best_epoch"] != run["best_epoch"]]
        lines.append(f"patience {rule_name(patience)}: median CPU ratio {statistics.median(ratios):.2f}, <= 5 on "
                     f"{sum(r <= 5 for r in ratios)} of {len(pairs)}, default's epoch kept on {len(pairs) - len(moved)}"
                     + (f"; another epoch: {', '.join(moved)}" if moved else ""))
    ratios = [run["cpu_s"] / run["gbm_cpu_s"] for run in runs]
    lines.append(f"default (measured): median CPU ratio {statistics.median(ratios):.2f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("manifests", nargs="*", type=Path, help="bench.outside manifests (their first target)")
    parser.add_argument("--all-targets", action="store_true", help="every target of each manifest, not only its first")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--out", type=Path, default=Path("stopping.jsonl"))
    parser.add_argument("--summary", type=Path, help="only summarize this file of runs")
    parser.add_argument("--curve", action="store_true", help="the net's test metric after every epoch (a forward each)")
    args = parser.parse_args(argv)
    if args.summary:
        print(summary([json.loads(line) for line in args.summary.read_text().splitlines() if line.strip()]))
        return
    import lightgbm  # noqa: F401 - imported before any clock runs: lightgbm imports scikit-learn and scipy
    import torch

    torch.set_num_threads(1)
    for path in args.manifests:
        manifest = json.loads(path.read_text())
        with tempfile.TemporaryDirectory(prefix="stopping-") as tmp:
            shutil.copy(manifest["path"], Path(tmp) / Path(manifest["path"]).name)
            for seed in (int(s) for s in args.seeds.split(",")):
                for target in range(len(manifest["targets"]) if args.all_targets else 1):
                    run = one(manifest, seed, Path(tmp), args.curve, target)
                    with open(args.out, "a") as f:
                        f.write(json.dumps(run) + "\n")
                    print(run["database"], run["target"], seed, run["epochs"],
                          {p: s["epochs"] for p, s in run["stops"].items()}, flush=True)
    print(summary([json.loads(line) for line in args.out.read_text().splitlines() if line.strip()]))


if __name__ == "__main__":
    main()
