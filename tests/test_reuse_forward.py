"""A full-batch fit runs the net once per epoch: validation's forward, kept with its graph, is the
next epoch's step (relsql/train/loop/reuse.py). The naive reference is the same fit with the reuse
refused (every epoch a training forward and a validation forward, as before): histories, best
epoch, weights and predictions must be equal bit for bit, and a weight changed between the two
must make the step compute its forward again."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import relsql
from bench import relgen
from relsql.compile.module import CompiledNet
from relsql.train.loop.reuse import KeptForward


def _same(a, b) -> bool:
    """Equal, NaN equal to NaN (a metric undefined alike in both runs)."""
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    return a == b


def _fit(monkeypatch, reuse: bool, make, fit: dict) -> tuple[relsql.Model, int]:
    """A model made by `make()` and fit with `fit`; with `reuse=False` the reuse is refused.
    Returns it and how many times its net ran a full-batch forward during fit."""
    calls = [0]
    forward = CompiledNet.forward

    def counted(self):
        calls[0] += 1
        return forward(self)

    model = make()
    with monkeypatch.context() as patch:
        patch.setattr(CompiledNet, "forward", counted)
        if not reuse:
            patch.setattr(KeptForward, "allowed", staticmethod(lambda learner: False))
        model.fit(**fit)
    return model, calls[0]


def _assert_same_fit(new: relsql.Model, old: relsql.Model) -> None:
    assert len(new.history) == len(old.history) > 1
    for a, b in zip(new.history, old.history):
        assert a.keys() == b.keys()
        assert all(_same(a[k], b[k]) for k in a), (a, b)
    assert new.learner.record.best_epoch == old.learner.record.best_epoch
    for (name, a), (other, b) in zip(new.learner.weights_by_name().items(), old.learner.weights_by_name().items()):
        assert name == other and torch.equal(a, b), name
    assert new.predict().equals(old.predict())


def _shop(tmp_path, target: str):
    path = relgen.write(relgen.shop(0, 0.2), tmp_path / f"shop_{target}.duckdb", target)
    db = relsql.connect(str(path), read_only=True)
    return lambda: relsql.Model(db, relsql.Template.auto(db, target=target), target=target, seed=0, progress=False)


def _cases(tmp_path, molecules):
    template = relsql.Template.from_file(relsql.sql_templates.path("mutagenesis"))
    yield "mutagenesis demo", lambda: relsql.Model(molecules, template, target="molecule.mutagenic", seed=0, progress=False)
    yield "relgen shop regression", _shop(tmp_path, "product.return_rate")
    yield "relgen shop multiclass", _shop(tmp_path, "orders.priority")


def test_reused_forward_trains_the_same_model(tmp_path, molecules, monkeypatch):
    epochs = 12
    fit = {"epochs": epochs, "patience": 4}  # early stopping may end it: the best epoch's weights put back
    for name, make in _cases(tmp_path, molecules):
        old, old_calls = _fit(monkeypatch, False, make, fit)
        new, new_calls = _fit(monkeypatch, True, make, fit)
        _assert_same_fit(new, old)
        # the naive loop runs a training and a validation forward per epoch (and fit's own after the
        # loop); reused, every epoch's step but the first reads the previous validation's forward
        assert old_calls - new_calls == len(old.history) - 1, (name, old_calls, new_calls)


class _Halve(relsql.Callback):
    """Halves a weight after epoch `at` by writing its storage (`p.data`), which autograd's version
    counter does not see; `bump`: through copy_ under no_grad instead (the counter sees it)."""

    def __init__(self, at: int, bump: bool):
        self.at, self.bump, self.kept_at_end = at, bump, "unset"

    def on_epoch_end(self, trainer, epoch, record):
        if epoch == self.at:
            weight = next(iter(trainer.learner.weights_by_name().values()))
            if self.bump:
                with torch.no_grad():
                    weight.copy_(weight * 0.5)
            else:
                weight.data.mul_(0.5)
        return None

    def on_fit_end(self, trainer, last):
        self.kept_at_end = trainer.kept.outputs


@pytest.mark.parametrize("bump", [False, True])
def test_a_callback_that_changes_a_weight_gets_a_fresh_forward(tmp_path, molecules, monkeypatch, bump):
    template = relsql.Template.from_file(relsql.sql_templates.path("mutagenesis"))

    def make():
        return relsql.Model(molecules, template, target="molecule.mutagenic", seed=0, progress=False)

    epochs = 6
    plain, _ = _fit(monkeypatch, True, make, {"epochs": epochs, "patience": 100})
    halve = _Halve(2, bump)
    old, old_calls = _fit(monkeypatch, False, make, {"epochs": epochs, "patience": 100, "callbacks": [_Halve(2, bump)]})
    new, new_calls = _fit(monkeypatch, True, make, {"epochs": epochs, "patience": 100, "callbacks": [halve]})
    assert not np.isclose(plain.history[3]["train_loss"], old.history[3]["train_loss"])  # the change mattered
    _assert_same_fit(new, old)
    assert old_calls - new_calls == epochs - 2  # reused at every epoch's step but the first and the one after the change
    assert halve.kept_at_end is None  # no graph is held once the fit ends


def test_a_plan_with_dropout_runs_both_forwards(tmp_path, monkeypatch):
    """Dropout draws in the step (train mode) and not in validation (eval mode): no reuse."""
    path = relgen.write(relgen.shop(0, 0.2), tmp_path / "shop.duckdb", "product.return_rate")
    db = relsql.connect(str(path), read_only=True)
    template = relsql.Template.auto(db, target="product.return_rate", dropout=0.2)

    def make():
        return relsql.Model(db, template, target="product.return_rate", seed=0, progress=False)

    fit = {"epochs": 4, "patience": 100}
    old, old_calls = _fit(monkeypatch, False, make, fit)
    new, new_calls = _fit(monkeypatch, True, make, fit)
    assert new_calls == old_calls
    _assert_same_fit(new, old)
