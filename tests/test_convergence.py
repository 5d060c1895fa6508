"""Training that converges by default (issue #29 item 3): losses and class weights against hand
formulas, model selection on the task's metric, the time budget, the final refit on training +
validation rows, and a split without a test part. The trainer's steps against a plain torch loop
(AdamW, cosine, clipping, resume) are in tests/test_trainer.py."""

from __future__ import annotations

import time

import numpy as np
import polars as pl
import pytest
import torch

import relsql
from relsql.train.loop import refit as refits
from relsql.train.loop.options import FitConfig
from relsql.train.loop.trainer import OneProcess, Trainer
from relsql.train.task.task import Task
from tests.test_trainer import TEMPLATE, assert_same_weights, customers, weights


def shop(n: int = 240) -> relsql.Database:
    """customers() with a numeric target too: the customer's mean order amount."""
    db = customers(n)
    db.execute("ALTER TABLE customer ADD COLUMN spend DOUBLE")
    db.execute("UPDATE customer SET spend = (SELECT avg(amount) FROM orders o WHERE o.customer_id = customer.customer_id)")
    return db


def model(db: relsql.Database, target: str = "customer.churned", **kwargs) -> relsql.Model:
    return relsql.Model(db, relsql.Template.from_sql(TEMPLATE), target, seed=3, dtype=torch.float64, progress=False,
                        **kwargs)


# -- losses ------------------------------------------------------------------------------------------
def test_regression_losses_are_the_hand_formulas():
    rng = np.random.default_rng(0)
    out, y = rng.normal(size=(50, 1)) * 2, rng.normal(size=50)
    r = out[:, 0] - y
    expected = {"mse": np.mean(r ** 2), "mae": np.mean(np.abs(r)),
                "huber": np.mean(np.where(np.abs(r) <= 1, 0.5 * r ** 2, np.abs(r) - 0.5))}
    assert np.abs(r).max() > 1 and np.abs(r).min() < 1  # both branches of the Huber loss
    for name, value in expected.items():
        task = Task("regression", regression_loss=name)
        assert float(task.loss(torch.as_tensor(out), torch.as_tensor(y))) == pytest.approx(value, abs=1e-12), name


def test_balanced_class_weights_are_the_hand_weighted_loss():
    rng = np.random.default_rng(1)
    y = (rng.random(40) < 0.2).astype(np.float64)  # about one positive in five
    task = Task("binary", classes=[False, True])
    task.balance(y)
    n, positives = len(y), y.sum()
    assert task.class_weights == pytest.approx([n / (2 * (n - positives)), n / (2 * positives)], abs=1e-12)
    logits = rng.normal(size=(40, 1))
    p = 1 / (1 + np.exp(-logits[:, 0]))
    each = -(y * np.log(p) + (1 - y) * np.log(1 - p))
    weighted = np.mean(each * np.where(y == 1, task.class_weights[1], task.class_weights[0]))
    assert float(task.loss(torch.as_tensor(logits), torch.as_tensor(y))) == pytest.approx(weighted, abs=1e-12)
    assert abs(weighted - each.mean()) > 1e-3  # the weights changed the loss

    labels = rng.integers(0, 3, size=30).astype(np.float64)
    multi = Task("multiclass", classes=["a", "b", "c"])
    multi.balance(labels)
    counts = np.bincount(labels.astype(int), minlength=3)
    assert multi.class_weights == pytest.approx(list(30 / (3 * counts)), abs=1e-12)
    scores = rng.normal(size=(30, 3))
    log_p = scores - np.log(np.exp(scores).sum(1, keepdims=True))
    nll = -log_p[np.arange(30), labels.astype(int)]
    expected = np.mean(nll * (30 / (3 * counts))[labels.astype(int)])
    assert float(multi.loss(torch.as_tensor(scores), torch.as_tensor(labels))) == pytest.approx(expected, abs=1e-12)


def test_fit_takes_the_loss_and_class_weights_it_is_given():
    db = shop()
    m = model(db)
    m.fit(epochs=3, class_weight="balanced")
    train_y = m.y[m.rows["train"]].numpy()
    n, positives = len(train_y), train_y.sum()
    assert m.task.class_weights == pytest.approx([n / (2 * (n - positives)), n / (2 * positives)])
    r = model(db, "customer.spend")
    r.fit(epochs=3)
    assert r.task.regression_loss == "huber"  # the default for regression
    r.fit(epochs=3, loss="mae")
    assert r.task.regression_loss == "mae"
    with pytest.raises(relsql.RelsqlError, match="regression target: drop class_weight"):
        r.fit(epochs=1, class_weight="balanced")
    with pytest.raises(relsql.RelsqlError, match="drop loss="):
        m.fit(epochs=1, loss="mae")
    with pytest.raises(relsql.RelsqlError, match="monitor must be one of"):
        m.fit(epochs=1, monitor="mae")


