"""A loaded model's predictions of some rows (demand grounding, relsql/ground/demand.py) equal
the saved model's where the batch reads ple columns as numbers with the file's edges and each
rule body is narrowed to the batch's heads (`sql.heads_within`): ple over NULLs, a LEFT JOIN,
a grouped rule whose heads come from a joined table, float64."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
import torch

import relsql
from tests.test_model import build

TEMPLATE = """
CREATE TABLE order_h AS SELECT o.order_id, tanh(linear(ple(o.amount, 4), 8, 'w_order')) FROM orders o;
CREATE TABLE cust_h AS
SELECT c.customer_id, avg(tanh(linear(ple(c.spend, o.amount, 4), 8, 'w_cust')))
FROM customer c LEFT JOIN orders o ON o.customer_id = c.customer_id AND o.express
GROUP BY c.customer_id;
CREATE TABLE by_order AS
SELECT o.customer_id, avg(oh.h) FROM orders o JOIN order_h oh ON oh.order_id = o.order_id GROUP BY o.customer_id;
CREATE TABLE predict AS
SELECT c.customer_id, linear(avg(b.h), 4, 'w_out')
FROM customer c JOIN by_order b ON b.customer_id = c.customer_id GROUP BY c.customer_id;
CREATE TABLE predict AS
SELECT c.customer_id, linear(avg(ch.h), 4, 'w_c') FROM customer c JOIN cust_h ch ON ch.customer_id = c.customer_id
GROUP BY c.customer_id;
"""


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    folder = tmp_path_factory.mktemp("load_rows_encoded")
    db = build(folder / "shop.duckdb", n=90)
    db.execute("UPDATE orders SET amount = NULL WHERE order_id % 7 = 0")
    model = relsql.Model(db, relsql.Template.from_sql(TEMPLATE), target="customer.churned", seed=5, dtype=torch.float64,
                         progress=False)
    model.fit(epochs=4, hybrid=False)
    path = model.save(folder / "m.pt")
    expected = model.predict()
    db.con.close()
    return folder, path, expected


def test_some_rows_as_the_saved_model_with_ple_read_as_numbers(saved):
    folder, path, expected = saved
    db = relsql.connect(folder / "shop.duckdb", read_only=True)
    loaded = relsql.Model.load(path, db)
    asked = expected.filter(pl.col("customer_id") % 4 == 1)
    got = loaded.predict(keys=asked.select("customer_id"))
    joined = asked.join(got, on="customer_id", suffix="_loaded")
    assert joined.height == asked.height > 10
    np.testing.assert_allclose(joined["prediction_loaded"].to_numpy(), joined["prediction"].to_numpy(), rtol=0, atol=1e-12)
    grounder = loaded.learner.pending.rows_batched.grounder  # the demand grounder the rows used (relsql/train/learner/loaded.py)
    assert all(p.edges for name in ("order_h", "cust_h") for p in grounder.prepared[name])  # ple read as numbers
    db.close()


def test_a_grounder_for_a_grounding_store_keeps_ple_encoded_by_the_database(saved):
    """A grounding store writes a rule's columns as the grounder selects them: without
    ple_numbers=True the presets' ple columns stay (bins + 1)-wide lists, not numbers."""
    from relsql.ground.demand import BatchGrounder
    from relsql.train.persist import saved as files

    folder, path, _ = saved
    state = files.read(path)
    db = relsql.connect(folder / "shop.duckdb", read_only=True)
    grounder = BatchGrounder(state.template, db, state.output, state.presets, progress=False)
    assert not any(p.edges for rules in grounder.prepared.values() for p in rules)
    batch = grounder.ground(np.arange(5))
    column = batch.relations["order_h"].rules[0].columns[0]
    assert column.dim() == 2 and column.shape[1] == 4 + 1  # ple over 4 bins: 4 components and the NULL indicator
    db.close()
