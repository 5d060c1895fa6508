"""Data-parallel training on one machine, and what the measured costs project to on many.

    python -m bench.distributed [--scale 1] [--ranks 1 2] [--batch-size 16384] [--epochs 1]
                                [--engines duckdb spark] [--embedding] [--out out/bench]

TPC-H at `--scale` (generated once into out/tpch/, like bench.tpch_memory), opened read-only;
`Template.auto(db, "orders.o_orderpriority")` (2 hops: line items, parts, suppliers, customer,
nation). The database grounds every relation once into the grounding store (the engine's part);
then, from the same initial weights, one epoch is trained by one process (`Model.fit`) and by
each rank count of `--ranks` (`fit(workers=N)`: N processes reading the store, a share of every
batch each, one gloo all-reduce per step). Per run: epoch seconds, target rows per second, and
rank 0's split of the epoch into waiting on the store (reading a batch's groundings and planning
it, in the background thread, counted when the step waits), compute (forward, backward, Adam)
and all-reduce (which includes waiting for the slower rank).

With `--engines ... spark` the same is done with Spark as the engine (`local[2]`, the tables
exported once to Parquet under out/tpch/ and read by Spark as temp views; the template is the
one generated on DuckDB, whose keys it infers): Spark computes the key tables, dictionaries,
statistics and the bulk grounding, the ranks read what it wrote.

`--embedding` adds to the orders' representation a database-stored embedding of the customer
key (width 16, `storage='database'`; on DuckDB in a copy of the TPC-H file, on Spark in a
warehouse folder of its own): one DuckDB process reads and updates its rows in SQL per step, N
ranks hold it sharded in memory (relsql/train/embeddings/sharded.py) and exchange the batch's rows and
gradients in their collectives; the parent writes the table back at the end (on Spark a new
table swapped in; Spark has no one-process run with it, its 1-rank run is that).

The projection (printed as such, never measured) takes the 1-rank per-row cost and the measured
per-step all-reduce, and scales them to TPC-H sf 100 / 1000 on 4-64 workers, each a machine like
this one, with a ring all-reduce over a 10 Gb/s network (0.1 ms per hop). Bulk grounding there is
the engine's (Spark's) job and is not projected.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from bench import write_csv
from bench.tpch_memory import database_file

ROOT = Path(__file__).resolve().parent.parent
ORDERS_PER_SF = 1_500_000
NETWORK_BYTES_PER_S = 10e9 / 8
HOP_SECONDS = 1e-4


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--batch-size", type=int, default=16_384)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--engines", nargs="+", choices=["duckdb", "spark"], default=["duckdb"])
    parser.add_argument("--embedding", action="store_true", help="add a database-stored customer embedding")
    parser.add_argument("--out", type=Path, default=ROOT / "out" / "bench")
    args = parser.parse_args(argv)

    import relsql

    path = database_file(args.scale, ROOT / "out" / "tpch")
    duck = relsql.connect(path, read_only=True)
    template = relsql.Template.auto(duck, "orders.o_orderpriority")
    if args.embedding:
        return embedding_runs(path, template, args)
    rows: list[dict] = []
    for engine in args.engines:
        db = duck if engine == "duckdb" else spark_database(duck, path)
        rows += measure(db, engine, template, args)
    write_csv(args.out / "distributed.csv", rows)
    project(rows, args)


EMBEDDING = """
CREATE TABLE p_orders AS
SELECT o."o_orderkey", linear(embed(o."o_custkey", 16, 'customer', storage='database'), 16, 'w_customer_embedding') AS h
FROM "orders" o;
"""


def embedding_runs(path: Path, template, args) -> None:
    """The same runs with a database-stored embedding, on a writable copy of the TPC-H file."""
    import shutil
    import tempfile

    import relsql

    embedded = relsql.Template.from_sql(template.source + EMBEDDING)
    rows: list[dict] = []
    for engine in args.engines:
        if engine == "spark":
            with tempfile.TemporaryDirectory(prefix="relsql-bench-warehouse-") as warehouse:
                with relsql.connect(path, read_only=True) as duck:
                    db = spark_database(duck, path, warehouse)
                rows += measure(db, "spark+embedding", embedded, args)
                db.close()
            continue
        copy = path.with_name(path.stem + "-embedding.duckdb")
        shutil.copyfile(path, copy)
        try:
            with relsql.connect(copy) as db:
                rows += measure(db, "duckdb+embedding", embedded, args)
        finally:
            copy.unlink(missing_ok=True)
    write_csv(args.out / "distributed_embedding.csv", rows)


def spark_database(duck, path: Path, warehouse: str | None = None):
    """A local[2] Spark session over the TPC-H tables, exported once to Parquet beside the file
    (`warehouse`: where Spark keeps the tables relsql writes, default Spark's)."""
    import os
    import sys

    import sqlglot.expressions as exp
    from pyspark.sql import SparkSession

    import relsql

    folder = path.with_name(path.stem + "-parquet")
    if not folder.exists():
        partial = folder.with_name(folder.name + ".partial")
        partial.mkdir(parents=True, exist_ok=True)
        for table in duck.tables():
            name = exp.Table(this=exp.to_identifier(table, quoted=True))
            copy = exp.Copy(this=name, files=[exp.Literal.string(str(partial / f"{table}.parquet"))],
                            params=[exp.CopyParameter(this=exp.Var(this="FORMAT"), expression=exp.Var(this="PARQUET"))])
            duck.con.execute(copy.sql("duckdb"))
        partial.rename(folder)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    session = (SparkSession.builder.master("local[2]").appName("relsql-bench").config("spark.ui.enabled", "false")
               .config("spark.sql.shuffle.partitions", "8").config("spark.sql.session.timeZone", "UTC")
               .config("spark.driver.memory", "6g"))
    if warehouse is not None:
        session = session.config("spark.sql.warehouse.dir", warehouse)
    session = session.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    for file in sorted(folder.glob("*.parquet")):
        session.read.parquet(str(file)).createOrReplaceTempView(file.stem)
    return relsql.connect(session)


def measure(db, engine: str, template, args) -> list[dict]:
    """One epoch by one process and by each rank count, from the same initial weights."""
    import relsql
    from relsql.train.learner.record import FitRecord
    from relsql.train.loop import distributed
    from relsql.train.loop.options import FitConfig

    started = time.perf_counter()
    model = relsql.Model(db, template, "orders.o_orderpriority", batch_size=args.batch_size, progress=False)
    setup = {"key_tables_s": model.timings["grounding"], "bulk_grounding_s": model.timings.get("bulk_grounding", 0.0),
             "model_s": time.perf_counter() - started}
    initial = model.learner.weights_copy()
    train_rows = len(model.rows["train"]) * args.epochs
    parameters = sum(p.numel() for p in model.parameters())
    print(f"TPC-H sf {args.scale:g} on {engine}: {train_rows // args.epochs:,} training orders, batch {args.batch_size:,}, "
          f"{parameters:,} parameters; key tables {setup['key_tables_s']:.1f}s, bulk grounding into the store "
          f"{setup['bulk_grounding_s']:.1f}s")
    rows = []

    def record(kind: str, ranks: int, wall: float) -> dict:
        t = model.timings
        epoch = t.get("epochs", wall) / args.epochs
        row = {"engine": engine, "run": kind, "ranks": ranks, "epoch_s": round(epoch, 2),
               "rows_per_s": round(train_rows / args.epochs / epoch), "startup_s": round(t.get("rank_startup", 0.0), 2),
               "waiting_on_store_s": round(t.get("waiting_on_store", t.get("waiting_on_database", 0.0)) / args.epochs, 2),
               "compute_s": round(t.get("compute", 0.0) / args.epochs, 2),
               "all_reduce_s": round(t.get("all_reduce", 0.0) / args.epochs, 2),
               "validation_s": round(t.get("validation", 0.0) / args.epochs, 2), "parameters": parameters,
               "training_rows": train_rows // args.epochs, **{k: round(v, 2) for k, v in setup.items()}}
        rows.append(row)
        print(f"  {kind:<22} ranks {ranks}: epoch {row['epoch_s']:7.2f}s  {row['rows_per_s']:>8,} rows/s  "
              f"(store {row['waiting_on_store_s']:.2f}s, compute {row['compute_s']:.2f}s, all-reduce {row['all_reduce_s']:.2f}s; "
              f"rank start {row['startup_s']:.1f}s)")
        return row

    if db.transactional or not engine.endswith("+embedding"):  # else stored embeddings train on ranks only
        model.learner.restore_weights(initial)
        model.learner.record = FitRecord()
        steps: list[float] = []
        started = time.perf_counter()
        model.fit(epochs=args.epochs, patience=args.epochs, batch_size=args.batch_size,
                  callback=lambda info: steps.append(time.perf_counter()))
        model.timings["epochs"] = steps[-1] - started  # to its last step: validation (one process) left out
        record("one process (Model.fit)", 1, time.perf_counter() - started)
    for ranks in args.ranks:
        model.learner.restore_weights(initial)
        model.learner.record = FitRecord()
        started = time.perf_counter()
        distributed.fit(model.learner, FitConfig(epochs=args.epochs, batch_size=args.batch_size, lr=0.01, patience=args.epochs,
                                                  workers=ranks))
        record("fit(workers=N)", ranks, time.perf_counter() - started)
    return rows


def project(rows: list[dict], args) -> None:
    """Per-rank costs measured here, scaled to TPC-H sf 100 / 1000 on many workers (a projection)."""
    one = next(r for r in rows if r["run"].startswith("fit") and r["ranks"] == 1)
    train_rows, parameters = one["training_rows"] * args.epochs, one["parameters"]
    per_row = (one["epoch_s"] - one["all_reduce_s"]) / (train_rows / args.epochs)
    steps = max(1, -(-train_rows // args.epochs // args.batch_size))
    measured = [r for r in rows if r["run"].startswith("fit") and r["ranks"] > 1]
    local_all_reduce = (measured[-1]["all_reduce_s"] / steps) if measured else 0.0
    print(f"\nprojection, not measured: per training row {per_row * 1e6:.1f} us of store reads + compute on one rank "
          f"(from the 1-rank run), {parameters:,} float32 parameters all-reduced per step over a ring at 10 Gb/s "
          f"(measured here between 2 local ranks: {local_all_reduce * 1000:.1f} ms per step, imbalance included)")
    projected = []
    for sf in (100, 1000):
        training = ORDERS_PER_SF * sf * 7 // 10
        for workers in (4, 16, 64):
            steps = -(-training // args.batch_size)
            ring = 2 * (workers - 1) / workers * parameters * 4 / NETWORK_BYTES_PER_S + 2 * (workers - 1) * HOP_SECONDS
            epoch = training * per_row / workers + steps * ring
            projected.append({"sf": sf, "workers": workers, "training_rows": training, "projected_epoch_s": round(epoch, 1),
                              "of_which_all_reduce_s": round(steps * ring, 1)})
            print(f"  sf {sf:>5}: {workers:>2} workers, {training:>11,} rows: about {epoch:8.1f}s per epoch "
                  f"({steps * ring:.1f}s of it all-reduce)")
    write_csv(args.out / "distributed_projection.csv", projected)


if __name__ == "__main__":
    main()
