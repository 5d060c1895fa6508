"""Accuracy side by side: relsql's defaults vs the GBM baselines vs an RDL peer (issue #29, item 8).

    python -m bench.quality [--quick] [--seeds 0 1 2 3 4] [--targets customer.churned ...] [--extra]
                            [--search 60s] [--auto '{"width": 32}'] [--fit '{"lr": 0.001}']
                            [--peer '{"epochs": 200}'] [--scale 1.0] [--json out.json] [--out out/bench/quality] [--dfs]

Targets: bench/relgen.py's 12 planted targets in 4 databases (star, chain of 4, snowflake, a time
column on the event table; data seed 0, one DuckDB file per target, only its label column in
it), and with --extra (or named in --targets) bench/realdata.py's: TPC-DS customer.buys_again and
customer.spend, Mutagenesis' molecule.mutagenic, Nations' holds.label. For every target and model
seed, ON THE SAME SPLIT (the relsql model's learner.rows: seed s's 70/15/15 random split):
- relsql: `Model(db, Template.auto(db, target=..., **auto), target=..., seed=s).fit(**fit)`;
- relsql_search (with --search BUDGET): a fresh `Model(...)` of the same seed, `.search(BUDGET)`
  (relsql/train/model/search.py; the budget per target and seed);
- majority, gbm_own_columns, gbm_one_hop: `relsql.train.gbm.baselines.compare(model.learner, "test")`
  (LightGBM on the target table's own columns / on one-hop SQL features, fitted on the training
  rows, stopped early on the validation rows);
- rdl_peer: bench/rdl_peer.py (PyG HeteroGraphSAGE with per-table encoders, full batch, AdamW,
  best validation epoch), reading the target's DuckDB file generically (tables, declared keys);
- dfs_gbm (with --dfs): bench/dfs_peer.py, featuretools' Deep Feature Synthesis (depth 2) + LightGBM
  on the model's learner (its keys, time cut and split; the `quality` extra).
Scored on the test rows: ROC-AUC (binary), accuracy (multiclass), MAE (regression; R^2 too).
Wall seconds: relsql = template + model build + fit; baselines = the whole compare() call (all
three); rdl_peer = graph + training; dfs_gbm = features + fit. torch uses 1 thread, the GBMs OMP_NUM_THREADS=1.

"relsql >= one-hop GBM" per target: mean(relsql) >= mean(gbm_one_hop) - std(relsql) over seeds
(MAE: mean(relsql) <= mean(gbm) + std(relsql)); the count lines tally it against each method, and
relsql_search against the one-hop GBM (within relsql_search's std).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before LightGBM/sklearn load their OpenMP runtime

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from bench import rdl_peer, realdata, relgen  # noqa: E402

QUICK_TARGETS = ["customer.churned", "product.return_rate", "store.tier", "txn.fraud"]
EXTRA_TARGETS = list(realdata.SPECS)
METHODS = ["relsql", "majority", "gbm_own_columns", "gbm_one_hop", "rdl_peer"]
SEARCH = "relsql_search"  # a method only with --search
DFS = "dfs_gbm"  # a method only with --dfs
PRIMARY = {"binary": "roc_auc", "multiclass": "accuracy", "regression": "mae"}


def higher_is_better(metric: str) -> bool:
    return metric != "mae"


def _r2(scores: dict[str, float], y_test: np.ndarray) -> dict[str, float]:
    """R^2 from the RMSE and the test labels' variance (regression scores only)."""
    if "rmse" in scores and y_test.var() > 0:
        return {**scores, "r2": 1.0 - scores["rmse"] ** 2 / float(y_test.var())}
    return scores


@dataclass
class Case:
    """One target's database file and its labels, in the target table's primary-key order."""
    name: str  # "table.column"
    database: str
    shape: str
    kind: str  # binary | multiclass | regression
    path: Path
    keys: np.ndarray  # the target table's primary keys, sorted as the database sorts them
    values: np.ndarray  # the label of each, in that order

    @property
    def table(self) -> str:
        return self.name.split(".")[0]

    @property
    def column(self) -> str:
        return self.name.split(".")[1]


