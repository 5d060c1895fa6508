"""The target (relsql/train/task/target.py): the task decided per column type, labels against a SQL
query written here, seeded and temporal splits, and the leakage check."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import relsql
from tests.test_trainer import TEMPLATE, customers

READS_TARGET = TEMPLATE.replace("linear(avg(oh.h), 4, 'w_out')",
                                "linear(avg(oh.h), 4, 'w_out') + linear(avg(features(c.churned)), 4, 'w_leak')")


@pytest.fixture(scope="module")
def db() -> relsql.Database:
    """customers() with one target column per type."""
    db = customers()
    db.execute("ALTER TABLE customer ADD COLUMN flag INTEGER")
    db.execute("ALTER TABLE customer ADD COLUMN tier VARCHAR")
    db.execute("ALTER TABLE customer ADD COLUMN spend DOUBLE")
    db.execute("ALTER TABLE customer ADD COLUMN visits INTEGER")
    db.execute("CREATE TYPE mood AS ENUM ('sad', 'calm', 'glad')")
    db.execute("ALTER TABLE customer ADD COLUMN mood mood")
    db.execute("UPDATE customer SET flag = customer_id % 2, tier = ['bronze', 'silver', 'gold'][1 + customer_id % 3], "
               "spend = customer_id * 1.5 - 40, visits = customer_id % 90, "
               "mood = CAST(['sad', 'calm', 'glad'][1 + customer_id % 3] AS mood)")
    return db


def model(db: relsql.Database, column: str, **kwargs) -> relsql.Model:
    kwargs = {"seed": 3, **kwargs}
    return relsql.Model(db, relsql.Template.from_sql(TEMPLATE), f"customer.{column}", progress=False, **kwargs)


@pytest.mark.parametrize("column,kind,classes", [
    ("churned", "binary", [False, True]),  # BOOLEAN
    ("flag", "binary", [0, 1]),  # an integer with two values
    ("tier", "multiclass", ["bronze", "gold", "silver"]),  # VARCHAR
    ("mood", "multiclass", ["calm", "glad", "sad"]),  # an ENUM: its values
    ("spend", "regression", []),  # DOUBLE
    ("visits", "regression", []),  # an integer with more than 20 values
])
def test_the_task_follows_the_column_type(db, column, kind, classes):
    m = model(db, column)
    assert (m.task.kind, m.task.classes) == (kind, classes)
    assert m.task.units == (len(classes) if kind == "multiclass" else 1)


def test_a_date_target_is_refused(db):
    with pytest.raises(relsql.SchemaError, match="customer.signup"):
        model(db, "signup")


def labels_by_key(m: relsql.Model) -> dict[int, object]:
    """customer_id → label value, from the target's labelled rows and encoded labels."""
    keys = m.net.grounding.relations["predict"].keys.to_pydict()
    key_of = dict(zip(keys["_rid"], keys["customer_id"]))
    y = m.y.cpu().numpy()
    if m.task.kind == "regression":
        values = (y * m.task.std + m.task.mean).tolist()
    else:
        values = [m.task.classes[int(v)] for v in y]
    return {key_of[int(rid)]: value for rid, value in zip(m.labelled, values)}


@pytest.mark.parametrize("column", ["churned", "tier", "spend"])
def test_labels_are_those_a_sql_query_finds(db, column):
    m = model(db, column, dtype=torch.float64)  # exact labels: float32 would round the regression values
    # the naive reference: target rows that have an output row (customers with orders), label not NULL
    query = (f"SELECT c.customer_id, c.{column} FROM customer c WHERE c.{column} IS NOT NULL "
             "AND EXISTS (SELECT 1 FROM orders o WHERE o.customer_id = c.customer_id)")
    expected = dict(db.con.execute(query).fetchall())
    found = labels_by_key(m)
    assert found.keys() == expected.keys()
    for key, value in expected.items():
        assert found[key] == pytest.approx(value, abs=1e-9), key
    with_rows = db.con.execute("SELECT count(*) FROM customer c WHERE EXISTS "
                               "(SELECT 1 FROM orders o WHERE o.customer_id = c.customer_id)").fetchone()[0]
    assert len(m.positions) == with_rows  # NULL labels are kept for prediction
    if column == "spend":  # standardized by the training rows alone
        train = np.array([expected[k] for k in _keys(m, m.rows["train"])])
        assert m.task.mean == pytest.approx(train.mean(), abs=1e-9)
        assert m.task.std == pytest.approx(train.std(), abs=1e-9)


def _keys(m: relsql.Model, positions: np.ndarray) -> list[int]:
    keys = m.net.grounding.relations["predict"].keys.to_pydict()
    key_of = dict(zip(keys["_rid"], keys["customer_id"]))
    return [key_of[int(m.labelled[p])] for p in positions]


def test_a_seeded_split_is_reproducible_and_a_partition(db):
    a, b, c = model(db, "churned"), model(db, "churned"), model(db, "churned", seed=4)
    n = len(a.labelled)
    for split in ("train", "val", "test"):
        assert np.array_equal(a.rows[split], b.rows[split])
    assert not np.array_equal(a.rows["train"], c.rows["train"])
    every = np.concatenate([a.rows[s] for s in ("train", "val", "test")])
    assert sorted(every.tolist()) == list(range(n))  # each labelled row in exactly one split
    assert [len(a.rows[s]) for s in ("train", "val")] == [round(0.7 * n), round(0.15 * n)]
    # same rows on a model of another dtype: the split depends on the seed only
    assert np.array_equal(model(db, "churned", dtype=torch.float64).rows["test"], a.rows["test"])


def test_a_time_split_trains_on_the_earliest_rows(db):
    m = model(db, "churned", time_column="signup", split=(0.6, 0.2, 0.2))
    signup = dict(db.con.execute("SELECT customer_id, signup FROM customer").fetchall())
    times = {s: [signup[k] for k in _keys(m, m.rows[s])] for s in ("train", "val", "test")}
    assert all(times.values())
    assert max(times["train"]) <= min(times["val"]) and max(times["val"]) <= min(times["test"])
    assert len(set(times["train"])) > 1  # the column varies: the ordering above says something
    random = model(db, "churned", split=(0.6, 0.2, 0.2))
    assert (max(signup[k] for k in _keys(random, random.rows["train"]))
            > min(signup[k] for k in _keys(random, random.rows["test"])))


def test_a_template_that_reads_the_target_is_refused(db):
    with pytest.raises(relsql.SchemaError, match="reads the target customer.churned"):
        relsql.Model(db, relsql.Template.from_sql(READS_TARGET), "customer.churned", progress=False)
    condition = TEMPLATE.replace("GROUP BY c.customer_id", "AND c.churned IS NOT NULL GROUP BY c.customer_id")
    with pytest.raises(relsql.SchemaError, match="reads the target"):  # a WHERE on the label chooses the groundings
        relsql.Model(db, relsql.Template.from_sql(condition), "customer.churned", progress=False)
    allowed = relsql.Model(db, relsql.Template.from_sql(READS_TARGET), "customer.churned", progress=False,
                           allow_target_inputs=True)
    assert "w_leak" in allowed.net.weights_by_name()
    assert model(db, "tier").task.kind == "multiclass"  # the same template predicting another column is fine
