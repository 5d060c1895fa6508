"""Variants of Template.auto's options and fit()'s arguments on the outside corpus, run by run, then
compared with a base variant on the same (database, seed): the measurement behind docs/quality.md's
network-alone and blend sections, kept here instead of rewritten for each question.

    python -m bench.variants run --manifests M... [--seeds 0-2] --variants VARIANTS --out RUNS.jsonl [--jobs 2]
    python -m bench.variants compare RUNS.jsonl [--base NAME] [--pick A,B [--pick-on val_loss|val]]

VARIANTS is JSON: {name: {"auto": {...Template.auto options}, "fit": {...fit() arguments}}}. Each
run is one manifest's first target, one model seed and one variant, in a process of its own (torch
and DuckDB on one thread): `Template.auto(db, target, time_column=..., **auto)`, `Model(seed=)`,
`fit(hybrid=False, refit=False, **fit)` (the network alone unless the variant says `"hybrid": true`;
without the refit, the model evaluate() scores), `evaluate()` on the test split; the first variant
also records the one-hop and own-column GBMs (`bench.outside.gbm_peer`) on the same split; a network alone
records which part of its template it kept (`kept`: "whole template" or "own columns"). Runs
already in RUNS.jsonl are skipped, so a stopped run goes on where it stopped; a run that failed is
recorded with its error (compare lists it) and skipped too: delete its line to run it again.

compare prints, per variant against the base (the variant `run` named first, which records the
anchors, unless --base), over the (database, seed) pairs both have: runs better / worse, the mean and median gain (ROC-AUC or
accuracy: the difference; RMSE or MAE: the relative change; + is better) with a 95 % bootstrap
interval of the mean, per source (the database name before its first "_"), the runs at least the
one-hop GBM, and the median ratio of the fit's CPU seconds. `--pick A,B` adds the variant `picked(A,B)`:
per run, whichever of A and B scored better on validation at its kept epoch (each run records that
epoch's `val_loss` and `val`, the task's metric), at the CPU of training both: whether choosing between
two templates or fits by validation would beat either.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

LOWER_IS_BETTER = ("rmse", "mae", "loss")
RESAMPLES = 2000


def one(manifest_path: str, seed: int, name: str, variant: dict, anchors: bool) -> dict:
    """One run in this process: the variant's template and fit on the manifest's first target."""
    import torch

    import relsql
    from bench.outside import gbm_peer

    torch.set_num_threads(1)
    manifest = json.loads(Path(manifest_path).read_text())
    entry = manifest["targets"][0]
    options = {"time_column": entry["time_column"]} if entry.get("time_column") else {}
    db = relsql.connect(manifest["path"], read_only=True, **({"keys": manifest["keys"]} if manifest.get("keys") else {}))
    try:
        template = relsql.Template.auto(db, target=entry["target"], **options, **variant.get("auto", {}))
        model = relsql.Model(db, template, target=entry["target"], seed=seed, progress=False, threads=1, **options)
        started = time.process_time()
        model.fit(**{"hybrid": False, "refit": False, **variant.get("fit", {})})
        cpu = time.process_time() - started
        metric = model.task.metric
        out = {"database": manifest["name"], "seed": seed, "variant": name, "metric": metric,
               "score": model.evaluate().get(metric), "epochs": len(model.history), "cpu": cpu,
               "train_rows": int(len(model.learner.rows["train"]))}
        epoch = model.learner.record.kept() or {}
        out.update(val_loss=epoch.get("val_loss"), val=epoch.get(f"val_{metric}"))  # the kept epoch's, for `picked`
        chosen = getattr(model.learner, "own_columns", None)  # the network alone: its whole template or own columns
        if chosen:
            out["kept"] = chosen["kept"]
        if anchors:
            peer = gbm_peer(model.learner)
            out.update(gbm=peer.get("gbm_score"), own_gbm=peer.get("own_gbm_score"))
        return out
    finally:
        db.close()


def gain(score: float, base: float, metric: str) -> float:
    """How much better `score` is than `base`: the difference, or the relative change where lower is better."""
    return (base - score) / abs(base) if metric in LOWER_IS_BETTER else score - base


def at_least(score: float | None, anchor: float | None, metric: str) -> bool:
    if score is None or anchor is None:
        return False
    return score <= anchor + 1e-12 if metric in LOWER_IS_BETTER else score >= anchor - 1e-12


def compare(runs: list[dict], base: str | None = None) -> dict[str, dict]:
    """{variant: its comparison with `base`} (see the module's docstring), the base included."""
    by: dict[tuple, dict] = defaultdict(dict)
    for run in runs:
        by[run["database"], run["seed"]][run["variant"]] = run
    names = list(dict.fromkeys(run["variant"] for run in runs))
    base = base or next((run["variant"] for run in runs if run.get("gbm") is not None), names[0])  # the anchors' run
    names.sort(key=lambda name: name != base)
    anchors = {key: next((r["gbm"] for r in found.values() if r.get("gbm") is not None), None) for key, found in by.items()}
    table = {}
    for name in names:
        gains, sources, cpu, reach = [], defaultdict(list), [], 0
        for key, found in by.items():
            if name not in found or base not in found or None in (found[name]["score"], found[base]["score"]):
                continue
            mine, theirs = found[name], found[base]
            g = gain(mine["score"], theirs["score"], mine["metric"])
            gains.append(g)
            sources[key[0].split("_")[0]].append(g)
            cpu.append(mine["cpu"] / theirs["cpu"] if theirs["cpu"] else float("nan"))
            reach += at_least(mine["score"], anchors[key], mine["metric"])
        if not gains:
            continue
        values = np.array(gains)
        draws = np.random.default_rng(0).choice(values, (RESAMPLES, len(values))).mean(axis=1)
        table[name] = {"runs": len(values), "better": int((values > 1e-12).sum()), "worse": int((values < -1e-12).sum()),
                       "mean": float(values.mean()), "median": float(np.median(values)),
                       "interval": (float(np.percentile(draws, 2.5)), float(np.percentile(draws, 97.5))),
                       "at_least_gbm": reach, "cpu_ratio": float(statistics.median(cpu)),
                       "sources": {s: (float(np.mean(v)), sum(x > 1e-12 for x in v), sum(x < -1e-12 for x in v))
                                   for s, v in sorted(sources.items())}}
    return table


def picked(runs: list[dict], among: list[str], on: str = "val_loss") -> list[dict]:
    """Per (database, seed) that ran every variant of `among`, a run of the variant `picked(a,b)`: the one
    whose kept epoch scored best on validation (`on`: "val_loss", lower is better, or "val", the task's
    metric), with its test score and the CPU of all of them (choosing trains each). Runs recorded before
    the validation scores were (no `on`) are left out."""
    by: dict[tuple, dict] = defaultdict(dict)
    for row in runs:
        by[row["database"], row["seed"]][row["variant"]] = row
    name, found = f"picked({','.join(among)})", []
    for rows in by.values():
        if not all(v in rows and rows[v].get(on) is not None for v in among):
            continue
        lower = on == "val_loss" or rows[among[0]]["metric"] in LOWER_IS_BETTER
        best = min(among, key=lambda v: rows[v][on] if lower else -rows[v][on])  # the first on a tie
        found.append({**rows[best], "variant": name, "chose": best, "gbm": None,
                      "cpu": sum(rows[v]["cpu"] for v in among)})
    return found


def run(manifests: list[str], seeds: list[int], variants: dict, out: Path, jobs: int, timeout: int) -> None:
    """Every (manifest, seed, variant) not yet in `out`, each in a process of its own, `jobs` at a time."""
    done = set()
    if out.exists():
        for line in out.read_text().splitlines():
            row = json.loads(line)
            done.add((row["manifest"], row["seed"], row["variant"]))
    first = next(iter(variants))
    todo = [(m, s, n) for m in manifests for s in seeds for n in variants if (str(Path(m).resolve()), s, n) not in done]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(
        [str(Path(__file__).resolve().parent.parent)] + [p for p in [os.environ.get("PYTHONPATH")] if p])}

    def child(task: tuple[str, int, str]) -> None:
        manifest, seed, name = task
        command = [sys.executable, "-m", "bench.variants", "one", manifest, str(seed), name, json.dumps(variants[name]),
                   "--anchors" if name == first else "--no-anchors"]
        try:
            finished = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
            lines = [line for line in finished.stdout.splitlines() if line.startswith("{")]
            row = json.loads(lines[-1]) if lines else {
                "error": (finished.stderr.strip().splitlines() or ["no output"])[-1][:300]}
        except subprocess.TimeoutExpired:
            row = {"error": f"timeout after {timeout} s"}
        row.update(manifest=str(Path(manifest).resolve()), seed=seed, variant=name)
        with out.open("a") as file:  # one line per run, appended whole
            file.write(json.dumps(row) + "\n")
        print(f"{Path(manifest).stem} s{seed} {name}: {row.get('score', row.get('error'))}", file=sys.stderr, flush=True)

    with ThreadPoolExecutor(max(1, jobs)) as pool:
        list(pool.map(child, todo))


