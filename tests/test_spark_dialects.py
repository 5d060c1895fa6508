"""The default template on Spark computes what it computes on DuckDB: one small shop (a number with
NULLs and ties, a DATE with NULLs, TIMESTAMPs with fractions of a second, a list column, long text,
a snapshot time) loaded into DuckDB and into a Spark session (UTC) gives the same `Template.auto`
text, the same encodings, and a model trained with the same seed in float64 gives the same
predictions (to 1e-9: the statistics' float64 sums are each engine's own, in its own order), for
predict(where=) and into a Spark table too. DuckDB is the reference: relsql's SQL is DuckDB's, and
Spark writes DuckDB's functions with DuckDB's meaning (relsql/data/spark_sql.py)."""

from __future__ import annotations

import shutil
import warnings

import duckdb
import numpy as np
import pytest
import sqlglot
import torch

import relsql
from relsql.data.references import Reference, referenced
from relsql.ground.execute import ground
from relsql.predictive import PredictiveQuery
from tests.test_spark import copy_to_spark

pytest.importorskip("pyspark", reason="pyspark is not installed: bash scripts/setup installs relsql[spark]")
if shutil.which("java") is None:
    pytest.skip("Spark needs Java 17 (apt-get install -y openjdk-17-jre-headless)", allow_module_level=True)

pytestmark = pytest.mark.spark

# Spark's catalog declares no keys: both engines get the same keys text (so the templates' headers,
# which name where each key came from, are the same too)
KEYS = """PRIMARY KEY customer(customer_id)
PRIMARY KEY item(item_id)
PRIMARY KEY orders(order_id)
FOREIGN KEY orders(customer_id) REFERENCES customer(customer_id)
FOREIGN KEY orders(item_id) REFERENCES item(item_id)
"""
TARGET, TIME = "customer.label", "snapshot"


@pytest.fixture(scope="module")
def shop(spark):
    """(DuckDB, Spark) handles on the same tables: customer(age DOUBLE with NULLs, joined DATE with
    NULLs, seen TIMESTAMP, tags VARCHAR[] with NULLs, snapshot DATE, label: an order within 20 days
    before the snapshot) <- orders(amount, ordered TIMESTAMP with microseconds, note: 1,500 texts)
    -> item(price, kind: 3 codes)."""
    con = duckdb.connect()
    con.execute("CREATE TABLE customer(customer_id INTEGER, age DOUBLE, joined DATE, seen TIMESTAMP, tags VARCHAR[], "
                "snapshot DATE, label BOOLEAN)")
    con.execute("CREATE TABLE item(item_id INTEGER, price DOUBLE, kind VARCHAR)")
    con.execute("CREATE TABLE orders(order_id INTEGER, customer_id INTEGER, item_id INTEGER, amount DOUBLE, "
                "ordered TIMESTAMP, note VARCHAR)")
    con.execute("INSERT INTO item SELECT i, round(1 + (i * 37 % 89) / 3.0, 2), ['a', 'b', 'c'][1 + i % 3] FROM range(40) r(i)")
    ordered = ("TIMESTAMP '2024-09-01 00:00:00' + i * INTERVAL 4 HOUR + i * INTERVAL 13 MINUTE "
               "+ i * INTERVAL 1234567 MICROSECOND")
    con.execute(f"""INSERT INTO customer
        WITH o AS (SELECT i % 300 AS cid, {ordered} AS ordered FROM range(1500) r(i)),
             c AS (SELECT i, DATE '2025-01-01' + CAST(i % 200 AS INTEGER) AS snapshot FROM range(300) r(i))
        SELECT i, CASE WHEN i % 11 = 0 THEN NULL ELSE 18 + (i * 37 % 61) + (i % 7) / 8 END,
               CASE WHEN i % 9 = 0 THEN NULL ELSE DATE '2015-01-01' + CAST(i * 13 AS INTEGER) END,
               TIMESTAMP '2019-03-02 05:00:00' + i * INTERVAL 17 HOUR + i * INTERVAL 7 MINUTE,
               CASE WHEN i % 8 = 0 THEN NULL ELSE ['t' || (i % 5), 't' || (i % 3)] END, snapshot,
               coalesce((SELECT max(o.ordered) >= c.snapshot - INTERVAL 20 DAY FROM o
                         WHERE o.cid = c.i AND o.ordered < c.snapshot), false)
        FROM c""")
    con.execute(f"""INSERT INTO orders SELECT i, i % 300, (i * 7) % 40, round((i * 53 % 997) / 7.0, 2), {ordered},
        'w' || (i * 7919 % 3001) || ' v' || (i % 17) || ' z' || (i * 13 % 101) FROM range(1500) r(i)""")
    duck = relsql.connect(con, keys=KEYS)
    # the session is shared: earlier modules' temp views (TPC-H's lineitem, ...) and tables they wrote into
    # the current database (test_spark's mutagenic_predictions) would be tables here and change the template
    for view in spark.catalog.listTables():
        if view.isTemporary:
            spark.catalog.dropTempView(view.name)
    previous = spark.catalog.currentDatabase()
    spark.sql("CREATE DATABASE IF NOT EXISTS relsql_dialects")
    spark.catalog.setCurrentDatabase("relsql_dialects")
    spark.conf.set("spark.sql.timestampType", "TIMESTAMP_NTZ")  # DuckDB's TIMESTAMP is Spark's TIMESTAMP_NTZ
    try:
        copy_to_spark(duck, spark)
    finally:
        spark.conf.unset("spark.sql.timestampType")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        on_spark = relsql.connect(spark, keys=KEYS)
    yield duck, on_spark
    on_spark.close()
    duck.close()
    con.close()
    spark.catalog.setCurrentDatabase(previous)


