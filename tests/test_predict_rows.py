"""Scoring chosen rows: results.predict(keys=...) and (where=...) on real DuckDB files, checked
against the full prediction and against the database's own evaluation of the condition; a
condition that could do anything but filter the target table's rows is refused unrun."""

from __future__ import annotations

import numpy as np
import pandas as pd
import polars as pl
import pytest

import relsql
from relsql.train.learner import results
from relsql.where import WhereError
from tests.test_model import SIMPLE, build


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    folder = tmp_path_factory.mktemp("rows")
    db = build(folder / "shop.duckdb", n=80)
    model = relsql.Model(db, relsql.Template.from_sql(SIMPLE), target="customer.churned", seed=1, progress=False)
    model.fit(epochs=10, hybrid=False)
    model.save(folder / "m.pt")
    yield model, folder
    db.con.close()


def rows_where(db, condition: str) -> list[int]:
    """The database's own answer: the customers satisfying `condition`, by id (the test's own SQL)."""
    return [r[0] for r in db.con.execute(f"SELECT customer_id FROM customer WHERE {condition} ORDER BY 1").fetchall()]


def contents(db) -> dict:
    return {t: db.con.execute(f'SELECT * FROM "{t}" ORDER BY ALL').fetchall() for t in ("customer", "orders")}


@pytest.mark.parametrize("make", [
    lambda ids: pl.DataFrame({"customer_id": ids}),
    lambda ids: pd.DataFrame({"customer_id": ids}),
    lambda ids: {"customer_id": ids},
])
def test_keys_in_their_order(trained, make):
    model, _ = trained
    every = results.predict(model.learner, splits=True)
    ids = [41, 3, 17, 0, 79, 3]
    chosen = results.predict(model.learner, splits=True, keys=make(ids))
    assert chosen["customer_id"].to_list() == ids
    by_id = {r["customer_id"]: r for r in every.iter_rows(named=True)}
    assert chosen.rows(named=True) == [by_id[i] for i in ids]


def test_unknown_keys_and_wrong_columns(trained):
    model, _ = trained
    with pytest.raises(relsql.RelsqlError, match="999"):
        results.predict(model.learner, keys={"customer_id": [1, 999]})
    with pytest.raises(relsql.RelsqlError, match="key columns of `customer`"):
        results.predict(model.learner, keys={"id": [1]})
    with pytest.raises(relsql.RelsqlError, match="does not fit the type"):
        results.predict(model.learner, keys={"customer_id": ["one"]})


@pytest.mark.parametrize("condition", [
    "spend > 3 AND tier = 'gold'",
    "Spend < 0 OR customer.\"tier\" IN ('bronze')",
    "signup >= DATE '2020-01-15' AND NOT churned",
    "churned IS NULL",
    "lower(tier) LIKE 's%'",
    "churned",
])
def test_where_selects_what_the_database_selects(trained, condition):
    model, folder = trained
    oracle = rows_where(model.db, condition)
    chosen = results.predict(model.learner, splits=True, where=condition)
    assert chosen["customer_id"].to_list() == oracle and 0 < len(oracle) < 80
    every = results.predict(model.learner, splits=True)
    assert chosen.equals(every.filter(pl.col("customer_id").is_in(oracle)))


def test_keys_and_where_together(trained):
    model, folder = trained
    passing = set(rows_where(model.db, "spend > 0"))
    ids = [9, 2, 5, 4, 7, 6]
    chosen = results.predict(model.learner, keys={"customer_id": ids}, where="spend > 0")
    assert chosen["customer_id"].to_list() == [i for i in ids if i in passing]


@pytest.mark.parametrize("condition, words", [
    ("1=1; DROP TABLE customer", "2 statements"),
    ("DROP TABLE customer", "a statement .DROP., not a condition"),
    ("COPY customer TO 'x.csv'", "a statement"),
    ("customer_id IN (SELECT customer_id FROM orders)", "a query"),
    ("EXISTS (SELECT 1)", "subquery"),
    ("o.amount > 1", "not a column of `customer`"),
    ("amount > 1", "no column `amount`"),
    ("count(*) > 1", "aggregate"),
    ("row_number() OVER () > 1", "window"),
    ("read_csv('/etc/passwd') IS NULL", "file reader"),
    ("setseed(0.5) IS NULL", "function"),
    ("spend > ?", "parameter"),
    ("spend", "not a condition"),
    ("", "non-empty"),
    ("spend > 'abc'", "could not evaluate"),
])
def test_bad_where_is_refused_and_nothing_changes(trained, condition, words):
    model, _ = trained
    before = contents(model.db)
    with pytest.raises(WhereError, match=words.replace("(", r"\(").replace("?", r"\?")):
        results.predict(model.learner, where=condition)
    assert contents(model.db) == before


