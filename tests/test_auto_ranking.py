"""Automatic templates for ranking targets (#30): two towers from the schema, time-safe."""

from __future__ import annotations

import random
from datetime import date, timedelta

import numpy as np
import pytest
import torch

import relsql
from relsql.template.auto import is_automatic

SNAPSHOTS = (date(2024, 2, 1), date(2024, 3, 1), date(2024, 4, 1))
EARLIEST = SNAPSHOTS[0]


def _shop(db: relsql.Database, seed: int = 0) -> None:
    """Customers, items in four categories with prices, purchases over four months (one exactly on
    a snapshot date), and task_rec: the distinct items each customer bought in the 30 days from a snapshot."""
    rng = random.Random(seed)
    db.execute("""
        CREATE TABLE customer(customer_id BIGINT PRIMARY KEY, age DOUBLE);
        CREATE TABLE item(item_id BIGINT PRIMARY KEY, category VARCHAR, price DOUBLE);
        CREATE TABLE purchase(purchase_id BIGINT PRIMARY KEY, customer_id BIGINT REFERENCES customer(customer_id),
                              item_id BIGINT REFERENCES item(item_id), bought DATE, quantity INT);
        CREATE TABLE task_rec(task_id BIGINT PRIMARY KEY, customer_id BIGINT REFERENCES customer(customer_id),
                              snapshot DATE, item_id BIGINT[]);
    """)
    db.execute("INSERT INTO customer VALUES " + ", ".join(f"({c}, {20 + c % 30})" for c in range(30)))
    db.execute("INSERT INTO item VALUES " + ", ".join(f"({i}, 'cat{i % 4}', {1.5 * i + 1})" for i in range(16)))
    rows = []
    for p in range(300):
        c = rng.randrange(30)
        i = c % 4 + 4 * rng.randrange(4) if rng.random() < 0.8 else rng.randrange(16)
        day = date(2024, 3, 1) if p == 0 else date(2024, 1, 1) + timedelta(days=rng.randrange(120))
        rows.append(f"({p}, {c}, {i}, DATE '{day}', {1 + rng.randrange(3)})")
    db.execute("INSERT INTO purchase VALUES " + ", ".join(rows))
    db.execute("""
        INSERT INTO task_rec
        SELECT row_number() OVER (ORDER BY c.customer_id, s.snap), c.customer_id, s.snap,
               (SELECT list(DISTINCT p.item_id ORDER BY p.item_id) FROM purchase p
                WHERE p.customer_id = c.customer_id AND p.bought >= s.snap AND p.bought < s.snap + 30)
        FROM customer c, (VALUES """ + ", ".join(f"(DATE '{s}')" for s in SNAPSHOTS) + ") s(snap)")


@pytest.fixture
def shop():
    db = relsql.connect()
    _shop(db)
    yield db
    db.close()


def _vectors(db, tpl, relation: str, key: str) -> dict:
    """`relation`'s vector per key value, weights from seed 0."""
    net = relsql.compile(tpl, db, dtype=torch.float64, seed=0)
    frame = net.values(relation)
    return {k: np.array(v) for k, v in zip(frame[key].to_list(), frame["value"].to_list())}


def _same(a, b) -> bool:
    """Equal up to summation order (a changed row can reorder a group's groundings: ~1e-13 in float64)."""
    return bool(np.allclose(a, b, rtol=0, atol=1e-9))


def _candidate(tpl) -> str:
    """The contract's candidate relation: the last one keyed by exactly item_id."""
    return [name for name, rel in tpl.relations.items() if rel.keys == ["item_id"]][-1]


def test_list_target_makes_two_towers(shop):
    tpl = relsql.Template.auto(shop, "task_rec.item_id", time_column="snapshot")
    again = relsql.Template.from_sql(tpl.source)  # the text is an editable template on its own
    assert is_automatic(tpl.source) and set(again.relations) == set(tpl.relations)
    assert tpl.output == "predict" and tpl.relations["predict"].keys == ["task_id"]
    assert list(tpl.relations)[-1] == "predict"  # the output stays the last statement
    candidate = _candidate(tpl)
    assert candidate == "candidate_item"
    assert 'embed(r."customer_id", 32, ' in tpl.source  # the customer's own vector (matrix factorization's)
    assert 'embed(t."item_id", 32, ' in tpl.source and "price" in tpl.source  # the item's id and own columns
    assert "* 0.1768" in tpl.source  # ID embeddings scaled by 1/sqrt(32)
    out = relsql.compile(tpl, shop, dtype=torch.float64, seed=0)()
    assert out["predict"].shape == (shop.scalar("SELECT count(*) FROM task_rec")[0], 32)
    assert out[candidate].shape == (16, 32)
    small = relsql.Template.auto(shop, "task_rec.item_id", time_column="snapshot", dimension=16)
    out = relsql.compile(small, shop, dtype=torch.float64, seed=0)()
    assert out["predict"].shape[1] == out[_candidate(small)].shape[1] == 16


