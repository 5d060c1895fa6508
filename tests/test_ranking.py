"""Ranking targets end to end: a list-of-keys (or foreign-key) target trains two towers,
`recommend(k)` keeps its contract, `evaluate()` equals naive metrics over recommend()'s output,
models save and load, and bad input is a RelsqlError naming the fix."""

from __future__ import annotations

import datetime as dt

import numpy as np
import polars as pl
import pytest
import torch

import relsql
from relsql.errors import RelsqlError
from tests.tables import insert_rows

TEMPLATE = """
CREATE TABLE item_h AS SELECT i.item_id, embed(i.item_id, 16, 'item') AS h FROM item i;
CREATE TABLE task_h AS SELECT t.task_id, embed(t.customer_id, 16, 'who') AS h FROM task_rec t;
CREATE TABLE task_h AS
SELECT t.task_id, avg(x.h) AS h
FROM task_rec t JOIN purchase p ON p.customer_id = t.customer_id JOIN item_h x ON x.item_id = p.item_id
WHERE p.day < t.snapshot
GROUP BY t.task_id;
"""
START = dt.date(2025, 1, 1)


def shop(path, customers: int = 60, items: int = 40, seed: int = 0) -> relsql.Database:
    """Customers who keep buying from their own small set of favourite items: the past predicts the future."""
    rng = np.random.default_rng(seed)
    db = relsql.connect(str(path))
    db.execute("CREATE TABLE item(item_id BIGINT PRIMARY KEY, price DOUBLE)")
    db.execute("CREATE TABLE customer(customer_id BIGINT PRIMARY KEY, age INTEGER)")
    db.execute("CREATE TABLE purchase(purchase_id BIGINT PRIMARY KEY, customer_id BIGINT REFERENCES customer(customer_id), "
               "item_id BIGINT REFERENCES item(item_id), day DATE)")
    db.execute("CREATE TABLE task_rec(task_id BIGINT PRIMARY KEY, customer_id BIGINT, snapshot DATE, item_id BIGINT[])")
    con = db.con
    insert_rows(con, "item", [(i, float(rng.uniform(1, 9))) for i in range(items)])
    insert_rows(con, "customer", [(c, int(rng.integers(18, 80))) for c in range(customers)])
    favourites = {c: rng.choice(items, 4, replace=False) for c in range(customers)}
    rows, pid = [], 0
    for c in range(customers):
        for month in range(6):
            for _ in range(3):
                rows.append((pid, c, int(rng.choice(favourites[c])),
                             START + dt.timedelta(days=30 * month + int(rng.integers(30)))))
                pid += 1
    insert_rows(con, "purchase", rows)
    tasks, tid = [], 0
    for month in range(1, 6):
        snapshot = START + dt.timedelta(days=30 * month)
        for c in range(customers):
            bought = sorted({i for p, cc, i, d in rows if cc == c and snapshot <= d < snapshot + dt.timedelta(days=30)})
            if bought:
                tasks.append((tid, c, snapshot, bought))
                tid += 1
    for c in range(5):  # rows to predict: no label
        tasks.append((tid, c, START + dt.timedelta(days=180), None))
        tid += 1
    insert_rows(con, "task_rec", tasks)
    return db


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    db = shop(tmp_path_factory.mktemp("shop") / "shop.duckdb")
    model = relsql.Model(db, relsql.Template.from_sql(TEMPLATE), target="task_rec.item_id", time_column="snapshot", seed=0)
    model.fit(epochs=60, time_budget=None, lr=0.05)
    return db, model


def naive_metrics(recommended: dict, truth: dict, k: int) -> dict[str, float]:
    """MAP@k, recall@k, NDCG@k and MRR row by row, in plain Python."""
    aps, recalls, ndcgs, rrs = [], [], [], []
    for row, items in truth.items():
        ranked = recommended.get(row, [])[:k]
        hits, precision_sum, dcg, rr = 0, 0.0, 0.0, 0.0
        for i, item in enumerate(ranked, start=1):
            if item in items:
                hits += 1
                precision_sum += hits / i
                dcg += 1 / np.log2(i + 1)
                rr = rr or 1 / i
        ideal = sum(1 / np.log2(i + 1) for i in range(1, min(k, len(items)) + 1))
        aps.append(precision_sum / min(k, len(items)))
        recalls.append(hits / len(items))
        ndcgs.append(dcg / ideal)
        rrs.append(rr)
    return {f"map@{k}": np.mean(aps), f"recall@{k}": np.mean(recalls), f"ndcg@{k}": np.mean(ndcgs), "mrr": np.mean(rrs)}


