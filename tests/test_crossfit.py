"""relsql/train/loop/crossfit.py with hybrid.py: the blend's weight is picked on validation outputs
whose epoch the row's own half did not choose. Checked against a naive reference written here
(every epoch's validation outputs kept by a user callback, each half's best epoch found with
scikit-learn's ROC-AUC and the log loss breaking ties), and a resumed fit picks what an
uninterrupted one does."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.metrics import log_loss, roc_auc_score

import relsql
from relsql.train.gbm import hybrid
from relsql.train.loop.callbacks import Callback
from tests.test_hybrid import TEMPLATE  # the network reads the order amounts' mean only

EPOCHS = 25


def shop(path) -> relsql.Database:
    """900 customers (135 validation rows: enough for ROC-AUC to select on); busy = 3+ orders, or a noisy amount."""
    rng = np.random.default_rng(3)
    db = relsql.connect(path)
    db.execute("CREATE TABLE customer(customer_id INT PRIMARY KEY, age DOUBLE, busy BOOLEAN)")
    db.execute("CREATE TABLE orders(order_id INT PRIMARY KEY, customer_id INT REFERENCES customer(customer_id), amount DOUBLE)")
    customers, orders = [], []
    for c in range(900):
        k = int(rng.integers(1, 6))
        amounts = rng.normal(size=k)
        orders += [(len(orders) + i, c, float(a)) for i, a in enumerate(amounts)]
        customers.append((c, float(rng.normal()), bool(k >= 3 or amounts.mean() + rng.normal() > 1.0)))
    db.con.executemany("INSERT INTO customer VALUES (?, ?, ?)", customers)
    db.con.executemany("INSERT INTO orders VALUES (?, ?, ?)", orders)
    return db


class EveryEpoch(Callback):
    """The validation outputs and labels after every epoch, computed here from the epoch's weights."""

    def __init__(self, model):
        self.model, self.outputs = model, []

    def on_epoch_end(self, trainer, epoch, record):
        with torch.no_grad():
            out, y = self.model.learner.split_outputs("val")
        self.outputs.append(out[:, 0].double().numpy().copy())
        self.y = y.double().numpy()


