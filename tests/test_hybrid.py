"""relsql/train/gbm/hybrid.py with results.py and saved.py: on a database whose label is a threshold of a
child aggregate that the network does not see, the blend picked on the validation rows scores at
least the network alone there; evaluate and predict use the blend; the model file keeps it and a
loaded model predicts the same; predict says which split each row was in."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import relsql
from relsql.train.gbm import flat, hybrid
from relsql.train.learner import results
from relsql.train.persist import saved

# the network reads the order amounts' mean only; the label is whether a customer has >= 3 orders
TEMPLATE = """
CREATE TABLE order_h AS SELECT o.order_id, tanh(linear(features(o.amount), 4, 'w_order')) FROM orders o;
CREATE TABLE predict AS
SELECT c.customer_id, linear(avg(oh.h), 1, 'w_out')
FROM customer c JOIN orders o ON o.customer_id = c.customer_id JOIN order_h oh ON oh.order_id = o.order_id
GROUP BY c.customer_id;
"""


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    rng = np.random.default_rng(1)
    db = relsql.connect(tmp_path_factory.mktemp("hybrid") / "shop.duckdb")
    db.execute("CREATE TABLE customer(customer_id INT PRIMARY KEY, age DOUBLE, busy BOOLEAN)")
    db.execute("CREATE TABLE orders(order_id INT PRIMARY KEY, customer_id INT REFERENCES customer(customer_id), amount DOUBLE)")
    customers, orders = [], []
    for c in range(300):
        k = int(rng.integers(1, 6))
        orders += [(len(orders) + i, c, float(rng.normal())) for i in range(k)]
        customers.append((c, float(rng.normal()), None if c % 23 == 0 else k >= 3))  # some rows are prediction-only
    db.con.executemany("INSERT INTO customer VALUES (?, ?, ?)", customers)
    db.con.executemany("INSERT INTO orders VALUES (?, ?, ?)", orders)
    model = relsql.Model(db, relsql.Template.from_sql(TEMPLATE), target="customer.busy", progress=False, seed=0,
                         dtype=torch.float64)
    model.fit(epochs=20, refit=False)  # the blends below are fitted on this model's held-out validation rows
    return db, model


def test_the_blend_beats_or_equals_the_network_on_validation_and_is_used_by_evaluate(trained):
    db, model = trained
    learner = model.learner
    alone = results.evaluate(learner, "val")
    blend = hybrid.fit(learner)
    assert blend.weight < 1.0  # the count of orders is what the GBM has and the network lacks
    metric = blend.metric  # the metric that picked the epoch picks the blend (45 validation rows: the loss)
    assert metric == model.monitor.removeprefix("val_") == "loss"
    assert -blend.scores[blend.weight] >= -blend.scores[1.0]
    assert blend.scores[1.0] == pytest.approx(alone[metric], abs=1e-12)
    learner.hybrid = blend
    try:
        blended = results.evaluate(learner, "val")
        assert blended[metric] == pytest.approx(blend.scores[blend.weight], abs=1e-12)
        assert blended["roc_auc"] >= alone["roc_auc"] and blended["roc_auc"] > 0.9
        assert f"network weight {blend.weight:.1f}" in blend.describe()
    finally:
        learner.hybrid = None


def test_save_and_load_keep_the_blend_and_its_predictions(trained, tmp_path):
    db, model = trained
    learner = model.learner
    learner.hybrid = hybrid.fit(learner)
    try:
        ours = results.predict(learner)
        path = saved.write(saved.ModelState.of(learner), tmp_path / "m.pt")
        state = saved.read(path)
        loaded = relsql.Model.load(path, db)
        loaded.learner.hybrid = hybrid.Hybrid.from_plain(state.hybrid)  # what Model.load is to do
        theirs = results.predict(loaded.learner)
        assert theirs.equals(ours) and ours.height == 300
    finally:
        learner.hybrid = None
    damaged = state.hybrid | {"weight": 0.35}
    with pytest.raises(relsql.RelsqlError, match="damaged"):
        hybrid.Hybrid.from_plain(damaged)



def test_predict_reuses_the_features_fit_computed_and_predicts_as_a_fresh_query_does(trained, monkeypatch):
    """hybrid.fit keeps its one-hop feature matrix for predict (no second SQL query); the predictions
    equal those of the path that queries the features again."""
    db, model = trained
    learner = model.learner
    queries = []
    of_output = flat.Flat.of_output
    monkeypatch.setattr(flat.Flat, "of_output", lambda self, *a: queries.append(a) or of_output(self, *a))
    learner.hybrid = hybrid.fit(learner)
    try:
        assert len(queries) == 1 and learner.hybrid.weight < 1.0  # the GBM's share is in every prediction
        kept = results.predict(learner)
        assert len(queries) == 1  # predict read no feature again
        learner.hybrid._cache.clear()
        queried = results.predict(learner)
        assert len(queries) == 2  # this time predict queried them
        assert kept.equals(queried) and kept.height == 300
        fresh = of_output(learner.hybrid.features, db, learner.output, int(learner.output_rows))
        assert np.array_equal(learner.hybrid._cache[hybrid._key(learner)], fresh, equal_nan=True)
    finally:
        learner.hybrid = None

def test_predict_says_which_split_each_row_was_in(trained):
    db, model = trained
    frame = results.predict(model.learner, splits=True)
    assert frame.columns == ["customer_id", "prediction", "probability", "split"]
    by_key = dict(zip(frame["customer_id"].to_list(), frame["split"].to_list()))
    learner = model.learner
    keys = learner.net.grounding.relations[learner.output].keys.to_pydict()
    rid_of = dict(zip(keys["customer_id"], keys["_rid"]))
    for split, positions in learner.rows.items():
        rids = set(learner.labelled[positions].tolist())
        assert {k for k, s in by_key.items() if s == split} == {k for k in by_key if rid_of[k] in rids}
    unlabelled = {k for k, s in by_key.items() if s is None}
    assert unlabelled == {c for c in range(300) if c % 23 == 0}


def test_a_blend_of_the_gbm_alone_refits_the_gbm_only(trained, tmp_path):
    """Where validation gives the network weight 0, the refit fits the GBM again on every labelled
    row and leaves the network as selected: the network's weights are those of the same fit without
    a refit, the trees those of a GBM fitted by hand on every labelled row, the predictions theirs."""
    from relsql.train.gbm import gbm

    db, _ = trained
    models = []
    for refit in (None, False):  # the default (refit where it can) and none
        m = relsql.Model(db, relsql.Template.from_sql(TEMPLATE), target="customer.busy", progress=False, seed=0,
                         dtype=torch.float64)
        m.fit(epochs=20, refit=refit, hybrid=True)
        models.append(m)
    m, kept = models
    assert m.hybrid.weight == 0.0 == kept.hybrid.weight  # the count of orders decides; the network does not see it
    assert m.refit["epochs"] == 0 and m.refit["rows"] == len(m.labelled) and m.refit["gbm_rounds"] >= 1
    ours, theirs = m.learner.weights_by_name(), kept.learner.weights_by_name()
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[n], theirs[n]) for n in ours)
    every = np.concatenate([m.rows["train"], m.rows["val"], m.rows["test"]])
    x = m.hybrid.features.of_output(db, m.output, int(m.output_rows))[m.labelled]
    labels = m.learner.y.double().numpy()
    by_hand = gbm.fit(x[every], labels[every], "binary", 1, 0, rounds=m.refit["gbm_rounds"])
    assert np.array_equal(m.hybrid.trees.raw(x), by_hand.raw(x))
    assert not np.array_equal(by_hand.raw(x), kept.hybrid.trees.raw(x))  # the selected GBM learned fewer rows
    frame = m.predict().sort("customer_id")
    rid_of = dict(zip(*[m.learner.net.grounding.relations[m.output].keys.to_pydict()[k] for k in ("customer_id", "_rid")]))
    every_x = m.hybrid.features.of_output(db, m.output, int(m.output_rows))
    expected = 1 / (1 + np.exp(-by_hand.raw(every_x[[rid_of[c] for c in frame["customer_id"].to_list()]]).ravel()))
    assert np.abs(frame["probability"].to_numpy() - expected).max() <= 1e-9
    assert f"only its GBM was fitted again, on all {len(m.labelled)} labelled rows" in m.report()
    loaded = relsql.Model.load(m.save(tmp_path / "gbm_only.pt"), db)
    assert {k: v for k, v in loaded.refit.items() if k != "train_loss"} == {k: v for k, v in m.refit.items() if k != "train_loss"}
    assert np.isnan(loaded.refit["train_loss"]) and loaded.predict().sort("customer_id").equals(frame)