def test_recommend_contract_and_scores_are_the_towers_dot_product(trained):
    db, model = trained
    frame = model.recommend(k=5)
    assert frame.columns == ["task_id", "item_id", "rank", "score"]
    assert frame["task_id"].unique().sort().to_list() == list(range(frame["task_id"].max() - 4, frame["task_id"].max() + 1))
    assert frame.height == 5 * 5
    for _, group in frame.group_by("task_id"):
        assert group["rank"].to_list() == [1, 2, 3, 4, 5]
        assert group["score"].to_list() == sorted(group["score"].to_list(), reverse=True)
        assert group["item_id"].n_unique() == 5
    query = {r["task_id"]: np.array(r["value"]) for r in model.net.values("task_h").to_dicts()}
    item = {r["item_id"]: np.array(r["value"]) for r in model.net.values("item_h").to_dicts()}
    for row in frame.to_dicts():
        assert row["score"] == pytest.approx(float(query[row["task_id"]] @ item[row["item_id"]]), rel=1e-5, abs=1e-5)
    best = {t: max(item, key=lambda i: query[t] @ item[i]) for t in frame["task_id"].unique().to_list()}
    assert {r["task_id"]: r["item_id"] for r in frame.filter(pl.col("rank") == 1).to_dicts()} == best


def test_evaluate_equals_naive_metrics_over_recommend(trained):
    db, model = trained
    test_rows = model.learner.labelled[model.rows["test"]]
    keys = model.learner.net.grounding.relations["task_h"].keys.to_pylist()
    task_of = {r["_rid"]: r["task_id"] for r in keys}
    chosen = pl.DataFrame({"task_id": [task_of[r] for r in test_rows.tolist()]})
    frame = model.recommend(k=10, keys=chosen)
    recommended = {t: g.sort("rank")["item_id"].to_list() for (t,), g in frame.group_by("task_id")}
    lists = db.arrow("SELECT task_id, item_id FROM task_rec WHERE item_id IS NOT NULL").to_pylist()
    truth = {r["task_id"]: set(r["item_id"]) for r in lists if r["task_id"] in set(chosen["task_id"].to_list())}
    expected = naive_metrics(recommended, truth, 10)
    scores = model.evaluate()
    for name, value in expected.items():
        assert scores[name] == pytest.approx(value, abs=1e-9), name


def test_training_beats_popularity_on_a_shop_of_habits(trained):
    db, model = trained
    scores = model.evaluate()
    train_rows = model.learner.labelled[model.rows["train"]]
    counts = np.bincount(model.learner.goal.pairs(model.rows["train"])[1], minlength=40)
    top = np.argsort(-counts, kind="stable")[:10]
    from relsql.train.ranking.metrics import ranking_scores

    offsets, ids = model.learner.goal.truth("test")
    popular = ranking_scores(np.tile(top, (len(model.rows["test"]), 1)), offsets, ids, 10)
    assert len(train_rows) > 100
    assert scores["map@10"] > 2 * popular["map@10"], (scores, popular)


def test_the_split_is_by_time(trained):
    db, model = trained
    times = {r["task_id"]: r["snapshot"] for r in db.arrow("SELECT task_id, snapshot FROM task_rec").to_pylist()}
    keys = {r["_rid"]: r["task_id"] for r in model.learner.net.grounding.relations["task_h"].keys.to_pylist()}
    latest_train = max(times[keys[r]] for r in model.learner.labelled[model.rows["train"]].tolist())
    earliest_test = min(times[keys[r]] for r in model.learner.labelled[model.rows["test"]].tolist())
    assert latest_train <= earliest_test


def test_save_load_gives_the_same_recommendations(trained, tmp_path):
    db, model = trained
    path = model.save(tmp_path / "rank.relsql")
    loaded = relsql.Model.load(path, db)
    assert loaded.task.kind == "ranking"
    assert loaded.recommend(k=5).equals(model.recommend(k=5))
    assert loaded.evaluate()["map@10"] == pytest.approx(model.evaluate()["map@10"], abs=1e-12)