def naive_crossfit(outputs: list[np.ndarray], y: np.ndarray, seed: int) -> np.ndarray:
    """Each half's best epoch by ROC-AUC (then the lower log loss, then the earlier epoch); the other
    half's outputs at it."""
    order = np.random.default_rng([seed, 7]).permutation(len(y))
    halves = (np.sort(order[: len(y) // 2]), np.sort(order[len(y) // 2:]))
    crossed = np.zeros(len(y))
    for mine, other in ((0, 1), (1, 0)):
        rows = halves[mine]
        ranks = []
        for epoch, out in enumerate(outputs):
            p = 1.0 / (1.0 + np.exp(-out[rows]))
            ranks.append((round(roc_auc_score(y[rows], out[rows]), 9), -round(log_loss(y[rows], p, labels=[0, 1]), 9), -epoch))
        best = max(range(len(outputs)), key=lambda e: ranks[e])
        crossed[halves[other]] = outputs[best][halves[other]]
    return crossed


def fitted(db, seed: int, **options):
    model = relsql.Model(db, relsql.Template.from_sql(TEMPLATE), target="customer.busy", seed=seed, progress=False,
                         dtype=torch.float64)
    every = EveryEpoch(model)
    model.fit(epochs=EPOCHS, patience=100, refit=False, hybrid=True, callbacks=[every], **options)
    return model, every


@pytest.mark.parametrize("seed", [0, 1])
def test_the_blend_weighs_outputs_cross_fitted_as_a_naive_reference_does(tmp_path, seed):
    db = shop(tmp_path / "shop.duckdb")
    model, every = fitted(db, seed)
    assert model.monitor == "val_roc_auc" and len(every.outputs) == EPOCHS
    expected = naive_crossfit(every.outputs, every.y, seed)
    crossfit = model.learner.record.crossfit
    assert crossfit is not None
    np.testing.assert_allclose(crossfit[:, 0].double().numpy(), expected, rtol=0, atol=1e-12)
    selected = every.outputs[model.best_epoch]
    assert not np.allclose(expected, selected)  # the halves chose other epochs than the whole did
    blend = model.learner.hybrid
    assert blend.crossfit and "cross-fitted" in blend.describe() and "cross-fitted" in model.report()
    # the network-alone score the weight was picked against is the cross-fitted outputs', not the kept epoch's
    assert blend.scores[1.0] == pytest.approx(roc_auc_score(every.y, expected), abs=1e-12)
    theirs = blend.gbm_outputs(model.learner, model.learner.labelled[model.rows["val"]])[:, 0]
    by_hand = {a: roc_auc_score(every.y, a * expected + (1 - a) * theirs) for a in hybrid.WEIGHTS}
    assert blend.scores == pytest.approx(by_hand, abs=1e-12)
    assert blend.weight == max(hybrid.WEIGHTS, key=lambda a: (round(by_hand[a], 12), a))
    db.close()


def resumed(db, path, crash_at: int, **options) -> relsql.Model:
    """A fit (seed 0) checkpointed to `path` and crashed after epoch `crash_at`, then resumed to its end."""
    class Crash(Exception):
        pass

    class StopAt(Callback):
        def on_epoch_end(self, trainer, epoch, record):
            if epoch == crash_at:
                raise Crash

    def model():
        return relsql.Model(db, relsql.Template.from_sql(TEMPLATE), target="customer.busy", seed=0, progress=False,
                            dtype=torch.float64)

    with pytest.raises(relsql.RelsqlError, match="Crash"):
        model().fit(refit=False, hybrid=True, checkpoint=path, callbacks=[StopAt()], **options)
    again = model()
    again.fit(refit=False, hybrid=True, checkpoint=path, resume=True, **options)
    return again


def test_a_resumed_fit_picks_the_weight_an_uninterrupted_one_does(tmp_path):
    db = shop(tmp_path / "shop.duckdb")
    whole, _ = fitted(db, 0)
    again = resumed(db, tmp_path / "run.ckpt", 11, epochs=EPOCHS, patience=100)
    assert torch.equal(again.learner.record.crossfit, whole.learner.record.crossfit)
    assert again.learner.hybrid.weight == whole.learner.hybrid.weight
    assert again.learner.hybrid.scores == whole.learner.hybrid.scores
    db.close()


def test_a_saved_blend_keeps_its_crossfit_flag_and_older_files_read_as_not_cross_fitted(tmp_path):
    db = shop(tmp_path / "shop.duckdb")
    model, _ = fitted(db, 0)
    plain = model.learner.hybrid.to_plain()
    assert hybrid.Hybrid.from_plain(plain).crossfit is True
    older = {k: v for k, v in plain.items() if k != "crossfit"}
    assert hybrid.Hybrid.from_plain(older).crossfit is False
    with pytest.raises(relsql.RelsqlError, match="crossfit"):
        hybrid.Hybrid.from_plain(plain | {"crossfit": "yes"})
    path = model.save(tmp_path / "m.pt")
    loaded = relsql.Model.load(path, db)
    assert loaded.learner.hybrid.crossfit is True and loaded.learner.hybrid.weight == model.learner.hybrid.weight
    db.close()


def test_too_few_validation_rows_leave_the_blend_on_the_kept_epochs_outputs(tmp_path):
    """Fewer than crossfit.MIN_ROWS validation rows: no halves; the blend still fits, not cross-fitted."""
    from relsql.train.loop import crossfit

    db = relsql.connect(tmp_path / "tiny.duckdb")
    db.execute("CREATE TABLE customer(customer_id INT PRIMARY KEY, age DOUBLE, busy BOOLEAN)")
    db.execute("CREATE TABLE orders(order_id INT PRIMARY KEY, customer_id INT REFERENCES customer(customer_id), amount DOUBLE)")
    db.con.executemany("INSERT INTO customer VALUES (?, ?, ?)", [(c, float(c % 5), c % 2 == 0) for c in range(16)])
    db.con.executemany("INSERT INTO orders VALUES (?, ?, ?)", [(o, o % 16, float(o % 7)) for o in range(40)])
    model = relsql.Model(db, relsql.Template.from_sql(TEMPLATE), target="customer.busy", seed=0, progress=False)
    model.fit(epochs=5, refit=False, hybrid=True)
    assert 0 < len(model.rows["val"]) < crossfit.MIN_ROWS
    assert model.learner.record.crossfit is None
    assert model.learner.hybrid is not None and not model.learner.hybrid.crossfit
    assert "cross-fitted" not in model.learner.hybrid.describe()
    db.close()


def test_mini_batches_cross_fit_as_the_full_batch_does(tmp_path):
    """fit(batch_size=...) validates through the batch source; the halves read the same outputs, so the
    naive reference agrees there too."""
    db = shop(tmp_path / "shop.duckdb")
    model = relsql.Model(db, relsql.Template.from_sql(TEMPLATE), target="customer.busy", seed=1, progress=False,
                         dtype=torch.float64)
    every = EveryEpoch(model)
    model.fit(epochs=8, patience=100, refit=False, hybrid=True, batch_size=128, callbacks=[every])
    expected = naive_crossfit(every.outputs, every.y, 1)
    np.testing.assert_allclose(model.learner.record.crossfit[:, 0].double().numpy(), expected, rtol=0, atol=1e-10)
    assert model.learner.hybrid.crossfit
    db.close()
