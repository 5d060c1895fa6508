"""Predictive queries for ranking (issue #30): LIST_DISTINCT(events.key) ... [RANK TOP k].

The task table's lists are checked against a naive Python loop over the same purchase rows:
the distinct item keys of each (customer, snapshot) window [snapshot, snapshot + N days), sorted;
no row for an observed window without an item; a NULL list for a window past the data.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import random
import sqlite3

import pyarrow as pa
import pytest

import relsql
from relsql.predictive import PredictiveQuery, QueryError, parse
from relsql.predictive.terms import is_task_table
from tests.test_model import insert_rows

BASE = dt.date(2021, 1, 1)
DAY = dt.timedelta(days=1)


def shop(n_customers: int = 30, n_items: int = 15, seed: int = 0, declared: bool = True):
    """customer, item (BIGINT key), purchase(customer_id, item_id, bought DATE): each customer buys
    from a few favourite items on random days over 200 days (repeats in a window are common), a
    few purchases have no item (NULL), and the last customers never buy."""
    rng = random.Random(seed)
    customers = [(c, f"c{c}") for c in range(n_customers)]
    items = [(1000 + i, rng.choice("xyz")) for i in range(n_items)]
    purchases = []
    for c in range(n_customers - 3):
        favourites = rng.sample([i for i, _ in items], 4)
        for day in range(200):
            if rng.random() < 0.06:
                item = None if rng.random() < 0.05 else rng.choice(favourites)
                purchases.append((len(purchases), c, item, BASE + day * DAY))
    db = relsql.connect()
    fk = " REFERENCES customer(customer_id)" if declared else ""
    ik = " REFERENCES item(item_id)" if declared else ""
    pk = " PRIMARY KEY" if declared else ""
    db.execute(f"CREATE TABLE customer(customer_id INTEGER{pk}, name VARCHAR)")
    db.execute(f"CREATE TABLE item(item_id BIGINT{pk}, category VARCHAR)")
    db.execute(f"CREATE TABLE purchase(purchase_id INTEGER{pk}, customer_id INTEGER{fk}, item_id BIGINT{ik}, bought DATE)")
    insert_rows(db, "customer", customers)
    insert_rows(db, "item", items)
    insert_rows(db, "purchase", purchases)
    return db, customers, purchases


@pytest.fixture(scope="module")
def small():
    db, customers, purchases = shop()
    yield db, customers, purchases
    db.close()


def naive(customers, purchases, snapshots, window, population="active"):
    """{(customer, snapshot): sorted distinct items, or None past the data} by brute force."""
    last = max(p[3] for p in purchases)
    out = {}
    for s in snapshots:
        observed = s + window * DAY <= last + DAY
        for c, _ in customers:
            mine = [p for p in purchases if p[1] == c]
            if population == "active" and not any(p[3] < s for p in mine):
                continue
            inside = sorted({p[2] for p in mine if s <= p[3] < s + window * DAY and p[2] is not None})
            if not observed:
                out[(c, s)] = None
            elif inside:
                out[(c, s)] = inside
    return out


def written(db, name, column="item_id"):
    """{(customer, snapshot): list}, read back through relsql (Arrow), checking the list type and
    that task_id numbers the rows by (snapshot, customer)."""
    data = db.arrow(f'SELECT * FROM "{name}" ORDER BY task_id')
    assert data.schema.field(column).type == pa.list_(pa.int64())
    rows = data.to_pylist()
    assert [r["task_id"] for r in rows] == list(range(1, len(rows) + 1))
    assert [(r["snapshot"], r["customer_id"]) for r in rows] == sorted((r["snapshot"], r["customer_id"]) for r in rows)
    return {(r["customer_id"], r["snapshot"]): r[column] for r in rows}


# -- lists against a naive computation ------------------------------------------------------------------------
def test_every_snapshot_lists_match_naive_and_rank_top_k_is_returned(small):
    db, customers, purchases = small
    result = parse("LIST_DISTINCT(purchase.item_id) OVER 30 DAYS FOR customer AT EVERY 20 DAYS RANK TOP 10").write(db, "t_every")
    snaps = list(result.snapshots)
    assert len(snaps) > 3 and all(b - a == 20 * DAY for a, b in zip(snaps, snaps[1:]))
    expected = naive(customers, purchases, snaps, 30)
    got = written(db, "t_every")
    assert got == expected
    assert any(len(v) > 1 for v in got.values())  # several distinct items in a window, sorted
    assert result.rows == result.labelled == len(expected)  # every window observed, none empty
    assert (result.k, result.target, result.references) == (10, "item_id", ("item", "item_id"))
    assert result.label_type == "BIGINT[]" and result.positives is None
    assert dict(db.columns("t_every")) == {"task_id": "BIGINT", "customer_id": "INTEGER", "snapshot": "DATE",
                                           "item_id": "BIGINT[]"}
    assert "RANK TOP 10" in str(result) and "item.item_id" in str(result)
    # an active customer without a purchase in an observed window has no row for it
    active = {(c, s) for s in snaps for c, _ in customers if any(p[1] == c and p[3] < s for p in purchases)}
    assert expected.keys() < active


def test_windows_past_the_data_give_null_lists_for_every_existing_entity(small):
    db, customers, purchases = small
    last = max(p[3] for p in purchases)
    snaps = [dt.date(2021, 2, 1), dt.date(2021, 5, 3), last - 10 * DAY, last + 5 * DAY]
    for population in ("active", "all"):
        text = (f"LIST_DISTINCT(purchase.item_id) OVER 14 DAYS FOR customer {population.upper()} "
                f"AT {', '.join(map(str, snaps))}")
        result = parse(text).write(db, "t_dates", replace=True)
        expected = naive(customers, purchases, snaps, 14, population)
        assert written(db, "t_dates") == expected
        unobserved = [k for k, v in expected.items() if v is None]
        assert {s for _, s in unobserved} == set(snaps[2:])
        assert result.rows - result.labelled == len(unobserved) and result.k is None
    assert len(unobserved) == len(customers) * 2  # ALL: every customer, even those that never buy


def test_python_form_equals_the_text_form_and_round_trips(small):
    db, _, _ = small
    query = PredictiveQuery(entity="customer", events="purchase", aggregate="list_distinct", value="item_id",
                            window_days=30, every_days=20, k=5)
    assert str(query) == "LIST_DISTINCT(purchase.item_id) OVER 30 DAYS FOR customer ACTIVE AT EVERY 20 DAYS RANK TOP 5"
    assert parse(str(query)) == query
    early = parse("list_distinct(purchase.item_id) over 30 days rank top 5 for each customer at every 20 days")
    assert early == query  # RANK TOP may also follow the window, as in Kumo's queries
    result = query.write(db, "t_py")
    assert result.k == 5
    assert written(db, "t_py") == written(db, "t_every")


def test_inferred_keys_and_a_list_named_like_the_referenced_key():
    """No declared keys (the item link is inferred from the name, next to an existing list task
    table); and a foreign key column named otherwise lists under the referenced key's name."""
    db, customers, purchases = shop(n_customers=12, seed=3, declared=False)
    try:
        snaps = [dt.date(2021, 3, 1), dt.date(2021, 5, 1)]
        at = ", ".join(map(str, snaps))
        parse(f"LIST_DISTINCT(purchase.item_id) OVER 30 DAYS FOR customer AT {at}").write(db, "t_inferred")
        assert written(db, "t_inferred") == naive(customers, purchases, snaps, 30)
        db.execute("ALTER TABLE item ADD PRIMARY KEY (item_id)")
        db.execute("CREATE TABLE bought(customer_id INTEGER, product BIGINT REFERENCES item(item_id), bought DATE)")
        db.execute("INSERT INTO bought SELECT customer_id, item_id, bought FROM purchase")
        again = parse(f"LIST_DISTINCT(bought.product) OVER 30 DAYS FOR customer AT {at}").write(db, "t_renamed")
        assert again.target == "item_id" and again.references == ("item", "item_id")
        assert written(db, "t_renamed") == naive(customers, purchases, snaps, 30)
    finally:
        db.close()