def duckdb_sql(text: str):
    return sqlglot.parse_one(text, read="duckdb")


@pytest.fixture(scope="module")
def template(shop):
    return relsql.Template.auto(shop[0], TARGET, time_column=TIME)


def test_duckdb_functions_keep_their_meaning_on_spark(shop):
    """epoch (as sqlglot parses it from DuckDB's text, and as relsql's encoders build it) with its
    microseconds, of a DATE and a TIMESTAMP, NULLs kept; dayofweek from Sunday 0 and isodow over
    each day of a week; base-10 log; DuckDB computes the expected values."""
    duck, on_spark = shop
    query = duckdb_sql("""SELECT o.order_id, epoch(o.ordered) AS e, epoch(c.snapshot) AS d, epoch(c.joined) AS j,
        dayofweek(c.snapshot) AS w, isodow(c.snapshot) AS i, log(o.amount + 1) AS l, list_value(1.5, o.amount) AS v,
        list_sort(list_value(o.amount, NULL, 1.5)) AS s, list_distinct(list_value(o.amount, NULL, 1.5, o.amount)) AS u
        FROM orders o JOIN customer c ON c.customer_id = o.customer_id WHERE o.order_id % 7 < 3 ORDER BY o.order_id""")
    expected, found = duck.arrow(query), on_spark.arrow(query)
    assert expected.num_rows == found.num_rows > 600
    for name in ("order_id", "e", "d", "j", "w", "i", "v", "s"):
        assert expected.column(name).to_pylist() == found.column(name).to_pylist(), name
    assert [sorted(u) for u in expected.column("u").to_pylist()] == [sorted(u) for u in found.column("u").to_pylist()]
    assert all(None not in u for u in found.column("u").to_pylist())  # DuckDB's list_distinct drops NULLs
    assert np.allclose(expected.column("l").to_numpy(), found.column("l").to_numpy(), rtol=1e-15, atol=0)
    assert sorted(set(expected.column("w").to_pylist())) == list(range(7))
    assert expected.column("j").null_count > 0
    fractions = np.asarray(expected.column("e").to_numpy()) % 1
    assert (fractions > 0).mean() > 0.9  # the microseconds count (unix_timestamp would drop them)


def test_the_automatic_template_is_the_same_text_on_spark_with_every_encoder(shop, template):
    source = template.source
    for encoder in ('ple(t."age", 32)', 'calendar(t."joined", t."seen", t."snapshot")', 'embed(t."tags", 16',
                    'text(t."note", 16', '(epoch(r."snapshot") - epoch(x."ordered")) / 86400.0', 'embed(t."kind", 16',
                    'CROSS JOIN LATERAL (SELECT sign('):  # the orders' ages on a fixed scale (issue 44)
        assert encoder in source, encoder
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the session is in UTC: no time zone warning
        assert relsql.Template.auto(shop[1], TARGET, time_column=TIME).source == source