def main(argv: list[str] | None = None) -> None:
    from bench.outside_hostile import seeds as parse_seeds

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    go = commands.add_parser("run")
    go.add_argument("--manifests", nargs="+", required=True)
    go.add_argument("--seeds", default="0-2")
    go.add_argument("--variants", required=True, help='JSON {name: {"auto": {...}, "fit": {...}}}, the first the base')
    go.add_argument("--out", required=True)
    go.add_argument("--jobs", type=int, default=1)
    go.add_argument("--timeout", type=int, default=900)
    single = commands.add_parser("one")
    single.add_argument("manifest")
    single.add_argument("seed", type=int)
    single.add_argument("name")
    single.add_argument("variant")
    single.add_argument("--anchors", action=argparse.BooleanOptionalAction, default=False)
    cmp = commands.add_parser("compare")
    cmp.add_argument("runs")
    cmp.add_argument("--base")
    cmp.add_argument("--pick", action="append", default=[],
                     help="variants a,b,...: also compare the one validation picks per run (repeatable)")
    cmp.add_argument("--pick-on", default="val_loss", choices=("val_loss", "val"))
    args = parser.parse_args(argv)
    if args.command == "one":
        print(json.dumps(one(args.manifest, args.seed, args.name, json.loads(args.variant), args.anchors)))
    elif args.command == "run":
        run(args.manifests, parse_seeds(args.seeds), json.loads(args.variants), Path(args.out), args.jobs, args.timeout)
    else:
        runs = [json.loads(line) for line in Path(args.runs).read_text().splitlines()]
        failed = [r for r in runs if "error" in r]
        for r in failed:
            print(f"failed: {Path(r['manifest']).stem} s{r['seed']} {r['variant']}: {r['error']}")
        runs = [r for r in runs if "error" not in r]
        runs += [row for among in args.pick for row in picked(runs, among.split(","), args.pick_on)]
        for name, c in compare(runs, args.base).items():
            low, high = c["interval"]
            print(f"{name}: {c['runs']} runs, better / worse {c['better']} / {c['worse']}, mean {c['mean']:+.4f} "
                  f"({low:+.4f} .. {high:+.4f}), median {c['median']:+.4f}, >= one-hop GBM {c['at_least_gbm']}, "
                  f"fit CPU x{c['cpu_ratio']:.2f}; " + ", ".join(
                      f"{s} {m:+.4f} ({b} / {w})" for s, (m, b, w) in c["sources"].items()))


if __name__ == "__main__":
    main()
