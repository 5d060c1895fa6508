"""What `Model.fit()` adds by default to an automatic template and never to a hand-written one:
the GBM blend picked on validation (kept by save/load), the report's training and split lines,
and `Model.search` on the façade."""

from __future__ import annotations

import duckdb
import numpy as np
import pytest
import torch

import relsql
from demos.synthetic import build

HAND = """
CREATE TABLE enc AS SELECT c.customer_id, tanh(linear(features(c.age), 8)) AS h FROM customer c;
CREATE TABLE out AS SELECT e.customer_id, linear(e.h, 1) AS h FROM enc e;
"""


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    path = tmp_path_factory.mktemp("fit_defaults") / "shop.duckdb"
    con = duckdb.connect(str(path))
    build(con, customers=600, products=60, seed=3)
    con.close()
    return relsql.connect(str(path))


def test_an_automatic_template_is_blended_and_the_blend_is_saved(db, tmp_path):
    model = relsql.Model(db, relsql.Template.auto(db, target="customer.churned"), target="customer.churned", seed=0,
                         progress=False)
    model.fit(epochs=30)
    blend = model.learner.hybrid
    assert blend is not None and 0.0 <= blend.weight <= 1.0
    report = model.report()
    assert "hybrid:" in report and "training: kept the epoch with the best validation" in report
    assert "split: random (0.7/0.15/0.15, seed 0" in report
    path = model.save(tmp_path / "m.pt")
    loaded = relsql.Model.load(path, db)
    assert loaded.learner.hybrid is not None and loaded.learner.hybrid.weight == blend.weight
    assert np.allclose(loaded.predict()["probability"].to_numpy(), model.predict()["probability"].to_numpy(), atol=1e-6)


def test_a_hand_written_template_means_what_it_meant(db):
    model = relsql.Model(db, relsql.Template.from_sql(HAND), target="customer.churned", seed=0, progress=False)
    model.fit(epochs=5)
    assert model.learner.hybrid is None and "hybrid:" not in model.report()
    model.fit(epochs=5, hybrid=True)  # asked for: blended
    assert model.learner.hybrid is not None
    with pytest.raises(relsql.RelsqlError, match="hybrid must be"):
        model.fit(epochs=1, hybrid="yes")


def test_search_is_a_model_method(db):
    model = relsql.Model(db, relsql.Template.from_sql(HAND), target="customer.churned", seed=0, progress=False)
    assert model.search(budget="1s", trials=1, epochs=3) is model
    assert model.trials.height == 1 and model.trials["chosen"].to_list() == [True]


def test_fit_draws_from_the_models_own_generator(db):
    """Dropout masks come from the model's seeded stream: the caller's generator is untouched, and
    what the caller drew before does not change the model."""
    tpl = relsql.Template.auto(db, target="customer.churned", hops=1, dropout=0.3)
    outputs = []
    for caller_seed in (1, 2):
        torch.manual_seed(caller_seed)
        before = torch.random.get_rng_state()
        model = relsql.Model(db, tpl, target="customer.churned", seed=5, progress=False)
        model.fit(epochs=4, hybrid=False, patience=10)
        assert torch.equal(torch.random.get_rng_state(), before)
        outputs.append(model.predict()["probability"].to_numpy())
    assert np.array_equal(outputs[0], outputs[1])
    again = relsql.Model(db, tpl, target="customer.churned", seed=6, progress=False).fit(epochs=4, hybrid=False)
    assert not np.array_equal(again.predict()["probability"].to_numpy(), outputs[0])  # another seed, other draws


def test_a_warmup_is_refused_where_the_schedule_has_none_and_warms_the_cosine_rate(db):
    """fit(warmup=) used to be accepted and ignored under the default plateau schedule."""
    model = relsql.Model(db, relsql.Template.from_sql(HAND), target="customer.churned", seed=0, progress=False)
    for schedule in ("plateau", None):
        with pytest.raises(relsql.RelsqlError, match="warms up the cosine schedule only"):
            model.fit(epochs=2, warmup=0.1, schedule=schedule)
    model.fit(epochs=2, schedule=None, warmup=0.0)  # no warm-up asked for: accepted
    assert [h["lr"] for h in model.history] == [0.01, 0.01]
    model.fit(epochs=20, schedule="cosine", warmup=0.2, hybrid=False, refit=False)  # 4 warm-up steps of 20
    rates = [h["lr"] for h in model.history[-20:]]  # the rate of the next step, after each epoch of this fit
    assert rates[:3] == pytest.approx([0.01 * 2 / 4, 0.01 * 3 / 4, 0.01 * 4 / 4], rel=1e-12)
    assert rates[4] < 0.01  # then cosine decay
