"""MUTAG with the GCN template from relsql/sql_templates/: load the TU files into DuckDB, compile, train.

    python demos/mutag_gcn.py [--template relsql/sql_templates/sage.sql] [--epochs 100]

The graph convolution, its normalization and the readout are all in the SQL template; this
script only loads data, picks the output relation and runs a plain torch training loop.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

import relsql
from relsql.datasets.tu_format import load_tu, mutag_folder

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--template", default=str(ROOT / "relsql" / "sql_templates" / "gcn.sql"))
    parser.add_argument("--epochs", type=int, default=100)
    args = parser.parse_args()

    db = relsql.connect()
    counts = load_tu(db.con, mutag_folder(), "MUTAG")
    print(f"MUTAG in DuckDB: {counts}")
    template = relsql.Template.from_file(args.template)
    started = time.perf_counter()
    net = relsql.compile(template, db, seed=0)
    print(f"grounded and compiled {args.template} in {time.perf_counter() - started:.2f}s")
    print(net.explain())

    output = template.output
    graphs = net.values(output)["graph_id"].to_list()
    labels = dict(db.con.execute("SELECT graph_id, label FROM graph").fetchall())
    target = torch.tensor([max(labels[g], 0) for g in graphs])
    generator = torch.Generator().manual_seed(0)
    order = torch.randperm(len(graphs), generator=generator)
    train, test = order[: int(0.8 * len(graphs))], order[int(0.8 * len(graphs)):]
    optimizer = torch.optim.Adam(net.parameters(), lr=0.01)
    started = time.perf_counter()
    for _ in range(args.epochs):
        optimizer.zero_grad()
        logits = net()[output]
        loss = torch.nn.functional.cross_entropy(logits[train], target[train])
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        predicted = net()[output].argmax(1)
    accuracy = (predicted[test] == target[test]).float().mean().item()
    print(f"{args.epochs} full-batch epochs in {time.perf_counter() - started:.2f}s; "
          f"train loss {loss.item():.3f}; test accuracy {accuracy:.3f} on {len(test)} graphs")


if __name__ == "__main__":
    main()
