"""The synthetic shop (demos/synthetic): shape, keys, determinism, and the planted two-hop signal."""

from __future__ import annotations

import duckdb
import pytest

import relsql
from demos.synthetic import build, shop
from relsql.errors import SourceError

KEY_SQL = ("SELECT table_name, constraint_type, constraint_column_names, referenced_table FROM duckdb_constraints() "
           "WHERE constraint_type IN ('PRIMARY KEY', 'FOREIGN KEY') ORDER BY ALL")

# The planted rule, recomputed independently of the generator: avg product quality over the orders < 0.5
RULE_SQL = """
SELECT c.customer_id, c.churned, avg(p.quality) < 0.5 AS rule, count(*) AS n_orders
FROM customer c JOIN orders o ON o.customer_id = c.customer_id JOIN product p ON p.product_id = o.product_id
GROUP BY c.customer_id, c.churned
"""


@pytest.fixture(scope="module")
def con():
    con = duckdb.connect()
    counts = build(con)
    assert set(counts) == {"customer", "product", "orders"}
    yield con
    con.close()


def _snapshot(con):
    return {t: con.execute(f"SELECT * FROM {t} ORDER BY 1").fetchall() for t in ("customer", "product", "orders")}


def test_row_counts(con):
    assert con.execute("SELECT count(*) FROM customer").fetchone()[0] == 2000
    assert con.execute("SELECT count(*) FROM product").fetchone()[0] == 200
    per = con.execute("SELECT min(n), max(n), count(*), sum(n) "
                      "FROM (SELECT customer_id, count(*) AS n FROM orders GROUP BY 1)").fetchone()
    assert per[0] >= 1 and per[1] <= 8 and per[2] == 2000  # every customer has 1..8 orders
    assert per[3] == con.execute("SELECT count(*) FROM orders").fetchone()[0]
    small = duckdb.connect()
    assert build(small, customers=50, products=7, seed=3) == {
        "customer": 50, "product": 7, "orders": small.execute("SELECT count(*) FROM orders").fetchone()[0]}


def test_columns_and_types(con):
    db = relsql.connect(con)
    assert db.columns("customer") == [("customer_id", "INTEGER"), ("age", "DOUBLE"), ("region", "VARCHAR"),
                                      ("signup", "DATE"), ("churned", "BOOLEAN")]
    assert db.columns("product") == [("product_id", "INTEGER"), ("price", "DOUBLE"), ("category", "VARCHAR"),
                                     ("quality", "DOUBLE")]
    assert db.columns("orders") == [("order_id", "INTEGER"), ("customer_id", "INTEGER"), ("product_id", "INTEGER"),
                                    ("quantity", "INTEGER"), ("ordered_at", "DATE")]
    # referential integrity holds in the data even without declared keys
    assert con.execute("SELECT count(*) FROM orders o ANTI JOIN customer c USING (customer_id)").fetchone()[0] == 0
    assert con.execute("SELECT count(*) FROM orders o ANTI JOIN product p USING (product_id)").fetchone()[0] == 0
    assert con.execute("SELECT count(*) FROM orders o JOIN customer c USING (customer_id) "
                       "WHERE o.ordered_at < c.signup").fetchone()[0] == 0


def test_keys_declared(con):
    assert con.execute(KEY_SQL).fetchall() == [
        ("customer", "PRIMARY KEY", ["customer_id"], None),
        ("orders", "FOREIGN KEY", ["customer_id"], "customer"),
        ("orders", "FOREIGN KEY", ["product_id"], "product"),
        ("orders", "PRIMARY KEY", ["order_id"], None),
        ("product", "PRIMARY KEY", ["product_id"], None),
    ]
    catalog = relsql.connect(con).catalog()
    assert catalog.tables["orders"].primary_key == ("order_id",)
    assert {(fk.columns, fk.table, fk.references) for fk in catalog.tables["orders"].foreign_keys} == {
        (("customer_id",), "customer", ("customer_id",)), (("product_id",), "product", ("product_id",))}


