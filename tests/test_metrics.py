"""relsql.train.task.metrics against scikit-learn as the oracle, on seeded random labels (with ties,
constant scores, classes nobody predicts and labels outside the classes)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from sklearn import metrics as oracle

from relsql.train.task import metrics

SEEDS = range(6)


def _binary(seed: int, rows: int = 2_000) -> tuple[np.ndarray, np.ndarray]:
    """0/1 labels as float64 (as Task.scores passes them) and scores that lean towards them."""
    rng = np.random.default_rng(seed)
    y = (rng.random(rows) < rng.uniform(0.05, 0.6)).astype(np.float64)
    return y, rng.normal(size=rows) + y * rng.uniform(0, 2)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("ties", [None, 1, 0])
def test_roc_auc_is_sklearns(seed, ties):
    y, score = _binary(seed)
    if ties is not None:
        score = score.round(ties)  # 0 decimals: a handful of distinct scores, long runs of ties
    assert metrics.roc_auc(y, score) == pytest.approx(oracle.roc_auc_score(y, score), abs=1e-12)


def test_roc_auc_of_constant_scores_is_one_half_and_of_one_class_is_nan():
    y, _ = _binary(0)
    assert metrics.roc_auc(y, np.zeros(len(y))) == oracle.roc_auc_score(y, np.zeros(len(y))) == 0.5
    assert math.isnan(metrics.roc_auc(np.ones(10), np.arange(10.0)))
    assert math.isnan(metrics.roc_auc(np.zeros(10), np.arange(10.0)))


def test_roc_auc_of_a_nan_score_is_nan():
    """A NaN has no rank (scikit-learn refuses it); a number computed from it would be made up."""
    y, score = _binary(1)
    score[7] = np.nan
    assert math.isnan(metrics.roc_auc(y, score))


@pytest.mark.parametrize("seed", SEEDS)
def test_binary_f1_and_accuracy_are_sklearns(seed):
    y, score = _binary(seed)
    predicted = (score > 0.5).astype(np.float64)
    assert metrics.f1(y, predicted) == pytest.approx(oracle.f1_score(y, predicted), abs=1e-12)
    assert metrics.accuracy(y, predicted) == pytest.approx(oracle.accuracy_score(y, predicted), abs=1e-12)
    assert metrics.f1(y, np.zeros(len(y))) == 0.0  # nothing predicted positive


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("classes", [3, 7, 50])
def test_macro_f1_is_sklearns_over_all_classes(seed, classes):
    """Macro F1 over classes 0..classes-1, those absent from both arrays scoring 0 as in
    scikit-learn with zero_division=0; here the last class never occurs."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes - 1, 3_000).astype(np.float64)
    predicted = np.where(rng.random(len(y)) < 0.5, y, rng.integers(0, classes - 1, len(y))).astype(np.float64)
    expected = oracle.f1_score(y, predicted, labels=list(range(classes)), average="macro", zero_division=0)
    assert metrics.f1(y, predicted, classes) == pytest.approx(expected, abs=1e-12)


def test_macro_f1_counts_a_label_outside_the_classes_only_against_the_others():
    y = np.array([0, 1, 2, 2, 5, 1.5, -1])
    predicted = np.array([0, 1, 2, 5, 2, 1, 0], dtype=np.float64)
    expected = oracle.f1_score(y.astype(str), predicted.astype(str), labels=["0.0", "1.0", "2.0"], average="macro",
                               zero_division=0)
    assert metrics.f1(y, predicted, 3) == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize("seed", SEEDS)
def test_mae_and_rmse_are_sklearns(seed):
    rng = np.random.default_rng(seed)
    y = rng.normal(size=1_000) * 10
    predicted = y + rng.normal(size=1_000)
    assert metrics.mae(y, predicted) == pytest.approx(oracle.mean_absolute_error(y, predicted), rel=1e-12)
    assert metrics.rmse(y, predicted) == pytest.approx(oracle.root_mean_squared_error(y, predicted), rel=1e-12)


@pytest.mark.parametrize("metric", [metrics.accuracy, metrics.mae, metrics.rmse, metrics.roc_auc])
def test_no_rows_give_nan(metric):
    assert math.isnan(metric(np.array([]), np.array([])))


@pytest.mark.parametrize("seed", range(5))
def test_average_ranks_are_scipys_rankdata_with_ties(seed):
    from scipy.stats import rankdata
    rng = np.random.default_rng(seed)
    values = rng.integers(0, 7, size=300).astype(float)  # many ties
    assert np.array_equal(metrics.average_ranks(values), rankdata(values))
    assert np.array_equal(metrics.average_ranks(values[:1]), [1.0])