def test_write_recommendations_is_a_new_table_and_replaces_only_its_own(trained):
    db, model = trained
    rows = model.write_recommendations("recs", k=3)
    back = pl.from_arrow(db.arrow("SELECT * FROM recs ORDER BY task_id, rank"))
    assert rows == back.height == 15
    assert back.columns == ["task_id", "item_id", "rank", "score"]
    with pytest.raises(RelsqlError, match="replace=True"):
        model.write_recommendations("recs", k=3)
    assert model.write_recommendations("recs", k=2, replace=True) == 10
    with pytest.raises(RelsqlError):
        model.write_recommendations("item", replace=True)  # the user's table
    assert db.arrow("SELECT count(*) AS n FROM item").column("n")[0].as_py() == 40


def test_bad_arguments_name_the_fix(trained):
    db, model = trained
    with pytest.raises(RelsqlError, match="k"):
        model.recommend(k=0)
    with pytest.raises(RelsqlError, match="recommend"):
        model.predict()
    with pytest.raises(RelsqlError, match="drop class_weight"):
        model.fit(epochs=1, class_weight="balanced")
    with pytest.raises(RelsqlError, match="loss"):
        model.fit(epochs=1, loss="mse")
    with pytest.raises(RelsqlError, match="drop workers"):  # was a rank's TypeError
        model.fit(epochs=1, workers=2)


def test_negatives_and_losses_train(tmp_path):
    db = shop(tmp_path / "s.duckdb", customers=30, items=20)
    tpl = relsql.Template.from_sql(TEMPLATE)
    for loss, negatives in (("bce", "uniform"), ("bpr", "popularity"), ("softmax", "in-batch")):
        model = relsql.Model(db, tpl, target="task_rec.item_id", time_column="snapshot")
        model.fit(epochs=5, loss=loss, negatives=negatives, time_budget=None)
        assert np.isfinite(model.history[-1]["train_loss"])
        assert model.task.loss == loss and model.task.negatives == negatives


def test_fit_draws_are_seeded(tmp_path):
    db = shop(tmp_path / "s.duckdb", customers=30, items=20)
    tpl = relsql.Template.from_sql(TEMPLATE)
    runs = []
    for _ in range(2):
        model = relsql.Model(db, tpl, target="task_rec.item_id", time_column="snapshot", seed=3)
        model.fit(epochs=4, time_budget=None)
        runs.append([h["train_loss"] for h in model.history])
    assert runs[0] == runs[1]
    assert model.history[0]["lr"] == pytest.approx(0.03)  # a ranking target's default rate


def test_a_scalar_foreign_key_target_ranks(tmp_path):
    db = shop(tmp_path / "s.duckdb", customers=30, items=20)
    tpl = relsql.Template.from_sql("""
    CREATE TABLE item_h AS SELECT i.item_id, embed(i.item_id, 8) AS h FROM item i;
    CREATE TABLE buy_h AS SELECT p.purchase_id, embed(p.customer_id, 8) AS h FROM purchase p;
    """)
    model = relsql.Model(db, tpl, target="purchase.item_id", split=(0.8, 0.2, 0.0))
    assert model.task.kind == "ranking"
    model.fit(epochs=3, time_budget=None)
    assert 0 <= model.evaluate("val")["map@10"] <= 1


