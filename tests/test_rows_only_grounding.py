"""Grounding only the asked rows' closure (`BatchGrounder(rows_only=True).restrict`,
relsql/ground/demand.py and closure.py): key tables that hold only the rows some asked output
rows reach, numbered among those. Checked against the full grounder (every relation's whole key
table, the path before) on the same rows, compared by key: the same rows of every relation, the
same groundings in the same order, the same values. Templates cover partial bindings (a relation
read on some of its key columns), NULL keys, a LEFT JOIN and a subquery (read whole), a self-join
and rows asked twice or not at all."""

from __future__ import annotations

import warnings

import numpy as np
import pyarrow as pa
import pytest
import torch

import relsql
from relsql.ground.demand import BatchGrounder
from tests.test_model import build

SHOP = """
CREATE TABLE order_h AS SELECT o.order_id, tanh(linear(features(o.amount), 8, 'w_order')) FROM orders o;
CREATE TABLE cust_h AS
SELECT c.customer_id, avg(tanh(linear(features(c.spend, o.amount), 8, 'w_cust')))
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

# a relation keyed (customer, order) read on its customer only; orders read by two statements (a
# customer's own, and another's: order 3 x customer); one keyed by an order read through a
# tier (NULL tiers); a body with a subquery
PARTIAL = """
CREATE TABLE pair AS SELECT o.customer_id, o.order_id, tanh(linear(features(o.amount), 8, 'w_pair')) FROM orders o;
CREATE TABLE tier_h AS SELECT c.tier, avg(tanh(linear(features(c.spend), 8, 'w_tier'))) FROM customer c GROUP BY c.tier;
CREATE TABLE big AS SELECT o.order_id, tanh(linear(features(o.amount), 8, 'w_big')) FROM orders o
WHERE o.amount > (SELECT avg(amount) FROM orders);
CREATE TABLE order_h AS SELECT o.order_id, tanh(linear(features(o.amount), 8, 'w_oh')) FROM orders o;
CREATE TABLE cust AS
SELECT c.customer_id, avg(p.h) FROM customer c JOIN pair p ON p.customer_id = c.customer_id GROUP BY c.customer_id;
CREATE TABLE cust AS
SELECT o.customer_id, avg(oh.h) FROM orders o JOIN order_h oh ON oh.order_id = o.order_id GROUP BY o.customer_id;
CREATE TABLE cust AS
SELECT c.customer_id, avg(oh.h) FROM customer c JOIN order_h oh ON oh.order_id = c.customer_id * 3 GROUP BY c.customer_id;
CREATE TABLE cust AS
SELECT c.customer_id, avg(t.h) FROM customer c JOIN tier_h t ON t.tier = c.tier GROUP BY c.customer_id;
CREATE TABLE cust AS
SELECT o.customer_id, avg(b.h) FROM orders o JOIN big b ON b.order_id = o.order_id
WHERE o.amount < (SELECT max(amount) FROM orders) GROUP BY o.customer_id;
CREATE TABLE predict AS SELECT c.customer_id, linear(avg(x.h), 4, 'w_out') FROM customer c
JOIN cust x ON x.customer_id = c.customer_id GROUP BY c.customer_id;
"""

# and two aliases of `pair` joined through orders only: nothing equates the orders with an asked
# customer, so `pair` is read whole (else the candidates would pair every order with every customer)
SELF = PARTIAL + """
CREATE TABLE cust AS
SELECT p.customer_id, avg(q.h) FROM pair p JOIN orders o ON o.order_id = p.order_id
JOIN pair q ON q.order_id = o.order_id AND q.customer_id = p.customer_id GROUP BY p.customer_id;
"""


@pytest.fixture(scope="module")
def shop(tmp_path_factory):
    folder = tmp_path_factory.mktemp("rows_only")
    db = build(folder / "shop.duckdb", n=120)
    db.execute("UPDATE orders SET customer_id = NULL WHERE order_id % 11 = 0")  # orders of no one
    db.execute("UPDATE customer SET tier = NULL WHERE customer_id % 5 = 0")  # NULL keys of tier_h
    db.execute("INSERT INTO orders VALUES (100000, 100000, 1.0, true)")  # an order of a customer not in the table
    yield db
    db.con.close()


def _grounders(db, text):
    template = relsql.Template.from_sql(text)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        full = BatchGrounder(template, db, "predict", progress=False)
        local = BatchGrounder(template, db, "predict", progress=False, rows_only=True)
    return full, local


def _by_key(grounding, grounder) -> dict:
    """A batch's grounding with every row id replaced by its relation's key values."""
    keys = {}
    for name, rows in grounding.rows.items():
        if grounder.template.relations[name].keys:
            table = grounder.keys(name, rows.numpy()).drop(["_rid"])
            keys[name] = [tuple(r.values()) for r in table.to_pylist()]
        else:
            keys[name] = [()] * rows.numel()
    out = {}
    for name, relation in grounding.relations.items():
        rules = []
        for r in relation.rules:
            rules.append((r.rule.origin, [keys[name][i] for i in r.head.tolist()],
                          [[keys[ref][i] for i in t.tolist()] for ref, t in zip(r.rule.refs, r.refs)],
                          {k: v.numpy().tolist() for k, v in r.columns.items()}))
        out[name] = (keys[name], rules)
    return out


def _check(full, local, asked_ids):
    """Restricting `local` to `asked_ids` (customer ids, as asked: repeats, unknown ones) gives
    the full grounder's grounding of those customers, by key."""
    every = full.keys("predict")
    asked = pa.table({"customer_id": pa.array(asked_ids, type=pa.int64())})
    local.restrict(asked)
    known = local.keys("predict")
    wanted = sorted(set(asked_ids) & set(every.column("customer_id").to_pylist()))
    assert known.column("customer_id").to_pylist() == wanted  # the asked rows that exist, in key order
    assert known.column("_rid").to_pylist() == list(range(len(wanted)))
    if not wanted:
        return
    position = {k: i for i, k in enumerate(every.column("customer_id").to_pylist())}
    expected = full.ground(np.array([position[k] for k in wanted]))
    got = local.ground(np.arange(len(wanted)))
    assert _by_key(got, local) == _by_key(expected, full)
    total = sum(local.sizes.values())
    assert total < sum(full.sizes.values())  # restricted: fewer rows than the whole key tables


