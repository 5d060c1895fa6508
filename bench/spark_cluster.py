"""The same model on DuckDB and on a Spark standalone cluster: max prediction difference, both times.

    python -m bench.spark_cluster [--master spark://HOST:PORT] [--workers 2] [--cores 1]
                                  [--data mutagenesis|tpch] [--sf 0.1] [--epochs 2] [--batch-size N]
                                  [--executor-python PATH] [--out out/bench]

Without --master, a master and `--workers` workers (`--cores` each) are started on this machine
(bench/spark_standalone.py: Spark's own daemons, separate processes, loopback) and torn down
after. The driver is this process. Data: `mutagenesis` (188 molecules, the embedding template of
tests/test_spark_cluster.py) or `tpch` at `--sf` (bench/tpch_memory.py's customer-level template
on `customer.c_mktsegment`; tables generated once by DuckDB's tpch extension into out/tpch and
handed to Spark as Parquet files, as a cluster would read them). Both engines train in float64
with the same seed and batches; Spark's ranks run on the executors (`fit(workers=W)`), DuckDB's
one process trains the same full-data gradient steps (`fit()`, no refit), so the predictions
agree to rounding.

Reported per engine: setup (grounding, the grounding store's build) and the training's wall
time, groundings per second of setup, this process's CPU seconds, and at the end the max
absolute prediction difference. Spark's executors are processes of their own: the cluster's CPU
seconds (its daemons, executors and their Python workers, read from /proc while the application
runs; not the driver's JVM) are reported too (a started cluster only). `--executor-python` runs
the executors on another Python (one without relsql, to time the shipping of the package).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

from bench.spark_standalone import standalone

ROOT = Path(__file__).resolve().parent.parent

MUTAGENESIS = """
CREATE TABLE atom_embed AS SELECT a.atom_id, tanh(embed(a.element, 8, 'atom_embed')) AS h FROM atom a;
CREATE TABLE predict AS
SELECT a.molecule_id, linear(avg(e.h), 1, 'predict') + bias(1, 'predict_bias') AS h
FROM atom a JOIN atom_embed e ON e.atom_id = a.atom_id GROUP BY a.molecule_id;
"""


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _data(args) -> tuple[str, str, str, dict[str, Path]]:
    """(template, target, DuckDB file, {table: Parquet folder}) for the chosen data."""
    import duckdb

    folder = ROOT / "out" / "spark_cluster"
    if args.data == "mutagenesis":
        from relsql.datasets.mutagenesis import load

        path = folder / "mutagenesis.duckdb"
        if not path.exists():
            folder.mkdir(parents=True, exist_ok=True)
            con = duckdb.connect(str(path))
            load(con)
            con.close()
        template, target = MUTAGENESIS, "molecule.mutagenic"
    else:
        from bench.tpch_memory import TEMPLATE, database_file

        path = database_file(args.sf, ROOT / "out" / "tpch")
        template, target = TEMPLATE, "customer.c_mktsegment"
    parquet = folder / f"{path.stem}_parquet"
    con = duckdb.connect(str(path), read_only=True)
    tables = [row[0] for row in con.execute("SELECT table_name FROM information_schema.tables "
                                            "WHERE table_schema = 'main'").fetchall()]
    if not parquet.exists():
        partial = parquet.with_suffix(".partial")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        for table in tables:
            relation = con.table(table)
            relation.write_parquet(str(partial / f"{table}.parquet"))
        os.replace(partial, parquet)
    con.close()
    return template, target, str(path), {t: parquet / f"{t}.parquet" for t in tables}


def _train(db, template: str, target: str, args, store: str | None, workers: int | None) -> tuple[object, dict]:
    import torch

    import relsql

    figures: dict = {}
    started, cpu = time.perf_counter(), _cpu()
    model = relsql.Model(db, relsql.Template.from_sql(template), target, seed=0, batch_size=args.batch_size,
                         dtype=torch.float64, progress=False, store=store or True, max_groundings=10**11)
    figures["setup_s"], figures["setup_cpu_s"] = time.perf_counter() - started, _cpu() - cpu
    started, cpu = time.perf_counter(), _cpu()
    if workers:
        model.fit(epochs=args.epochs, workers=workers)
    else:
        model.fit(epochs=args.epochs, refit=False)  # the ranks never refit
    figures["fit_s"], figures["fit_cpu_s"] = time.perf_counter() - started, _cpu() - cpu
    figures["epoch_s"] = figures["fit_s"] / args.epochs
    figures["rows"] = model.output_rows
    sizes = model.batched.grounding_store.sizes
    groundings = sum(size["groundings"] for size in sizes.values())
    figures["groundings"] = groundings
    figures["store_mib"] = sum(size["bytes"] for size in sizes.values()) / 2**20
    figures["store_build_s"] = model.timings.get("bulk_grounding", float("nan"))
    figures["groundings_per_s"] = groundings / figures["setup_s"]
    return model, figures


def _spark(url: str, folder: Path, tables: dict[str, Path], template: str, target: str, args) -> tuple[object, dict]:
    from pyspark.sql import SparkSession

    import relsql

    session = (SparkSession.builder.master(url).appName("relsql-bench")
               .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.session.timeZone", "UTC").config("spark.sql.shuffle.partitions", str(args.partitions))
               .config("spark.executor.memory", args.executor_memory).config("spark.executor.cores", str(args.cores))
               .config("spark.driver.memory", "2g").config("spark.sql.warehouse.dir", str(folder / "warehouse"))
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    for table, path in tables.items():
        session.read.parquet(str(path)).createOrReplaceTempView(table)
    db = relsql.connect(url, scratch=str(folder / "scratch"))
    model, figures = _train(db, template, target, args, str(folder / "store"), args.workers * args.cores)
    figures["predict_started"] = time.perf_counter()
    return (model, db, session), figures


def _predictions(model):
    """Key columns and the prediction's score (the probability, else the prediction) as a polars frame."""
    frame = model.predict(with_split=False)
    score = next(c for c in ("probability", "prediction") if c in frame.columns)
    keys = [c for c in frame.columns if c not in ("prediction", "probability", "probabilities")]
    if "probabilities" in frame.columns:
        frame = frame.with_columns(frame["probabilities"].list.max().alias("score"))
    else:
        frame = frame.with_columns(frame[score].cast(float).alias("score"))
    return frame.select([*keys, "score"]).sort(keys), keys


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--master", help="an existing cluster's spark:// URL; else one is started here")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--cores", type=int, default=1)
    parser.add_argument("--worker-memory", default="1500m")
    parser.add_argument("--executor-memory", default="1g")
    parser.add_argument("--partitions", type=int, default=4, help="spark.sql.shuffle.partitions")
    parser.add_argument("--data", choices=("mutagenesis", "tpch"), default="mutagenesis")
    parser.add_argument("--sf", type=float, default=0.1)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--executor-python", default=sys.executable)
    parser.add_argument("--out", default=str(ROOT / "out" / "bench"))
    args = parser.parse_args()
    os.environ["PYSPARK_PYTHON"] = args.executor_python
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

    import torch

    import relsql

    torch.set_num_threads(args.workers * args.cores)
    template, target, path, tables = _data(args)
    print(f"data: {args.data}{f' sf {args.sf:g}' if args.data == 'tpch' else ''}; {args.workers} workers x "
          f"{args.cores} cores; {args.epochs} epochs, batch {args.batch_size}", flush=True)

    duck = relsql.connect(path, read_only=True)
    model, duck_figures = _train(duck, template, target, args, None, None)
    reference, keys = _predictions(model)
    print("duckdb:", json.dumps({k: round(v, 3) for k, v in duck_figures.items()}), flush=True)

    folder = Path(tempfile.mkdtemp(prefix="relsql-spark-bench-"))
    try:
        if args.master:
            spark_parts, spark_figures = _spark(args.master, folder, tables, template, target, args)
            theirs, _ = _predictions(spark_parts[0])
            spark_parts[1].close()
            spark_parts[2].stop()
        else:
            with standalone(folder / "cluster", workers=args.workers, cores=args.cores,
                            memory=args.worker_memory) as cluster:
                started = cluster.cpu_seconds()
                spark_parts, spark_figures = _spark(cluster.url, folder, tables, template, target, args)
                spark_figures["cluster_cpu_s"] = cluster.cpu_seconds() - started  # executors alive: the app runs
                theirs, _ = _predictions(spark_parts[0])
                spark_parts[1].close()
                spark_parts[2].stop()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    spark_figures.pop("predict_started", None)
    print("spark: ", json.dumps({k: round(v, 3) for k, v in spark_figures.items()}), flush=True)

    joined = reference.join(theirs, on=keys, how="full", suffix="_spark", coalesce=True)
    if joined.height != reference.height or joined["score_spark"].null_count() or joined["score"].null_count():
        raise SystemExit(f"the engines predicted different rows: {reference.height} on DuckDB, {theirs.height} on Spark")
    difference = float((joined["score"] - joined["score_spark"]).abs().max())
    print(f"max prediction difference: {difference:.3e} over {joined.height} rows")
    print(f"setup: DuckDB {duck_figures['setup_s']:.1f} s, Spark {spark_figures['setup_s']:.1f} s "
          f"({spark_figures['setup_s'] / duck_figures['setup_s']:.1f}x); training: DuckDB {duck_figures['fit_s']:.1f} s, "
          f"Spark {spark_figures['fit_s']:.1f} s ({spark_figures['fit_s'] / duck_figures['fit_s']:.1f}x)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = f"spark_cluster_{args.data}{f'_sf{args.sf:g}' if args.data == 'tpch' else ''}.json"
    (out / name).write_text(json.dumps({"args": vars(args), "duckdb": duck_figures, "spark": spark_figures,
                                        "max_difference": difference, "rows": joined.height}, indent=1))


if __name__ == "__main__":
    main()