# -- selection and budgets ----------------------------------------------------------------------------
def ranked_best(history: list[dict], key: str, larger: bool) -> int:
    """The epoch with the best `key` (ties to the lower validation loss, then the earlier epoch)."""
    best = None
    for record in history:
        score = record[key] if larger else -record[key]
        rank = (score, -record["val_loss"])
        if best is None or rank[0] > best[0][0] + 1e-7 or (rank[0] >= best[0][0] - 1e-7 and rank[1] > best[0][1] + 1e-7):
            best = (rank, record["epoch"])
    return best[1]


def test_fit_selects_on_the_task_metric_and_says_so(caplog):
    db = shop(800)  # 109 validation rows: enough to select on the metric
    m = model(db, "customer.spend")
    with caplog.at_level("INFO", logger="relsql"):
        m.fit(epochs=40, lr=0.05)
    assert m.monitor == "val_mae"
    assert m.best_epoch == ranked_best(m.history, "val_mae", larger=False)
    assert any("model selection" in r.getMessage() and "val_mae" in r.getMessage() for r in caplog.records)
    b = model(db)
    b.fit(epochs=30, lr=0.05)
    assert b.monitor == "val_roc_auc" and b.best_epoch == ranked_best(b.history, "val_roc_auc", larger=True)
    loss = model(db)
    loss.fit(epochs=30, lr=0.05, monitor="loss")
    assert loss.monitor == "val_loss"
    assert loss.best_epoch == min(range(30), key=lambda e: loss.history[e]["val_loss"])
    small = model(shop())  # 33 validation rows: the loss selects
    small.fit(epochs=2)
    assert small.monitor == "val_loss"


def test_the_time_budget_stops_training_and_says_so():
    m = model(shop())
    started = time.perf_counter()
    m.fit(epochs=100_000, patience=100_000, time_budget=1.0)
    took = time.perf_counter() - started
    assert m.stopped == "time budget (1s)"
    assert 1 < len(m.history) < 100_000 and took < 20
    assert m.time_budget == 1.0 and m.epoch_cap == 100_000
    before = len(m.history)  # a second fit's epochs follow the first's in the history
    m.fit(epochs=3, time_budget=1000.0)
    assert m.stopped == "epochs" and len(m.history) == before + 3


def test_selection_needs_a_validation_part_that_can_measure_the_metric():
    binary = Task("binary", classes=[False, True])
    assert binary.selects_on(np.array([0.0, 1.0] * 60)) == "roc_auc"
    assert binary.selects_on(np.array([0.0, 1.0] * 40)) == "loss"  # 80 rows
    assert binary.selects_on(np.array([0.0] * 195 + [1.0] * 5)) == "loss"  # 5 positives
    assert Task("regression").selects_on(np.zeros(100)) == "mae"
    assert Task("multiclass", classes=[1, 2, 3]).selects_on(np.zeros(150)) == "accuracy"


def test_defaults_train_longer_than_100_epochs_without_a_time_budget():
    m = model(shop())
    m.fit()
    assert m.epoch_cap > 100 and m.time_budget is None  # no wall clock: the same seed, the same model
    assert m.stopped == "epochs" or m.stopped.startswith("early")


# -- refit and splits ---------------------------------------------------------------------------------
def every_labelled(learner) -> None:
    """A by-hand refit's rows: every labelled row trains (train, validation, test in that order)."""
    rows = dict(learner.rows)
    learner.goal.rows = {**rows, "train": np.concatenate([rows["train"], rows["val"], rows["test"]]),
                         "val": rows["val"][:0], "test": rows["test"][:0]}