def test_scalar_foreign_key_target(shop):
    """purchase.item_id: the label's own key is never followed, and no statement reads the target
    column of any row; the customer's other purchases come as a commented-out history term."""
    tpl = relsql.Template.auto(shop, "purchase.item_id")
    assert tpl.relations["predict"].keys == ["purchase_id"] and _candidate(tpl) == "candidate_item"
    assert list(tpl.relations)[-1] == "predict"
    assert '-- JOIN "purchase" y ON y."customer_id" = r."customer_id" AND y."purchase_id" <> r."purchase_id"' in tpl.source
    out = relsql.compile(tpl, shop, dtype=torch.float64, seed=0)()
    assert out["predict"].shape == (300, 32) and out["candidate_item"].shape == (16, 32)
    before = _vectors(shop, tpl, "predict", "purchase_id")
    items = _vectors(shop, tpl, "candidate_item", "item_id")
    shop.execute("UPDATE purchase SET item_id = (item_id * 7 + 3) % 16")  # every label changed
    after = _vectors(shop, tpl, "predict", "purchase_id")
    assert all(_same(before[p], after[p]) for p in before)
    assert all(_same(items[i], v) for i, v in _vectors(shop, tpl, "candidate_item", "item_id").items())
    uncommented = "\n".join(line[3:] if line.startswith("-- ") and not line.startswith("-- history")
                             and line[3:].split(" ")[0] in ("CREATE", "SELECT", "FROM", "JOIN", "GROUP") else line
                             for line in tpl.source.splitlines())
    edited = relsql.Template.from_sql(uncommented)  # the user's edit: the history over the customer's other purchases
    customer, = shop.scalar("SELECT customer_id FROM purchase WHERE purchase_id = 5")
    sibling, = shop.scalar(f"SELECT min(purchase_id) FROM purchase WHERE customer_id = {customer} AND purchase_id <> 5")
    before = _vectors(shop, edited, "predict", "purchase_id")
    shop.execute("UPDATE purchase SET item_id = (item_id + 1) % 16 WHERE purchase_id = 5")
    after = _vectors(shop, edited, "predict", "purchase_id")
    assert _same(before[5], after[5])  # its own label never reaches its query vector
    assert not _same(before[sibling], after[sibling])  # but it is history for the customer's others


def test_history_is_the_mean_candidate_vector_of_earlier_purchases(shop):
    """Naive oracle: predict(history) - predict(no history) = the mean candidate vector of the
    items the row's customer bought strictly before its snapshot (zero without any)."""
    full = relsql.Template.auto(shop, "task_rec.item_id", time_column="snapshot")
    bare = relsql.Template.auto(shop, "task_rec.item_id", time_column="snapshot", history=False)
    assert "-- history:" in full.source and "-- history:" not in bare.source
    with_history, without = _vectors(shop, full, "predict", "task_id"), _vectors(shop, bare, "predict", "task_id")
    candidates = _vectors(shop, full, "candidate_item", "item_id")
    purchases = shop.arrow("SELECT customer_id, item_id, bought FROM purchase").to_pylist()
    checked = 0
    for task in shop.arrow("SELECT task_id, customer_id, snapshot FROM task_rec").to_pylist():
        items = [p["item_id"] for p in purchases if p["customer_id"] == task["customer_id"] and p["bought"] < task["snapshot"]]
        expected = np.mean([candidates[i] for i in items], axis=0) if items else np.zeros(32)
        np.testing.assert_allclose(with_history[task["task_id"]] - without[task["task_id"]], expected, atol=1e-9)
        checked += bool(items)
    assert checked > 30


def test_time_keeps_later_purchases_out(shop):
    tpl = relsql.Template.auto(shop, "task_rec.item_id", time_column="snapshot")
    assert "min(s.\"snapshot\")" in tpl.source  # the shared candidate tower reads only what precedes all snapshots
    before = _vectors(shop, tpl, "predict", "task_id")
    items_before = _vectors(shop, tpl, "candidate_item", "item_id")
    # purchase 0 lies exactly on the 2024-03-01 snapshot: change which item it was
    customer, = shop.scalar("SELECT customer_id FROM purchase WHERE purchase_id = 0")
    rows = shop.arrow(f"SELECT task_id, snapshot FROM task_rec WHERE customer_id = {customer}").to_pylist()
    tasks = {r["snapshot"]: r["task_id"] for r in rows}
    shop.execute("UPDATE purchase SET item_id = (item_id + 1) % 16 WHERE purchase_id = 0")
    after = _vectors(shop, tpl, "predict", "task_id")
    assert _same(before[tasks[SNAPSHOTS[0]]], after[tasks[SNAPSHOTS[0]]])
    assert _same(before[tasks[SNAPSHOTS[1]]], after[tasks[SNAPSHOTS[1]]])  # at the snapshot: still its future
    assert not _same(before[tasks[SNAPSHOTS[2]]], after[tasks[SNAPSHOTS[2]]])  # before the last one: seen
    others = [t for t in before if t not in tasks.values()]
    assert all(_same(before[t], after[t]) for t in others)
    changed = _vectors(shop, tpl, "candidate_item", "item_id")
    assert all(_same(items_before[i], changed[i]) for i in items_before)  # after the earliest snapshot
    # a purchase before the earliest snapshot is the candidate tower's (popularity)
    early, = shop.scalar(f"SELECT min(purchase_id) FROM purchase WHERE bought < DATE '{EARLIEST}'")
    shop.execute(f"UPDATE purchase SET item_id = (item_id + 1) % 16 WHERE purchase_id = {early}")
    assert any(not _same(changed[i], v) for i, v in _vectors(shop, tpl, "candidate_item", "item_id").items())


