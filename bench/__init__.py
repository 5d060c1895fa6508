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


def children_private_mib() -> float:
    """Memory only this process's children hold (Private_Clean + Private_Dirty of each child's
    smaps_rollup, Linux): a forked child's RSS also counts every page it shares with its parent,
    which the parent's own peak already holds. 0 where there is no child or no /proc."""
    total = 0
    for children in Path("/proc/self/task").glob("*/children"):
        try:
            pids = children.read_text().split()
        except OSError:
            continue
        for pid in pids:
            try:
                for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                    if line.startswith(("Private_Clean:", "Private_Dirty:")):
                        total += int(line.split()[1])
            except (OSError, ValueError, IndexError):
                pass
    return total / 1024


class TreeMemory:
    """The peak memory of this process and its children together, the way PyG's side gets its
    VmHWM: this process's RSS plus its children's private pages, sampled every `interval` seconds
    in a thread (never below this process's own VmHWM). A forked child's private pages include
    those it inherited and the parent has freed since (parent and child together hold them), so
    this process's peak plus the child's peak would count them twice."""

    def __init__(self, interval: float = 0.25):  # sampling more often slowed relsql's epoch
        import threading

        self.interval, self.peak, self.children = interval, 0.0, 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-memory", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        page = resource.getpagesize()
        while not self._stop.wait(self.interval):
            try:
                own = int(Path("/proc/self/statm").read_text().split()[1]) * page / 2**20
            except (OSError, ValueError, IndexError):
                return
            children = children_private_mib()
            self.children = max(self.children, children)
            self.peak = max(self.peak, own + children)

    def stop(self) -> float:
        """The peak in MiB."""
        self._stop.set()
        self._thread.join()
        return max(self.peak, peak_rss_mib())


def write_csv(path: Path, rows: list[dict]) -> None:
    """`rows` as a CSV file (columns from the first row), its folder created; says where."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {path}")


def plot_ratios(rows: list[dict], labels: list[str], path: Path, title: str, target: float) -> None:
    """Bars of relsql/peer time per row (forward and training step), log scale, the target marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    xs = np.arange(len(rows))
    fig, ax = plt.subplots(figsize=(max(6.0, 0.8 * len(rows) + 2), 5))
    ax.bar(xs - 0.2, [r["fwd_ratio"] for r in rows], 0.4, label="forward")
    ax.bar(xs + 0.2, [r["step_ratio"] for r in rows], 0.4, label="training step (fwd + bwd)")
    ax.axhline(target, color="red", linestyle="--", label=f"target {target}")
    ax.axhline(1.0, color="gray", linewidth=0.8)
    ax.set_yscale("log")
    ax.set_ylabel("relsql time / PyG time (lower is better)")
    ax.set_xticks(xs, labels, fontsize=7 if len(rows) < 16 else 6)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
