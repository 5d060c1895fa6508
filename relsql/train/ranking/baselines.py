"""The baseline a ranking model must beat, on its own split: the most popular candidates.

Popularity counts each candidate's positives among the training rows (RelBench's and every
recommender paper's first baseline); every row gets the same k candidates. A model that does
not beat it has learned nothing personal."""

from __future__ import annotations

import numpy as np

from relsql.train.ranking.metrics import ranking_scores


def popularity(learner, split: str) -> dict[str, float]:
    """The ranking metrics of recommending the training rows' k most frequent candidates to every row of `split`."""
    k = learner.task.k
    counts = learner.training_popularity().numpy()
    top = np.argsort(-counts, kind="stable")[:k]
    offsets, ids = learner.goal.truth(split)
    scores = ranking_scores(np.tile(top, (len(learner.rows[split]), 1)), offsets, ids, k)
    return {name: float(scores[name]) for name in learner.task.metric_names()}


def popularity_lines(learner, split: str, ours: float) -> list[str]:
    """The report's lines on popularity: its scores on `split`, and a warning where the model's `ours`
    (on the task's metric) does not beat it."""
    scores, metric = learner.baseline(split), learner.task.metric
    lines = [f"  baseline (the {learner.task.k} most popular candidates of the training rows) on {split}: "
             + ", ".join(f"{name} {value:.4f}" for name, value in scores.items())]
    if not ours > scores[metric]:
        lines.append(f"  warning: the model does not beat popularity on {split} {metric} ({ours:.4f} vs {scores[metric]:.4f})")
    return lines
