"""Metrics of predictions against labels; each returns a float (nan where undefined).

numpy only: scikit-learn would be a heavy install for the demo, and scipy.stats costs ~55 MiB of
memory to import; these give scikit-learn's values (tests/test_metrics.py uses it as the oracle). bench/metrics.py times them.
"""

from __future__ import annotations

import numpy as np


def accuracy(y: np.ndarray, predicted: np.ndarray) -> float:
    """Share of rows predicted exactly."""
    return float((y == predicted).mean()) if len(y) else float("nan")


def roc_auc(y: np.ndarray, score: np.ndarray) -> float:
    """Area under the ROC curve for 0/1 labels (Mann–Whitney U over average ranks, so ties count
    half). A NaN score has no rank, so its AUC is nan."""
    return float(roc_aucs(y, score[None, :])[0])


def roc_aucs(y: np.ndarray, scores: np.ndarray) -> np.ndarray:
    """`roc_auc` of each row of `scores` (k x n) against one set of labels, sorted in one call: the
    blend weighs 11 blends after every epoch the network improves, and one call per blend was
    ~0.08 ms of numpy overhead each (docs/performance.md). A row without tied scores takes its
    positives' rank sum from their sorted positions alone; a row with ties, average ranks."""
    positive = y == 1
    positives = int(positive.sum())
    negatives = len(y) - positives
    out = np.full(len(scores), np.nan)
    if positives == 0 or negatives == 0:
        return out
    order = np.argsort(scores, axis=1)  # stability is not needed: tied values share one average rank
    ordered = np.take_along_axis(scores, order, 1)
    tied = (ordered[:, 1:] == ordered[:, :-1]).any(1)
    undefined = np.isnan(ordered).any(1)
    hits = positive[order]
    for row in range(len(scores)):
        if undefined[row]:
            continue
        if tied[row]:
            rank_sum = _ranks_of_sorted(order[row], ordered[row])[positive].sum()
        else:
            rank_sum = float(np.flatnonzero(hits[row]).sum()) + positives  # 1-based positions, exact integers
        out[row] = (rank_sum - positives * (positives + 1) / 2) / (positives * negatives)
    return out


def average_ranks(values: np.ndarray) -> np.ndarray:
    """1-based ranks of `values`, each run of tied values sharing its average rank: one sort and
    vectorised runs (a Python loop over the runs was 5x slower at 300k rows). The sort need not be
    stable: a run's members get one rank whatever their order (numpy's default sort was 6x faster
    than its stable one at 10k rows)."""
    order = np.argsort(values)
    return _ranks_of_sorted(order, values[order])


def _ranks_of_sorted(order: np.ndarray, ordered: np.ndarray) -> np.ndarray:
    """`average_ranks` from a sort already made: `order` and the values in that order."""
    starts = np.flatnonzero(np.concatenate(([True], ordered[1:] != ordered[:-1])))
    ends = np.append(starts[1:], len(ordered))
    ranks = np.empty(len(ordered))
    ranks[order] = np.repeat((starts + 1 + ends) / 2.0, ends - starts)
    return ranks


def f1(y: np.ndarray, predicted: np.ndarray, classes: int = 2) -> float:
    """F1 of the positive class for two classes, macro F1 over classes otherwise (a class with no
    true or predicted row scores 0)."""
    if classes == 2:
        return _f1_binary(y, predicted)
    return float(np.mean(_f1_by_class(y, predicted, classes)))


def _f1_binary(y: np.ndarray, predicted: np.ndarray) -> float:
    """F1 of class 1: three vectorised counts (faster than bincount for one class)."""
    true, guessed = y == 1, predicted == 1
    tp = float((true & guessed).sum())
    denominator = float(true.sum()) + float(guessed.sum())  # 2tp + fp + fn
    return 2 * tp / denominator if denominator else 0.0


def _f1_by_class(y: np.ndarray, predicted: np.ndarray, classes: int) -> np.ndarray:
    """F1 of each class 0..classes-1, counted with bincount in one pass per array rather than
    three passes per class; a label that is not a class index counts only against the others."""
    def counts(labels: np.ndarray) -> np.ndarray:
        index = labels.astype(np.int64)
        if len(index) and (index.min() < 0 or index.max() >= classes or (index != labels).any()):
            index = index[(labels >= 0) & (labels < classes) & (index == labels)]  # rare: drop non-classes
        return np.bincount(index, minlength=classes).astype(np.float64)

    tp = counts(y[y == predicted])
    denominator = counts(predicted) + counts(y)  # 2tp + fp + fn
    return np.divide(2 * tp, denominator, out=np.zeros(classes), where=denominator > 0)


def mae(y: np.ndarray, predicted: np.ndarray) -> float:
    """Mean absolute error."""
    return float(np.abs(y - predicted).mean()) if len(y) else float("nan")


def rmse(y: np.ndarray, predicted: np.ndarray) -> float:
    """Root mean squared error."""
    return float(np.sqrt(((y - predicted) ** 2).mean())) if len(y) else float("nan")
