"""What Model checks before it trains: the template must not read its label, the output must be
the relation the target asks for, every split asked for gets rows; and what it reports."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import relsql
from tests.test_model import SIMPLE, build


@pytest.fixture(scope="module")
def shop(tmp_path_factory):
    db = build(tmp_path_factory.mktemp("shop") / "shop.duckdb", n=120)
    db.execute("ALTER TABLE customer ADD COLUMN flag BOOLEAN")
    db.execute("UPDATE customer SET flag = churned")  # a copy of the label under another name
    return db


@pytest.mark.parametrize("template", [
    "CREATE TABLE p AS SELECT c.customer_id, linear(features(c.churned, c.spend), 1) FROM customer c;",
    "CREATE TABLE p AS SELECT c.customer_id, linear(features(flag), 1) FROM customer c;",
    "CREATE TABLE p AS SELECT c.customer_id, linear(features(c.spend), 1) FROM customer c WHERE c.churned;",
    "CREATE TABLE h AS SELECT o.order_id, linear(features(o.amount), 2) FROM orders o;\n"
    "CREATE TABLE p AS SELECT x.customer_id, linear(avg(h.h), 1) FROM customer x JOIN orders o "
    "ON o.customer_id = x.customer_id AND x.churned JOIN h ON h.order_id = o.order_id GROUP BY x.customer_id;",
])
def test_a_template_that_reads_its_label_is_refused(shop, template):
    with pytest.raises(relsql.SchemaError, match="reads the target customer.churned"):
        relsql.Model(shop, relsql.Template.from_sql(template), target="customer.churned", progress=False)
    if "WHERE" not in template and "AND x.churned" not in template:  # (those leave one class)
        model = relsql.Model(shop, relsql.Template.from_sql(template), target="customer.churned", progress=False,
                             allow_target_inputs=True)  # said explicitly: allowed
        assert model.output == "p"


def test_a_template_that_does_not_read_its_label_passes(shop):
    model = relsql.Model(shop, relsql.Template.from_sql(SIMPLE), target="customer.churned", progress=False)
    assert model.output == "predict"


@pytest.fixture(scope="module")
def family():
    from relsql.datasets.neuralogic_files import load_builtin

    db = relsql.connect()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dataset = load_builtin(db.con, "family")
    return db, relsql.Template.from_file(dataset.template)


def test_a_query_table_asks_for_its_own_relation_and_empty_splits_are_refused(family):
    """NeuraLogic's Family: the template's last relation is negFoal, but query_foal asks for foal;
    it has one labelled row, so validation and test would be empty."""
    db, template = family
    assert list(template.relations)[-1] == "negFoal"
    with pytest.raises(relsql.RelsqlError, match="val and test splits are empty: output relation `foal` has a row for 1"):
        relsql.Model(db, template, target="query_foal.target", progress=False)
    model = relsql.Model(db, template, target="query_foal.target", progress=False, split=(1.0, 0.0, 0.0))
    assert model.output == "foal" and len(model.rows["train"]) == 1


def test_the_report_compares_with_the_majority_baseline_and_says_when_it_does_not_beat_it(shop):
    model = relsql.Model(shop, relsql.Template.from_sql(SIMPLE), target="customer.churned", progress=False, seed=0)
    model.fit(epochs=1, lr=1e-6)  # untrained: should not beat the majority class
    baseline = model.baseline("test")
    y = model.y[model.rows["test"]].numpy()
    train = model.y[model.rows["train"]].numpy()
    majority = float(train.mean() >= 0.5)
    assert baseline["accuracy"] == pytest.approx(float(np.mean(y == majority)))
    assert baseline["roc_auc"] == 0.5
    report = model.report()
    assert "majority class" in report and "stopped at the epoch cap" in report
    assert ("does not beat the majority baseline" in report) == (model.evaluate()["roc_auc"] <= baseline["roc_auc"])


def test_regression_baseline_is_the_training_mean(shop):
    model = relsql.Model(shop, relsql.Template.from_sql(SIMPLE), target="customer.spend", progress=False, seed=0)
    values = model.y.double().numpy() * model.task.std + model.task.mean  # back in the column's units
    train, test = values[model.rows["train"]], values[model.rows["test"]]
    baseline = model.baseline("test")
    assert baseline["mae"] == pytest.approx(np.abs(test - train.mean()).mean(), rel=1e-6)
    assert baseline["rmse"] == pytest.approx(np.sqrt(((test - train.mean()) ** 2).mean()), rel=1e-6)


def test_the_metrics_plot_has_a_title_best_epoch_baseline_and_fixed_axes(shop, tmp_path, monkeypatch):
    import matplotlib.figure

    saved = []
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", lambda fig, *a, **k: saved.append(fig))
    model = relsql.Model(shop, relsql.Template.from_sql(SIMPLE), target="customer.churned", progress=False, seed=0)
    model.fit(epochs=3)
    model.save(tmp_path / "m.pt")
    (figure,) = saved
    left, right = figure.axes
    assert figure._suptitle.get_text() == "customer.churned: predict"
    assert right.get_ylim() == (-0.02, 1.02) and "binary cross-entropy" in left.get_ylabel()
    labels = [line.get_label() for line in right.get_lines()]
    assert f"kept epoch {model.best_epoch + 1}" in labels and "baseline 0.500" in labels  # numbered from 1, as the log


def test_torch_threads_while_training_and_put_back_after(shop):
    import torch

    from relsql import cores

    before = torch.get_num_threads()
    seen = []
    for threads in (None, 2):
        model = relsql.Model(shop, relsql.Template.from_sql(SIMPLE), target="customer.churned", progress=False, threads=threads)
        model.fit(epochs=1, callback=lambda info: seen.append(torch.get_num_threads()))
        assert torch.get_num_threads() == before
    assert seen == [cores.half(), 2]
    with pytest.raises(relsql.RelsqlError, match="threads"):
        relsql.Model(shop, relsql.Template.from_sql(SIMPLE), target="customer.churned", progress=False, threads=0)


def test_progress_as_log_lines_and_planning_in_the_report(shop, caplog):
    import logging

    with caplog.at_level(logging.INFO, logger="relsql"):
        model = relsql.Model(shop, relsql.Template.from_sql(SIMPLE), target="customer.churned", progress=False)
        model.fit(epochs=2, patience=10)
    messages = [r.getMessage() for r in caplog.records if r.name == "relsql"]
    assert any(m.startswith("grounded 2 relations") for m in messages)
    assert any(m.startswith("planned ") for m in messages)
    assert [m.split(":")[0] for m in messages if m.startswith("epoch")] == ["epoch 1 of 2", "epoch 2 of 2"]
    assert model.timings["planning"] > 0 and "planning" in model.report()


def test_a_model_trained_full_batch_loads_and_predicts_in_mini_batches(tmp_path):
    import torch

    db = build(tmp_path / "shop.duckdb", n=300)
    model = relsql.Model(db, relsql.Template.from_sql(SIMPLE), target="customer.churned", progress=False,
                         dtype=torch.float64)
    model.fit(epochs=5)
    path = model.save(tmp_path / "m.pt")
    loaded = relsql.Model.load(path, db, batch_size=64)
    assert loaded.mini_batches and loaded.batched.grounder.sizes["predict"] == 300
    ours, theirs = loaded.predict(), model.predict()
    assert ours["customer_id"].to_list() == theirs["customer_id"].to_list()
    assert np.allclose(ours["probability"].to_numpy(), theirs["probability"].to_numpy(), rtol=1e-9, atol=1e-12)
    assert loaded.evaluate()["loss"] == pytest.approx(model.evaluate()["loss"], rel=1e-9)


def test_the_own_columns_baseline_is_a_linear_model_of_the_target_tables_columns(shop):
    from relsql.train.gbm import baselines

    model = relsql.Model(shop, relsql.Template.from_sql(SIMPLE), target="customer.churned", progress=False, seed=0)
    scores, columns = baselines.own_columns(model, "test")
    assert columns == ["spend"]  # not the key, the target, its copy `flag`, text or dates
    # spend is the mean order amount x 10 (plus noise); the label is mean amount > 0: a linear model finds it
    assert scores["accuracy"] >= 0.9 and scores["roc_auc"] >= 0.95
    assert "own columns spend" in model.report()
