"""How many cores this process may use, and the half of them relsql's two engines each take.

On a small machine under load, torch's and DuckDB's defaults (a thread per core each) spin against
each other and other jobs (relsql/train/learner/threads.py, relsql/data/duckdb.py's engine_threads),
so each gets half the cores while relsql runs. Torch-free: the database layer reads it too.
"""

from __future__ import annotations

import os


def usable() -> int:
    """The cores this process may run on (its CPU affinity), at least one."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def half() -> int:
    """Half the cores this process may use, at least one: the other half is the other engine's."""
    return max(1, usable() // 2)
