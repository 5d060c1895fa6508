"""Automatic templates on warehouse shapes: time through date dimensions, time-less event tables,
identifier columns, and the default aggregation that can count (issue 19)."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

import relsql
from relsql.template.auto import aggregation_terms, id_like


@pytest.fixture
def shop(tmp_path):
    """A star schema: sales carry only surrogate date keys; visits only a key to a table of periods
(not named like a date dimension, so not taken as one unless mapped)."""
    db = relsql.connect(tmp_path / "shop.duckdb")
    db.execute("""
        CREATE TABLE date_dim(d_date_sk INTEGER PRIMARY KEY, d_date DATE, d_year INTEGER);
        CREATE TABLE store(s_store_sk INTEGER PRIMARY KEY, s_size DOUBLE);
        CREATE TABLE customer(c_customer_sk INTEGER PRIMARY KEY, snapshot DATE, age DOUBLE, label BOOLEAN,
                              c_first_shipto_date_sk INTEGER, c_customer_id VARCHAR);
        CREATE TABLE sales(sale_id INTEGER PRIMARY KEY,
                           customer_sk INTEGER REFERENCES customer(c_customer_sk),
                           sold_date_sk INTEGER REFERENCES date_dim(d_date_sk),
                           store_sk INTEGER REFERENCES store(s_store_sk), amount DOUBLE);
        CREATE TABLE periods(p_sk INTEGER PRIMARY KEY, p_start DATE);
        CREATE TABLE visits(visit_id INTEGER PRIMARY KEY, customer_sk INTEGER REFERENCES customer(c_customer_sk),
                            period_sk INTEGER REFERENCES periods(p_sk), pages DOUBLE);
        INSERT INTO date_dim SELECT i, DATE '2020-01-01' + INTERVAL (i) DAY, 2020 FROM range(1, 400) t(i);
        INSERT INTO store VALUES (1, 10.0), (2, 25.0);
        INSERT INTO customer VALUES (1, DATE '2020-03-01', 30, true, 2451000, 'AAAAAAAABAAAAAAA'),
                                    (2, DATE '2020-09-01', 40, false, 2452113, 'AAAAAAAACAAAAAAA'),
                                    (3, DATE '2020-05-01', 50, true, 2450777, 'AAAAAAAADAAAAAAA');
        -- day 10 is before every snapshot; day 100 (2020-04-10) after customer 1's, before 2's and 3's
        INSERT INTO sales VALUES (1, 1, 10, 1, 5.0), (2, 1, 100, 2, 7.0), (3, 2, 100, 1, 3.0),
                                 (4, 2, 10, 2, 4.0), (5, 3, 10, 1, 6.0), (6, 3, 300, 2, 9.0), (7, 1, NULL, 1, 2.0);
        INSERT INTO periods VALUES (1, DATE '2020-01-01'), (2, DATE '2020-06-01');
        INSERT INTO visits VALUES (1, 1, 2, 3.0), (2, 2, 1, 8.0), (3, 3, 1, 1.0);
    """)
    yield db
    db.con.close()


def _predict(tpl, db):
    return relsql.compile(tpl, db, dtype=torch.float64, seed=0)()["predict"]


def test_time_follows_the_date_key_to_the_date_dimension(shop):
    """Sales have no date of their own: their time is date_dim.d_date, joined in the statement."""
    tpl = relsql.Template.auto(shop, "customer.label", hops=2, time_column="snapshot")
    assert 'JOIN "date_dim" xd ON xd."d_date_sk" = x."sold_date_sk" AND xd."d_date" < r."snapshot"' in tpl.source
    assert "sales via sold_date_sk -> date_dim.d_date" in tpl.source
    before = _predict(tpl, shop)
    # Swap the amounts of two sales of day 100: after customer 1's snapshot, before customer 2's
    # (the column's mean and spread stay the same).
    shop.execute("UPDATE sales SET amount = CASE sale_id WHEN 2 THEN 3.0 ELSE 7.0 END WHERE sale_id IN (2, 3)")
    after = _predict(tpl, shop)
    assert torch.equal(before[0], after[0])  # customer 1 sees nothing from its future
    assert not torch.equal(before[1], after[1])  # customer 2 sees the changed sale
    # a sale without a date (NULL key) has no known time: it never joins
    shop.execute("UPDATE sales SET amount = 100.0 WHERE sale_id = 7")
    shop.execute("UPDATE sales SET amount = 2.0 WHERE sale_id = 7")
    assert torch.equal(after, _predict(tpl, shop))


def test_a_timeless_event_table_is_left_out_and_listed(shop):
    tpl = relsql.Template.auto(shop, "customer.label", hops=2, time_column="snapshot")
    used = tpl.source.split("-- tables used:")[1].splitlines()[0]
    assert "visits" not in used and '"visits"' not in tpl.source
    assert "-- left out, no time known: visits (the child rows of customer via customer_sk)" in tpl.source
    # stores are reached only as the parent row of a sale: an attribute, joined
    assert "store" in used and "joined only as parent rows (attributes of an entity, not events): store" in tpl.source
    before = _predict(tpl, shop)
    shop.execute("UPDATE visits SET pages = CASE visit_id WHEN 1 THEN 8.0 WHEN 2 THEN 3.0 ELSE 1.0 END")
    assert torch.equal(before, _predict(tpl, shop))
    assert "left out (reached only through tables left out for time): periods" in tpl.source
    # explicitly: time-less tables joined unfiltered, or a time given for them
    assert '"visits"' in relsql.Template.auto(shop, "customer.label", time_column="snapshot", timeless="include").source
    mapped = relsql.Template.auto(shop, "customer.label", time_column="snapshot", time_columns={"visits": "period_sk"})
    assert 'JOIN "periods" xd ON xd."p_sk" = x."period_sk" AND xd."p_start" < r."snapshot"' in mapped.source
    assert _predict(mapped, shop).shape == (3, 1)
    with pytest.raises(relsql.SchemaError, match="timeless"):
        relsql.Template.auto(shop, "customer.label", time_column="snapshot", timeless="maybe")
    with pytest.raises(relsql.SchemaError, match="no column `nope`"):
        relsql.Template.auto(shop, "customer.label", time_column="snapshot", time_columns={"visits": "nope"})
    with pytest.raises(relsql.SchemaError, match="neither a date"):
        relsql.Template.auto(shop, "customer.label", time_column="snapshot", time_columns={"visits": "pages"})


def test_identifier_columns_never_become_numbers(shop):
    text = relsql.Template.auto(shop, "customer.label", hops=2).source
    features = " ".join(re.findall(r"features\([^)]*\)", text))
    assert "_sk" not in features and "sale_id" not in features and "c_customer_id" not in features
    sql = "\n".join(line for line in text.splitlines() if not line.startswith("--"))
    assert "c_first_shipto_date_sk" not in sql and "c_customer_id" not in sql
    assert "left out, named like identifiers but not keys (never numeric features): " \
           "customer.c_first_shipto_date_sk, customer.c_customer_id" in text
    assert "embed(t.\"d_year\"" in text  # a small integer code stays embedded
    assert all(id_like(n) for n in ("id", "customer_id", "ss_item_sk", "row_key", "customerId", "CustomerID",
                                    "c_custkey", "o_orderkey", "uuid"))
    assert not any(id_like(n) for n in ("paid", "valid", "grid", "hockey", "monkey", "skid", "kids", "l_quantity"))


def test_default_aggregation_counts_child_rows(tmp_path):
    """The label is the number of orders; every order looks alike, so a mean alone cannot see it."""
    rng = np.random.default_rng(0)
    db = relsql.connect()
    n = rng.integers(1, 7, 240)
    db.execute("CREATE TABLE customer(customer_id INTEGER PRIMARY KEY, age DOUBLE, many BOOLEAN);"
               "CREATE TABLE orders(order_id INTEGER PRIMARY KEY, customer_id INTEGER REFERENCES customer(customer_id),"
               " amount DOUBLE)")
    db.con.executemany("INSERT INTO customer VALUES (?, ?, ?)",
                       [(i, float(rng.normal()), bool(k > 3)) for i, k in enumerate(n.tolist())])
    orders = [(i, int(c), float(rng.normal())) for i, c in enumerate(np.repeat(np.arange(len(n)), n).tolist())]
    db.con.executemany("INSERT INTO orders VALUES (?, ?, ?)", orders)
    accuracy = {}
    for aggregation in ("all", "avg"):
        tpl = relsql.Template.auto(db, "customer.many", hops=1, aggregation=aggregation)
        model = relsql.Model(db, tpl, target="customer.many", seed=0, progress=False).fit(epochs=150, lr=0.02, patience=40,
                                                                                       hybrid=False)  # the network's terms
        accuracy[aggregation] = model.evaluate()["accuracy"]
    text = relsql.Template.auto(db, "customer.many", hops=1).source
    assert "log(1 + count(*))" in text and re.search(r"sum\(e\.h\) \* 0\.\d+", text) and "max(e.h)" in text
    assert accuracy["all"] >= 0.9 and accuracy["all"] >= accuracy["avg"] + 0.15, accuracy


def test_aggregation_argument():
    assert aggregation_terms("all") == ("avg", "sum", "max", "count")
    assert aggregation_terms("mean, count") == aggregation_terms(["avg", "count"]) == ("avg", "count")
    assert aggregation_terms("sum") == ("sum",)
    for bad in ("median", "", "avg,avg", ["avg", 3], 3, None, "all,sum"):
        with pytest.raises(relsql.SchemaError, match="aggregation"):
            aggregation_terms(bad)


def test_another_task_tables_labels_never_feed_an_auto_template():
    """Two questions on one entity: the second task table's label counts events after its snapshot,
    which can be after the first task's snapshots; the auto-template for the first leaves it out."""
    db = relsql.connect()
    db.execute("CREATE TABLE customer(customer_id INT PRIMARY KEY, region VARCHAR)")
    db.execute("INSERT INTO customer SELECT i, 'r' || (i % 3) FROM range(30) t(i)")
    db.execute("CREATE TABLE orders(order_id INT PRIMARY KEY, customer_id INT REFERENCES customer, day DATE, amount DOUBLE)")
    db.execute("INSERT INTO orders SELECT i, (i * 7) % 30, DATE '2024-01-01' + INTERVAL ((i * 37) % 170) DAY, i % 7 "
               "FROM range(70) t(i)")
    for name, days in (("task_a", 30), ("task_b", 60)):
        relsql.PredictiveQuery.parse(
            f"COUNT(orders.*) OVER {days} DAYS > 0 FOR customer AT 2024-03-01, 2024-04-01").write(db, name)
    source = relsql.Template.auto(db, target="task_a.label", time_column="snapshot").source
    body = "\n".join(line for line in source.splitlines() if not line.startswith("--"))
    assert "task_b" not in body and "orders" in body
    assert "-- left out, task tables of other questions (their labels hold the future): task_b" in source


def test_a_path_without_rows_is_left_out_not_written_as_an_empty_statement():
    db = relsql.connect()
    db.execute("CREATE TABLE customer(customer_id INT PRIMARY KEY, age DOUBLE, churned BOOLEAN)")
    db.execute("INSERT INTO customer SELECT i, i % 50, i % 3 = 0 FROM range(40) t(i)")
    db.execute("CREATE TABLE product(product_id INT PRIMARY KEY, price DOUBLE)")
    db.execute("INSERT INTO product SELECT i, i * 1.5 FROM range(5) t(i)")
    db.execute("CREATE TABLE orders(order_id INT PRIMARY KEY, customer_id INT REFERENCES customer, "
               "product_id INT REFERENCES product, amount DOUBLE)")
    db.execute("INSERT INTO orders SELECT i, i % 40, NULL, i % 9 FROM range(120) t(i)")  # no order names a product
    template = relsql.Template.auto(db, target="customer.churned", hops=2)
    assert "-- left out, no rows along the way (a statement without groundings): product (via customer -> orders -> product)" \
        in template.source
    net = relsql.compile(template, db)  # before: "the statement has no groundings"
    assert net()["predict"].shape[0] == 40
