"""Where the refit starts (relsql/train/loop/refit.py REFIT_SHARE): a share goes on from the selected
weights for that share of the kept epochs at the kept epoch's rate (checked here where plateaus had
halved that rate, against the continuation by hand); 0 keeps the selected network. The default
share's refit by hand, and the restart (None), are in tests/test_convergence.py."""

from __future__ import annotations

import math

import torch

from relsql.train.loop import refit as refits
from relsql.train.loop.options import FitConfig
from relsql.train.loop.trainer import OneProcess, Trainer
from tests.test_convergence import every_labelled, model, shop
from tests.test_trainer import assert_same_weights, weights


def test_a_share_continues_from_the_selected_weights_at_the_kept_epochs_rate(monkeypatch):
    db = shop()
    fast = 0.5  # a rate that stalls, so plateaus halve it before the kept epoch
    selected = model(db)
    selected.fit(epochs=40, lr=fast, patience=8, refit=False)
    share = selected.history[selected.best_epoch]["lr"] / fast
    assert share < 1  # the kept epoch's rate is not the base rate: the continuation must take it
    monkeypatch.setattr(refits, "REFIT_SHARE", 0.5)
    continued = model(db)
    continued.fit(epochs=40, lr=fast, patience=8, refit=True)
    assert continued.history == selected.history  # the same selection run
    epochs = math.ceil(0.5 * (selected.best_epoch + 1))
    assert continued.refit["epochs"] == epochs and continued.refit["rows"] == len(continued.labelled)
    # by hand: the selected model goes on over every labelled row, at the kept epoch's rate, keeping the last epoch
    every_labelled(selected.learner)
    Trainer(selected.learner, OneProcess(), FitConfig(epochs=epochs, lr=fast * share, patience=8, optimizer="adamw",
                                                      schedule="plateau", clip=1.0), keep="last", horizon=40,
            replay=[1.0]).fit(batched=False)
    assert_same_weights(weights(continued), weights(selected))


def test_share_zero_keeps_the_selected_network(monkeypatch):
    db = shop()
    selected = model(db)
    selected.fit(epochs=12, lr=0.05, refit=False)
    monkeypatch.setattr(refits, "REFIT_SHARE", 0.0)
    kept = model(db)
    kept.fit(epochs=12, lr=0.05, refit=True)
    assert kept.learner.hybrid is None  # a network alone: no GBM to fit again either
    assert kept.refit is None and "REFIT_SHARE is 0" in kept.no_refit
    assert all(torch.equal(a, b) for a, b in zip(weights(kept).values(), weights(selected).values()))
    assert weights(kept).keys() == weights(selected).keys()
