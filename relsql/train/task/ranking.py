"""What a ranking target is trained and judged with: k, the loss, the negatives."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from relsql import arguments
from relsql.errors import RelsqlError

# the ranking metrics early stopping may compare (all larger-is-better); MAP@k by default
METRICS = ("map", "recall", "ndcg", "mrr", "precision")
LOSSES = ("softmax", "bce", "bpr")
NEGATIVES = ("uniform", "popularity", "in-batch")
SELECTION_ROWS = 20  # validation rows with positives needed before MAP@k (not the loss) selects the epoch
# ranks scored or returned per row: metrics hold [rows, k] arrays (a saved model's k is input too)
MAX_K = 100_000


def checked_k(k: object, where: str = "k") -> int:
    """`k` as a whole number in 1..MAX_K; `where` names the argument in the message."""
    value = arguments.integer(where, k)
    if value > MAX_K:
        raise RelsqlError(f"{where}={value:,} asks for more than {MAX_K:,} ranked candidates per row, which every row's "
                          f"[rows, k] arrays would have to hold; ask for k <= {MAX_K:,} (10 to 100 is usual)")
    return value


@dataclass
class RankingTask:
    """A foreign-key target's task: rank the candidate relation's rows for each target row.

    The attributes other tasks have (classes, mean, std, class_weights) keep their neutral values,
    so that code reading a task's kind and metric works alike for every target."""

    kind: str = "ranking"
    k: int = 10
    loss: str = "softmax"  # softmax (sampled softmax, logQ-corrected) | bce | bpr
    negatives: str = "uniform"  # uniform | popularity | in-batch (the step's positive items)
    count: int = 512  # negatives per step, shared by the step's positives
    candidates: str = ""  # the candidate relation (the tower keyed by the referenced table's key)
    pairs: str = ""  # the pair relation (keyed by the output's keys and the referenced key), "" if none
    classes: list = field(default_factory=list)
    mean: float = 0.0
    std: float = 1.0
    regression_loss: str = "mse"
    class_weights: list[float] | None = None

    units = 1
    plots_history = False  # Model.save plots no history beside the file (its loss axis names a label's loss)

    def __post_init__(self) -> None:
        self.k = checked_k(self.k, "ranking k")

    def saved_fields(self) -> dict:
        """What the model file keeps of this task beyond kind, classes, mean and std: k, loss, negatives, relations."""
        return {"k": int(self.k), "loss": self.loss, "negatives": self.negatives, "count": int(self.count),
                "candidates": self.candidates, "pairs": self.pairs}

    @property
    def metric(self) -> str:
        return f"map@{self.k}"

    @property
    def compared(self) -> str:
        """The metric models of this target are compared on (search ranks its trials by it): MAP@k."""
        return self.metric

    def metric_names(self) -> tuple[str, ...]:
        """The names evaluate() reports, e.g. map@10, recall@10, ndcg@10, mrr, precision@10."""
        return tuple(name if name == "mrr" else f"{name}@{self.k}" for name in METRICS)

    def selects_on(self, rows_with_positives: int) -> str:
        """MAP@k where enough validation rows have positives to measure it, else the loss."""
        return self.metric if rows_with_positives >= SELECTION_ROWS else "loss"


def maximized(metric: str) -> bool:
    """Whether a ranking metric name (map@10, mrr, ...) is better when larger: all of them are."""
    return metric.split("@", 1)[0] in METRICS


def empty_scores(task: RankingTask) -> dict[str, float]:
    """The metrics of a split without rows to rank: undefined."""
    return {name: float(np.nan) for name in task.metric_names()}
