"""Benchmark scripts (python -m bench.<name>) and the few helpers they share."""

from __future__ import annotations

import csv
import resource
from pathlib import Path


def peak_rss_mib() -> float:
    """This process's peak RSS. VmHWM belongs to the exec'd image; ru_maxrss can carry the forking parent's peak."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def write_csv(path: Path, rows: list[dict]) -> None:
    """`rows` as a CSV file (columns from the first row), its folder created; says where."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {path}")