def test_keys_absent_without_flag(con):
    bare = duckdb.connect()
    build(bare, foreign_keys=False)
    assert bare.execute("SELECT count(*) FROM duckdb_constraints()").fetchone()[0] == 0
    catalog = relsql.connect(bare).catalog()
    assert all(t.primary_key == () and t.foreign_keys == () for t in catalog.tables.values())
    assert _snapshot(bare) == _snapshot(con)  # same rows, only the constraints differ


def test_deterministic(con):
    again = duckdb.connect()
    build(again, seed=0)
    assert _snapshot(again) == _snapshot(con)
    other = duckdb.connect()
    build(other, seed=1)
    assert _snapshot(other)["customer"] != _snapshot(con)["customer"]


def test_class_balance(con):
    rate = con.execute("SELECT avg(churned::INTEGER) FROM customer").fetchone()[0]
    assert 0.4 <= rate <= 0.6
    for seed in (1, 2):
        other = duckdb.connect()
        build(other, seed=seed)
        assert 0.4 <= other.execute("SELECT avg(churned::INTEGER) FROM customer").fetchone()[0] <= 0.6


def test_planted_rule_holds(con):
    agree, covered = con.execute(f"SELECT avg((rule = churned)::INTEGER), count(*) FROM ({RULE_SQL})").fetchone()
    assert covered == 2000
    assert agree >= 0.85
    assert agree == pytest.approx(1 - shop.NOISE, abs=0.005)  # exactly the flipped 10% disagree


def test_customer_columns_carry_no_signal(con):
    corr_age, corr_signup = con.execute(
        "SELECT corr(age, churned::INTEGER), corr(epoch(signup), churned::INTEGER) FROM customer").fetchone()
    assert abs(corr_age) < 0.1 and abs(corr_signup) < 0.1
    overall = con.execute("SELECT avg(churned::INTEGER) FROM customer").fetchone()[0]
    rates = con.execute("SELECT region, avg(churned::INTEGER), count(*) FROM customer GROUP BY region").fetchall()
    assert len(rates) == len(shop.REGIONS)
    assert all(abs(rate - overall) < 0.1 for _, rate, _ in rates)
    assert all(abs(rate - overall) < 0.01 for _, rate, _ in rates)  # regions are dealt out evenly per class
    # one hop is not enough either: the number of orders and their quantities say nothing
    corr_n, corr_qty = con.execute(
        "SELECT corr(n, churned::INTEGER), corr(q, churned::INTEGER) FROM (SELECT c.churned, count(*) AS n, avg(o.quantity) AS q "
        "FROM customer c JOIN orders o USING (customer_id) GROUP BY c.customer_id, c.churned)").fetchone()
    assert abs(corr_n) < 0.1 and abs(corr_qty) < 0.1
    # while the two-hop aggregate is strongly predictive
    corr_quality = con.execute(
        "SELECT corr(q, churned::INTEGER) FROM (SELECT c.churned, avg(p.quality) AS q FROM customer c "
        "JOIN orders o USING (customer_id) JOIN product p USING (product_id) GROUP BY c.customer_id, c.churned)").fetchone()[0]
    assert corr_quality < -0.5


def test_refuses_existing_tables_and_leaves_nothing(con):
    before = _snapshot(con)
    with pytest.raises(SourceError, match="already exist"):
        build(con)
    assert _snapshot(con) == before
    partial = duckdb.connect()
    partial.execute("CREATE TABLE orders (x INTEGER)")
    with pytest.raises(SourceError, match="orders"):
        build(partial)
    assert [r[0] for r in partial.execute("SELECT table_name FROM information_schema.tables").fetchall()] == ["orders"]


def test_accepts_relsql_database():
    db = relsql.connect()
    counts = build(db, customers=100, products=10, seed=5)
    assert counts["customer"] == 100 and db.tables() == ["customer", "orders", "product"]
    with pytest.raises(ValueError, match="customers"):
        build(relsql.connect(), customers=0)
