"""Python's cyclic garbage collector around a parse whose nodes all stay alive.

A template's parse (SQL or a saved plain form) allocates tens of thousands of syntax-tree and IR nodes
that all stay alive. In a process holding torch's and the database's objects (~3 * 10^5), each full
collection those allocations trigger walks all of them again, at 0.1-0.25 s each: half of Lahman's 51 KB
template's parse in a loaded model's process. `paused` switches the collector off for the parse; what the
parse dropped is collected afterwards. (Raising the collector's thresholds around whole constructions and
fits was measured and not kept: docs/performance.md, "The garbage collector".)
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """The collector off inside (as it was after): for a parse that allocates many nodes that all
    stay alive, where each collection would only walk them and everything else again."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