def test_bad_input_is_a_relsql_error(tmp_path):
    db = shop(tmp_path / "s.duckdb", customers=20, items=10)
    db.execute("CREATE TABLE bad_nulls AS SELECT task_id, customer_id, snapshot, list_append(item_id, NULL) AS item_id "
               "FROM task_rec")
    bad = relsql.Template.from_sql(TEMPLATE.replace("task_rec", "bad_nulls"))
    with pytest.raises(RelsqlError, match="NULLs inside"):
        relsql.Model(db, bad, target="bad_nulls.item_id")
    db.execute("CREATE TABLE bad_keys AS SELECT task_id, customer_id, snapshot, list_append(item_id, 999) AS item_id "
               "FROM task_rec")
    with pytest.raises(RelsqlError, match="999"):
        relsql.Model(db, relsql.Template.from_sql(TEMPLATE.replace("task_rec", "bad_keys")), target="bad_keys.item_id")
    no_tower = relsql.Template.from_sql("CREATE TABLE task_h AS SELECT t.task_id, embed(t.customer_id, 8) AS h FROM task_rec t;")
    with pytest.raises(RelsqlError, match="candidate tower"):
        relsql.Model(db, no_tower, target="task_rec.item_id")
    narrow = relsql.Template.from_sql("CREATE TABLE item_h AS SELECT i.item_id, embed(i.item_id, 8) AS h FROM item i;\n"
                                      "CREATE TABLE task_h AS SELECT t.task_id, embed(t.customer_id, 16) AS h FROM task_rec t;")
    with pytest.raises(RelsqlError, match="width"):
        relsql.Model(db, narrow, target="task_rec.item_id")
    with pytest.raises(RelsqlError, match="references no table"):
        relsql.Model(db, relsql.Template.from_sql(
            "CREATE TABLE c_h AS SELECT c.customer_id, linear(features(c.age), 1) AS h FROM customer c;"),
            target="customer.age", task="ranking")
    db.execute("CREATE TABLE lonely(thing_id BIGINT PRIMARY KEY)")
    db.execute("CREATE TABLE wants(w_id BIGINT PRIMARY KEY, thing_id BIGINT[])")
    db.execute("INSERT INTO wants VALUES (1, [1])")
    empty = relsql.Template.from_sql("""
    CREATE TABLE thing_h AS SELECT x.thing_id, embed(x.thing_id, 4) AS h FROM lonely x;
    CREATE TABLE wants_h AS SELECT w.w_id, embed(w.w_id, 4) AS h FROM wants w;
    """)
    with pytest.raises(RelsqlError, match="no rows"):
        relsql.Model(db, empty, target="wants.thing_id")



def test_avg_over_a_bare_embedding_relation_equals_a_naive_mean():
    """A candidate tower that is only an embedding, averaged over a customer's purchases (the
    sparse-aggregate pass once tried to multiply by the weight as if it had one row)."""
    db = relsql.connect()
    db.execute("CREATE TABLE item(item_id BIGINT PRIMARY KEY)")
    db.execute("CREATE TABLE purchase(pid BIGINT PRIMARY KEY, customer_id BIGINT, item_id BIGINT)")
    db.execute("CREATE TABLE task(task_id BIGINT PRIMARY KEY, customer_id BIGINT)")
    db.execute("INSERT INTO item SELECT range FROM range(40)")
    db.execute("INSERT INTO purchase SELECT range, range % 7, range % 40 FROM range(200)")
    db.execute("INSERT INTO task SELECT range, range % 7 FROM range(10)")
    net = relsql.compile(relsql.Template.from_sql("""
    CREATE TABLE item_h AS SELECT i.item_id, embed(i.item_id, 16, 'item') AS h FROM item i;
    CREATE TABLE task_h AS SELECT t.task_id, avg(x.h) AS h FROM task t JOIN purchase p ON p.customer_id = t.customer_id
    JOIN item_h x ON x.item_id = p.item_id GROUP BY t.task_id;
    """), db, dtype=torch.float64)
    item = {r["item_id"]: np.array(r["value"]) for r in net.values("item_h").to_dicts()}
    task = {r["task_id"]: np.array(r["value"]) for r in net.values("task_h").to_dicts()}
    for t in range(10):
        expected = np.mean([item[p % 40] for p in range(200) if p % 7 == t % 7], axis=0)
        np.testing.assert_allclose(task[t], expected, atol=1e-12)


def test_automatic_templates_leave_list_task_tables_out(tmp_path):
    """A LIST_DISTINCT task table holds the items of windows after its snapshots: another target's
    automatic template must not read it as data."""
    db = shop(tmp_path / "s.duckdb", customers=20, items=10)
    relsql.PredictiveQuery.parse("LIST_DISTINCT(purchase.item_id) OVER 30 DAYS FOR customer AT EVERY 30 DAYS").write(db, "future")
    text = relsql.Template.auto(db, target="customer.age").source
    assert '"future"' not in text and " future " not in text
