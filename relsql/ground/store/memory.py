"""Memory a store's batches hold: its pages kept mapped up to a budget, and the C heap handed back
to the system after a large batch, so that resident memory follows the batch, not the database."""

from __future__ import annotations

import mmap
import os

RESIDENT_BUDGET = 128 << 20  # bytes of a large store's pages a process keeps mapped in before handing them back
MAPPED_WHOLE = 512 << 20  # a store of at most this many bytes stays mapped whole, as a loader's graph stays in memory
TRIM_AFTER = 16 << 20  # bytes of groundings a batch reads, past which the C heap's free memory goes back to the system


def resident_budget(store_bytes: int) -> int:
    """Bytes of store pages kept mapped between batches. A store of at most MAPPED_WHOLE bytes
    stays mapped whole (batches then read it without page faults, as PyG's loader reads a graph
    held in memory: TPC-H sf 1's 264 MiB store, 0.93x PyG's next(loader) instead of 1.11x); a
    larger one keeps RESIDENT_BUDGET bytes, so that memory follows the batch, not the database
    (at sf 10, a 512 MiB budget took the peak RSS from 1.2 to 1.5 times sf 1's)."""
    return store_bytes + RESIDENT_BUDGET if store_bytes <= MAPPED_WHOLE else RESIDENT_BUDGET


_STATM: list = [None, None]  # (process id, open descriptor of its /proc/<pid>/statm)


def resident_file_bytes() -> int | None:
    """This process's resident file-backed memory (Linux: /proc/<pid>/statm), else None. Read
    several times per batch, so through a descriptor kept open per process (a pread costs 3 µs
    where open + read costs 23 µs; a forked child opens its own)."""
    pid = os.getpid()
    try:
        if _STATM[0] != pid:
            _STATM[:] = [pid, os.open(f"/proc/{pid}/statm", os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))]
        return int(os.pread(_STATM[1], 256, 0).split()[2]) * mmap.PAGESIZE
    except (OSError, ValueError, IndexError):
        return None


_LIBC: list = []  # [the C library's malloc_trim, or None where there is none (not glibc)]


def trim_heap() -> None:
    """Hand the C heap's free memory back to the system. A large batch's arrays (numpy's and
    torch's, in this thread and the trainer's) are freed into glibc's heaps, which keep freed
    chunks of up to 32 MiB and fragment: over an epoch anonymous memory grew with the number of
    batches, i.e. with the database (TPC-H sf 10, batches of 16,384 customers: +0.9 GB in one
    epoch). Costs 10-30 ms, so only after batches past TRIM_AFTER."""
    if not _LIBC:
        import ctypes
        import ctypes.util

        try:  # glibc's own name first: find_library runs ldconfig in a subprocess
            _LIBC.append(ctypes.CDLL("libc.so.6").malloc_trim)
        except (OSError, AttributeError):
            try:
                _LIBC.append(ctypes.CDLL(ctypes.util.find_library("c")).malloc_trim)
            except (OSError, AttributeError, TypeError):
                _LIBC.append(None)
    if _LIBC[0] is not None:
        _LIBC[0](0)