def test_a_restarting_refit_trains_from_the_initial_weights_on_every_labelled_row(monkeypatch):
    """The refit's other start (refit.REFIT_SHARE None, what bench/refit_holdout.py compares with)."""
    monkeypatch.setattr(refits, "REFIT_SHARE", None)
    db = shop()
    epochs, lr = 30, 0.05
    m = model(db)
    m.fit(epochs=epochs, lr=lr, refit=True, schedule="cosine")
    selected = m.best_epoch + 1
    labelled = sum(len(r) for r in m.rows.values())
    assert m.refit["epochs"] == selected and m.refit["rows"] == labelled == len(m.labelled)
    assert len(m.history) >= selected and m.monitor == "val_loss"  # 33 validation rows: too few for ROC-AUC
    # by hand: the same model, its training rows every labelled row, for the selected epochs
    by_hand = model(db)
    every_labelled(by_hand.learner)
    trainer = Trainer(by_hand.learner, OneProcess(), FitConfig(epochs=selected, lr=lr, patience=50, optimizer="adamw",
                                                               schedule="cosine", clip=1.0), keep="last", horizon=epochs)
    assert trainer.fit(batched=False).diverged is None
    assert_same_weights(weights(m), weights(by_hand))
    # the default plateau schedule: the refit replays the rates the selection run had, epoch by epoch
    p = model(db)
    fast = 0.5  # a rate that stalls, so plateaus halve it
    p.fit(epochs=60, lr=fast, patience=12, refit=True)
    rates = [h["lr"] for h in p.history]
    assert len(set(rates[:p.best_epoch])) > 1  # the rate halved on a plateau before the selected epoch
    by_hand = model(db)
    every_labelled(by_hand.learner)
    trainer = Trainer(by_hand.learner, OneProcess(), FitConfig(epochs=p.best_epoch + 1, lr=fast, patience=12,
                                                               optimizer="adamw", schedule="plateau", clip=1.0),
                      keep="last", replay=[r / fast for r in rates])
    assert trainer.fit(batched=False).diverged is None
    assert_same_weights(weights(p), weights(by_hand))
    without = model(db)
    without.fit(epochs=epochs, lr=lr, schedule="cosine", refit=False)
    assert without.refit is None and without.no_refit == "refit=False"
    assert max(float((weights(m)[n] - weights(without)[n]).abs().max()) for n in weights(m)) > 1e-4


