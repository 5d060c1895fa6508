"""fit(overfit=...): besides patience, training stops 20 epochs after the best epoch where the net
overfits (each of those epochs' validation loss >= 1.15 x the best's) or has learnt its training rows
by heart (training loss <= 0.2 x the best validation loss). Checked against a rule written out here
on hand-made histories, and on a real fit: the stopped run is an exact prefix of the patience-only run."""

from __future__ import annotations

import pytest
import torch

import relsql
from relsql.datasets import mutagenesis as mutagenesis_data
from relsql.train.loop.trainer import EarlyStopping
from tests.test_auto_ranking import _shop
from tests.test_trainer import customers, model

K, MARGIN, SHARE = 20, 0.15, 0.2  # the documented rule (docs/training.md), not read from the code


def reference(history: list[dict], patience: int, overfit: bool) -> tuple[int | None, int, str]:
    """(epoch it stops after or None, best epoch, which rule): the rule as docs/training.md states it."""
    best, best_loss = None, float("inf")
    for epoch, record in enumerate(history):
        if record["val_loss"] < best_loss - 1e-7:
            best, best_loss = epoch, record["val_loss"]
            continue
        since = epoch - best
        if since >= patience:
            return epoch, best, "patience"
        if overfit and since >= K:
            window = history[epoch - K + 1: epoch + 1]
            if all(r["val_loss"] >= (1 + MARGIN) * best_loss for r in window):
                return epoch, best, "overfitting"
            if record["train_loss"] <= SHARE * best_loss:
                return epoch, best, "fitted"
    return None, best, "epochs"


def replay(stopping: EarlyStopping, history: list[dict]) -> tuple[int | None, int, str]:
    for epoch, record in enumerate(history):
        _, stop = stopping.update(epoch, record)
        if stop:
            kind = ("overfitting" if stopping.why.startswith("overfitting") else
                    "fitted" if stopping.why.startswith("training rows fitted") else "patience")
            return epoch, stopping.best_epoch, kind
    return None, stopping.best_epoch, "epochs"


def history(val: list[float], train: list[float] | float = 0.5) -> list[dict]:
    train = train if isinstance(train, list) else [train] * len(val)
    return [{"val_loss": v, "train_loss": t} for v, t in zip(val, train, strict=True)]


CASES = {
    # the validation loss 30 % above the best from epoch 3 on: stops 20 epochs after the best (epoch 2)
    "overfitting": history([1.0, 0.8, 0.5] + [0.65] * 40),
    # 1.14 x the best: under the margin, so only patience stops it
    "just under the margin": history([1.0, 0.5] + [0.57] * 40),
    # a spike of 12 epochs above the margin, then back near the best and a new best at epoch 30
    "a spike, then better": history([1.0, 0.5] + [0.9] * 12 + [0.52] * 16 + [0.49] + [0.55] * 40),
    # the training loss falls to a tenth of the best validation loss: stops 20 epochs after the best
    "fitted": history([1.0, 0.6, 0.4] + [0.42] * 40, [0.9, 0.5, 0.3] + [0.03] * 40),
    # a slow learner: validation flat within the margin, training loss well above a fifth of it
    "slow learner": history([0.7, 0.6] + [0.62, 0.61] * 30, [0.7] + [0.5 - i / 200 for i in range(61)]),
}


@pytest.fixture(scope="module")
def learner():
    return model(customers(60)).learner


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("overfit", [True, False])
def test_the_stop_follows_the_documented_rule(learner, case, overfit):
    records, patience = CASES[case], 35
    expected = reference(records, patience, overfit)
    assert replay(EarlyStopping(learner, patience, overfit=overfit), records) == expected


def test_the_cases_cover_each_way_of_ending():
    """The table above is not vacuous: the reference itself ends each case as its name says."""
    ends = {case: reference(records, 35, True)[2] for case, records in CASES.items()}
    assert ends == {"overfitting": "overfitting", "just under the margin": "patience", "a spike, then better": "patience",
                    "fitted": "fitted", "slow learner": "patience"}
    assert reference(CASES["overfitting"], 35, True)[0] == 22 and reference(CASES["fitted"], 35, True)[0] == 22
    assert reference(CASES["a spike, then better"], 35, True)[1] == 30


def test_without_validation_rows_only_patience_stops(learner):
    """Monitoring the training loss there is no validation loss to compare with."""
    saved = learner.rows["val"]
    learner.rows["val"] = saved[:0]
    try:
        stopping = EarlyStopping(learner, 35, overfit=True)
        assert stopping.monitor == "train" and not stopping.overfit
    finally:
        learner.rows["val"] = saved


@pytest.fixture(scope="module")
def mutagenesis():
    db = relsql.connect()
    mutagenesis_data.load(db)
    return db, relsql.Template.auto(db, target="molecule.mutagenic")


def test_a_real_fit_stops_on_a_prefix_of_the_patience_run(mutagenesis):
    """Template.auto on Mutagenesis (28 validation rows, the loss selects), where the net overfits: the
    same seed and split with and without the rule train the same weights epoch by epoch (the plateau
    schedule's 25 epochs outlast the rule's 20), so the stopped run's history is a prefix of the
    patience-only run's, it stops where the reference rule says on that history, its best epoch and
    weights are the same, and the report says why it ended."""
    db, template = mutagenesis
    runs = {overfit: relsql.Model(db, template, target="molecule.mutagenic", seed=6, progress=False)
            .fit(overfit=overfit, hybrid=False, refit=False) for overfit in (None, False)}
    on, off = runs[None], runs[False]
    assert off.stopped.startswith("early (no validation improvement")
    stop, best, kind = reference(off.history, 100, True)
    assert kind in ("overfitting", "fitted") and stop == len(on.history) - 1
    assert on.stopped.startswith("early (overfitting" if kind == "overfitting" else "early (training rows fitted")
    assert on.history == off.history[:len(on.history)]
    assert on.best_epoch == off.best_epoch == best
    assert on.stopped[len("early ("):-1] in on.report()
    for name, value in on.named_weights().items():
        assert torch.equal(value, off.named_weights()[name])


def test_a_ranking_target_keeps_patience_alone():
    """A ranking's training loss (sampled negatives) and validation loss share no scale: off by
    default there, and asking for it is refused with the way out."""
    db = relsql.connect()
    _shop(db)
    m = relsql.Model(db, relsql.Template.auto(db, "task_rec.item_id", time_column="snapshot"), target="task_rec.item_id",
                     time_column="snapshot", seed=0, progress=False)
    with pytest.raises(relsql.RelsqlError, match="overfit=True compares the training loss"):
        m.fit(epochs=2, overfit=True)


def test_overfit_is_checked(tmp_path):
    m = model(customers(60))
    with pytest.raises(relsql.RelsqlError, match="overfit must be True, False or None"):
        m.fit(epochs=2, overfit="yes")


def test_the_command_line_passes_overfit_on_only_when_given(tmp_path):
    from relsql.cli import _fit_options, _parser

    relsql.connect(tmp_path / "shop.duckdb").close()
    parser, _ = _parser()
    db = str(tmp_path / "shop.duckdb")
    options = {flags: _fit_options(parser.parse_args(["train", db, "--target", "customer.churned", *flags]))
               for flags in [(), ("--overfit",), ("--no-overfit",)]}
    assert "overfit" not in options[()]  # fit's default decides
    assert options[("--overfit",)]["overfit"] is True and options[("--no-overfit",)]["overfit"] is False
