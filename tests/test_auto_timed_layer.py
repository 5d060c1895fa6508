"""Template.auto's event rows: an event row's age (and an earlier sibling's label) pass, with the row's
encoding, through a layer of their own before the row is aggregated (relsql/template/auto/layers.py,
`timed_layer`). The compiled network's value is checked against a reference written here from the
raw tables, the ages computed in Python, and the weights read from the net."""

from __future__ import annotations

import datetime as dt
import math
import random

import numpy as np
import pytest
import torch

import relsql
from tests.tables import insert_rows
from tests.test_predictive import BASE
from tests.test_predictive import shop as orders_shop


def timed_shop() -> tuple[relsql.Database, list[tuple], list[tuple]]:
    """tests/test_predictive.py's customers and orders, with a number to predict per customer (y) at
    the time it joined: orders after that are its future and never join."""
    db, customers, orders = orders_shop(n=40, seed=3)
    db.execute("ALTER TABLE customer ADD COLUMN y DOUBLE")
    db.execute("UPDATE customer SET y = customer_id % 7 * 0.5")
    return db, customers, orders


@pytest.fixture(scope="module")
def shop():
    db, customers, orders = timed_shop()
    template = relsql.Template.auto(db, target="customer.y", time_column="joined", width=4)
    yield db, customers, orders, template
    db.close()


def _rows(net, relation: str, key: str) -> dict[int, np.ndarray]:
    frame = net.values(relation)
    return {k: np.array(v) for k, v in zip(frame[key].to_list(), frame[frame.columns[-1]].to_list())}


def test_an_event_rows_age_passes_a_layer_with_its_encoding(shop):
    _, _, _, template = shop
    layer = ("e.h + tanh(linear(e.h, 4, 'event_orders') + linear(ag.age, 4, 'age_orders') "
             "+ bias(4, 'event_orders_bias'))")
    assert f"avg({layer})" in template.source and f"max({layer})" in template.source
    assert "e.h + linear(ag.age" not in template.source  # the linear read it replaces
    assert "each through a layer with its age" in template.source  # the statement's comment says so


def test_the_compiled_value_matches_a_reference_from_the_raw_tables(shop):
    db, customers, orders, template = shop
    net = relsql.compile(template, db, dtype=torch.float64, seed=0)
    with torch.no_grad():  # the bias starts at 0: give every weight a value that shows in the result
        generator = torch.Generator().manual_seed(1)
        for weight in net.weights_by_name().values():
            weight.copy_(torch.randn(weight.shape, generator=generator, dtype=weight.dtype) * 0.5)
    w = {name: weight.detach().numpy() for name, weight in net.weights_by_name().items()}
    encoded_orders = _rows(net, "enc_orders", "order_id")
    encoded_customers = _rows(net, "enc_customer", "customer_id")
    got = _rows(net, "p_customer", "customer_id")

    def lin(name: str, x) -> np.ndarray:  # linear(x, d, name): its (d, inputs) matrix applied to x
        return w[name] @ np.atleast_1d(np.asarray(x, dtype=np.float64))

    per_parent = len(orders) / len({o[1] for o in orders})  # the sum's scale: 1 / child rows per parent that has some
    scale = float(f"{1 / per_parent:.3g}")
    checked = 0
    for customer_id, joined, *_ in customers:
        earlier = [o for o in orders if o[1] == customer_id and o[2] < joined]
        value = lin("w_customer_self", encoded_customers[customer_id])
        if earlier:
            rows = []
            for order_id, _, at, _ in earlier:
                days = (joined - at).days
                age = math.copysign(math.log1p(abs(days)), days)
                e = encoded_orders[order_id]
                rows.append(e + np.tanh(lin("event_orders", e) + lin("age_orders", [age]) + w["event_orders_bias"]))
            rows = np.array(rows)
            value = value + (lin("w_orders_to_customer_mean", rows.mean(0)) + lin("w_orders_to_customer_sum", rows.sum(0) * scale)
                             + lin("w_orders_to_customer_max", rows.max(0))
                             + lin("w_orders_to_customer_count", [math.log(1 + len(rows))]))
            checked += 1
        np.testing.assert_allclose(got[customer_id], value, rtol=1e-9, atol=1e-12, err_msg=str(customer_id))
    assert checked >= 30  # most customers have earlier orders: the layer's term is what is compared


def test_a_ranking_targets_event_rows_are_read_as_before():
    db, _, _ = timed_shop()
    db.execute("CREATE TABLE item(item_id INTEGER PRIMARY KEY, price DOUBLE)")
    insert_rows(db, "item", [(i, float(i)) for i in range(10)])
    db.execute("CREATE TABLE pick(pick_id INTEGER PRIMARY KEY, customer_id INTEGER REFERENCES customer(customer_id), "
               "item_id INTEGER REFERENCES item(item_id), picked_at DATE)")
    rng = random.Random(0)
    insert_rows(db, "pick", [(p, rng.randrange(40), rng.randrange(10), BASE + dt.timedelta(days=rng.randrange(365)))
                             for p in range(200)])
    template = relsql.Template.auto(db, target="pick.item_id", time_column="picked_at", width=4)
    assert "linear(ag.age" in template.source and "tanh(linear(e.h" not in template.source
    db.close()


@pytest.mark.parametrize("options", [{"layer": "gat"}, {"layer": "hgt"}, {"layer": "rgcn"}, {"members": 2}, {"dropout": 0.2}])
def test_the_layer_is_trained_under_every_layer_kind(options):
    db, _, _ = timed_shop()
    template = relsql.Template.auto(db, target="customer.y", time_column="joined", width=4, **options)
    net = relsql.compile(template, db, dtype=torch.float64, seed=0)
    net.train()
    net()["predict"].sum().backward()
    weights = net.weights_by_name()
    for name in ("event_orders", "age_orders", "event_orders_bias"):
        assert weights[name].grad is not None and weights[name].grad.abs().sum() > 0, name
    db.close()
