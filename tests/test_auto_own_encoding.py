"""Template.auto's prediction reads the target row's own columns through a second, wider encoding
(own_<target>, relsql/template/auto/encoders.py `own_encoder`) while the relations keep the template's
width. Checked on the compiled network: with the wide encoding's first units given the narrow one's
weights, they compute the narrow encoding exactly, and the prediction is its two linear reads."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import relsql
from relsql.template.auto.encoders import OWN_WIDTH
from tests.tables import insert_rows
from tests.test_auto_timed_layer import _rows, timed_shop


def numbered_shop():
    """tests/test_auto_timed_layer's shop (customers: a date and a code of their own) with a number
    (of 11 values: cut into ranges and embedded) and a flag per customer."""
    db, customers, orders = timed_shop()
    db.execute("ALTER TABLE customer ADD COLUMN score DOUBLE")
    db.execute("ALTER TABLE customer ADD COLUMN vip BOOLEAN")
    db.execute("UPDATE customer SET score = (customer_id * 37 % 11) * 0.7 - 2, vip = customer_id % 3 = 0")
    return db, customers, orders


@pytest.fixture(scope="module")
def shop():
    db, customers, _ = numbered_shop()
    yield db, customers, relsql.Template.auto(db, target="customer.y", time_column="joined", width=4)
    db.close()


def test_the_prediction_s_own_term_reads_a_wider_encoding(shop):
    db, _, template = shop
    shapes = {name: tuple(w.shape) for name, w in relsql.compile(template, db, seed=0).weights_by_name().items()}
    assert shapes["own_customer_num"] == (OWN_WIDTH, 33) and shapes["enc_customer_num"] == (4, 33)  # ple: 32 ranges + NULL
    assert shapes["own_customer_flags"] == (OWN_WIDTH, 1) and shapes["enc_customer_flags"] == (4, 1)
    assert shapes["own_customer_dates"] == (OWN_WIDTH, 8)
    assert shapes["own_customer_segment"][1] == OWN_WIDTH  # embed: (rows, width)
    assert {n.removeprefix("own_") for n in shapes if n.startswith("own_")} == {
        n.removeprefix("enc_") for n in shapes if n.startswith("enc_customer_")}  # the same columns, read the same ways
    assert shapes["w_out_own"] == (1, OWN_WIDTH) and shapes["w_out"] == (1, 4)
    assert template.relations["own_customer"].rules[0].depends == []  # the table's columns, not the narrow encoding
    assert template.relations["predict"].rules[0].refs == ["h_customer", "own_customer"]
    assert template.relations["p_customer"].rules[0].refs == ["enc_customer"]  # the self term keeps the narrow one
    readers = [name for name, relation in template.relations.items()
               if any("own_customer" in rule.refs for rule in relation.rules)]
    assert readers == ["predict"]


def test_its_first_units_compute_the_narrow_encoding_and_the_head_adds_both(shop):
    db, customers, template = shop
    net = relsql.compile(template, db, dtype=torch.float64, seed=0)
    weights = net.weights_by_name()
    with torch.no_grad():
        generator = torch.Generator().manual_seed(1)
        for weight in weights.values():
            weight.copy_(torch.randn(weight.shape, generator=generator, dtype=weight.dtype) * 0.5)
        copied = 0
        for name, narrow in weights.items():
            if name.startswith("enc_customer_"):
                wide = weights["own_customer_" + name.removeprefix("enc_customer_")]
                axis = [i for i, (a, b) in enumerate(zip(narrow.shape, wide.shape)) if a != b]
                assert len(axis) == 1, name  # the same inputs, only the width differs
                wide.narrow(axis[0], 0, narrow.shape[axis[0]]).copy_(narrow)
                copied += 1
        assert copied == 5  # the number's ranges, the flag, the date, the code and the number's own embedding
    narrow, wide = _rows(net, "enc_customer", "customer_id"), _rows(net, "own_customer", "customer_id")
    context, got = _rows(net, "h_customer", "customer_id"), _rows(net, "predict", "customer_id")
    w = {name: weight.detach().numpy() for name, weight in weights.items()}
    assert len(got) == len(customers)
    assert len({round(float(v[0]), 9) for v in narrow.values()}) > 5  # the numbers move the encoding
    for customer_id in got:
        assert wide[customer_id].shape == (OWN_WIDTH,)
        np.testing.assert_allclose(wide[customer_id][:4], narrow[customer_id], rtol=1e-12, atol=1e-12)
        assert not np.allclose(wide[customer_id][4:8], narrow[customer_id])  # the other units are its own
        expected = w["w_out"] @ context[customer_id] + w["w_out_own"] @ wide[customer_id]
        np.testing.assert_allclose(got[customer_id], expected, rtol=1e-10, atol=1e-12)


def test_no_hops_reads_every_own_column_through_the_narrow_encoding(shop):
    db, _, _ = shop  # no relational context: the own term would be the whole prediction and drop the codes and dates
    template = relsql.Template.auto(db, target="customer.y", time_column="joined", width=4, hops=0)
    assert set(template.relations) == {"enc_customer", "predict"}


def test_a_target_without_columns_of_its_own_reads_its_narrow_encoding_as_before(tmp_path):
    db = relsql.connect(str(tmp_path / "bare.duckdb"))
    db.execute("CREATE TABLE customer(customer_id INTEGER PRIMARY KEY, y DOUBLE)")
    db.execute("CREATE TABLE orders(order_id INTEGER PRIMARY KEY, customer_id INTEGER REFERENCES customer(customer_id), "
               "amount DOUBLE)")
    insert_rows(db, "customer", [(i, i % 3 * 0.5) for i in range(30)])
    insert_rows(db, "orders", [(i, i % 30, float(i * 7 % 13)) for i in range(90)])
    template = relsql.Template.auto(db, target="customer.y", width=4)
    assert "own_customer" not in template.relations  # nothing to encode again: the learnt constant as before
    assert template.relations["predict"].rules[0].refs == ["h_customer", "enc_customer"]
    db.close()


@pytest.mark.parametrize("options", [{"members": 2}, {"layer": "gat"}, {"layer": "hgt"}, {"dropout": 0.2}])
def test_the_wide_encoding_trains_under_other_options(options):
    db, _, _ = numbered_shop()
    template = relsql.Template.auto(db, target="customer.y", time_column="joined", width=4, **options)
    members = options.get("members", 1)
    net = relsql.compile(template, db, dtype=torch.float64, seed=0)
    assert net.weights_by_name()["w_out_own"].shape == (members, OWN_WIDTH * members)
    net.train()
    net()["predict"].sum().backward()
    grads = {n: w.grad for n, w in net.weights_by_name().items() if n.startswith("own_customer_") or n == "w_out_own"}
    assert len(grads) >= 3 and all(g is not None and g.abs().sum() > 0 for g in grads.values()), grads.keys()
    db.close()
