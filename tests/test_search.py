"""Model search (relsql/train/model/search.py): the best trial by validation score becomes the model,
every trial learns on the model's split, the budget bounds the trials, bad budgets are refused,
and `relsql train --search` runs end to end on a DuckDB file."""

from __future__ import annotations

import inspect
import math

import numpy as np
import polars as pl
import pytest
import torch

import relsql
from relsql.cli import main
from relsql.errors import RelsqlError
from relsql.template.auto import generate
from relsql.train.learner.defaults import LR
from relsql.train.model import search as searching


def _shop(path, n: int = 150, seed: int = 0) -> None:
    """customer.spend: a sine of the customer's age plus a tenth of the amounts of their orders."""
    rng = np.random.default_rng(seed)
    ages = rng.uniform(18, 80, n)
    orders, total = [], np.zeros(n)
    for c in range(n):
        for _ in range(int(rng.integers(0, 6))):
            amount = float(rng.exponential(20))
            orders.append((len(orders), c, amount))
            total[c] += amount
    spend = np.sin(ages / 8) * 10 + total / 10 + rng.normal(0, 0.5, n)
    with relsql.connect(path) as db:
        db.execute("CREATE TABLE customer(customer_id INT PRIMARY KEY, age DOUBLE, spend DOUBLE, big BOOLEAN)")
        db.execute("CREATE TABLE orders(order_id INT PRIMARY KEY, customer_id INT REFERENCES customer(customer_id), "
                   "amount DOUBLE)")
        db.con.executemany("INSERT INTO customer VALUES (?, ?, ?, ?)",
                           [(i, float(ages[i]), float(spend[i]), bool(spend[i] > np.median(spend))) for i in range(n)])
        db.con.executemany("INSERT INTO orders VALUES (?, ?, ?)", orders)


@pytest.fixture(scope="module")
def shop_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("search") / "shop.duckdb"
    _shop(path)
    return path


@pytest.fixture
def shop(shop_file):
    with relsql.connect(shop_file, read_only=True) as db:
        yield db


def _auto_model(db, **options) -> relsql.Model:
    template = relsql.Template.auto(db, "customer.spend", hops=1, width=8)
    return relsql.Model(db, template, target="customer.spend", seed=0, progress=False, **options)


def _split_keys(model) -> dict[str, list]:
    keys = searching.labelled_keys(model.learner)
    return {split: [keys[i] for i in rows] for split, rows in model.rows.items()}


def _settings(trials: pl.DataFrame) -> pl.DataFrame:
    return trials.drop("seconds")


def test_best_trial_by_validation_becomes_the_model_deterministically(shop, monkeypatch):
    built = []
    original = searching.build
    monkeypatch.setattr(searching, "build", lambda state, config: built.append(original(state, config)) or built[-1])
    model = _auto_model(shop)
    before, generator, spec = _split_keys(model), torch.random.get_rng_state(), model.spec
    searching.search(model, budget="10m", trials=6, epochs=27, hybrid=False)  # the network alone, as its trials
    trials = model.trials
    assert torch.equal(torch.random.get_rng_state(), generator)  # the caller's generator is left as it was
    scored = trials.filter(pl.col("error").is_null())
    assert scored.height == trials.height >= 6 and set(trials["metric"]) == {"val_mae"}
    chosen = trials.filter(pl.col("chosen"))
    assert chosen.height == 1 and chosen["score"][0] == scored["score"].min()
    assert set(trials["rung"]) == {1, 2} and sorted(set(trials["epochs"])) == [9, 27]  # 6 configurations: 2 rungs
    assert trials.filter(pl.col("rung") == 2).height == 2  # the best third went on
    # the model is the chosen configuration trained again: its template, its validation score
    row = chosen.row(0, named=True)
    options = {k: row[k] for k in searching.TEMPLATE_SPACE if row.get(k) is not None}
    assert model.template.source == generate(shop, "customer.spend", **options)
    assert model.spec == spec.replace(template=model.template, output=model.output)  # all else as the user built it
    assert math.isclose(model.evaluate("val")["mae"], row["score"], rel_tol=1e-9)
    # every trial's model (and the final one) learned and was scored on the same rows
    assert len(built) == trials["config"].n_unique() + 1
    for trial in [*(b.model for b in built), model]:
        assert _split_keys(trial) == before
    # the same search again: the same trials, the same scores
    again = _auto_model(shop)
    searching.search(again, budget="10m", trials=6, epochs=27)
    assert _settings(again.trials).equals(_settings(trials))