def case(name: str, path: Path, database: str, shape: str, kind: str) -> Case:
    """A Case read back from its written file (rdl_peer.read's order: by primary key)."""
    table, column = name.split(".")
    read = rdl_peer.read(path)[table]
    return Case(name, database, shape, kind, path, read.frame[read.key].to_numpy(), read.frame[column].to_numpy())


def make_case(name: str, out: Path, scale: float) -> Case:
    """Write target `name`'s database file into `out` and read it back."""
    path = Path(out) / f"{name.replace('.', '_')}.duckdb"
    if name in realdata.SPECS:
        spec = realdata.SPECS[name]
        return case(name, realdata.write(name, path), spec.database, spec.shape, spec.kind)
    db, target = relgen.all_targets(0, scale)[name]
    return case(name, relgen.write(db, path, name), db.name, db.shape, target.kind)


def split_positions(learner, table_rows: int, keys: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """The model's split as positions of the target table's rows: of `keys` (the primary keys in
    the peer's order), or, without keys, relgen ids 1..n in order."""
    import pandas as pd

    from relsql.train.learner import results

    frame = results.predict(learner, splits=True)
    key = frame.columns[0]
    out = {}
    for split in ("train", "val", "test"):
        ids = frame.filter(frame["split"] == split)[key].to_numpy()
        found = ids.astype(np.int64) - 1 if keys is None else pd.Index(keys).get_indexer(ids)
        assert (found >= 0).all(), f"{split} rows whose key is not in the target table"
        out[split] = np.sort(found)
    assert all(len(v) for v in out.values()) and max(v.max() for v in out.values()) < table_rows
    return out


def run_one(case: Case, seed: int, auto: dict, fit: dict, peer: dict, search: str | None = None, dfs: bool = False) -> list[dict]:
    """One target, one seed: a row per method with its test scores and wall seconds."""
    import torch

    import relsql
    from relsql.train.gbm import baselines

    common = {"target": case.name, "database": case.database, "shape": case.shape, "kind": case.kind,
              "metric": PRIMARY[case.kind], "seed": seed}
    rows = []
    con = relsql.connect(str(case.path), read_only=True)

    def model() -> relsql.Model:
        template = relsql.Template.auto(con, target=case.name, **auto)
        return relsql.Model(con, template, target=case.name, seed=seed, progress=False, threads=1)

    started = time.perf_counter()
    fitted = model()
    fitted.fit(**fit)
    seconds = time.perf_counter() - started
    learner = fitted.learner
    positions = split_positions(learner, len(case.values), case.keys)
    y_test = np.asarray(case.values[positions["test"]], dtype=np.float64) if case.kind == "regression" else np.zeros(1)
    history = {"epochs": len(fitted.history), "best_epoch": fitted.best_epoch, "stopped": fitted.stopped}
    rows.append({**common, "method": "relsql", "scores": _r2(fitted.evaluate("test"), y_test), "seconds": seconds, **history})
    if search:
        started = time.perf_counter()
        searched = model().search(search)
        seconds = time.perf_counter() - started
        assert searched.rows["test"].tolist() == learner.rows["test"].tolist(), "search left the model's split"
        trials = getattr(searched, "trials", None)
        rows.append({**common, "method": SEARCH, "scores": _r2(searched.evaluate("test"), y_test), "seconds": seconds,
                     "trials": 0 if trials is None else len(trials), "epochs": len(searched.history)})
    if hasattr(baselines, "compare"):
        started = time.perf_counter()
        compared = baselines.compare(learner, "test")
        seconds = time.perf_counter() - started
        for name, scores in compared.items():
            rows.append({**common, "method": name, "scores": _r2(scores, y_test), "seconds": seconds})
    if dfs:
        from bench import dfs_peer

        got = dfs_peer.peer(learner)
        if "dfs_error" in got:
            print(f"{case.name} seed {seed}: dfs_gbm failed: {got['dfs_error']}", flush=True)
        else:
            scores = got.get("dfs_scores") or {PRIMARY[case.kind]: float("nan")}
            rows.append({**common, "method": DFS, "scores": _r2(scores, y_test), "seconds": got["dfs_s"],
                         "features": got["dfs_features"], "capped": got["dfs_capped"]})
    started = time.perf_counter()
    torch.set_num_threads(1)
    result = rdl_peer.run_file(case.path, case.table, case.column, case.kind, positions, seed, **peer)
    rows.append({**common, "method": "rdl_peer", "scores": _r2(result["scores"], y_test),
                 "seconds": time.perf_counter() - started,
                 "epochs": result["epochs"], "best_epoch": result["best_epoch"]})
    con.close()
    for row in rows:
        row["score"] = row["scores"].get(row["metric"], float("nan"))
    return rows


# --------------------------------------------------------------------------- summary
def summarize(rows: list[dict]) -> list[dict]:
    """Per target: per method the mean and std (over seeds) of the primary metric, mean seconds,
    and whether relsql is at least each other method within relsql's std."""
    out = []
    for name in dict.fromkeys(r["target"] for r in rows):
        mine = [r for r in rows if r["target"] == name]
        metric = mine[0]["metric"]
        entry = {"target": name, "kind": mine[0]["kind"], "metric": metric, "seeds": len({r["seed"] for r in mine}),
                 "methods": {}}
        for method in [*METHODS, SEARCH, DFS]:
            scores = [r["score"] for r in mine if r["method"] == method]
            if scores:
                entry["methods"][method] = {"mean": statistics.fmean(scores),
                                            "std": statistics.pstdev(scores) if len(scores) > 1 else 0.0,
                                            "seconds": statistics.fmean(r["seconds"] for r in mine if r["method"] == method)}
        ours = entry["methods"]["relsql"]
        entry["relsql_at_least"] = {m: at_least(ours, s, metric) for m, s in entry["methods"].items()
                                    if m not in ("relsql", SEARCH)}
        searched, flat = entry["methods"].get(SEARCH), entry["methods"].get("gbm_one_hop")
        if searched and flat:
            entry["search_at_least_one_hop"] = at_least(searched, flat, metric)
        out.append(entry)
    return out


def at_least(ours: dict, theirs: dict, metric: str) -> bool:
    """relsql's mean within its own std of the other's mean, or better."""
    if higher_is_better(metric):
        return ours["mean"] >= theirs["mean"] - ours["std"]
    return ours["mean"] <= theirs["mean"] + ours["std"]


def table(summary: list[dict]) -> str:
    """The summary as a Markdown table and the count lines."""
    methods = [m for m in ["relsql", SEARCH, *METHODS[1:], DFS] if any(m in e["methods"] for e in summary)]
    lines = ["| target | metric | " + " | ".join(methods) + " | relsql >= one-hop |",
             "|---|---|" + "---|" * len(methods) + "---|"]
    for e in summary:
        cells = []
        for m in methods:
            s = e["methods"].get(m)
            cells.append("-" if s is None else f"{s['mean']:.3f} ± {s['std']:.3f} ({s['seconds']:.1f} s)")
        verdict = e["relsql_at_least"].get("gbm_one_hop")
        lines.append(f"| {e['target']} | {e['metric']} | " + " | ".join(cells)
                     + f" | {'-' if verdict is None else 'yes' if verdict else 'NO'} |")
    lines.append("")
    for m in methods[1:]:
        judged = [e["relsql_at_least"][m] for e in summary if m in e["relsql_at_least"]]
        if judged:
            lines.append(f"relsql default >= {m} (within one std of relsql): {sum(judged)} of {len(judged)} targets")
    judged = [e["search_at_least_one_hop"] for e in summary if "search_at_least_one_hop" in e]
    if judged:
        lines.append("relsql with search >= gbm_one_hop (within one std of relsql_search): "
                     f"{sum(judged)} of {len(judged)} targets")
    return "\n".join(lines)


# --------------------------------------------------------------------------- driver
def _json_arg(text: str, name: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise SystemExit(f"--{name} must be a JSON object, e.g. '{{\"width\": 32}}': {err}") from None
    if not isinstance(value, dict):
        raise SystemExit(f"--{name} must be a JSON object, got {text!r}")
    return value


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m bench.quality", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help=f"{len(QUICK_TARGETS)} targets x seeds 0 1 (about 2-3 minutes)")
    parser.add_argument("--seeds", nargs="*", type=int, default=None)
    parser.add_argument("--targets", nargs="*", default=None, help="relgen's and bench/realdata.py's target names")
    parser.add_argument("--extra", action="store_true", help=f"add {', '.join(EXTRA_TARGETS)}")
    parser.add_argument("--search", default=None, help="also Model.search(BUDGET) per target and seed, e.g. 60s")
    parser.add_argument("--auto", default="{}", help="Template.auto keyword arguments, JSON")
    parser.add_argument("--fit", default="{}", help="Model.fit keyword arguments, JSON")
    parser.add_argument("--peer", default="{}", help="bench/rdl_peer.run keyword arguments, JSON")
    parser.add_argument("--scale", type=float, default=1.0, help="rows per table, times this")
    parser.add_argument("--json", default=None, help="write every number here")
    parser.add_argument("--dfs", action="store_true", help="also featuretools DFS (depth 2) + LightGBM (bench/dfs_peer.py)")
    parser.add_argument("--out", default="out/bench/quality", help="folder of the generated database files")
    args = parser.parse_args(argv)
    auto, fit, peer = _json_arg(args.auto, "auto"), _json_arg(args.fit, "fit"), _json_arg(args.peer, "peer")
    seeds = args.seeds if args.seeds is not None else ([0, 1] if args.quick else [0, 1, 2, 3, 4])
    if args.search is not None:
        from relsql.train.model.search import budget_seconds

        try:
            budget_seconds(args.search)
        except Exception as err:  # a RelsqlError saying what a budget looks like
            raise SystemExit(f"--search: {err}") from None
    planted = list(relgen.all_targets(0, args.scale))
    names = args.targets or (QUICK_TARGETS if args.quick else planted)
    names = names + [n for n in EXTRA_TARGETS if args.extra and n not in names]
    unknown = [n for n in names if n not in planted and n not in EXTRA_TARGETS]
    if unknown:
        raise SystemExit(f"unknown targets {unknown}; known: {', '.join(planted + EXTRA_TARGETS)}")
    warnings.simplefilter("ignore")
    import torch

    torch.set_num_threads(1)
    print(f"targets {names}, seeds {seeds}, auto {auto}, fit {fit}, peer {peer}, scale {args.scale}, "
          f"search {args.search}", flush=True)
    rows: list[dict] = []
    started = time.perf_counter()
    for name in names:
        target = make_case(name, Path(args.out), args.scale)
        for seed in seeds:
            got = run_one(target, seed, auto, fit, peer, args.search, args.dfs)
            rows += got
            print(f"{name} seed {seed}: " + ", ".join(f"{r['method']} {r['score']:.4f} ({r['seconds']:.1f} s)" for r in got),
                  flush=True)
    summary = summarize(rows)
    print()
    print(table(summary))
    machine = (f"{platform.node()}: {os.cpu_count()} cores, {platform.processor() or platform.machine()}, "
               f"python {platform.python_version()}, torch {torch.__version__}")
    print(f"\n{machine}; total {time.perf_counter() - started:.0f} s")
    result = {"settings": {"auto": auto, "fit": fit, "peer": peer, "seeds": seeds, "targets": names, "scale": args.scale,
                           "search": args.search},
              "machine": machine, "rows": rows, "summary": summary}
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=1, default=str))
        print(f"wrote {args.json}")
    return result


if __name__ == "__main__":
    main()