def test_foreign_key_declares_the_entity_only(small):
    db, customers, purchases = small
    parse("LIST_DISTINCT(purchase.item_id) OVER 30 DAYS FOR customer AT 2021-04-01").write(db, "t_fk", foreign_key=True)
    table = db.catalog()["t_fk"]
    assert table.primary_key == ("task_id",)
    assert ([(fk.columns, fk.table, fk.references) for fk in table.foreign_keys]
            == [(("customer_id",), "customer", ("customer_id",))])
    assert written(db, "t_fk") == naive(customers, purchases, [dt.date(2021, 4, 1)], 30)


def test_a_parquet_folder_gets_a_list_column_and_sqlite_is_refused(small, tmp_path):
    db, customers, purchases = small
    for table in ("customer", "item", "purchase"):
        db.execute(f"COPY {table} TO '{tmp_path / table}.parquet' (FORMAT parquet)")
    with relsql.connect(tmp_path) as folder:
        parse("LIST_DISTINCT(purchase.item_id) OVER 30 DAYS FOR customer AT 2021-04-01").write(folder, "task")
        assert written(folder, "task") == naive(customers, purchases, [dt.date(2021, 4, 1)], 30)
    sqlite = tmp_path / "shop.sqlite"
    with contextlib.closing(sqlite3.connect(sqlite)) as lite:
        lite.execute("CREATE TABLE customer(customer_id INTEGER PRIMARY KEY, name TEXT)")
        lite.execute("CREATE TABLE item(item_id INTEGER PRIMARY KEY, category TEXT)")
        lite.execute("CREATE TABLE purchase(purchase_id INTEGER PRIMARY KEY, "
                     "customer_id INTEGER REFERENCES customer(customer_id), "
                     "item_id INTEGER REFERENCES item(item_id), bought DATE)")
        lite.executemany("INSERT INTO customer VALUES (?, ?)", customers)
        lite.executemany("INSERT INTO purchase VALUES (?, ?, ?, ?)", [(*p[:3], p[3].isoformat()) for p in purchases])
        lite.commit()
    with relsql.connect(sqlite) as lite, pytest.raises(relsql.SchemaError, match="no list type"):
        parse("LIST_DISTINCT(purchase.item_id) OVER 30 DAYS FOR customer AT 2021-04-01").write(lite, "task")


