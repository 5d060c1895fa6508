"""Model.load builds on first use: loading grounds nothing, predict(keys=...) grounds only the rows
asked for and what they reach, and gives the saved model's predictions (float64, a real DuckDB
file); predict() of every row, evaluate() and the net build the whole model as Model(...) does."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
import torch

import relsql
from tests.tables import insert_rows
from tests.test_model import build

TEMPLATE = """
CREATE TABLE order_h AS SELECT o.order_id, tanh(linear(features(o.amount, o.express), 8, 'w_order')) FROM orders o;
CREATE TABLE return_h AS SELECT r.return_id, tanh(linear(features(r.cost), 8, 'w_return')) FROM returns r;
CREATE TABLE predict AS
SELECT c.customer_id, linear(avg(oh.h), 4, 'w_out')
FROM customer c JOIN orders o ON o.customer_id = c.customer_id JOIN order_h oh ON oh.order_id = o.order_id
GROUP BY c.customer_id;
CREATE TABLE predict AS
SELECT c.customer_id, linear(avg(rh.h), 4, 'w_ret')
FROM customer c JOIN returns r ON r.customer_id = c.customer_id JOIN return_h rh ON rh.return_id = r.return_id
GROUP BY c.customer_id;
"""

RETURNING = 20  # customers 0..19 returned something; the others reach no row of `returns`


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    folder = tmp_path_factory.mktemp("load_rows")
    db = build(folder / "shop.duckdb", n=120)
    db.execute("CREATE TABLE returns(return_id INT PRIMARY KEY, customer_id INT, cost DOUBLE)")
    insert_rows(db, "returns", [(i, i % RETURNING, float(i % 7) - 3.0) for i in range(3 * RETURNING)])
    model = relsql.Model(db, relsql.Template.from_sql(TEMPLATE), target="customer.churned", seed=3, dtype=torch.float64,
                         progress=False)
    model.fit(epochs=8, hybrid=False)
    path = model.save(folder / "m.pt")
    expected = {"predict": model.predict(), "test": model.evaluate("test")}
    db.con.close()
    return folder, path, expected


def temp_tables(db) -> list[str]:
    return [r[0] for r in db.con.execute("SELECT table_name FROM duckdb_tables() WHERE temporary").fetchall()]


def test_load_grounds_nothing_and_asked_rows_ground_only_what_they_reach(saved):
    folder, path, expected = saved
    db = relsql.connect(str(folder / "shop.duckdb"), read_only=True)
    loaded = relsql.Model.load(path, db)
    assert temp_tables(db) == []  # no key table, no grounding: loading read the file and checked columns
    ids = [100, 37, 58, 21]  # none of them returned anything
    chosen = loaded.predict(keys={"customer_id": ids})
    pending = loaded.learner.pending
    assert pending is not None  # still not built: only the asked rows were grounded
    assert sorted(pending.grounded["predict"].tolist()) == sorted(int(r) for r in pending.rows_batched.grounder.keys(
        "predict").to_pandas().set_index("customer_id").loc[ids, "_rid"])
    orders = db.con.execute(f"SELECT count(*) FROM orders WHERE customer_id IN ({', '.join(map(str, ids))})").fetchone()[0]
    assert len(pending.grounded["order_h"]) == orders > 0
    assert "return_h" not in pending.grounded  # the asked rows reach no return: its encodings were not grounded
    whole = expected["predict"]
    rows = [whole.filter(pl.col("customer_id") == i).row(0, named=True) for i in ids]
    assert chosen["customer_id"].to_list() == ids and chosen["split"].to_list() == [r["split"] for r in rows]
    assert chosen["prediction"].to_list() == [r["prediction"] for r in rows]
    np.testing.assert_allclose(chosen["probability"].to_numpy(), [r["probability"] for r in rows], rtol=0, atol=1e-12)
    db.close()


def test_where_and_then_every_row_and_evaluate_as_the_saved_model(saved):
    folder, path, expected = saved
    db = relsql.connect(str(folder / "shop.duckdb"), read_only=True)
    loaded = relsql.Model.load(path, db)
    some = loaded.predict(where="customer_id < 25 AND tier = 'gold'")
    oracle = [r[0] for r in db.con.execute("SELECT customer_id FROM customer WHERE customer_id < 25 AND tier = 'gold' "
                                           "ORDER BY 1").fetchall()]
    assert some["customer_id"].to_list() == oracle and len(oracle) > 0
    assert "return_h" in loaded.learner.pending.grounded  # customers below 20 reach their returns
    every = loaded.predict()  # every row: the model is built as Model(...) builds it, the file's weights set
    assert loaded.learner.pending is None
    assert every.equals(expected["predict"])
    assert loaded.evaluate("test") == expected["test"]
    mine = every.filter(pl.col("customer_id").is_in(oracle))
    np.testing.assert_allclose(some["probability"].to_numpy(), mine["probability"].to_numpy(), rtol=0, atol=1e-12)
    db.close()


def test_batch_size_load_predicts_asked_rows_and_then_builds(saved):
    folder, path, expected = saved
    db = relsql.connect(str(folder / "shop.duckdb"), read_only=True)
    loaded = relsql.Model.load(path, db, batch_size=16)
    assert temp_tables(db) == []
    ids = list(range(0, 120, 7))
    chosen = loaded.predict(keys=pl.DataFrame({"customer_id": ids}))
    whole = expected["predict"].filter(pl.col("customer_id").is_in(ids))
    order = {k: i for i, k in enumerate(whole["customer_id"].to_list())}
    np.testing.assert_allclose(chosen["probability"].to_numpy(),
                               whole["probability"].to_numpy()[[order[i] for i in ids]], rtol=0, atol=1e-12)
    assert loaded.learner.pending is not None
    assert loaded.net is not None and loaded.learner.pending is None  # the net itself: built
    np.testing.assert_allclose(loaded.predict()["probability"].to_numpy(), expected["predict"]["probability"].to_numpy(),
                               rtol=0, atol=1e-12)
    db.close()


def test_a_head_of_another_width_is_refused_when_the_rows_are_planned(saved, tmp_path):
    """The file alone cannot tell the head's width from the plan's: the first batch's plan does."""
    from relsql.train.persist import checkpoint as files

    folder, path, _ = saved
    state = torch.load(path, weights_only=True)
    state["head"] = {"weight": torch.zeros(1, 7, dtype=torch.float64), "bias": torch.zeros(1, dtype=torch.float64)}
    bad = files.write(tmp_path / "bad.pt", "relsql-model-3", state, "model file")
    db = relsql.connect(str(folder / "shop.duckdb"), read_only=True)
    loaded = relsql.Model.load(bad, db)
    with pytest.raises(relsql.RelsqlError, match=r"bad\.pt does not fit its own template: its head maps \(7, 1\)"):
        loaded.predict(keys={"customer_id": [3]})
    with pytest.raises(relsql.RelsqlError, match=r"bad\.pt does not fit its own template"):
        loaded.predict()
    db.close()
