"""A loaded model's predict(keys=/where=) grounds only the asked rows' closure (key tables
restricted to them, `BatchGrounder(rows_only=True)`): its predictions and split column equal the
built model's for the same keys. The split is found by key where the labelled target rows are
the labelled output rows (every customer has an order); where some labelled customer has no
output row, the key tables are whole and the split is read as the labels are."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
import torch

import relsql
from tests.test_model import build

TEMPLATE = """
CREATE TABLE order_h AS SELECT o.order_id, tanh(linear(features(o.amount), 8, 'w_order')) FROM orders o;
CREATE TABLE by_order AS
SELECT o.customer_id, avg(oh.h) FROM orders o JOIN order_h oh ON oh.order_id = o.order_id GROUP BY o.customer_id;
CREATE TABLE predict AS
SELECT c.customer_id, linear(avg(b.h), 4, 'w_out')
FROM customer c JOIN by_order b ON b.customer_id = c.customer_id GROUP BY c.customer_id;
"""


def _saved(folder, orphans: bool):
    db = build(folder / "shop.duckdb", n=80)
    if orphans:  # labelled customers without orders: no output row
        db.execute("DELETE FROM orders WHERE customer_id IN (1, 2, 40)")
    model = relsql.Model(db, relsql.Template.from_sql(TEMPLATE), target="customer.churned", seed=2, dtype=torch.float64,
                         progress=False)
    model.fit(epochs=2, hybrid=False)
    path = model.save(folder / "m.pt")
    expected = model.predict()
    db.con.close()
    return path, expected


@pytest.fixture(scope="module", params=[False, True], ids=["every-customer", "orphans"])
def saved(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp("rows_only_load")
    return folder, request.param, *_saved(folder, request.param)


def test_keys_predict_and_split_as_the_built_model(saved):
    folder, orphans, path, expected = saved
    db = relsql.connect(folder / "shop.duckdb", read_only=True)
    loaded = relsql.Model.load(path, db)
    ids = [3, 70, 17, 34, 5, 66, 51] + ([1, 40] if not orphans else [])
    got = loaded.predict(keys={"customer_id": ids})
    assert got["customer_id"].to_list() == ids
    want = pl.DataFrame({"customer_id": ids}).join(expected, on="customer_id", how="left")
    np.testing.assert_allclose(got["probability"].to_numpy(), want["probability"].to_numpy(), rtol=0, atol=1e-12)
    assert got["split"].to_list() == want["split"].to_list()
    assert set(want["split"].to_list()) >= {"train"} and None in want["split"].to_list()  # 17, 34, 51: unlabelled
    grounder = loaded.learner.pending.rows_batched.grounder
    assert grounder.rows_only
    # restricted to the asked customers unless the split needs every output row (orphans: not found by key)
    assert grounder.sizes["predict"] == (expected.height if orphans else len(ids))
    db.close()


def test_without_split_and_by_where_only_the_asked_rows(saved):
    folder, orphans, path, expected = saved
    db = relsql.connect(folder / "shop.duckdb", read_only=True)
    loaded = relsql.Model.load(path, db)
    got = loaded.predict(keys={"customer_id": [9, 8]}, with_split=False)
    assert "split" not in got.columns and got["customer_id"].to_list() == [9, 8]
    grounder = loaded.learner.pending.rows_batched.grounder
    assert grounder.sizes["predict"] == 2 and grounder.sizes["order_h"] < expected.height
    picked = loaded.predict(where="customer_id >= 60 AND customer_id < 66", with_split=False)
    want = expected.filter((pl.col("customer_id") >= 60) & (pl.col("customer_id") < 66)).sort("customer_id")
    assert picked["customer_id"].to_list() == want["customer_id"].to_list()
    np.testing.assert_allclose(picked["probability"].to_numpy(), want["probability"].to_numpy(), rtol=0, atol=1e-12)
    assert grounder.sizes["predict"] == want.height
    with pytest.raises(relsql.RelsqlError, match="not rows the model predicts"):
        loaded.predict(keys={"customer_id": [9, 100000]})
    if orphans:
        with pytest.raises(relsql.RelsqlError, match="not rows the model predicts"):
            loaded.predict(keys={"customer_id": [1]})  # a customer without orders has no output row
    db.close()


def test_fanout_keeps_the_whole_key_tables(tmp_path):
    """Fan-out sampling hashes row ids: a model with fanout keeps the whole key tables (the global
    ids its sampling is made with). (Its rows' predictions differ from the built model's full
    predict() already before rows_only: the sampled groundings depend on the batch.)"""
    db = build(tmp_path / "shop.duckdb", n=60)
    model = relsql.Model(db, relsql.Template.from_sql(TEMPLATE), target="customer.churned", seed=2, dtype=torch.float64,
                         progress=False, batch_size=16, fanout={"by_order": 2})
    model.fit(epochs=1, hybrid=False)
    path = model.save(tmp_path / "m.pt")
    db.con.close()
    db = relsql.connect(tmp_path / "shop.duckdb", read_only=True)
    loaded = relsql.Model.load(path, db)
    got = loaded.predict(keys={"customer_id": [4, 33, 12]})
    assert got["customer_id"].to_list() == [4, 33, 12]
    grounder = loaded.learner.pending.rows_batched.grounder
    assert not grounder.rows_only and grounder.sizes["predict"] == 60
    db.close()
