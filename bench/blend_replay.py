"""The blend's choice, replayed offline: record once what fit()'s blend chooses between, then
score other ways of choosing on those numbers in seconds instead of refitting the corpus.

    python -m bench.blend_replay record --manifests DIR/*.json [--seeds 0-4] --out OUT
                                        [--auto '{"dropout": 0.4}'] [--fit '{"lr": 0.03}']
    python -m bench.blend_replay replay OUT [OUT ...]

record: for each manifest's first target and each seed, in this process and through the public
API: `Template.auto` (with --auto's options), `Model(seed=)`, `fit(refit=False, **fit)` (the
default blend; without the refit, so the model in hand is the one `evaluate()` scores). Writes
OUT/NAME_sSEED.npz with the raw outputs (the task's output space: log-odds, class scores or
standardized values) on the training, validation and test rows of the selected network (`net`),
the blend's GBM (`gbm2`: the one it kept, on two-hop features or their one-hop part, `gbm_depth`
in the json), every GBM the blend chose among (`cand_<reach>`: two-hop, one-hop,
own-column; fitted again, the same trees; `cand_<reach>_oof`: its out-of-fold outputs on the training
and validation rows, `out_of_fold`), a one-hop GBM (`gbm1`, bench.outside's peer) and the own-column
GBM (`gbm0`), with the encoded labels (`y`), and the network's cross-fitted validation outputs the
blend weighed (`net_val_crossfit`, relsql/train/loop/crossfit.py); and OUT/NAME_sSEED.json with the task, the metric
that picked the blend, the weight it picked and `evaluate()`'s scores.

replay: scores each rule of RULES on the test rows of every recorded run and prints, per source
(the name before the first "_"), how often the rule is at least the one-hop GBM and the
own-column GBM, and its mean gain over the one-hop GBM (ROC-AUC/accuracy: the difference;
RMSE/MAE: relative). The rule "picked" must reproduce `evaluate()`: each run's replayed score is
checked against the recorded one, so a replay that drifts from relsql's blend says so.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import numpy as np

PARTS = ("train", "val", "test")
FOLDS = 5  # out-of-fold outputs of each blend candidate (`out_of_fold`)


# ============================================================================ record
def record(manifest_path: Path, seed: int, out: Path, auto: dict, fit: dict) -> dict:
    """One run (a manifest's first target, one seed): its outputs to OUT/NAME_sSEED.npz/.json."""
    import relsql
    from relsql.train.gbm import baselines
    from relsql.train.gbm import hybrid as hybrids

    manifest = json.loads(Path(manifest_path).read_text())
    entry = manifest["targets"][0]
    options = {"time_column": entry["time_column"]} if entry.get("time_column") else {}
    with tempfile.TemporaryDirectory() as work:  # the corpus file is never written to
        path = shutil.copy(manifest["path"], work)
        db = relsql.connect(path, **({"keys": manifest["keys"]} if manifest.get("keys") else {}))
        try:
            template = relsql.Template.auto(db, target=entry["target"], **options, **auto)
            model = relsql.Model(db, template, target=entry["target"], seed=seed, progress=False, **options)
            model.fit(**{**fit, "refit": False})
            learner = model.learner
            arrays = {}
            for part in PARTS:
                net, y = learner.split_outputs(part)
                arrays[f"net_{part}"], arrays[f"y_{part}"] = net.detach().cpu().double().numpy(), y.cpu().double().numpy()
            blend = learner.hybrid
            if learner.record.crossfit is not None:  # the validation outputs the blend weighed (relsql/train/loop/crossfit.py)
                arrays["net_val_crossfit"] = learner.record.crossfit.detach().cpu().double().numpy()
            if blend is not None:  # the features fit computed, kept by the blend (no second query)
                for part in PARTS:
                    arrays[f"gbm2_{part}"] = blend.gbm_outputs(learner, learner.labelled[learner.rows[part]])
            for candidate in hybrids.candidates(learner) or []:  # each GBM the blend chose among (refitted: deterministic)
                x = candidate.x()
                name = f"cand_{hybrids.reach(candidate.features)}"
                for part in PARTS:
                    arrays[f"{name}_{part}"] = candidate.trees.raw(x[learner.labelled[learner.rows[part]]])
                arrays[f"{name}_oof"] = out_of_fold(learner, candidate)
            spec = baselines.one_hop(learner)
            x = baselines.features(learner, spec)
            for name, width in (("gbm1", x.shape[1]), ("gbm0", len(spec.own))):
                if width:
                    trees = baselines.fit_trees(learner, x[:, :width])
                    for part in PARTS:
                        arrays[f"{name}_{part}"] = trees.raw(x[learner.rows[part], :width])
            task = learner.task
            info = {"database": manifest["name"], "seed": seed, "target": entry["target"],
                    "task": {"kind": task.kind, "classes": list(range(len(task.classes))), "mean": task.mean,
                             "std": task.std, "regression_loss": task.regression_loss,
                             "class_weights": task.class_weights},
                    "metric": task.metric, "chosen_on": hybrids.chosen_on(learner) if blend else None,
                    "weight": blend.weight if blend else None, "gbm_depth": blend.features.depth if blend else None,
                    "scores": model.evaluate(), "auto": auto, "fit": fit}
        finally:
            db.close()
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"{manifest['name']}_s{seed}"
    np.savez(stem.with_suffix(".npz"), **arrays)
    stem.with_suffix(".json").write_text(json.dumps(info, default=float))
    return info


def out_of_fold(learner, candidate, folds: int = FOLDS) -> np.ndarray:
    """A blend candidate's outputs on the training and validation rows (in that order), each from
    a GBM of the candidate's features and settings fitted on the other `folds` - 1 parts of those
    rows (a seeded partition) for the rounds the candidate's early stopping kept: what picking the
    candidate on every labelled row but the test ones would see."""
    from relsql.train.gbm import gbm
    from relsql.train.gbm import hybrid as hybrids

    rows = np.concatenate([learner.rows["train"], learner.rows["val"]])
    x = candidate.x()[learner.labelled][rows]
    y = learner.y.detach().cpu().double().numpy()[rows]
    part = np.random.default_rng(0).permutation(len(rows)) % folds
    rounds = max(1, len(candidate.trees.roots) // max(1, candidate.trees.units))
    out = np.zeros((len(rows), learner.task.units))
    for k in range(folds):
        trees = gbm.fit(x[part != k], y[part != k], learner.task.kind, learner.task.units, learner.seed, rounds=rounds,
                        **hybrids.settings(candidate.features))
        out[part == k] = trees.raw(x[part == k])
    return out


# ============================================================================ replay
def score(run: dict, out: np.ndarray, y: np.ndarray, metric: str | None = None) -> float:
    """`metric` (default: the task's) of raw outputs against encoded labels, as relsql scores a
    blend (relsql/train/gbm/hybrid.py `score`, the recorded task's own metrics and loss)."""
    from relsql.train.gbm import hybrid
    from relsql.train.task.task import Task

    return hybrid.score(Task(**run["task"]), out, y, metric or run["metric"])


REACHES = ("two-hop", "one-hop", "own-column")  # the order fit() tries the blend's GBMs in (hybrid._feature_sets)


EVIDENCE = 1.5  # the "evidence" rule's standard errors (measured 2026-12-06, not adopted: docs/quality.md)
RESAMPLES = 200


def chosen(run: dict, a: dict, evidence: float | None = None) -> tuple[float, str]:
    """The network's weight and the GBM (its arrays' prefix: `cand_<reach>`, or `gbm2` in a run
    recorded without its candidates) fit()'s blend keeps, by relsql's own rule (hybrid.choose) on the
    recorded validation outputs: the network's cross-fitted ones where fit had them, as fit weighs
    them. With `evidence`, the rule measured on 2026-12-06: the GBM scoring best alone where its
    lead over the one-hop GBM passes `evidence` standard errors of a paired bootstrap (`lead`), else
    the one-hop GBM; then the network's weight with it."""
    from relsql.train.gbm import hybrid
    from relsql.train.task.task import Task

    names = [f"cand_{r}" for r in REACHES if f"cand_{r}_val" in a] or ["gbm2"]
    net, task, truth, metric = a.get("net_val_crossfit", a["net_val"]), Task(**run["task"]), a["y_val"], run["chosen_on"]
    outputs = [a[f"{name}_val"] for name in names]
    if evidence is None:
        index, weight, _ = hybrid.choose(task, net, outputs, truth, metric)
        return weight, names[index]
    plain = names.index("cand_one-hop") if "cand_one-hop" in names else 0
    index = _best_alone(task, outputs, truth, metric)
    if index != plain:
        ahead, error = lead(task, outputs[index], outputs[plain], truth, metric)
        index = index if ahead > evidence * error else plain
    return _weight(task, net, outputs[index], truth, metric), names[index]


def _best_alone(task, outputs: list[np.ndarray], truth: np.ndarray, metric: str) -> int:
    """The index of the outputs scoring best by `metric` (the first, wider GBM, on a tie)."""
    from relsql.train.gbm import hybrid

    scores = [hybrid._ranked(hybrid.score(task, out, truth, metric), metric) for out in outputs]
    return max(range(len(outputs)), key=lambda i: (scores[i], -i))


def _weight(task, net: np.ndarray, theirs: np.ndarray, truth: np.ndarray, metric: str) -> float:
    """The network's weight with GBM outputs `theirs`, picked on validation as fit picks it."""
    from relsql.train.gbm import hybrid

    return hybrid.best_weight(hybrid.weighed(task, net, theirs, truth, metric), metric)


def lead(task, ours: np.ndarray, theirs: np.ndarray, truth: np.ndarray, metric: str) -> tuple[float, float]:
    """How far outputs `ours` score ahead of `theirs` (larger-is-better units) and the spread of
    that lead over RESAMPLES draws of the rows with replacement, the same draws for both, from a
    fixed seed (draws where a score is undefined left out; infinite with fewer than two left)."""
    from relsql.train.gbm import hybrid

    def lead_on(rows):
        return (hybrid._ranked(hybrid.score(task, ours[rows], truth[rows], metric), metric)
                - hybrid._ranked(hybrid.score(task, theirs[rows], truth[rows], metric), metric))

    leads = [lead_on(rows) for rows in np.random.default_rng(0).integers(0, len(truth), (RESAMPLES, len(truth)))]
    leads = np.array([x for x in leads if math.isfinite(x)])
    return lead_on(np.arange(len(truth))), float(leads.std()) if len(leads) > 1 else math.inf


def chosen_out_of_fold(run: dict, a: dict) -> tuple[float, str]:
    """The GBM whose out-of-fold outputs score best on the training and validation rows together
    (the first, wider, on a tie), then the network's weight with it on the validation rows."""
    from relsql.train.task.task import Task

    names = [f"cand_{r}" for r in REACHES if f"cand_{r}_oof" in a]
    if not names:
        return chosen(run, a)
    task, metric = Task(**run["task"]), run["chosen_on"]
    name = names[_best_alone(task, [a[f"{n}_oof"] for n in names], np.concatenate([a["y_train"], a["y_val"]]), metric)]
    return _weight(task, a.get("net_val_crossfit", a["net_val"]), a[f"{name}_val"], a["y_val"], metric), name


def chosen_average(run: dict, a: dict, reaches: tuple[str, ...] = REACHES) -> tuple[float, str]:
    """The blend's GBMs of `reaches` averaged (their raw outputs, equal shares) as one GBM, then the
    network's weight with it picked on the validation rows as fit picks it (measured 2026-12-07)."""
    from relsql.train.task.task import Task

    names = [f"cand_{r}" for r in reaches if f"cand_{r}_val" in a]
    if len(names) < 2:
        return chosen(run, a)
    prefix = "average:" + ",".join(names)
    for part in PARTS:  # kept with the run's arrays: a rule's test outputs read them by prefix
        a.setdefault(f"{prefix}_{part}", np.mean([a[f"{n}_{part}"] for n in names], axis=0))
    task, metric = Task(**run["task"]), run["chosen_on"]
    return _weight(task, a.get("net_val_crossfit", a["net_val"]), a[f"{prefix}_val"], a["y_val"], metric), prefix


def selected_ensemble(run: dict, a: dict, steps: int = 10, part: str = "val") -> np.ndarray:
    """Ensemble selection (greedy forward selection with replacement, Caruana et al. 2004) over the
    network's and every GBM's outputs on the validation rows (the network's cross-fitted ones): start
    from the member scoring best alone, then `steps` - 1 times add the member whose addition scores
    best; the members' shares are their counts. Returns the shares' mix of the `part` outputs."""
    from relsql.train.gbm import hybrid
    from relsql.train.task.task import Task

    names = ["net"] + [f"cand_{r}" for r in REACHES if f"cand_{r}_val" in a]
    if "gbm2_test" not in a:
        return a[f"net_{part}"]
    task, metric, truth = Task(**run["task"]), run["chosen_on"], a["y_val"]
    val = {n: a.get("net_val_crossfit", a["net_val"]) if n == "net" else a[f"{n}_val"] for n in names}
    counts = dict.fromkeys(names, 0)
    total = np.zeros_like(val["net"])
    for step in range(steps):
        scored = {n: hybrid._ranked(hybrid.score(task, (total + val[n]) / (step + 1), truth, metric), metric) for n in names}
        best = max(names, key=lambda n: (scored[n], -names.index(n)))
        counts[best] += 1
        total = total + val[best]
    return sum(counts[n] * a[f"{n}_{part}"] for n in names) / steps


def _equal_shares(a: dict, prefix: str) -> tuple[float, str]:
    """The network's share where it and each GBM of an average (`prefix`) count alike."""
    members = sum(f"cand_{r}_val" in a for r in REACHES) if prefix.startswith("average:") else 1
    return 1.0 / (members + 1), prefix


def picked(run: dict, a: dict) -> float:
    """The network's weight fit()'s blend picks from the recorded validation outputs (`chosen`)."""
    return chosen(run, a)[0]


def _mix(weight_of, pick=chosen):
    """A rule: the network's test outputs blended with a GBM's at `weight_of` the weight `pick`
    chooses ((run, arrays) -> (weight, the GBM's arrays' prefix))."""
    def rule(run: dict, a: dict) -> np.ndarray:
        if "gbm2_test" not in a:  # no blend was fitted: the network alone
            return a["net_test"]
        weight, name = pick(run, a)
        w = weight_of(weight)
        return w * a["net_test"] + (1 - w) * a[f"{name}_test"]
    return rule


RULES = {
    "picked": _mix(lambda w: w),
    "evidence 1.5": _mix(lambda w: w, lambda run, a: chosen(run, a, EVIDENCE)),  # not adopted (docs/quality.md, 2026-12-06)
    "out-of-fold pick": _mix(lambda w: w, chosen_out_of_fold),  # not adopted (docs/quality.md, 2026-12-06)
    "GBMs averaged": _mix(lambda w: w, chosen_average),
    "2 GBMs averaged": _mix(lambda w: w, lambda run, a: chosen_average(run, a, REACHES[:2])),
    "all averaged": _mix(lambda w: w, lambda run, a: _equal_shares(a, chosen_average(run, a)[1])),
    "ensemble selection 10": lambda run, a: selected_ensemble(run, a, 10, "test"),
    "ensemble selection 4": lambda run, a: selected_ensemble(run, a, 4, "test"),
    "ensemble selection 20": lambda run, a: selected_ensemble(run, a, 20, "test"),
    "shrunk 0.75": _mix(lambda w: 0.75 * w),
    "shrunk 0.5": _mix(lambda w: 0.5 * w),
    "GBM alone": lambda run, a: a.get("gbm2_test", a["net_test"]),
    "network alone": lambda run, a: a["net_test"],
}


def load(folders: list[Path]) -> list[tuple[dict, dict]]:
    runs = []
    for folder in folders:
        for meta in sorted(Path(folder).glob("*.json")):
            runs.append((json.loads(meta.read_text()), dict(np.load(meta.with_suffix(".npz")))))
    return runs


def replay(runs: list[tuple[dict, dict]], rules: dict = RULES) -> dict[str, dict[str, dict]]:
    """{rule: {source: {"runs", "at_least_one_hop", "at_least_own", "mean_gain"}}} ("all" too)."""
    from relsql.train.gbm import hybrid

    table: dict[str, dict[str, dict]] = {}
    for name, rule in rules.items():
        counts: dict[str, dict] = defaultdict(lambda: {"runs": 0, "at_least_one_hop": 0, "at_least_own": 0, "gains": []})
        for run, a in runs:
            metric, y = run["metric"], a["y_test"]
            mine = score(run, rule(run, a), y)
            for source in (run["database"].split("_")[0], "all"):
                c = counts[source]
                c["runs"] += 1
                for anchor, key in (("gbm1", "at_least_one_hop"), ("gbm0", "at_least_own")):
                    if f"{anchor}_test" in a:
                        theirs = score(run, a[f"{anchor}_test"], y)
                        c[key] += bool(mine <= theirs + 1e-12 if metric in hybrid.LOWER_IS_BETTER else mine >= theirs - 1e-12)
                        if anchor == "gbm1":
                            c["gains"].append((theirs - mine) / theirs if metric in hybrid.LOWER_IS_BETTER else mine - theirs)
        table[name] = {s: {**{k: v for k, v in c.items() if k != "gains"},
                           "mean_gain": float(np.mean(c["gains"])) if c["gains"] else float("nan")}
                       for s, c in sorted(counts.items())}
    return table


def check(runs: list[tuple[dict, dict]]) -> list[str]:
    """Runs whose replayed blend does not give the score evaluate() recorded (to float32's rounding:
    evaluate() blends in the network's dtype, the replay in float64)."""
    def differs(run: dict, a: dict) -> bool:
        recorded = run["scores"][run["metric"]]
        return abs(score(run, RULES["picked"](run, a), a["y_test"]) - recorded) > 1e-6 * max(1.0, abs(recorded))
    return [f"{run['database']} s{run['seed']}" for run, a in runs if differs(run, a)]


# ============================================================================ command line
def main(argv: list[str] | None = None) -> None:
    from bench.outside_hostile import seeds as parse_seeds

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    rec = commands.add_parser("record")
    rec.add_argument("--manifests", nargs="+", required=True)
    rec.add_argument("--seeds", default="0")
    rec.add_argument("--out", required=True)
    rec.add_argument("--auto", default="{}", help="Template.auto options as JSON")
    rec.add_argument("--fit", default="{}", help="fit() options as JSON (refit is always False)")
    rep = commands.add_parser("replay")
    rep.add_argument("folders", nargs="+")
    args = parser.parse_args(argv)
    if args.command == "record":
        out = Path(args.out)
        auto, fit = json.loads(args.auto), json.loads(args.fit)
        for seed in parse_seeds(args.seeds):
            for manifest in args.manifests:
                info = record(Path(manifest), seed, out, auto, fit)
                print(f"{info['database']} s{seed}: {info['metric']} {info['scores'][info['metric']]:.4f}, "
                      f"network weight {info['weight']}", file=sys.stderr)
        return
    runs = load([Path(f) for f in args.folders])
    drift = check(runs)
    print(f"{len(runs)} runs; replayed blend differs from evaluate() on: {', '.join(drift) or 'none'}")
    for name, per in replay(runs).items():
        print(f"{name:14s} " + "  ".join(
            f"{s}: >=one-hop {c['at_least_one_hop']}/{c['runs']}, >=own {c['at_least_own']}, gain {c['mean_gain']:+.4f}"
            for s, c in per.items()))


if __name__ == "__main__":
    main()
