"""An embedding of 10 million keys that never sits in torch: embed(..., storage='database').

    python demos/out_of_core.py [--users 10000000] [--rows 12000000] [--batch-size 65536] [--epochs 1]

Writes a DuckDB file `out/demo/clicks.duckdb` with a table `click(id, user_id, x, y)`: --rows
clicks by --users distinct users (every user clicks at least once), a numeric feature x, and a
label y that depends on x. The template embeds the user id with its embedding kept in the table
`relsql_embedding_user` of that file: every batch reads the rows of its users (creating those
not seen before) from memory-mapped arrays beside the database, trains them, and applies their
gradient with Adagrad there; the changed rows go into the table with its step counter in one
transaction at each write-back (here: the best epoch's copy after validation). Printed: the
table's rows and steps, the epoch's wall time and the time waiting on the database worker, the
step time at the start and at the end of the epoch, the load average, and the peak resident
memory, next to what the embedding alone would take in torch memory (with Adam's two moment
tensors).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import peak_rss_mib  # noqa: E402

TEMPLATE = """
CREATE TABLE pred AS
SELECT c.id, linear(tanh(embed(c.user_id, 8, 'user', storage='database') + linear(features(c.x), 8, 'wx')), 1, 'out') AS h
FROM click c;
"""


def build(path: Path, users: int, rows: int) -> None:
    import duckdb

    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    con = duckdb.connect(str(path))
    con.execute(f"""
        CREATE TABLE click AS
        SELECT i AS id,
               (CASE WHEN i < {users} THEN i ELSE hash(i) % {users} END)::BIGINT AS user_id,
               (hash(i * 7) % 1000) / 1000.0 AS x,
               (hash(i * 7) % 1000) / 1000.0 > 0.5 AS y
        FROM range({rows}) t(i)
    """)
    con.close()


def main(argv: list[str] | None = None) -> dict:
    import numpy as np
    import torch

    import relsql

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--users", type=int, default=10_000_000)
    parser.add_argument("--rows", type=int, default=12_000_000)
    parser.add_argument("--batch-size", type=int, default=65536)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--memory-limit", default="1GB")
    parser.add_argument("--path", default=str(ROOT / "out" / "demo" / "clicks.duckdb"))
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")
    torch.set_num_threads(2)

    path = Path(args.path)
    started = time.perf_counter()
    build(path, args.users, args.rows)
    print(f"{args.rows:,} clicks of {args.users:,} users written to {path} in {time.perf_counter() - started:.0f} s")
    db = relsql.connect(path, memory_limit=args.memory_limit)
    started = time.perf_counter()
    model = relsql.Model(db, relsql.Template.from_sql(TEMPLATE), target="click.y", seed=0, batch_size=args.batch_size,
                         progress=True)
    print(f"setup (key tables, feature statistics) {time.perf_counter() - started:.0f} s")
    print(f"setup: key tables {model.timings['grounding'] - model.timings.get('bulk_grounding', 0.0):.0f} s, "
          f"bulk grounding into the store {model.timings.get('bulk_grounding', 0.0):.0f} s")
    steps: list[float] = []
    last = [time.perf_counter()]

    def step_time(info: dict) -> None:  # wall time between consecutive steps (the first from fit's start)
        now = time.perf_counter()
        steps.append(now - last[0])
        last[0] = now

    started = last[0] = time.perf_counter()
    model.fit(epochs=args.epochs, patience=args.epochs, callback=step_time)
    elapsed = time.perf_counter() - started
    store = model.batched.stores["user"]
    result = {"users": args.users, "rows": args.rows, "table_rows": store.rows(), "steps": store.step(),
              "epoch_s": round(elapsed / args.epochs, 1), "waiting_on_database_s": round(model.timings["waiting_on_database"], 1),
              "peak_rss_mib": round(peak_rss_mib()), "in_torch_mib": round(args.users * 8 * 4 * 3 / 2**20),
              "val_accuracy": round(model.history[-1]["val_accuracy"], 3),
              "first_steps_s": round(float(np.median(steps[1:6])), 2), "last_steps_s": round(float(np.median(steps[-5:])), 2)}
    print(f"relsql_embedding_user: {result['table_rows']:,} rows after {result['steps']} steps; "
          f"epoch {result['epoch_s']} s, of which waiting on the database {result['waiting_on_database_s']} s; "
          f"validation accuracy {result['val_accuracy']}")
    print(f"step time: {result['first_steps_s']} s at the start of the epoch, {result['last_steps_s']} s at its end "
          f"(medians of 5 steps; ratio {result['last_steps_s'] / result['first_steps_s']:.2f})")
    print(f"peak resident memory {result['peak_rss_mib']:,} MiB; the same embedding in torch with Adam's moments: "
          f"{result['in_torch_mib']:,} MiB for its tensors alone")
    status = Path("/proc/self/status")
    if status.exists():  # Linux: resident memory now, anonymous vs pages of mapped files (the row arrays'; reclaimable)
        fields = dict(line.split(":", 1) for line in status.read_text().splitlines() if ":" in line)
        result.update({f"{k.lower()}_mib": round(int(fields[k].split()[0]) / 1024)
                       for k in ("RssAnon", "RssFile") if k in fields})
        print(f"resident now: anonymous {result.get('rssanon_mib', 0):,} MiB, mapped files {result.get('rssfile_mib', 0):,} MiB")
    result["load_average"] = tuple(round(v, 2) for v in os.getloadavg())
    print(f"load average (1, 5, 15 min) {result['load_average']}")
    db.close()
    return result


if __name__ == "__main__":
    main()