# -- errors name the place and the fix ------------------------------------------------------------------------
@pytest.mark.parametrize(("text", "position", "fix"), [
    ("LIST_DISTINCT(purchase.item_id) OVER 30 DAYS FOR customer AT 2021-04-01 RANK TOP 0", 82, "RANK TOP 10"),
    ("LIST_DISTINCT(purchase.item_id) OVER 30 DAYS > 0 FOR customer AT 2021-04-01", 46, "remove the comparison"),
    ("COUNT(purchase.*) OVER 30 DAYS > 0 FOR customer AT 2021-04-01 RANK TOP 10", 63, "LIST_DISTINCT"),
    ("LIST_DISTINCT(purchase.*) OVER 30 DAYS FOR customer AT 2021-04-01", 24, "LIST_DISTINCT(purchase.item_id)"),
    ("LIST_DISTINCT(purchase.item_id) OVER 30 DAYS RANK TOP 3 FOR customer AT 2021-04-01 RANK TOP 3", 84, "once"),
    ("LIST_DISTINCT(purchase.item_id) OVER 30 DAYS FOR customer AT 2021-04-01 RANK 10", 78, "RANK TOP 10"),
])
def test_syntax_errors_name_the_position_and_the_fix(text, position, fix):
    with pytest.raises(QueryError) as err:
        parse(text)
    assert err.value.position == position - 1, str(err.value)
    assert fix in str(err.value)


@pytest.mark.parametrize(("fields", "fix"), [
    ({"k": 0}, "at least 1"),
    ({"k": -3}, "RANK TOP 10"),
    ({"k": True}, "whole number"),
    ({"op": ">", "threshold": 0}, "remove the comparison"),
    ({"aggregate": "count", "value": None, "k": 10}, "LIST_DISTINCT"),
])
def test_python_form_errors_are_query_errors(fields, fix):
    base = {"entity": "customer", "events": "purchase", "aggregate": "list_distinct", "value": "item_id",
            "window_days": 30, "every_days": 30}
    with pytest.raises(QueryError, match=fix):
        PredictiveQuery(**{**base, **fields})


@pytest.mark.parametrize(("column", "fix"), [
    ("bought", "not a foreign key"),
    ("purchase_id", "not a foreign key"),
    ("customer_id", "link to the entity"),
])
def test_a_list_of_something_not_a_key_is_refused(small, column, fix):
    db, _, _ = small
    with pytest.raises(QueryError, match=fix) as err:
        parse(f"LIST_DISTINCT(purchase.{column}) OVER 30 DAYS FOR customer AT 2021-04-01").write(db, "t_bad")
    assert "t_bad" not in db.catalog().tables
    if fix == "not a foreign key":
        assert "(item_id)" in str(err.value)  # names the key column it could list


def test_a_list_column_clashing_with_the_entity_key_is_refused():
    """Customer-to-customer links: the list would be named customer_id, like the entity key."""
    db = relsql.connect()
    try:
        db.execute("CREATE TABLE customer(customer_id INTEGER PRIMARY KEY)")
        db.execute("CREATE TABLE follows(customer_id INTEGER REFERENCES customer(customer_id), "
                   "followed INTEGER REFERENCES customer(customer_id), since DATE)")
        db.execute("INSERT INTO customer VALUES (1), (2)")
        db.execute("INSERT INTO follows VALUES (1, 2, DATE '2021-01-01'), (2, 1, DATE '2021-02-01')")
        with pytest.raises(QueryError, match="renames its key"):
            parse("LIST_DISTINCT(follows.followed) OVER 30 DAYS FOR customer AT 2021-01-15").write(db, "t")
    finally:
        db.close()


def test_is_task_table_recognises_list_and_label_task_tables(small):
    db, _, _ = small
    parse("COUNT(purchase.*) OVER 30 DAYS > 0 FOR customer AT 2021-04-01").write(db, "t_label")
    parse("LIST_DISTINCT(purchase.item_id) OVER 30 DAYS FOR customer AT 2021-04-01").write(db, "t_list")
    catalog = db.catalog()
    assert is_task_table(catalog["t_label"].columns) and is_task_table(catalog["t_list"].columns)
    assert not any(is_task_table(catalog[t].columns) for t in ("customer", "item", "purchase"))
