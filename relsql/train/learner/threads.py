"""How many threads torch uses while relsql trains and predicts.

On a small machine under load, torch's default (one thread per core) made training 20-60x
slower (Mutagenesis, 60 epochs on 2 cores with two busy processes beside it: 1 thread 1.9-2.8 s,
2 threads 2.5-58 s): its threads spin-wait for each other while the cores are taken, and in
mini-batch training DuckDB grounds the next batch on the same cores at the same time. So relsql
gives torch half the cores (at least one) unless told otherwise, and only while it runs: torch's
own setting is put back afterwards, since it is process-wide.
"""

from __future__ import annotations

import contextlib

import torch

from relsql import cores


@contextlib.contextmanager
def torch_threads(count: int | None):
    """torch uses `count` threads (default: `cores.half()`, the other half is the database's) inside the block."""
    before = torch.get_num_threads()
    torch.set_num_threads(count or cores.half())
    try:
        yield
    finally:
        torch.set_num_threads(before)
