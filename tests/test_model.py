"""relsql.Model end to end on real DuckDB files: tasks, splits, training, predictions, persistence."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import relsql
from tests.tables import insert_rows

# Customers whose label is decided by their orders' amounts: a relation one join away.
TEMPLATE = """
CREATE TABLE order_h AS SELECT o.order_id, tanh(linear(features(o.amount, o.express), 8, 'w_order')) FROM orders o;
CREATE TABLE customer_h AS
SELECT c.customer_id, tanh(linear(avg(oh.h), 8, 'w_agg') + linear(avg(features(o2.amount)), 8, 'w_self'))
FROM customer c JOIN orders o2 ON o2.customer_id = c.customer_id JOIN order_h oh ON oh.order_id = o2.order_id
GROUP BY c.customer_id;
CREATE TABLE predict AS SELECT h.customer_id, linear(h.h, 4, 'w_out') FROM customer_h h;
"""

SIMPLE = """
CREATE TABLE order_h AS SELECT o.order_id, tanh(linear(features(o.amount, o.express), 8, 'w_order')) FROM orders o;
CREATE TABLE predict AS
SELECT c.customer_id, linear(avg(oh.h), 4, 'w_out')
FROM customer c JOIN orders o ON o.customer_id = c.customer_id JOIN order_h oh ON oh.order_id = o.order_id
GROUP BY c.customer_id;
"""


def build(path, n=300, seed=0):
    rng = np.random.default_rng(seed)
    db = relsql.connect(path)
    db.execute("CREATE TABLE customer(customer_id INT PRIMARY KEY, segment VARCHAR, churned BOOLEAN, spend DOUBLE, "
               "tier VARCHAR, signup DATE)")
    db.execute("CREATE TABLE orders(order_id INT PRIMARY KEY, customer_id INT, amount DOUBLE, express BOOLEAN)")
    customers, orders = [], []
    for c in range(n):
        k = int(rng.integers(1, 6))
        amounts = rng.normal(0, 1, k) + (1.0 if c % 2 else -1.0)
        for a in amounts:
            orders.append((len(orders), c, float(a), bool(rng.random() < 0.3)))
        mean = float(amounts.mean())
        label = None if c % 17 == 0 else mean > 0
        tier = ["bronze", "silver", "gold"][int(np.clip(mean + 1.5, 0, 2.99))]
        customers.append((c, "s", label, mean * 10 + rng.normal(0, 0.1), tier, f"2020-01-{1 + c % 28:02d}"))
    insert_rows(db, "customer", customers)
    insert_rows(db, "orders", orders)
    return db


@pytest.fixture
def db(tmp_path):
    db = build(tmp_path / "shop.duckdb")
    yield db
    db.con.close()


def test_binary_classification_learns_a_signal_one_join_away(db):
    model = relsql.Model(db, relsql.Template.from_sql(TEMPLATE), target="customer.churned", seed=0, progress=False)
    assert model.task.kind == "binary" and model.task.classes == [False, True]
    labelled = sum(1 for c in range(300) if c % 17)
    assert sum(len(r) for r in model.rows.values()) == labelled  # NULL targets are prediction-only
    model.fit(epochs=150, lr=0.02)
    scores = model.evaluate()
    assert scores["accuracy"] > 0.8 and scores["roc_auc"] > 0.85, scores
    frame = model.predict()
    assert frame.height == 300 and frame.columns == ["customer_id", "prediction", "probability", "split"]
    unlabelled = {c for c in range(300) if not c % 17}  # their target is NULL: prediction-only, in no split
    assert {c for c, s in zip(frame["customer_id"], frame["split"]) if s is None} == unlabelled
    assert frame["split"].value_counts().sort("split").drop_nulls()["count"].to_list() == \
        [len(model.rows["test"]), len(model.rows["train"]), len(model.rows["val"])]
    probability = frame["probability"].to_numpy()  # of the positive class, True: predicted where above 1/2
    assert ((probability > 0) & (probability < 1)).all()
    assert (frame["prediction"].to_numpy() == (probability > 0.5)).all()


def test_multiclass_and_regression_tasks(db):
    multi = relsql.Model(db, relsql.Template.from_sql(SIMPLE), target="customer.tier", seed=1, progress=False)
    assert multi.task.kind == "multiclass" and multi.task.classes == ["bronze", "gold", "silver"]
    multi.fit(epochs=80, lr=0.03)
    assert multi.evaluate()["accuracy"] > 0.6
    frame = multi.predict()
    assert frame.columns == ["customer_id", "prediction", "probabilities", "split"]
    probabilities = np.array(frame["probabilities"].to_list())
    assert probabilities.shape == (300, 3) and np.allclose(probabilities.sum(1), 1.0)
    assert frame["prediction"].to_list() == [multi.task.classes[i] for i in probabilities.argmax(1)]
    multi.write_predictions("tiers")
    assert dict(db.columns("tiers"))["probabilities"] == "DOUBLE[]"  # a native list column
    reg = relsql.Model(db, relsql.Template.from_sql(SIMPLE), target="customer.spend", seed=1, progress=False)
    assert reg.task.kind == "regression"
    reg.fit(epochs=150, lr=0.03)
    scores = reg.evaluate()
    spends = np.array([r[0] for r in db.con.execute("SELECT spend FROM customer").fetchall()])
    assert scores["rmse"] < 0.5 * spends.std(), scores  # far better than predicting the mean
    assert reg.predict()["prediction"].dtype.is_float()


def test_an_enum_target_gets_the_labels_of_its_values(db):
    """DuckDB hands an ENUM column over as Arrow dictionary codes; labels follow the values."""
    plain = relsql.Model(db, relsql.Template.from_sql(SIMPLE), target="customer.tier", seed=1, progress=False)
    db.execute("CREATE TYPE tier_kind AS ENUM ('silver', 'gold', 'bronze'); "
               "ALTER TABLE customer ALTER tier TYPE tier_kind")
    enum = relsql.Model(db, relsql.Template.from_sql(SIMPLE), target="customer.tier", seed=1, progress=False)
    assert enum.task.classes == plain.task.classes == ["bronze", "gold", "silver"]
    assert torch.equal(enum.y, plain.y) and len(set(enum.y.tolist())) == 3


def test_temporal_split_orders_by_time(db):
    model = relsql.Model(db, relsql.Template.from_sql(SIMPLE), target="customer.churned", time_column="signup",
                         seed=0, progress=False)
    days = dict(db.con.execute("SELECT customer_id, signup FROM customer").fetchall())
    keys = model.net.grounding.relations["predict"].keys.to_pydict()["customer_id"]
    labelled_ids = [keys[i] for i in model.labelled]
    latest_train = max(days[labelled_ids[i]] for i in model.rows["train"])
    earliest_test = min(days[labelled_ids[i]] for i in model.rows["test"])
    assert latest_train <= earliest_test


def test_early_stopping_keeps_the_best_validation_weights(db):
    model = relsql.Model(db, relsql.Template.from_sql(SIMPLE), target="customer.churned", seed=0, progress=False)
    model.fit(epochs=400, lr=0.3, patience=5)
    assert len(model.history) < 400
    best = min(h["val_loss"] for h in model.history)
    assert model.best_epoch == min(range(len(model.history)), key=lambda i: model.history[i]["val_loss"])
    assert model.evaluate("val")["loss"] == pytest.approx(best, rel=1e-5)


def test_seeded_training_is_reproducible(db):
    runs = []
    for _ in range(2):
        model = relsql.Model(db, relsql.Template.from_sql(SIMPLE), target="customer.churned", seed=3, progress=False)
        runs.append(model.fit(epochs=10).predict())
    assert runs[0].equals(runs[1])


@pytest.mark.smoke
def test_save_load_round_trip_and_plot(db, tmp_path):
    model = relsql.Model(db, relsql.Template.from_sql(TEMPLATE), target="customer.churned", seed=0, progress=False)
    model.fit(epochs=20)
    with pytest.raises(relsql.RelsqlError, match="does not exist; create it first"):
        model.save(tmp_path / "models" / "churn.pt")  # a missing folder is never created
    assert not (tmp_path / "models").exists()
    (tmp_path / "models").mkdir()
    path = model.save(tmp_path / "models" / "churn.pt")
    assert path.with_suffix(".png").stat().st_size > 1000
    loaded = relsql.Model.load(path, db)
    assert loaded.predict().equals(model.predict())
    assert loaded.evaluate() == model.evaluate()
    assert "test:" in model.report() and "task binary" in model.report()


def test_write_predictions_is_a_new_table_and_refuses_overwrite(db):
    model = relsql.Model(db, relsql.Template.from_sql(SIMPLE), target="customer.churned", seed=0, progress=False)
    before = {t: db.arrow(f'SELECT * FROM "{t}"') for t in db.tables()}
    assert model.write_predictions("churn_predictions") == 300
    written = db.arrow('SELECT * FROM "churn_predictions" ORDER BY customer_id')
    assert written.column_names == ["customer_id", "prediction", "probability"]
    with pytest.raises(relsql.SchemaError, match="already exists"):
        model.write_predictions("churn_predictions")
    model.write_predictions("churn_predictions", replace=True)
    for table, data in before.items():
        assert db.arrow(f'SELECT * FROM "{table}"').equals(data)


def test_failed_write_leaves_no_table(db, monkeypatch):
    """The table is created inside a transaction; a failure before COMMIT rolls it back."""
    model = relsql.Model(db, relsql.Template.from_sql(SIMPLE), target="customer.churned", seed=0, progress=False)
    real_execute = type(db).execute

    def execute_then_fail(self, query):
        real_execute(self, query)
        raise RuntimeError("disk full")

    monkeypatch.setattr(type(db), "execute", execute_then_fail)
    with pytest.raises(RuntimeError, match="disk full"):
        model.write_predictions("broken")
    monkeypatch.undo()
    assert "broken" not in db.tables()


@pytest.mark.parametrize("target, needle", [
    ("customer", "table.column"),
    ("client.churned", "client"),
    ("customer.gone", "no column `gone`"),
    ("customer.segment", "single class"),
])
def test_bad_targets(db, target, needle):
    with pytest.raises(relsql.RelsqlError, match=needle):
        relsql.Model(db, relsql.Template.from_sql(SIMPLE), target=target, progress=False)


def test_output_keyed_differently_from_target(db):
    tpl = relsql.Template.from_sql("CREATE TABLE predict AS SELECT o.order_id, linear(o.amount, 1) FROM orders o;")
    with pytest.raises(relsql.SchemaError, match="keyed by"):
        relsql.Model(db, tpl, target="customer.churned", progress=False)


def test_float64_model(db):
    model = relsql.Model(db, relsql.Template.from_sql(SIMPLE), target="customer.churned", dtype=torch.float64,
                         progress=False)
    model.fit(epochs=3)
    assert all(p.dtype == torch.float64 for p in model.named_weights().values())