def test_no_popularity_when_nothing_precedes_the_earliest_snapshot(shop):
    """A statement without groundings is an error: with no purchase before the earliest snapshot,
    the candidate tower has no popularity term, and the header says so."""
    shop.execute("INSERT INTO task_rec VALUES (1000, 0, DATE '2023-06-01', [1, 2])")
    tpl = relsql.Template.auto(shop, "task_rec.item_id", time_column="snapshot")
    assert "-- no popularity from purchase in the candidate tower: no rows before the earliest task_rec.snapshot" in tpl.source
    assert "log(1 + count(*))" not in tpl.source.split("CREATE TABLE candidate_item")[1]
    assert relsql.compile(tpl, shop, dtype=torch.float64, seed=0)()["candidate_item"].shape == (16, 32)


def test_without_time_the_candidate_tower_counts_every_interaction(shop):
    tpl = relsql.Template.auto(shop, "task_rec.item_id")
    assert "log(1 + count(*))" in tpl.source.split("CREATE TABLE candidate_item")[2]
    assert "min(s." not in tpl.source


def test_interactions_without_time_or_key(shop):
    """rating(customer_id, item_id) has neither a time nor a key: left out of a temporal template's
    towers by default (its rows may be later than the snapshot), read unfiltered on request."""
    shop.execute("CREATE TABLE rating(customer_id BIGINT REFERENCES customer(customer_id), "
                 "item_id BIGINT REFERENCES item(item_id), stars INT)")
    shop.execute("INSERT INTO rating SELECT customer_id, item_id, 1 + purchase_id % 5 FROM purchase WHERE purchase_id % 3 = 0")
    text = relsql.Template.auto(shop, "task_rec.item_id", time_column="snapshot").source
    assert "-- no history from rating in the query tower: its rows' time is unknown" in text
    assert 'JOIN "rating"' not in text
    tpl = relsql.Template.auto(shop, "task_rec.item_id", time_column="snapshot", timeless="include")
    assert "met in rating (its customer_id -> item_id), unfiltered" in tpl.source
    assert 'JOIN "rating" y ON y."customer_id" = r."customer_id"\n' in tpl.source
    out = relsql.compile(tpl, shop, dtype=torch.float64, seed=0)()
    assert out["predict"].shape == (90, 32)
    untimed = relsql.Template.auto(shop, "task_rec.item_id").source  # no time column: every interaction counts
    assert "met in rating" in untimed and "candidate_item <- rating" in untimed


def test_bad_ranking_options(shop):
    with pytest.raises(relsql.SchemaError, match="ranking targets"):
        relsql.Template.auto(shop, "purchase.quantity", dimension=8)
    with pytest.raises(relsql.SchemaError, match="history"):
        relsql.Template.auto(shop, "task_rec.item_id", history="yes")
    shop.execute("CREATE TABLE wish(wish_id BIGINT PRIMARY KEY, gift_id BIGINT[])")
    with pytest.raises(relsql.SchemaError, match="no table has one"):
        relsql.Template.auto(shop, "wish.gift_id")


def test_ranking_aggregates_child_rows_without_max_by_default(shop):
    """A ranking target's query tower takes avg, sum and count over child rows (max's backward was half
    of each step on bench.recommend's shop, for the same MAP); asked for, max comes back; a label
    target keeps all four."""
    ranking = relsql.Template.auto(shop, "task_rec.item_id", time_column="snapshot")
    terms = "'w_customer__purchase_to_customer_{}'"  # the purchases' terms, each its own weight
    assert all(terms.format(term) in ranking.source for term in ("mean", "sum", "count"))
    assert terms.format("max") not in ranking.source and "_max'" not in ranking.source
    asked = relsql.Template.auto(shop, "task_rec.item_id", time_column="snapshot", aggregation="all")
    assert terms.format("max") in asked.source
    assert "linear(max(e.h + linear(ag.age, 16, 'age_customer__purchase'))" in asked.source
    label = relsql.Template.auto(shop, "customer.age")  # customer's purchases are its child rows
    assert "'w_purchase_to_customer_max'" in label.source
    out = relsql.compile(ranking, shop, dtype=torch.float64, seed=0)()
    assert out["predict"].shape == (shop.scalar("SELECT count(*) FROM task_rec")[0], 32)
