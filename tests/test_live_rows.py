"""A model plans over the rows its output reads (relsql/ground/reach.py `live`): rows of an inner
relation that no output row depends on (orders of customers the table lacks) are cut before planning,
and the model is the same one: its predictions, untrained and trained, equal the whole grounding's in
float64. The rows kept are checked against the plain answer (the orders whose customer is a row)."""

from __future__ import annotations

import numpy as np

from relsql.ground import reach
from relsql.train.learner import learner as learner_module
from tests.test_trainer import customers, model

ORPHANS = 60


def orphaned(n: int = 120):
    """customers() with orders of customers the table lacks (an orphan foreign key): no prediction reads them."""
    db = customers(n)
    db.execute(f"INSERT INTO orders SELECT 100000 + i, 5000 + i, cos(i), i % 2 = 0 FROM range({ORPHANS}) t(i)")
    return db


def predictions(m) -> np.ndarray:
    return m.predict().sort("customer_id")["probability"].to_numpy()


def test_rows_no_prediction_reads_are_not_planned_and_the_model_is_the_same(monkeypatch):
    db = orphaned()
    cut = model(db)
    with monkeypatch.context() as patch:
        patch.setattr(learner_module, "LIVE_SHARE", 2.0)  # never cut: the whole grounding
        whole = model(db)
    orders = db.con.execute("SELECT count(*) FROM orders").fetchone()[0]
    read = sorted(r[0] for r in db.con.execute("SELECT order_id FROM orders WHERE customer_id IN "
                                           "(SELECT customer_id FROM customer)").fetchall())
    assert whole.learner.net.grounding.relations["order_h"].size == orders == len(read) + ORPHANS
    kept = cut.learner.net.grounding.relations["order_h"]
    assert kept.size == len(read) and sorted(kept.keys.column("order_id").to_pylist()) == read
    assert kept.keys.column("_rid").to_pylist() == list(range(kept.size))  # renumbered in order
    assert cut.learner.net.grounding.relations["predict"].keys.equals(whole.learner.net.grounding.relations["predict"].keys)
    np.testing.assert_allclose(predictions(cut), predictions(whole), rtol=0, atol=1e-12)
    for m in (cut, whole):
        m.fit(epochs=6, lr=0.05, refit=False)
    assert cut.history == whole.history or all(
        abs(a["train_loss"] - b["train_loss"]) < 1e-9 for a, b in zip(cut.history, whole.history, strict=True))
    np.testing.assert_allclose(predictions(cut), predictions(whole), rtol=0, atol=1e-9)


def test_a_grounding_with_few_dead_rows_is_planned_as_it_is():
    db = customers(120)
    db.execute("INSERT INTO orders VALUES (900000, 99999, 0.5, true)")  # one dead order of hundreds
    m = model(db)
    grounding = m.learner.net.grounding
    assert grounding.relations["order_h"].size == db.con.execute("SELECT count(*) FROM orders").fetchone()[0]
    assert reach.live(grounding, "predict", learner_module.LIVE_SHARE) is grounding  # below the share: no copy
    cut = reach.live(grounding, "predict")
    assert cut.relations["order_h"].size == grounding.relations["order_h"].size - 1
    assert reach.live(cut, "predict") is cut  # nothing dead left