def test_columns_are_quoted_not_pasted(tmp_path):
    """A column whose name needs quoting (a space, a keyword) is found and quoted."""
    db = build(tmp_path / "q.duckdb", n=40)
    db.execute('ALTER TABLE customer ADD COLUMN "order" DOUBLE')
    db.execute('UPDATE customer SET "order" = customer_id % 5')
    model = relsql.Model(db, relsql.Template.from_sql(SIMPLE), target="customer.churned", progress=False)
    model.fit(epochs=2, hybrid=False)
    chosen = results.predict(model.learner, where='"order" >= 3')
    assert chosen["customer_id"].to_list() == [i for i in range(40) if i % 5 >= 3]
    db.con.close()


def same(a: pl.DataFrame, b: pl.DataFrame) -> bool:
    """The same rows in the same order, probabilities equal to float32 rounding (mini-batches sum in another order)."""
    return (a["customer_id"].to_list() == b["customer_id"].to_list()
            and np.allclose(a["probability"].to_numpy(), b["probability"].to_numpy(), atol=1e-6))


@pytest.mark.parametrize("batch_size", [None, 16])
def test_after_load_on_another_database(trained, tmp_path, batch_size):
    """A saved model scores chosen rows of a database it was not trained on (new customers), in
    full batch and in mini-batches of only the rows asked for."""
    model, folder = trained
    other = build(tmp_path / "new.duckdb", n=50, seed=7)
    loaded = relsql.Model.load(folder / "m.pt", other, batch_size=batch_size)
    condition = "tier = 'gold' AND spend > 5"
    oracle = [r[0] for r in other.con.execute(f"SELECT customer_id FROM customer WHERE {condition} ORDER BY 1").fetchall()]
    every = results.predict(loaded.learner)
    chosen = results.predict(loaded.learner, where=condition)
    assert len(oracle) > 0 and same(chosen, every.filter(pl.col("customer_id").is_in(oracle)))
    ids = [oracle[-1], 0, 33]
    picked = results.predict(loaded.learner, keys=pl.DataFrame({"customer_id": ids}))
    by_id = {r["customer_id"]: i for i, r in enumerate(every.iter_rows(named=True))}
    assert same(picked, every[[by_id[i] for i in ids]])
    other.con.close()


def test_model_predict_takes_keys_and_where(tmp_path):
    """The façade passes both through: Model.predict(keys=...) and Model.predict(where=...)."""
    import duckdb
    import polars as pl

    import relsql

    con = duckdb.connect(str(tmp_path / "facade.duckdb"))
    con.execute("CREATE TABLE c(id INTEGER PRIMARY KEY, x DOUBLE, tier VARCHAR, y DOUBLE)")
    con.execute("INSERT INTO c SELECT i, i / 10, CASE WHEN i % 2 = 0 THEN 'gold' ELSE 'lead' END, i % 3 FROM range(60) r(i)")
    con.close()
    db = relsql.connect(str(tmp_path / "facade.duckdb"))
    tpl = relsql.Template.from_sql("CREATE TABLE p AS SELECT c.id, linear(features(c.x), 1) AS h FROM c;")
    model = relsql.Model(db, tpl, target="c.y", seed=0, progress=False)
    model.fit(epochs=2)
    chosen = model.predict(keys=pl.DataFrame({"id": [41, 3]}))
    assert chosen["id"].to_list() == [41, 3]
    whole = model.predict()
    assert chosen["prediction"].to_list() == [whole.filter(pl.col("id") == k)["prediction"][0] for k in (41, 3)]
    assert sorted(model.predict(where="tier = 'gold' AND x < 2")["id"].to_list()) == [0, 2, 4, 6, 8, 10, 12, 14, 16, 18]
