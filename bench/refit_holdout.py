"""What the refit on every labelled row is worth, scored on rows nobody trained on.

fit()'s refit (relsql/train/loop/refit.py) trains on the validation and test rows too, so the
split's scores cannot judge it. Here an outer hold-out does: in a copy of each database the latest
15 % of the target's labelled rows (by its time column; without one, a seeded random 15 %) get
NULL labels, so fit() treats them as rows to predict; each refit variant's predictions of them are
scored against the hidden labels (ROC-AUC for a binary target, RMSE for a regression).

    python -m bench.refit_holdout --manifests DIR/*.json [--seeds 0-3] [--variants restart,0,0.25,0.5]
                                  [--out OUT.jsonl]

Variants (refit.REFIT_SHARE): `restart` trains again from the initial weights for the kept number
of epochs, replaying the selection's rates; a share s continues from the selected weights for
ceil(s x kept epochs) epochs at the kept epoch's rate; `0` keeps the selected network (only the
blend's GBM is fitted again). Every variant of a run shares the selection run (same seed, same
split), so only the refit differs. Manifests are bench.outside's (`--corpus-dir`); each one's first
target is run. Prints, per variant against `restart`, the runs where the network was refit, how
often the variant scored better or worse, its mean gain (ROC-AUC: the difference; RMSE: relative)
and its fit CPU against restart's.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import duckdb
import polars as pl
from sklearn.metrics import mean_squared_error, roc_auc_score

import relsql
from bench.outside_hostile import seeds as seed_list
from relsql.train.loop import refit as refits

HIDDEN = 0.15


def hide(source: str, folder: Path, table: str, column: str, time_column: str | None, seed: int):
    """A copy of the database with the latest (or a random) HIDDEN share of labelled rows unlabelled;
    returns (its path, the hidden rows with their labels)."""
    path = folder / "db.duckdb"
    shutil.copy(source, path)
    con = duckdb.connect(str(path))
    try:
        columns = [r[0] for r in con.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = ? ORDER BY ordinal_position",
            [table]).fetchall()]
        named = ", ".join(f'"{c}"' for c in columns)
        labelled = con.execute(f'SELECT count(*) FROM "{table}" WHERE "{column}" IS NOT NULL').fetchone()[0]
        k = max(1, round(HIDDEN * labelled))
        con.execute("SELECT setseed(?)", [(seed + 1) / 100])
        order = f'"{time_column}" DESC, random()' if time_column else "random()"
        con.execute(f'CREATE TEMP TABLE hidden AS SELECT * FROM "{table}" WHERE "{column}" IS NOT NULL '
                    f"ORDER BY {order} LIMIT {k}")
        truth = pl.from_arrow(con.sql("SELECT * FROM hidden").to_arrow_table())
        con.execute(f'UPDATE "{table}" SET "{column}" = NULL WHERE ({named}) IN (SELECT ({named}) FROM hidden)')
    finally:
        con.close()
    return path, truth


def score(kind: str, truth, predicted, column: str) -> float:
    keys = [c for c in predicted.columns if c not in ("prediction", "split") and not c.startswith("probability")]
    joined = truth.join(predicted, on=keys, how="inner")
    y = joined[column].to_numpy().astype(float)
    if kind == "binary":
        return float(roc_auc_score(y, joined["probability"].to_numpy())) if len(set(y)) > 1 else float("nan")
    return math.sqrt(mean_squared_error(y, joined["prediction"].to_numpy()))


def run(manifest: dict, seed: int, variants: list[str]) -> list[dict]:
    entry = manifest["targets"][0]
    table, column = entry["target"].split(".")
    time_column = entry.get("time_column")
    options = {"time_column": time_column} if time_column else {}
    out = []
    with tempfile.TemporaryDirectory() as folder:
        path, truth = hide(manifest["path"], Path(folder), table, column, time_column, seed)
        db = relsql.connect(path, **({"keys": manifest["keys"]} if manifest.get("keys") else {}))
        for variant in variants:
            refits.REFIT_SHARE = None if variant == "restart" else float(variant)
            try:
                model = relsql.Model(db, relsql.Template.auto(db, target=entry["target"], **options),
                                     target=entry["target"], seed=seed, progress=False, **options)
                clock = time.process_time()
                model.fit()
                fit_cpu = time.process_time() - clock
                value = score(entry["kind"], truth, model.predict(), column)
            finally:
                refits.REFIT_SHARE = DEFAULT_SHARE
            blend = getattr(model.learner, "hybrid", None)
            out.append({"database": manifest["name"], "target": entry["target"], "kind": entry["kind"], "seed": seed,
                        "variant": variant, "hidden": truth.height, "score": value, "fit_cpu_s": fit_cpu,
                        "epochs": len(model.history), "refit_epochs": (model.refit or {}).get("epochs"),
                        "weight": None if blend is None else float(blend.weight)})
            print(json.dumps(out[-1]), flush=True)
    return out


def summary(rows: list[dict]) -> list[str]:
    """Each variant against restart, over the runs where restart trained the network again."""
    by = defaultdict(dict)
    for r in rows:
        by[(r["database"], r["seed"])][r["variant"]] = r
    lines = []
    for variant in sorted({r["variant"] for r in rows} - {"restart"}):
        gains, cost = [], []
        for runs in by.values():
            base, other = runs.get("restart"), runs.get(variant)
            if not base or not other or not base["refit_epochs"] or math.isnan(base["score"]):
                continue
            a, b = base["score"], other["score"]
            gains.append(b - a if base["kind"] == "binary" else (a - b) / a)
            cost.append(other["fit_cpu_s"] / base["fit_cpu_s"])
        if not gains:
            continue
        spread = statistics.stdev(gains) / math.sqrt(len(gains)) if len(gains) > 1 else float("nan")
        lines.append(f"{variant} vs restart: {len(gains)} runs, better {sum(g > 1e-9 for g in gains)}, worse "
                     f"{sum(g < -1e-9 for g in gains)}, mean gain {statistics.mean(gains):+.4f} (s.e. {spread:.4f}), "
                     f"fit CPU {statistics.median(cost):.2f}x (median)")
    return lines


DEFAULT_SHARE = refits.REFIT_SHARE


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--manifests", nargs="+", required=True)
    parser.add_argument("--seeds", default="0-3")
    parser.add_argument("--variants", default="restart,0,0.25,0.5")
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    rows = []
    for name in args.manifests:
        manifest = json.loads(Path(name).read_text())
        for seed in seed_list(args.seeds):
            rows += run(manifest, seed, args.variants.split(","))
    if args.out:
        Path(args.out).write_text("".join(json.dumps(r) + "\n" for r in rows))
    print("\n".join(summary(rows)))


if __name__ == "__main__":
    main()
