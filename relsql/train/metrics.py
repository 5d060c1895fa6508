"""Metrics computed with numpy (no scikit-learn dependency); each returns a float."""

from __future__ import annotations

import numpy as np


def accuracy(y: np.ndarray, predicted: np.ndarray) -> float:
    return float((y == predicted).mean()) if len(y) else float("nan")


def roc_auc(y: np.ndarray, score: np.ndarray) -> float:
    """Area under the ROC curve for 0/1 labels, by average ranks (ties count half)."""
    positives = int(y.sum())
    negatives = len(y) - positives
    if positives == 0 or negatives == 0:
        return float("nan")
    order = np.argsort(score, kind="mergesort")
    ranks = np.empty(len(score))
    sorted_scores = score[order]
    start = 0
    while start < len(score):  # average rank over each run of tied scores
        end = start
        while end + 1 < len(score) and sorted_scores[end + 1] == sorted_scores[start]:
            end += 1
        ranks[order[start:end + 1]] = (start + end) / 2 + 1
        start = end + 1
    return float((ranks[y == 1].sum() - positives * (positives + 1) / 2) / (positives * negatives))


def f1(y: np.ndarray, predicted: np.ndarray, classes: int = 2) -> float:
    """F1 of the positive class for two classes, macro F1 over classes otherwise."""
    labels = [1] if classes == 2 else range(classes)
    scores = []
    for c in labels:
        tp = float(((predicted == c) & (y == c)).sum())
        fp = float(((predicted == c) & (y != c)).sum())
        fn = float(((predicted != c) & (y == c)).sum())
        scores.append(2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 0.0)
    return float(np.mean(scores))


def mae(y: np.ndarray, predicted: np.ndarray) -> float:
    return float(np.abs(y - predicted).mean()) if len(y) else float("nan")


def rmse(y: np.ndarray, predicted: np.ndarray) -> float:
    return float(np.sqrt(((y - predicted) ** 2).mean())) if len(y) else float("nan")
