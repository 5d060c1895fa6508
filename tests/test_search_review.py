"""Review findings in search and the trainer (#43): search ranks trials as early stopping ranks
epochs, per-relation fan-out caps follow a trial's generated template, a ranking target is
searched on MAP@k, and fit's closing log line names the latest fit's kept epoch."""

from __future__ import annotations

import logging
import math
import re
from types import SimpleNamespace

import numpy as np
import polars as pl
import pytest

import relsql
from relsql.template.auto import generate
from relsql.train.loop.callbacks import EarlyStopping
from relsql.train.model import search as searching
from tests.test_auto_ranking import _shop as ranking_shop
from tests.test_trainer import customers, model

NAN = float("nan")


def _trial(metric, score, loss) -> dict:
    return {"metric": metric, "score": score, "val_loss": loss}


@pytest.mark.parametrize("metric, maximized", [("roc_auc", True), ("mae", False), ("map@10", True), ("mrr", True)])
def test_trials_rank_as_early_stopping_ranks_epochs(metric, maximized):
    """The order written out by hand: the better score first (larger or smaller as the metric is
    better), the lower loss on a tie, undefined scores after every defined one (by their loss), a
    failed trial last."""
    good, bad = (0.9, 0.4) if maximized else (0.4, 0.9)
    expected = [(good, 0.5), (good, 0.6), (bad, 0.1), (NAN, 0.1), (NAN, 0.2), (NAN, NAN)]
    shuffled = [expected[i] for i in (4, 2, 5, 0, 3, 1)]
    trials = sorted(shuffled, key=lambda t: searching.better(_trial(f"val_{metric}", *t)), reverse=True)
    assert [repr(t) for t in trials] == [repr(t) for t in expected]
    failed = _trial(None, NAN, NAN)
    assert searching.better(failed) == (-math.inf, -math.inf)  # below or level with every scored trial
    # early stopping ranks the same scores, as epochs, in the same order
    stopping = EarlyStopping(SimpleNamespace(rows={"val": np.arange(3)}), patience=5, metric=metric)
    epochs = sorted(expected[:5], key=lambda t: stopping.ranked({f"val_{metric}": t[0], "val_loss": t[1]}), reverse=True)
    assert [repr(t) for t in epochs] == [repr(t) for t in expected[:5]]


def test_trial_fanout_keeps_the_caps_of_relations_the_template_declares():
    template = SimpleNamespace(relations={"x_orders": None, "predict": None})
    assert searching.trial_fanout({"x_orders": 3, "x_orders__items": 2}, template) == {"x_orders": 3}
    assert searching.trial_fanout({"x_orders__items": 2}, template) is None
    assert searching.trial_fanout(4, template) == 4 and searching.trial_fanout(None, template) is None


def _three_tables(db) -> None:
    """customer <- orders <- items: a second hop (items) that a one-hop template leaves out."""
    rng = np.random.default_rng(0)
    db.execute("CREATE TABLE customer(customer_id INT PRIMARY KEY, age DOUBLE, spend DOUBLE)")
    db.execute("CREATE TABLE orders(order_id INT PRIMARY KEY, customer_id INT REFERENCES customer(customer_id), "
               "amount DOUBLE)")
    db.execute("CREATE TABLE items(item_id INT PRIMARY KEY, order_id INT REFERENCES orders(order_id), price DOUBLE)")
    db.con.executemany("INSERT INTO customer VALUES (?, ?, ?)",
                       [(i, float(rng.uniform(18, 80)), float(rng.normal())) for i in range(60)])
    db.con.executemany("INSERT INTO orders VALUES (?, ?, ?)",
                       [(i, int(rng.integers(60)), float(rng.exponential(20))) for i in range(150)])
    db.con.executemany("INSERT INTO items VALUES (?, ?, ?)",
                       [(i, int(rng.integers(150)), float(rng.exponential(5))) for i in range(300)])


def test_a_fanout_dict_follows_each_trials_generated_template(monkeypatch):
    db = relsql.connect()
    _three_tables(db)
    template = relsql.Template.auto(db, "customer.spend", hops=2, width=8)
    caps = {"p_orders": 2, "p_customer": 3}  # the orders' items per order; the orders per customer
    assert set(caps) <= set(template.relations)
    one_hop = relsql.Template.from_sql(generate(db, "customer.spend", hops=1, width=8))
    assert "p_orders" not in one_hop.relations and "p_customer" in one_hop.relations
    built = []
    original = searching.build
    monkeypatch.setattr(searching, "build", lambda state, config: built.append(original(state, config)) or built[-1])
    monkeypatch.setattr(searching, "TEMPLATE_SPACE", {"hops": (1,)})  # every drawn configuration: one hop
    base = relsql.Model(db, template, target="customer.spend", seed=0, progress=False, fanout=caps)
    searching.search(base, budget="10m", trials=2, epochs=2)
    trials = base.trials
    assert trials["error"].null_count() == trials.height and sorted(set(trials["hops"])) == [1, 2]
    fanouts = {"p_orders" in b.model.template.relations: b.model.spec.fanout for b in built}
    assert fanouts == {True: caps, False: {"p_customer": 3}}  # the two-hop template keeps both caps, the one-hop one its own


@pytest.fixture(scope="module")
def ranking_db():
    db = relsql.connect()
    ranking_shop(db)
    yield db
    db.close()


def test_search_tunes_a_ranking_target_on_map_at_k(ranking_db):
    template = relsql.Template.auto(ranking_db, "task_rec.item_id", time_column="snapshot")
    model = relsql.Model(ranking_db, template, target="task_rec.item_id", time_column="snapshot", seed=0, progress=False)
    before = {split: [searching.labelled_keys(model.learner)[i] for i in rows] for split, rows in model.rows.items()}
    searching.search(model, budget="10m", trials=3, epochs=3)
    trials = model.trials
    assert trials["error"].null_count() == trials.height and set(trials["metric"]) == {"val_map@10"}
    chosen = trials.filter(pl.col("chosen")).row(0, named=True)
    assert chosen["score"] == trials["score"].max()  # MAP@k: larger is better
    assert model.task.kind == "ranking" and trials.row(0, named=True)["lr"] == pytest.approx(0.03)  # fit's ranking rate first
    keys = searching.labelled_keys(model.learner)
    assert {split: [keys[i] for i in rows] for split, rows in model.rows.items()} == before  # the model's split
    assert math.isclose(model.evaluate("val")["map@10"], chosen["score"], rel_tol=1e-9)  # trained again: its score
    assert model.recommend(k=3).height > 0


def test_the_end_of_fit_line_names_the_latest_fits_kept_epoch(caplog):
    m = model(customers())
    m.fit(epochs=4, lr=0.05, patience=100, hybrid=False)
    first = len(m.history)
    with caplog.at_level(logging.INFO, logger="relsql"):
        m.fit(epochs=3, lr=0.01, patience=100, hybrid=False)
    latest = m.history[first:]
    kept = next(r for r in latest if r["epoch"] == m.best_epoch)
    earlier = next(r for r in m.history[:first] if r["epoch"] == m.best_epoch)
    assert f"{earlier['val_loss']:.4f}" != f"{kept['val_loss']:.4f}"  # the two fits' entries tell apart
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("trained to epoch"))
    shown = re.search(r"kept epoch (\d+): validation loss ([0-9.]+)", line)
    assert (int(shown.group(1)), shown.group(2)) == (m.best_epoch + 1, f"{kept['val_loss']:.4f}")
