"""What is predicted: binary, multi-class or regression, decided from the target column."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch
import torch.nn.functional as F

from relsql.targets import task_kind
from relsql.train.task import metrics


@dataclass
class Task:
    kind: str  # binary | multiclass | regression
    classes: list = field(default_factory=list)  # original values, in label order
    mean: float = 0.0  # regression targets are standardized with the training rows' statistics
    std: float = 1.0
    regression_loss: str = "mse"  # mse | mae | huber (delta 1 on the standardized target)
    class_weights: list[float] | None = None  # per class (0/1 for binary), multiplying each row's loss

    # Model.save plots the history (loss and metric per epoch, the baseline's metric) beside the file
    plots_history = True

    def saved_fields(self) -> dict:
        """What the model file keeps of this task beyond kind, classes, mean and std: nothing."""
        return {}

    @property
    def units(self) -> int:
        return len(self.classes) if self.kind == "multiclass" else 1

    @property
    def metric(self) -> str:
        """The validation metric reported while training."""
        return {"binary": "roc_auc", "multiclass": "accuracy", "regression": "rmse"}[self.kind]

    @property
    def compared(self) -> str:
        """The metric models of this target are compared on, as RelBench compares them (ROC-AUC for
        binary, accuracy for multi-class, MAE for regression): what search ranks its trials by."""
        return {"binary": "roc_auc", "multiclass": "accuracy", "regression": "mae"}[self.kind]

    def selects_on(self, y: np.ndarray) -> str:
        """What model selection and early stopping compare on validation labels `y` by default: the
        metric RelBench selects on (ROC-AUC for binary, accuracy for multi-class, MAE for
        regression) where the validation part can measure it (at least 100 rows, and for binary
        at least 10 of each class), else the loss. On Mutagenesis (28 validation rows) ROC-AUC
        moves in steps of 1/(positives x negatives) and picked epochs whose accuracy was 0.39
        where the loss picked 0.82 (fit's docstring has the figures)."""
        if len(y) < SELECTION_ROWS:
            return "loss"
        if self.kind == "binary" and min(int((y == 1).sum()), int((y == 0).sum())) < SELECTION_CLASS_ROWS:
            return "loss"
        return self.compared

    def encode(self, values: list | pa.Array | pa.ChunkedArray) -> np.ndarray:
        """Target values → float labels (0/1, class index, or standardized number); -1 for an
        unknown class."""
        if self.kind == "regression":
            numbers = values if isinstance(values, list) else pc.cast(values, pa.float64()).to_numpy(zero_copy_only=False)
            return (np.asarray(numbers, dtype=np.float64) - self.mean) / self.std
        if isinstance(values, list):
            index = {v: i for i, v in enumerate(self.classes)}
            return np.asarray([index.get(v, -1) for v in values], dtype=np.float64)
        if pa.types.is_dictionary(values.type):  # e.g. a DuckDB ENUM: its values, not its codes
            values = pc.cast(values, values.type.value_type)
        try:
            codes = pc.index_in(values, value_set=pa.array(self.classes, type=values.type))
        except (pa.ArrowException, TypeError, ValueError):  # classes Arrow cannot type like the column
            return self.encode(values.to_pylist())
        return pc.fill_null(codes, -1).to_numpy(zero_copy_only=False).astype(np.float64)

    def loss(self, output: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The mean over rows of each row's loss (times its class's weight where weights are set):
        a mean over rows, so the shares of a batch add up to the batch's loss on training ranks."""
        if self.kind == "regression":
            return REGRESSION_LOSSES[self.regression_loss](output[:, 0], y)
        if self.kind == "binary":
            each = F.binary_cross_entropy_with_logits(output[:, 0], y, reduction="none")
        else:
            each = F.cross_entropy(output, y.long(), reduction="none")
        if self.class_weights is not None:
            each = each * torch.as_tensor(self.class_weights, dtype=each.dtype, device=each.device)[y.long()]
        return each.mean()

    def losses(self, outputs: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """`loss` of each of k outputs (k, rows, units) against the same labels, as k values in one
        call, bit for bit: the blend weighs 11 blends per GBM after every epoch the network improves
        (30-1000 rows: 50-117 us for the 11 against 189-259 us one call each)."""
        k, rows = outputs.shape[0], outputs.shape[1]
        if self.kind == "regression":
            return REGRESSION_ROWS[self.regression_loss](outputs[:, :, 0], y.expand(k, rows)).mean(1)
        if self.kind == "binary":
            each = F.binary_cross_entropy_with_logits(outputs[:, :, 0], y.expand(k, rows), reduction="none")
        else:
            each = F.cross_entropy(outputs.reshape(k * rows, -1), y.long().repeat(k), reduction="none").reshape(k, rows)
        if self.class_weights is not None:
            each = each * torch.as_tensor(self.class_weights, dtype=each.dtype, device=each.device)[y.long()]
        return each.mean(1)

    def balance(self, y: np.ndarray) -> None:
        """Class weights n / (classes x count of the class) from the training rows' labels `y`
        (scikit-learn's "balanced"): each class then weighs as much in the loss; a class absent
        from the training rows gets weight 1."""
        classes = 2 if self.kind == "binary" else len(self.classes)
        counts = np.bincount(np.asarray(y, dtype=np.int64), minlength=classes).astype(np.float64)
        weights = np.where(counts > 0, len(y) / (classes * np.maximum(counts, 1)), 1.0)
        self.class_weights = [float(w) for w in weights]

    def decode(self, output: np.ndarray) -> tuple[list, np.ndarray | None]:
        """Raw outputs → (predictions as original values, class probabilities or None)."""
        if self.kind == "binary":
            p = 1 / (1 + np.exp(-output[:, 0]))
            probabilities = np.stack([1 - p, p], axis=1)
        elif self.kind == "multiclass":
            shifted = np.exp(output - output.max(1, keepdims=True))
            probabilities = shifted / shifted.sum(1, keepdims=True)
        else:
            return list(output[:, 0] * self.std + self.mean), None
        return [self.classes[i] for i in probabilities.argmax(1)], probabilities

    def scores(self, output: np.ndarray, y: np.ndarray) -> dict[str, float]:
        """Metrics of outputs against encoded labels."""
        return {name: self.score(output, y, name) for name in SCORES[self.kind]}

    def score(self, output: np.ndarray, y: np.ndarray, metric: str) -> float:
        """One of `scores`' metrics alone: the blend weighs 11 blends per GBM after every epoch
        the network improves (on plurel_3, 3,600 scores: every metric of each took 0.12 CPU-s of a
        2.2 s fit, the one needed 0.08)."""
        if metric not in SCORES[self.kind]:
            raise KeyError(metric)
        if self.kind == "regression":
            predicted, truth = output[:, 0] * self.std + self.mean, y * self.std + self.mean
            return metrics.mae(truth, predicted) if metric == "mae" else metrics.rmse(truth, predicted)
        if metric == "roc_auc":
            return metrics.roc_auc(y, output[:, 0])
        predicted = ((output[:, 0] > 0) if self.kind == "binary" else output.argmax(1)).astype(np.float64)
        if metric == "accuracy":
            return metrics.accuracy(y, predicted)
        return metrics.f1(y, predicted) if self.kind == "binary" else metrics.f1(y, predicted, len(self.classes))


SCORES = {"regression": ("mae", "rmse"), "binary": ("accuracy", "roc_auc", "f1"), "multiclass": ("accuracy", "f1")}


SELECTION_ROWS, SELECTION_CLASS_ROWS = 100, 10  # the validation part a metric needs to select on (Task.selects_on)
REGRESSION_LOSSES = {
    "mse": F.mse_loss,
    "mae": F.l1_loss,
    "huber": lambda output, y: F.huber_loss(output, y, delta=1.0),
}
REGRESSION_ROWS = {  # each row's loss, unreduced (Task.losses)
    "mse": lambda output, y: F.mse_loss(output, y, reduction="none"),
    "mae": lambda output, y: F.l1_loss(output, y, reduction="none"),
    "huber": lambda output, y: F.huber_loss(output, y, reduction="none", delta=1.0),
}


def detect(column: pa.ChunkedArray, where: str, kind: str | None = None) -> Task:
    """Pick the task from the target column's type and values (non-NULL rows only), by the rule
    relsql.targets holds for templates and training alike."""
    kind, classes = task_kind(column, where, kind)
    return Task(kind, classes=classes)
