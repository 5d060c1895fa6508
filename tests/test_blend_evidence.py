"""relsql/train/gbm/hybrid.py `choose` and `lead`: the blend takes a GBM other than the one-hop one
only where its validation lead passes EVIDENCE standard errors of a paired bootstrap; the network's
weight is then picked on validation as before. `lead` is checked against a naive bootstrap scored
by scikit-learn; `choose` on validation outputs built so that the lead is clearly real, clearly
noise, or the network's."""

from __future__ import annotations

import math

import numpy as np
import pytest
from sklearn.metrics import mean_absolute_error, roc_auc_score

from relsql.train.gbm import hybrid
from relsql.train.task.task import Task

REGRESSION = Task(kind="regression", classes=[], mean=3.0, std=2.0)
BINARY = Task(kind="binary", classes=[0, 1])


def _naive_lead(ours, theirs, truth, scorer, larger_is_better):
    """The lead and its spread over the same draws `lead` makes, each scored by scikit-learn."""
    sign = 1.0 if larger_is_better else -1.0
    draws = np.random.default_rng(0).integers(0, len(truth), (hybrid.RESAMPLES, len(truth)))
    leads = []
    for rows in draws:
        try:
            leads.append(sign * (scorer(truth[rows], ours[rows]) - scorer(truth[rows], theirs[rows])))
        except ValueError:  # one class in the draw: no ROC-AUC
            continue
    return sign * (scorer(truth, ours) - scorer(truth, theirs)), float(np.std(leads))


def test_the_lead_and_its_error_equal_a_naive_bootstrap_scored_by_scikit_learn():
    rng = np.random.default_rng(3)
    truth = rng.normal(size=120)
    ours, theirs = truth + 0.3 * rng.normal(size=120), truth + 0.5 * rng.normal(size=120)
    ahead, error = hybrid.lead(REGRESSION, ours[:, None], theirs[:, None], truth, "mae")
    # relsql scores a regression in the label's units: standardized outputs times std
    expected = _naive_lead(2.0 * ours, 2.0 * theirs, 2.0 * truth, mean_absolute_error, larger_is_better=False)
    assert (ahead, error) == pytest.approx(expected, rel=1e-9)
    assert ahead > 0 and error > 0
    labels = (rng.random(40) < 0.15).astype(np.float64)  # few positives: some draws have one class
    ours, theirs = labels + rng.normal(size=40), labels + 2 * rng.normal(size=40)
    ahead, error = hybrid.lead(BINARY, ours[:, None], theirs[:, None], labels, "roc_auc")
    assert (ahead, error) == pytest.approx(_naive_lead(ours, theirs, labels, roc_auc_score, larger_is_better=True),
                                           rel=1e-9)


def test_a_lead_beyond_the_evidence_takes_the_better_gbm_and_one_within_it_the_one_hop_gbm():
    rng = np.random.default_rng(4)
    truth = rng.normal(size=200)
    net = -3 * truth[:, None]  # a network that is wrong: a small weight at most
    one_hop = (truth + rng.normal(size=200))[:, None]
    reaches = ["two-hop", "one-hop", "own-column"]
    own = rng.normal(size=(200, 1))
    much_better = (truth + 0.2 * rng.normal(size=200))[:, None]
    index, weight, scores, held = hybrid.choose(REGRESSION, net, [much_better, one_hop, own], reaches, truth, "mae")
    assert (index, weight, held) == (0, 0.0, "")
    assert scores == hybrid.weighed(REGRESSION, net, much_better, truth, "mae")
    a_little_better = one_hop.copy()
    a_little_better[:1, 0] = truth[:1]  # one row of 200 better: ahead on validation, within its noise
    ahead, error = hybrid.lead(REGRESSION, a_little_better, one_hop, truth, "mae")
    assert 0 < ahead < hybrid.EVIDENCE * error
    index, weight, scores, held = hybrid.choose(REGRESSION, net, [a_little_better, one_hop, own], reaches, truth, "mae")
    assert index == 1 and scores == hybrid.weighed(REGRESSION, net, one_hop, truth, "mae")
    assert weight == hybrid.best_weight(scores, "mae")  # the network's weight picked on validation as before
    assert held.startswith("the GBM on two-hop features (validation lead") and "within 1.5 standard errors" in held


def test_a_network_that_adds_beyond_the_evidence_keeps_its_weight():
    rng = np.random.default_rng(5)
    truth = rng.normal(size=300)
    half = rng.normal(size=300)
    net = (truth - half + 0.1 * rng.normal(size=300))[:, None]  # each sees one part of the label
    one_hop = (half + 0.1 * rng.normal(size=300))[:, None]
    index, weight, _, held = hybrid.choose(REGRESSION, net, [one_hop], ["one-hop"], truth, "mae")
    assert index == 0 and 0.0 < weight < 1.0 and held == ""


def test_without_a_one_hop_gbm_the_first_candidate_is_the_reference():
    rng = np.random.default_rng(6)
    truth = rng.normal(size=100)
    net = -truth[:, None]
    own = (truth + rng.normal(size=100))[:, None]
    a_little_better = own.copy()
    a_little_better[:1, 0] = truth[:1]
    index, _, _, held = hybrid.choose(REGRESSION, net, [own, a_little_better], ["own-column", "two-hop"], truth, "mae")
    assert index == 0 and "two-hop" in held
    much_better = (truth + 0.1 * rng.normal(size=100))[:, None]
    index, _, _, held = hybrid.choose(REGRESSION, net, [own, much_better], ["own-column", "two-hop"], truth, "mae")
    assert (index, held) == (1, "")


def test_an_undefined_validation_score_keeps_the_one_hop_gbm():
    truth = np.zeros(30)  # one class: no ROC-AUC on validation at all
    rng = np.random.default_rng(7)
    net, two, one = (rng.normal(size=(30, 1)) for _ in range(3))
    ahead, error = hybrid.lead(BINARY, two, one, truth, "roc_auc")
    assert math.isnan(ahead) and error == math.inf
    index, _, _, _ = hybrid.choose(BINARY, net, [two, one], ["two-hop", "one-hop"], truth, "roc_auc")
    assert index == 1
