"""relsql/train/gbm/baselines.py: the baselines the report compares with are scored on the model's own
split with the model's metrics (checked against scikit-learn on the same predictions), a GBM on
one-hop SQL features sees what the target table's own columns lack, and a baseline scored on the
validation rows does not stop early on them."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pytest
from sklearn.metrics import accuracy_score, mean_absolute_error, roc_auc_score

import relsql
from relsql.train.gbm import baselines

TEMPLATE = """
CREATE TABLE order_h AS SELECT o.order_id, tanh(linear(features(o.amount), 4, 'w_order')) FROM orders o;
CREATE TABLE predict AS
SELECT c.customer_id, linear(avg(oh.h), 1, 'w_out')
FROM customer c JOIN orders o ON o.customer_id = c.customer_id JOIN order_h oh ON oh.order_id = o.order_id
GROUP BY c.customer_id;
"""


@pytest.fixture(scope="module")
def db():
    """The label is a threshold of the mean order amount: nothing in the customer's own row tells
    it (age is noise; the key, which leads the label in row order, must not enter). `value`, a
    regression target, is twice the number of orders (which is independent of the label)."""
    rng = np.random.default_rng(0)
    db = relsql.connect()
    db.execute("CREATE TABLE customer(customer_id INT PRIMARY KEY, age DOUBLE, churned BOOLEAN, value DOUBLE, since DATE)")
    db.execute("CREATE TABLE orders(order_id INT PRIMARY KEY, customer_id INT REFERENCES customer(customer_id), amount DOUBLE)")
    customers, orders = [], []
    for c in range(400):
        amounts = rng.normal(0, 1, int(rng.integers(1, 6))) + (0.8 if c < 200 else -0.8)
        orders += [(len(orders) + i, c, float(a)) for i, a in enumerate(amounts)]
        customers.append((c, float(rng.normal()), bool(amounts.mean() > 0), float(len(amounts) * 2 + rng.normal(0, 0.1)),
                          dt.date(2020, 1, 1) + dt.timedelta(days=int(rng.integers(0, 365)))))
    db.con.executemany("INSERT INTO customer VALUES (?, ?, ?, ?, ?)", customers)
    db.con.executemany("INSERT INTO orders VALUES (?, ?, ?)", orders)
    return db


def model(db, target, **kwargs):
    return relsql.Model(db, relsql.Template.from_sql(TEMPLATE), target=target, progress=False, seed=0, **kwargs)


def test_binary_baselines_on_the_models_split_match_scikit_learn(db):
    m = model(db, "customer.churned")
    scores = baselines.compare(m, "test")
    assert set(scores) == {"majority", "gbm_own_columns", "gbm_one_hop"}
    assert scores["gbm_one_hop"]["roc_auc"] > 0.95  # the mean order amount is a child aggregate
    assert scores["gbm_own_columns"]["roc_auc"] < 0.75  # age is noise; the key does not enter
    spec = baselines.one_hop(m)
    x = baselines.features(m, spec)
    trees = baselines.fit_trees(m, x)
    test = m.rows["test"]
    raw = trees.raw(x[test])[:, 0]
    y = m.y[test].numpy()
    assert scores["gbm_one_hop"]["roc_auc"] == pytest.approx(roc_auc_score(y, raw), abs=1e-12)
    assert scores["gbm_one_hop"]["accuracy"] == pytest.approx(accuracy_score(y, raw > 0), abs=1e-12)
    majority = float(m.y[m.rows["train"]].numpy().mean() >= 0.5)
    assert scores["majority"]["accuracy"] == pytest.approx(accuracy_score(y, np.full(len(y), majority)), abs=1e-12)


def test_regression_baselines_in_target_units(db):
    m = model(db, "customer.value")
    scores = baselines.compare(m, "test")
    x = baselines.features(m, baselines.one_hop(m))
    raw = baselines.fit_trees(m, x).raw(x[m.rows["test"]])[:, 0]
    truth = db.con.execute("SELECT value FROM customer ORDER BY customer_id").fetchnumpy()["value"]
    predicted = raw * m.task.std + m.task.mean
    mine = mean_absolute_error(truth[m.labelled[m.rows["test"]]], predicted)
    assert scores["gbm_one_hop"]["mae"] == pytest.approx(mine, rel=1e-6)  # the model's labels are float32
    assert scores["gbm_one_hop"]["mae"] < 0.5 * scores["majority"]["mae"]


def test_scored_on_validation_rows_the_gbm_does_not_stop_early_on_them(db):
    m = model(db, "customer.churned")
    x = baselines.features(m, baselines.one_hop(m))
    blind = baselines.fit_trees(m, x, early_stopping=False)
    assert len(blind.roots) == 200
    scores = baselines.compare(m, "val")
    raw = blind.raw(x[m.rows["val"]])[:, 0]
    assert scores["gbm_one_hop"]["roc_auc"] == pytest.approx(roc_auc_score(m.y[m.rows["val"]].numpy(), raw), abs=1e-12)


def test_the_report_names_the_split_lists_the_gbms_and_warns_by_how_much(db):
    m = model(db, "customer.churned")
    m.fit(epochs=1, lr=1e-6)  # untrained: the one-hop GBM is far better
    report = m.report()
    assert "split: random (0.7/0.15/0.15, seed 0; train" in report
    gbms = baselines.compare(m, "test")
    ours, best = m.evaluate("test")["roc_auc"], gbms["gbm_one_hop"]["roc_auc"]
    assert f"baseline (a GBM on one-hop SQL features: own columns, parent rows' columns, child rows' count/mean/min/max) " \
           f"on test: accuracy {gbms['gbm_one_hop']['accuracy']:.4f}" in report
    assert f"baseline (a GBM on customer's own columns) on test: accuracy {gbms['gbm_own_columns']['accuracy']:.4f}" in report
    assert (f"warning: the best baseline on test roc_auc is the one-hop GBM ({best:.4f}); the model ({ours:.4f}) "
            f"trails it by {best - ours:.4f}") in report
    timed = model(db, "customer.churned", time_column="since")
    timed.fit(epochs=1)
    assert "split: by time on customer.since (0.7/0.15/0.15: the earliest rows train, the latest test;" in timed.report()


def test_the_linear_own_columns_baseline_reads_no_foreign_key_as_a_number():
    db = relsql.connect()
    db.execute("CREATE TABLE region(region_id INT PRIMARY KEY, area DOUBLE)")
    db.execute("CREATE TABLE customer(customer_id INT PRIMARY KEY, home INT REFERENCES region(region_id), age DOUBLE, "
               "churned BOOLEAN)")
    db.con.executemany("INSERT INTO region VALUES (?, ?)", [(r, float(r)) for r in range(5)])
    db.con.executemany("INSERT INTO customer VALUES (?, ?, ?, ?)", [(c, c % 5, float(c % 7), c % 5 > 1) for c in range(60)])
    template = "CREATE TABLE p AS SELECT c.customer_id, linear(features(c.age), 1) FROM customer c;"
    m = relsql.Model(db, relsql.Template.from_sql(template), target="customer.churned", progress=False, seed=0)
    assert baselines.own_columns(m, "test")[1] == ["age"]  # not `home`, a foreign key
    assert "home" not in baselines.one_hop(m).names and "region(home).area" in baselines.one_hop(m).names
