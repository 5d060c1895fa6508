"""A statement of Template.auto over a node relation (x_<node> p) that leaves the node's row by key
columns p already holds reads them from p instead of joining back to the node's table row
(relsql/template/auto/layers.py `near_row`). The network is the same: checked against the form with
the join back everywhere (`HELD_KEYS = False`), in float64 with the same weights, on hostile
databases (self-referencing and composite keys, earlier siblings, parents with a time of their own,
a keyless table, inferred keys), on RelBench's `<=` cut and on a ranking target's towers. Where the
step reads a column that is not the node's key (a parent reached from a node row), the join stays."""

from __future__ import annotations

import re

import pytest

import relsql
from relsql import relbench as rb
from relsql.template.auto import layers
from tests.test_auto_leaves import HOSTILE_SEEDS, assert_same_network, hostile_copy
from tests.test_auto_ranking import _shop as ranking_shop
from tests.test_auto_siblings import _relbench_db

JOIN_BACK = re.compile(r'JOIN "[^"]+" q ON (?P<on>[^\n]*)\n(?P<rest>[^;]*);')


def both_forms(monkeypatch, db, target: str, **options) -> tuple[relsql.Template, relsql.Template]:
    """(the template reading held keys, the same with every join back to the node's row)."""
    held = relsql.Template.auto(db, target, **options)
    with monkeypatch.context() as patch:
        patch.setattr(layers, "HELD_KEYS", False)
        joined = relsql.Template.auto(db, target, **options)
    return held, joined


def joins_back(template: relsql.Template) -> list[tuple[set[str], set[str]]]:
    """For each join back to a node's table row: (the key columns it joins on, the columns of q the
    rest of the statement reads)."""
    found = []
    for match in JOIN_BACK.finditer(template.source):
        keys = set(re.findall(r'q\."([^"]+)" = p\.', match["on"]))
        found.append((keys, set(re.findall(r'\bq\."([^"]+)"', match["rest"]))))
    return found


def assert_only_needed(held: relsql.Template, joined: relsql.Template) -> None:
    """The held form keeps a join back only where the statement reads a column beyond the key; the
    joined form has one in every statement over a node relation, so strictly more where any was cut."""
    for keys, read in joins_back(held):
        assert read and not read <= keys, (keys, read)
    assert len(joins_back(held)) <= len(joins_back(joined))


@pytest.mark.parametrize("seed", HOSTILE_SEEDS)
def test_hostile_databases_the_same_network_with_fewer_joins(monkeypatch, tmp_path, hostile, seed):
    manifest = hostile[seed]
    db = hostile_copy(manifest, tmp_path)
    cut = 0
    for entry in manifest["targets"]:
        options = {"time_column": entry["time_column"]} if entry.get("time_column") else {}
        held, joined = both_forms(monkeypatch, db, entry["target"], **options)
        assert_only_needed(held, joined)
        cut += len(joins_back(joined)) - len(joins_back(held))
        assert_same_network(db, held, joined, "predict")
    assert cut > 0  # each of these databases has two-hop paths through a node's key


def test_a_parent_reached_from_a_node_row_keeps_its_join():
    """customer <- orders -> product: the statement reaching an order's product reads the order's
    product_id, not its key, so it joins back to the order's row; the one reaching a product's
    reviews reads only the product's key, which x_customer__orders__product holds."""
    db = relsql.connect()
    db.execute("""
        CREATE TABLE customer(customer_id INTEGER PRIMARY KEY, age DOUBLE, label BOOLEAN);
        CREATE TABLE product(product_id INTEGER PRIMARY KEY, price DOUBLE);
        CREATE TABLE orders(order_id INTEGER PRIMARY KEY, customer_id INTEGER REFERENCES customer(customer_id),
                            product_id INTEGER REFERENCES product(product_id), qty DOUBLE);
        CREATE TABLE review(review_id INTEGER PRIMARY KEY, product_id INTEGER REFERENCES product(product_id),
                            stars DOUBLE);
        INSERT INTO customer SELECT i, 20 + i, i % 3 = 0 FROM range(40) t(i);
        INSERT INTO product SELECT i, 1.5 * i FROM range(12) t(i);
        INSERT INTO orders SELECT i, i % 40, (i * 7) % 12, i % 5 FROM range(200) t(i);
        INSERT INTO review SELECT i, (i * 5) % 12, i % 5 FROM range(60) t(i);""")
    held = relsql.Template.auto(db, "customer.label", hops=3)
    back = joins_back(held)
    assert ({"order_id"}, {"product_id"}) in back  # orders -> product: the order's own product_id
    assert all(keys != {"product_id"} for keys, _ in back)  # product -> review: by the product's key, held
    assert re.search(r'JOIN "review" y ON y\."product_id" = p\.n_product_id', held.source)


def test_relbench_cut_the_same_network(monkeypatch):
    db = _relbench_db()
    held, joined = both_forms(monkeypatch, db, "task.y", time_column="date", time_columns=rb.time_columns(db))
    assert_only_needed(held, joined)
    assert "at or before" in held.source
    assert_same_network(db, held, joined, "predict")


def test_ranking_towers_the_same_network(monkeypatch):
    db = relsql.connect()
    ranking_shop(db)
    held, joined = both_forms(monkeypatch, db, "task_rec.item_id", time_column="snapshot")
    assert_only_needed(held, joined)
    assert_same_network(db, held, joined, "predict")
