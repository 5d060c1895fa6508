"""A relsql.Loader epoch at a batch size against a full-batch epoch, on bench.construction's shop.

    python -m bench.loader_epochs [--threads 2] [--epochs 5] [--batch-size 512]
    RELSQL_BATCH_PROCESS=0 python -m bench.loader_epochs     # batches prepared in the thread

One Loader per setting, kept for all its epochs (as a user's loop keeps it); each epoch is the
documented loop (forward, loss, backward, AdamW step). Prints the median wall and CPU seconds of
the epochs after the first (which records the plans of new batch shapes) and their ratio. The
process's CPU time does not count a batch process's child: compare walls, or run with
RELSQL_BATCH_PROCESS=0 for the whole CPU cost.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path


def epochs(model, batch_size: int | None, count: int) -> list[tuple[float, float]]:
    import torch

    import relsql

    with relsql.Loader(model, batch_size=batch_size) as loader:
        optimizer = torch.optim.AdamW(loader.parameters(), lr=0.01)
        loader.optimizer = optimizer
        seconds = []
        for _ in range(count):
            wall, cpu = time.perf_counter(), time.process_time()
            for batch in loader:
                optimizer.zero_grad()
                batch.loss().backward()
                optimizer.step()
            seconds.append((time.perf_counter() - wall, time.process_time() - cpu))
    return seconds[1:]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2, help="torch's threads in the user's loop")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=512)
    args = parser.parse_args(argv)
    import torch

    import relsql
    from bench.construction import ROOT, make_shop

    ROOT.mkdir(parents=True, exist_ok=True)
    db = relsql.connect(str(make_shop(Path(ROOT) / "shop.duckdb")), read_only=True)
    template = relsql.Template.auto(db, target="customer.churned")
    model = relsql.Model(db, template, target="customer.churned", progress=False)
    torch.set_num_threads(args.threads)
    full, mini = epochs(model, None, args.epochs), epochs(model, args.batch_size, args.epochs)

    def median(runs: list[tuple[float, float]], i: int) -> float:
        return statistics.median(r[i] for r in runs)

    print(f"torch threads {args.threads}, batch process {os.environ.get('RELSQL_BATCH_PROCESS', 'default')}, "
          f"load {os.getloadavg()[0]:.1f}: full batch wall {median(full, 0):.3f} s (cpu {median(full, 1):.3f}); "
          f"batch {args.batch_size} wall {median(mini, 0):.3f} s (cpu {median(mini, 1):.3f}); "
          f"ratio {median(mini, 0) / median(full, 0):.2f}")


if __name__ == "__main__":
    main()