@pytest.mark.slow  # several fits (> 1 s)
def test_the_default_refits_predicts_with_it_and_evaluates_on_the_held_out_scores_of_the_selected_model(tmp_path):
    db = shop()
    kept = model(db)
    kept.fit(epochs=25, lr=0.05, refit=False)
    default = model(db)
    default.fit(epochs=25, lr=0.05)
    assert default.no_refit is None and default.refit["rows"] == len(default.labelled)
    # the selection run is the same run: evaluate() gives its held-out scores, bit for bit, never the refit model's
    assert default.history == kept.history and default.best_epoch == kept.best_epoch
    for split in ("val", "test"):
        assert default.evaluate(split) == kept.evaluate(split) == default.refit["held_out"][split]
    rescored = default.learner.evaluate("test")  # the refit model on test rows it has learned
    assert rescored != default.evaluate("test")
    # predictions come from the refit model: the rows to predict (NULL targets) get other probabilities
    unlabelled = kept.predict().filter(pl.col("split").is_null())
    assert unlabelled.height == 22
    refit = default.predict().filter(pl.col("split").is_null())
    assert np.abs(refit["probability"].to_numpy() - unlabelled["probability"].to_numpy()).max() > 1e-4
    # ... equal to a by-hand refit: the selected weights, every labelled row, half the selected epochs, the kept rate
    by_hand = model(db)
    by_hand.fit(epochs=25, lr=0.05, refit=False)
    every_labelled(by_hand.learner)
    epochs, share = -(-(kept.best_epoch + 1) // 2), kept.history[kept.best_epoch]["lr"] / 0.05
    assert default.refit["epochs"] == epochs and default.refit["kept_epochs"] == kept.best_epoch + 1
    Trainer(by_hand.learner, OneProcess(), FitConfig(epochs=epochs, lr=0.05 * share, patience=100, optimizer="adamw",
                                                     schedule="plateau", clip=1.0), keep="last", horizon=25,
            replay=[1.0]).fit(batched=False)
    by_hand.learner.goal.rows = dict(kept.rows)  # the split back, for predict()'s split column
    mine = by_hand.predict().filter(pl.col("split").is_null())
    assert np.abs(mine["probability"].to_numpy() - refit["probability"].to_numpy()).max() <= 1e-9
    # saved and loaded: the refit model's predictions, and the held-out scores
    loaded = relsql.Model.load(default.save(tmp_path / "m.pt"), db)
    assert loaded.predict().equals(default.predict())
    assert loaded.evaluate("test") == pytest.approx(default.evaluate("test"), abs=0, rel=0)
    report = default.report()
    assert (f"refit: the network went on from the selected weights (epoch {kept.best_epoch + 1}) over all "
            f"{len(default.labelled)} labelled rows") in report
    assert "measured before the refit" in report and "refit: none (refit=False)" in kept.report()


def test_report_log_and_plot_number_the_kept_epoch_alike(caplog):
    m = model(shop())
    with caplog.at_level("INFO", logger="relsql"):
        m.fit(epochs=12, lr=0.05, refit=False)
    kept = m.best_epoch + 1  # history[best_epoch] is the kept epoch's entry, its "epoch" 0-based
    assert m.history[m.best_epoch]["epoch"] == m.best_epoch
    logged = [r.getMessage() for r in caplog.records if "kept epoch" in r.getMessage()]
    assert logged and f"kept epoch {kept}:" in logged[-1]
    assert f"(kept epoch {kept})" in m.report() and f"(epoch {kept})" in m.report()


@pytest.mark.slow  # several fits (> 1 s)
def test_the_blend_weight_is_picked_by_the_metric_that_picked_the_epoch():
    """MAE picks the epoch of a regression: it picks the blend too (it was RMSE), with its scores."""
    from relsql.train.gbm import hybrid

    m = model(shop(720), target="customer.spend")  # 108 validation rows: enough for MAE to select
    m.fit(epochs=6, lr=0.05, hybrid=True, refit=False)
    assert m.monitor == "val_mae" and m.hybrid.metric == "mae"
    net, y = m.learner.split_outputs("val")
    net = net.double().numpy()
    every = m.hybrid.features.of_output(m.db, m.output, int(m.output_rows))
    # the scores the blend compared are the validation MAEs of each mix, measured here by hand
    theirs = m.hybrid.trees.raw(every[m.labelled][m.rows["val"]])
    truth = y.double().numpy() * m.task.std + m.task.mean
    for a, score in m.hybrid.scores.items():
        mix = (a * net + (1 - a) * theirs)[:, 0] * m.task.std + m.task.mean
        assert score == pytest.approx(np.abs(mix - truth).mean(), rel=1e-9)
    assert m.hybrid.weight == max(hybrid.WEIGHTS, key=lambda a: (-m.hybrid.scores[a], a))


def test_a_saved_refit_record_is_checked_like_the_rest_of_the_file():
    from relsql.train.persist import saved

    good = {"epochs": 9, "rows": 200, "train_loss": 0.25, "held_out": {"test": {"loss": 0.5, "roc_auc": 0.75}}}
    assert saved.refit(good, "model file m.pt") == good and saved.refit(None, "m.pt") is None
    for bad in ({**good, "held_out": "0.9"}, {**good, "epochs": -1}, {**good, "held_out": {"train": {"loss": 0.1}}},
                {**good, "code": "import os"}, [1, 2]):
        with pytest.raises(relsql.RelsqlError, match="model file m.pt: refit is damaged"):
            saved.refit(bad, "model file m.pt")


def test_refit_needs_validation_rows():
    m = model(shop(), split=(1.0, 0.0, 0.0))
    with pytest.raises(relsql.RelsqlError, match="no validation rows"):
        m.fit(epochs=2, refit=True)
    m.fit(epochs=2)  # by default: no refit, and the report says why
    assert m.refit is None and "validation rows" in m.no_refit and "refit: none (the split has no validation" in m.report()


def test_a_split_without_a_test_part_trains_predicts_and_says_there_is_no_test_split():
    m = model(shop(), split=(0.85, 0.15, 0))
    assert len(m.rows["test"]) == 0 and len(m.rows["val"]) > 0
    m.fit(epochs=5, refit=True)
    assert m.evaluate("val")["roc_auc"] == m.evaluate("val")["roc_auc"]
    assert m.predict().height == 240
    with pytest.raises(relsql.RelsqlError, match="no test split"):
        m.evaluate("test")


# -- on training ranks --------------------------------------------------------------------------------
@pytest.mark.slow
def test_ranks_train_with_class_weights_and_the_schedule_like_one_process_and_agree_on_the_time_budget():
    from tests.test_distributed import assert_same_training, trained

    one, two = trained(1, epochs=3, class_weight="balanced", clip=0.1), trained(2, epochs=3, class_weight="balanced", clip=0.1)
    assert one.task.class_weights is not None and one.task.class_weights[0] != one.task.class_weights[1]
    assert_same_training(one, two)
    assert [h["lr"] for h in two.history] == pytest.approx([h["lr"] for h in one.history], abs=1e-15)
    budget = trained(2, epochs=100_000, patience=100_000, time_budget=2.0)
    assert budget.stopped == "time budget (2s)" and 1 <= len(budget.history) < 100_000