def assert_same_encodings(expected, found) -> None:
    """Equal heads and row ids; ple and text columns and codes bit for bit (ple's edges come from the
    numbers either engine sends, text is hashed here from the values); raw numbers computed in SQL
    (the ages) to 1e-13 relative; statistics (AVG, STDDEV_POP: each engine's own sums) to 1e-9
    relative, the columns they standardize to 1e-9."""
    assert expected.feature_stats.keys() == found.feature_stats.keys()
    exact = set()
    for key, stats in expected.feature_stats.items():
        other = found.feature_stats[key]
        if stats.get("kind") == "ple":
            assert stats == other, key
            exact.add(key)
        else:
            assert stats.get("kind") == other.get("kind") and stats["nulls"] == other["nulls"], key
            assert [stats["mean"], stats["std"]] == pytest.approx([other["mean"], other["std"]], rel=1e-9, abs=0), key
    assert expected.relations.keys() == found.relations.keys()
    for name, relation in expected.relations.items():
        for i, (a, b) in enumerate(zip(relation.rules, found.relations[name].rules, strict=True)):
            assert torch.equal(a.head, b.head), name
            assert all(torch.equal(x, y) for x, y in zip(a.refs, b.refs, strict=True)), name
            assert a.columns.keys() == b.columns.keys()
            for k in a.columns:
                x, y = a.columns[k], b.columns[k]
                if f"{name}#{i}:{k}" in exact or not x.dtype.is_floating_point:
                    assert torch.equal(x, y), (name, k)  # ple, codes, hashed text
                elif f"{name}#{i}:{k}" not in expected.feature_stats:  # raw numbers: the ages' ln(1 + days), each
                    # engine's own ln; a dropped fraction of a second (unix_timestamp) would move them by ~1e-8
                    assert torch.allclose(x.double(), y.double(), rtol=1e-13, atol=0), (name, k)
                else:
                    assert torch.allclose(x.double(), y.double(), rtol=0, atol=1e-9), (name, k)


def test_the_automatic_template_encodes_the_same_on_spark(shop, template):
    duck, on_spark = shop
    expected, found = ground(template, duck, progress=False), ground(template, on_spark, progress=False)
    assert_same_encodings(expected, found)
    kinds = {s.get("kind") for s in expected.feature_stats.values()}
    assert {"ple", "calendar"} <= kinds  # the ages are raw columns of a lateral row, compared to 1e-9 above