@pytest.mark.parametrize("kind", ["binary", "multiclass", "regression"])
def test_a_tasks_one_metric_is_sklearns_on_its_raw_outputs(kind):
    """Task.score (one metric, what the blend and the cross-fitted halves compute every epoch) on raw
    outputs: log-odds, class scores, standardized values, against scikit-learn on what they decode to."""
    from relsql.train.task.task import SCORES, Task

    rng = np.random.default_rng(5)
    rows = 500
    if kind == "regression":
        task = Task(kind, mean=3.0, std=2.0)
        y, out = rng.normal(size=rows), rng.normal(size=(rows, 1))
        truth, predicted = y * 2.0 + 3.0, out[:, 0] * 2.0 + 3.0
        expected = {"mae": oracle.mean_absolute_error(truth, predicted),
                    "rmse": math.sqrt(oracle.mean_squared_error(truth, predicted))}
    elif kind == "binary":
        task = Task(kind, classes=[False, True])
        y, score = _binary(5, rows)
        out = score[:, None]
        expected = {"roc_auc": oracle.roc_auc_score(y, score), "accuracy": oracle.accuracy_score(y, score > 0),
                    "f1": oracle.f1_score(y, score > 0)}
    else:
        task = Task(kind, classes=["a", "b", "c", "d"])
        y, out = rng.integers(0, 4, rows).astype(np.float64), rng.normal(size=(rows, 4))
        expected = {"accuracy": oracle.accuracy_score(y, out.argmax(1)),
                    "f1": oracle.f1_score(y, out.argmax(1), average="macro", labels=range(4))}
    assert set(SCORES[kind]) == set(expected)
    for metric, value in expected.items():
        assert task.score(out, y, metric) == pytest.approx(value, abs=1e-12)
    assert task.scores(out, y) == {m: task.score(out, y, m) for m in SCORES[kind]}
    with pytest.raises(KeyError):
        task.score(out, y, "r2")


@pytest.mark.parametrize("kind,setting", [("binary", None), ("binary", "balanced"), ("multiclass", None),
                                          ("multiclass", "balanced"), ("regression", "mse"), ("regression", "mae"),
                                          ("regression", "huber")])
def test_a_tasks_losses_of_many_outputs_are_its_loss_of_each(kind, setting):
    """Task.losses (the blend's 11 weights scored in one call) gives, bit for bit, Task.loss of each
    output; the binary and multiclass losses are scikit-learn's (weighted) log loss, the regression ones
    its squared and absolute errors."""
    import torch

    from relsql.train.task.task import Task

    rng = np.random.default_rng(11)
    rows, k = 300, 11
    if kind == "regression":
        task = Task(kind, mean=0.0, std=1.0)
        task.regression_loss = setting
        y = rng.normal(size=rows)
        outs = rng.normal(size=(k, rows, 1)) * 2
    else:
        classes = 2 if kind == "binary" else 4
        task = Task(kind, classes=list(range(classes)))
        y = rng.integers(0, classes, rows).astype(np.float64)
        if setting == "balanced":
            task.balance(y)
        outs = rng.normal(size=(k, rows, 1 if kind == "binary" else classes))
    many = task.losses(torch.as_tensor(outs), torch.as_tensor(y)).tolist()
    assert many == [float(task.loss(torch.as_tensor(out), torch.as_tensor(y))) for out in outs]
    weights = None if task.class_weights is None else np.asarray(task.class_weights)[y.astype(int)]
    for value, out in zip(many, outs):
        if kind == "binary":
            p = 1 / (1 + np.exp(-out[:, 0]))
            expected = oracle.log_loss(y, p, sample_weight=weights) * (1 if weights is None else weights.mean())
        elif kind == "multiclass":
            p = np.exp(out - out.max(1, keepdims=True))
            p /= p.sum(1, keepdims=True)
            expected = oracle.log_loss(y, p, sample_weight=weights, labels=range(4)) * (1 if weights is None else weights.mean())
        elif setting == "mse":
            expected = oracle.mean_squared_error(y, out[:, 0])
        elif setting == "mae":
            expected = oracle.mean_absolute_error(y, out[:, 0])
        else:
            error = np.abs(y - out[:, 0])
            expected = np.mean(np.where(error <= 1, 0.5 * error ** 2, error - 0.5))
        assert value == pytest.approx(expected, rel=1e-10, abs=1e-12)


@pytest.mark.parametrize("seed", SEEDS)
def test_roc_aucs_of_many_score_rows_are_sklearns_row_by_row(seed):
    """Rows without ties (their positions' rank sum), with ties (average ranks), in float32 as the
    blend's outputs are, a NaN row (nan, the others unharmed) and a constant row."""
    y, score = _binary(seed)
    rng = np.random.default_rng(seed)
    rows = np.stack([score, score.round(1), -score, rng.normal(size=len(y)), np.zeros(len(y)), score]).astype(np.float32)
    rows[5, 7] = np.nan
    got = metrics.roc_aucs(y, rows)
    for row in range(5):
        assert got[row] == pytest.approx(oracle.roc_auc_score(y, rows[row]), abs=1e-12)
        assert got[row] == metrics.roc_auc(y, rows[row])
    assert math.isnan(got[5])
    assert np.isnan(metrics.roc_aucs(np.ones(10), np.arange(20.0).reshape(2, 10))).all()
