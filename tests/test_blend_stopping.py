"""relsql/train/loop/blendstop.py: fit()'s selection run stops once the blend with the GBM has not
improved on validation for 50 epochs and the network's own best validation score moved by at most
0.005 over them. Checked against a naive reference written here (every epoch's validation outputs
kept by a user callback, scored with scikit-learn's ROC-AUC and log loss), and a resumed fit stops
where an uninterrupted one does."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.metrics import log_loss, roc_auc_score

import relsql
from relsql.train.gbm import hybrid
from relsql.train.loop import blendstop
from tests.test_crossfit import EveryEpoch, resumed, shop
from tests.test_hybrid import TEMPLATE  # the network reads the order amounts' mean only; the GBM counts orders


def naive_stop(outputs: list[np.ndarray], y: np.ndarray, theirs: list[np.ndarray]) -> int | None:
    """The epoch the rule stops at, or None: the network's best epoch by ROC-AUC (the lower log loss
    breaking ties); the best blend of its outputs there with any GBM over the weights 0, 0.1, ..., 1;
    stop when that has not grown for 50 epochs while the network's best ROC-AUC grew by at most 0.005."""
    best_auc, best_loss, best_out = -np.inf, -np.inf, None
    network, blend, last = [], -np.inf, 0
    for epoch, out in enumerate(outputs):
        auc = roc_auc_score(y, out)
        loss = -log_loss(y, 1.0 / (1.0 + np.exp(-out)), labels=[0, 1])
        if auc > best_auc + 1e-7 or (auc >= best_auc - 1e-7 and loss > best_loss + 1e-7):
            best_auc, best_loss, best_out = auc, loss, out
            value = max(roc_auc_score(y, a * best_out + (1 - a) * t) for t in theirs for a in np.linspace(0, 1, 11))
            if value > blend + 1e-12:
                blend, last = value, epoch
        network.append(best_auc)
        if epoch - last >= 50 and epoch >= 50 and network[-1] - network[-51] <= 0.005:
            return epoch
    return None


def fitted(db, seed: int, **options):
    model = relsql.Model(db, relsql.Template.from_sql(TEMPLATE), target="customer.busy", seed=seed, progress=False,
                         dtype=torch.float64)
    every = EveryEpoch(model)
    model.fit(epochs=400, refit=False, hybrid=True, callbacks=[every], **options)
    return model, every


@pytest.mark.slow  # two fits of ~60 epochs (> 1 s)
@pytest.mark.parametrize("seed", [0, 1])
def test_training_stops_where_a_naive_reference_of_the_rule_does(tmp_path, seed):
    assert (blendstop.PATIENCE, blendstop.DELTA) == (50, 0.005)  # the reference's numbers
    db = shop(tmp_path / "shop.duckdb")
    model, every = fitted(db, seed)
    theirs = [c.theirs[:, 0] for c in hybrid.candidates(model.learner)]
    stop = naive_stop(every.outputs, every.y, theirs)
    assert stop is not None and len(model.history) == stop + 1 == len(every.outputs)
    assert "the blend with the GBM has not improved" in model.stopped
    assert len(model.history) < model.best_epoch + 1 + 100  # before the network's own patience would have ended it
    assert "blend with the GBM has not improved" in model.report()
    db.close()


@pytest.mark.slow
def test_a_resumed_fit_stops_where_an_uninterrupted_one_does(tmp_path):
    db = shop(tmp_path / "shop.duckdb")
    whole, _ = fitted(db, 0)
    again = resumed(db, tmp_path / "run.ckpt", 30, epochs=400)
    assert len(again.history) == len(whole.history) and again.stopped == whole.stopped
    assert again.learner.hybrid.weight == whole.learner.hybrid.weight
    assert again.predict().equals(whole.predict())
    db.close()
