"""The metrics of relsql.train.task.metrics against the numpy loops they replaced, at 300k rows.

    python -m bench.metrics [--rows 300000] [--reps 7]

Binary labels (30% positive) with continuous scores and with scores rounded to 2 decimals (many
ties); F1 on 2 and on 20 classes. Prints the median of --reps runs of each, old and new, their
ratio, and checks that both give the same value.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import numpy as np

from relsql.train.task import metrics


def old_roc_auc(y: np.ndarray, score: np.ndarray) -> float:
    """The rank loop relsql used before issue 28 (average rank of each run of ties, in Python)."""
    positives = int(y.sum())
    negatives = len(y) - positives
    if positives == 0 or negatives == 0:
        return float("nan")
    order = np.argsort(score, kind="mergesort")
    ranks = np.empty(len(score))
    sorted_scores = score[order]
    start = 0
    while start < len(score):
        end = start
        while end + 1 < len(score) and sorted_scores[end + 1] == sorted_scores[start]:
            end += 1
        ranks[order[start:end + 1]] = (start + end) / 2 + 1
        start = end + 1
    return float((ranks[y == 1].sum() - positives * (positives + 1) / 2) / (positives * negatives))


def old_f1(y: np.ndarray, predicted: np.ndarray, classes: int = 2) -> float:
    """The per-class loop relsql used before issue 28 (three passes over the rows per class)."""
    labels = [1] if classes == 2 else range(classes)
    scores = []
    for c in labels:
        tp = float(((predicted == c) & (y == c)).sum())
        fp = float(((predicted == c) & (y != c)).sum())
        fn = float(((predicted != c) & (y == c)).sum())
        scores.append(2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 0.0)
    return float(np.mean(scores))


def median_seconds(function: Callable[[], float], reps: int) -> tuple[float, float]:
    """(median wall time of reps calls, the value returned)."""
    times, value = [], float("nan")
    for _ in range(reps):
        start = time.perf_counter()
        value = function()
        times.append(time.perf_counter() - start)
    return statistics.median(times), value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=300_000)
    parser.add_argument("--reps", type=int, default=7)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    y = (rng.random(args.rows) < 0.3).astype(np.float64)
    continuous = rng.normal(size=args.rows) + y
    cases = [("roc_auc, continuous scores", lambda: old_roc_auc(y, continuous), lambda: metrics.roc_auc(y, continuous)),
             ("roc_auc, scores with ties", lambda: old_roc_auc(y, continuous.round(2)),
              lambda: metrics.roc_auc(y, continuous.round(2)))]
    for classes in (2, 20):
        truth = rng.integers(0, classes, args.rows).astype(np.float64)
        guess = np.where(rng.random(args.rows) < 0.6, truth, rng.integers(0, classes, args.rows)).astype(np.float64)
        cases.append((f"f1, {classes} classes", lambda t=truth, g=guess, c=classes: old_f1(t, g, c),
                      lambda t=truth, g=guess, c=classes: metrics.f1(t, g, c)))
    print(f"{args.rows:,} rows, median of {args.reps} runs, load average {os.getloadavg()[0]:.1f}")
    print(f"{'metric':30s} {'old ms':>9s} {'new ms':>9s} {'old/new':>8s}  same value")
    for name, old, new in cases:
        old_time, old_value = median_seconds(old, args.reps)
        new_time, new_value = median_seconds(new, args.reps)
        same = abs(old_value - new_value) <= 1e-12
        print(f"{name:30s} {old_time * 1e3:9.1f} {new_time * 1e3:9.1f} {old_time / new_time:8.1f}  {same}")


if __name__ == "__main__":
    main()