@pytest.mark.parametrize("text", [SHOP, PARTIAL, SELF], ids=["shop", "partial", "self"])
def test_asked_rows_ground_as_in_the_full_grounding(shop, text):
    full, local = _grounders(shop, text)
    rng = np.random.default_rng(3)
    for ids in ([5], [0, 17, 34, 35, 100], list(rng.choice(120, 30, replace=False)), [7, 7, 3, 999]):
        _check(full, local, [int(i) for i in ids])


def test_relations_read_in_shapes_not_followed_are_whole(shop):
    """`big` is read only by a body with a subquery: whole; `pair`, read on the customer alone,
    holds only the asked customers' orders, and is whole where SELF's self-join reads it."""
    full, local = _grounders(shop, PARTIAL)
    local.restrict(pa.table({"customer_id": pa.array([1, 2], type=pa.int64())}))
    assert local.sizes["big"] == full.sizes["big"] > 0
    pairs = local.keys("pair")
    assert set(pairs.column("customer_id").to_pylist()) == {1, 2}
    orders = full.keys("pair").filter(pa.compute.is_in(full.keys("pair").column("customer_id"), pa.array([1, 2])))
    assert pairs.num_rows == orders.num_rows
    full, local = _grounders(shop, SELF)
    local.restrict(pa.table({"customer_id": pa.array([1, 2], type=pa.int64())}))
    assert local.sizes["pair"] == full.sizes["pair"] and local.sizes["predict"] == 2


def test_restrict_to_every_row_is_the_full_key_tables(shop):
    full, local = _grounders(shop, SHOP)
    local.restrict(None)
    assert local.sizes == full.sizes
    for name in full.order:
        if full.template.relations[name].keys:
            assert local.keys(name).equals(full.keys(name))
    assert _by_key(local.ground(np.arange(40)), local) == _by_key(full.ground(np.arange(40)), full)


def test_an_empty_ask_grounds_no_rows(shop):
    full, local = _grounders(shop, PARTIAL)
    local.restrict(pa.table({"customer_id": pa.array([], type=pa.int64())}))
    assert local.sizes["predict"] == 0 and local.sizes["pair"] == 0
    assert torch.is_tensor(full.ground(np.arange(2)).rows["predict"])