def test_a_hand_written_template_searches_its_fit_settings_only(shop):
    template = relsql.Template.auto(shop, "customer.spend", hops=1, width=8)
    edited = relsql.Template.from_sql(template.source.replace("\n\n", "\n-- edited by hand: its own template now\n\n", 1))
    assert searching.header_options(edited.source) is not None  # the header still reads as Template.auto's
    model = relsql.Model(shop, edited, target="customer.spend", seed=0, progress=None, split=(0.6, 0.3, 0.1))
    spec, learner = model.spec, model.learner
    searching.search(model, budget="10m", trials=3, epochs=9)
    assert model.spec == spec and model.learner is not learner  # a trial's learner, made of the model's own spec
    trials = model.trials
    assert not {"width", "hops", "aggregation", "layer"} & set(trials.columns)
    assert trials["lr"].n_unique() == 3 and model.template.source == edited.source
    assert trials.filter(pl.col("chosen"))["score"][0] == trials["score"].min()


def test_the_default_configuration_is_the_first_trial(shop):
    model = _auto_model(shop)
    searching.search(model, budget="10m", trials=2, epochs=9)
    first, fit = model.trials.row(0, named=True), inspect.signature(relsql.Model.fit).parameters
    assert (first["config"], first["width"], first["hops"]) == (0, 8, 1)
    assert fit["lr"].default is None  # None: 0.01 for a label target (relsql.train.learner.defaults.LR), 0.03 for a ranking one
    assert (first["lr"], first["weight_decay"]) == (LR, fit["weight_decay"].default) == (0.01, 0.0)


def test_a_tiny_budget_bounds_the_trials(shop):
    model = _auto_model(shop)
    searching.search(model, budget=1e-9, epochs=9)
    assert model.trials.height == 1 and model.trials["chosen"][0]  # the first trial always runs, then the budget is spent
    unbounded = _auto_model(shop)
    searching.search(unbounded, budget="10m", trials=4, epochs=9)
    assert unbounded.trials.height > 1


@pytest.mark.parametrize("budget, seconds", [("90s", 90.0), ("10m", 600.0), ("1h", 3600.0), ("1.5h", 5400.0),
                                             (" 2 min ", 120.0), (45, 45.0), (0.5, 0.5), ("30", 30.0)])
def test_budget_strings(budget, seconds):
    assert searching.budget_seconds(budget) == seconds


@pytest.mark.parametrize("budget", ["10x", "", "ten minutes", "-5s", "0s", "1h30m", float("inf"), float("nan"), True, None])
def test_bad_budgets_are_refused_with_the_fix(budget, shop):
    with pytest.raises(RelsqlError, match=r"such as '90s', '10m' or '1h'"):
        searching.budget_seconds(budget)


def test_bad_search_arguments(shop):
    model = _auto_model(shop)
    with pytest.raises(RelsqlError, match="drop lr"):
        searching.search(model, budget="1m", lr=0.1)
    with pytest.raises(RelsqlError, match="trials must be"):
        searching.search(model, budget="1m", trials=0)
    with pytest.raises(RelsqlError, match="budget must be"):
        searching.search(model, budget="soon")
    no_val = _auto_model(shop, split=(0.8, 0.0, 0.2))
    with pytest.raises(RelsqlError, match="validation rows"):
        searching.search(no_val, budget="1m")


def test_cli_train_search_end_to_end(shop_file, tmp_path, capsys):
    template, saved = tmp_path / "auto.sql", tmp_path / "model.pt"
    assert main(["template", str(shop_file), "--target", "customer.spend", "--hops", "1", "--width", "8",
                 "-o", str(template)]) == 0
    code = main(["train", str(shop_file), "--template", str(template), "--target", "customer.spend", "--search", "5m",
                 "--trials", "3", "--epochs", "9", "--model", str(saved)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "search: " in out and "3 configurations" in out and "chosen: configuration" in out
    with relsql.connect(shop_file, read_only=True) as db:
        loaded = relsql.Model.load(saved, db)
        assert loaded.predict().height == 150
        assert loaded.template.relations.keys() == relsql.Template.from_sql(loaded.template.source).relations.keys()


@pytest.mark.parametrize("flags, message", [(["--search", "10x"], "such as '90s'"),
                                             (["--trials", "3"], "--trials bounds a search"),
                                             (["--search", "1m", "--workers", "2"], "drop --checkpoint and --workers")])
def test_cli_refuses_bad_search_flags(shop_file, tmp_path, capsys, flags, message):
    template = tmp_path / "auto.sql"
    assert main(["template", str(shop_file), "--target", "customer.spend", "-o", str(template)]) == 0
    capsys.readouterr()
    assert main(["train", str(shop_file), "--template", str(template), "--target", "customer.spend", *flags]) == 2
    assert message in capsys.readouterr().err