def listed(value):
    """Plain data with its tensors and arrays as lists (comparable with ==)."""
    if isinstance(value, dict):
        return {k: listed(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [listed(v) for v in value]
    return value.tolist() if isinstance(value, torch.Tensor | np.ndarray) else value


def test_the_blends_two_hop_features_are_the_same_on_spark(shop):
    """flat.plan(depth=2) for orders.amount timed by `ordered`: both parents' other orders strictly
    earlier (a hub of 5 orders per customer, 37-38 per item), each parent's columns, planned and
    computed by Spark as by DuckDB (1e-12)."""
    import pyarrow as pa
    import sqlglot.expressions as exp

    from relsql.train.gbm import flat

    specs = [flat.plan(db, "orders", "amount", "ordered", depth=2) for db in shop]
    assert specs[0].to_plain() == specs[1].to_plain()
    assert {"avg(customer.orders.amount)", "max(item.orders.amount)", "count(item.orders(item_id))"} <= set(specs[0].names)
    matrices = []
    for db, spec in zip(shop, specs):
        db.register("__relsql_rows", pa.table({"order_id": list(range(0, 1500, 7)), "_rid": list(range(215))}))
        try:
            matrices.append(spec.matrix(db, exp.Table(this=exp.to_identifier("__relsql_rows", quoted=True)))[1])
        finally:
            db.unregister("__relsql_rows")
    assert matrices[0].shape == (215, len(specs[0].names))
    assert np.array_equal(np.isnan(matrices[0]), np.isnan(matrices[1]))
    assert np.allclose(matrices[0], matrices[1], rtol=1e-12, atol=0, equal_nan=True)


def test_a_model_trained_on_spark_predicts_what_duckdb_predicts(shop, template):
    """fit() with its defaults' hybrid (the GBM's one-hop features computed by Spark), seed 0,
    float64: the same predictions for every row, for predict(where=) with a DuckDB function in the
    condition, and in the table write_predictions writes into Spark's catalog."""
    duck, on_spark = shop
    models = []
    for db in (duck, on_spark):
        model = relsql.Model(db, template, TARGET, time_column=TIME, seed=0, dtype=torch.float64, progress=False)
        model.fit(epochs=3, hybrid=True, refit=False)
        models.append(model)
    expected, found = (m.predict() for m in models)
    blends = [m.hybrid for m in models]
    assert blends[0] is not None and blends[1] is not None
    assert blends[0].features.to_plain() == blends[1].features.to_plain()  # the same one-hop features, planned on Spark
    features = [m.hybrid.features.of_output(m.db, m.learner.output, int(m.output_rows)) for m in models]
    assert features[0].shape == features[1].shape and features[0].shape[1] >= 8  # own columns, orders counted, amounts, times
    assert np.array_equal(np.isnan(features[0]), np.isnan(features[1]))
    assert np.allclose(features[0], features[1], rtol=1e-12, atol=0, equal_nan=True)
    assert blends[0].weight == blends[1].weight and listed(blends[0].trees.to_plain()) == listed(blends[1].trees.to_plain())
    assert expected.columns == found.columns and expected.height == found.height == 300
    assert expected["customer_id"].to_list() == found["customer_id"].to_list()
    assert expected["split"].to_list() == found["split"].to_list()
    assert np.allclose(expected["probability"].to_numpy(), found["probability"].to_numpy(), rtol=0, atol=1e-9)
    where = "dayofweek(snapshot) = 0 AND age > 30"  # Sundays, as DuckDB numbers them
    chosen = [m.predict(where=where) for m in models]
    sundays = duck.arrow(duckdb_sql(f"SELECT customer_id FROM customer WHERE {where} ORDER BY 1")).column(0).to_pylist()
    assert 5 < len(sundays) < 60
    assert chosen[0]["customer_id"].to_list() == chosen[1]["customer_id"].to_list() == sundays
    assert np.allclose(chosen[0]["probability"].to_numpy(), chosen[1]["probability"].to_numpy(), rtol=0, atol=1e-9)
    try:
        assert models[1].write_predictions("dialects_predictions") == 300
        written = on_spark.arrow(duckdb_sql("SELECT * FROM dialects_predictions ORDER BY customer_id"))
    finally:  # the next test compares the two databases' tables
        on_spark.execute(duckdb_sql("DROP TABLE IF EXISTS dialects_predictions"))
    assert written.column_names == [c for c in expected.columns if c != "split"]
    assert written.column("customer_id").to_pylist() == expected["customer_id"].to_list()
    assert np.allclose(written.column("probability").to_numpy(), expected["probability"].to_numpy(), rtol=0, atol=1e-9)


def test_a_predictive_query_writes_the_same_task_table_on_spark(shop):
    """The task table (snapshots every 30 days, a label from the next 30 days' orders) has the same
    rows on Spark, and the automatic template over it the same text but for where task_id's key
    comes from (DuckDB declares it; Spark declares none, so it is inferred)."""
    duck, on_spark = shop
    question = PredictiveQuery(entity="customer", events="orders", window_days=30, op=">", threshold=0, every_days=30)
    try:
        check_task_tables(question, duck, on_spark)
    finally:  # from both: a task table left in one would be a table (left out, and named) of the next template
        for db in shop:
            db.execute(duckdb_sql("DROP TABLE IF EXISTS dialects_task"))


def test_a_list_distinct_query_writes_the_same_item_lists_on_spark(shop):
    """A recommendation task table (the distinct items each customer orders in the next 30 days,
    sorted; a NULL list past the data): the same rows and lists on Spark, where DuckDB's
    list_sort/list_distinct are written as array_sort/array_compact(array_distinct)."""
    duck, on_spark = shop
    question = PredictiveQuery(entity="customer", events="orders", aggregate="list_distinct", value="item_id",
                               window_days=30, every_days=30)
    try:
        written = [question.write(db, "dialects_items") for db in (duck, on_spark)]
        assert written[0] == written[1] and written[0].rows > 500
        tables = [db.arrow(duckdb_sql("SELECT * FROM dialects_items ORDER BY task_id")) for db in (duck, on_spark)]
        assert tables[0].column_names == tables[1].column_names
        lists = [t.column(tables[0].column_names[-1]).to_pylist() for t in tables]
        assert lists[0] == lists[1]
        assert sum(bool(v) for v in lists[0]) > 100  # (a customer orders every 50 days: one item per window)
        assert all(v is None or v == sorted(set(v)) for v in lists[0])
    finally:
        for db in shop:
            db.execute(duckdb_sql("DROP TABLE IF EXISTS dialects_items"))


def check_task_tables(question: PredictiveQuery, duck, on_spark) -> None:
    written = [question.write(db, "dialects_task") for db in (duck, on_spark)]
    assert written[0] == written[1] and written[0].rows > 1000 and 0 < written[0].positives < written[0].labelled
    tables = [db.arrow(duckdb_sql("SELECT * FROM dialects_task ORDER BY task_id")) for db in (duck, on_spark)]
    assert tables[0].column_names == tables[1].column_names == ["task_id", "customer_id", "snapshot", "label"]
    for name in ("task_id", "customer_id", "label"):
        assert tables[0].column(name).to_pylist() == tables[1].column(name).to_pylist(), name
    # DuckDB's TIMESTAMP; Spark's CAST(... AS TIMESTAMP) is its TIMESTAMP (with the session's zone, UTC)
    assert tables[0].column("snapshot").to_pylist() == [
        t.replace(tzinfo=None) for t in tables[1].column("snapshot").to_pylist()]
    sources = [relsql.Template.auto(db, "dialects_task.label", time_column="snapshot").source for db in (duck, on_spark)]
    inferred = "-- inferred primary key dialects_task(task_id)"
    assert inferred not in sources[0] and inferred in sources[1]
    assert sources[1].replace(inferred + "\n", "") == sources[0]
    assert "CROSS JOIN LATERAL" in sources[0] and "epoch(" in sources[0]  # the orders' ages at the task's snapshot


# a ranking target's two towers, small (the automatic template's grounding is ~70 statements, a minute on Spark):
# ID embeddings and ple edges from each engine's own dictionaries and quantiles, the query tower through a join
TWO_TOWERS = """CREATE TABLE candidate_item AS
SELECT i."item_id", embed(i."item_id", 8, 'id_item') * 0.35 + linear(ple(i."price", 4), 8, 'w_item') AS h
FROM "item" i;

CREATE TABLE predict AS
SELECT o."order_id", embed(o."customer_id", 8, 'id_customer') * 0.35
  + linear(ple(c."age", 4), 8, 'w_age') + linear(features(o."amount"), 8, 'w_amount') AS h
FROM "orders" o JOIN "customer" c ON c."customer_id" = o."customer_id";
"""


def test_a_foreign_key_target_ranks_on_spark_as_on_duckdb(shop):
    """orders.item_id, a foreign key given to connect(keys=...) (Spark's catalog declares none):
    on Spark as on DuckDB it references item(item_id), so Template.auto writes the same two towers
    and a model trained with the same seed in float64 is the same ranking: the same validation
    metrics and, from recommend(k=), the same top k with the same scores (to 1e-9)."""
    duck, on_spark = shop
    assert referenced(on_spark, "orders", "item_id") == referenced(duck, "orders", "item_id") == \
        Reference("item", "item_id", many=False)
    sources = [relsql.Template.auto(db, "orders.item_id", time_column="ordered", hops=1).source for db in shop]
    assert "-- ranking: orders.item_id references item(item_id)" in sources[0]
    assert "CREATE TABLE candidate_item AS" in sources[0]
    assert sources[1] == sources[0]
    template = relsql.Template.from_sql(TWO_TOWERS)
    models = []
    for db in shop:
        model = relsql.Model(db, template, "orders.item_id", time_column="ordered", seed=0, dtype=torch.float64,
                             progress=False)
        model.fit(epochs=3, refit=False)
        models.append(model)
    scores = [m.evaluate() for m in models]
    assert scores[0].keys() == scores[1].keys() and "map@10" in scores[0]
    assert [scores[0][k] for k in scores[0]] == pytest.approx([scores[1][k] for k in scores[0]], rel=0, abs=1e-9)
    where = "order_id % 25 = 0"
    expected, found = (m.recommend(k=5, where=where) for m in models)
    assert expected.columns == found.columns == ["order_id", "item_id", "rank", "score"]
    assert expected.height == found.height == 60 * 5
    for name in ("order_id", "item_id", "rank"):
        assert expected[name].to_list() == found[name].to_list(), name
    assert np.allclose(expected["score"].to_numpy(), found["score"].to_numpy(), rtol=0, atol=1e-9)
    assert expected["item_id"].n_unique() > 5  # the rows' own rankings, not one list for all
