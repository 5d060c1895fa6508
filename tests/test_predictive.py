"""Predictive queries (relsql/predictive/): task tables written from a one-line question.

Labels are checked against a naive Python computation of the same question over the same rows;
the end-to-end test trains an automatic template on a task table and beats the majority class;
the leakage test changes events after a snapshot and checks that the predictions (the inputs'
function, with fixed weights) for that snapshot do not move.
"""

from __future__ import annotations

import argparse
import datetime as dt
import random

import pyarrow as pa
import pytest
import torch

import relsql
from relsql.cli import task as task_cli
from relsql.predictive import PredictiveQuery, QueryError, TimePath, parse
from tests.tables import insert_rows

BASE = dt.date(2021, 1, 1)
DAY = dt.timedelta(days=1)


def shop(n: int = 200, seed: int = 0, path=None):
    """customer (declared key), orders (declared key and foreign key): half the customers are busy
    (an order on about 8% of days, amounts around 70), half are not (0.4%, around 30); nothing in
    the customer table tells which, only the past orders do."""
    rng = random.Random(seed)
    customers, orders = [], []
    for c in range(n):
        busy = rng.random() < 0.5
        customers.append((c, BASE + rng.randrange(0, 300) * DAY, rng.choice("abc")))
        for day in range(365):
            if rng.random() < (0.08 if busy else 0.004) or day == rng.randrange(0, 365):
                orders.append((len(orders), c, BASE + day * DAY, round(rng.gauss(70 if busy else 30, 15), 2)))
    db = relsql.connect(path)
    db.execute("CREATE TABLE customer(customer_id INTEGER PRIMARY KEY, joined DATE, segment VARCHAR)")
    db.execute("CREATE TABLE orders(order_id INTEGER PRIMARY KEY, customer_id INTEGER REFERENCES customer(customer_id), "
               "ordered_at DATE, amount DOUBLE)")
    insert_rows(db, "customer", customers)
    insert_rows(db, "orders", orders)
    return db, customers, orders


@pytest.fixture(scope="module")
def small():
    db, customers, orders = shop(n=40, seed=1)
    yield db, customers, orders
    db.close()


def naive(customers, orders, snapshots, window, *, measure="count", op=None, threshold=0, population="active"):
    """{(customer, snapshot): label} by brute force: events in [snapshot, snapshot + window);
    NULL when the window ends after the day after the last event."""
    last = max(o[2] for o in orders)
    out = {}
    for s in snapshots:
        for c, joined, _ in customers:
            mine = [o for o in orders if o[1] == c]
            if population == "active" and not any(o[2] < s for o in mine):
                continue
            if population == "since" and not joined < s:
                continue
            inside = [o for o in mine if s <= o[2] < s + window * DAY]
            value = len(inside) if measure == "count" else sum(o[3] for o in inside)
            label = value if op is None else {">": value > threshold, ">=": value >= threshold, "=": value == threshold,
                                              "<": value < threshold}[op]
            out[(c, s)] = None if s + window * DAY > last + DAY else label
    return out


def written(db, name):
    rows = db.con.execute(f'SELECT customer_id, snapshot, label, task_id FROM "{name}" ORDER BY task_id').fetchall()
    assert [r[3] for r in rows] == list(range(1, len(rows) + 1))  # task_id numbers the rows by (snapshot, key)
    assert [(r[1], r[0]) for r in rows] == sorted((r[1], r[0]) for r in rows)
    return {(c, s): label for c, s, label, _ in rows}


# -- labels against a naive computation -----------------------------------------------------------------------
def test_count_any_matches_naive_and_every_steps_back_from_the_last_full_window(small):
    db, customers, orders = small
    result = parse("COUNT(orders.*) OVER 30 DAYS > 0 FOR customer AT EVERY 45 DAYS").write(db, "t_any")
    last = max(o[2] for o in orders)
    snaps = list(result.snapshots)
    assert snaps[-1] == last + DAY - 30 * DAY  # the latest snapshot whose window the data covers
    assert all(b - a == 45 * DAY for a, b in zip(snaps, snaps[1:]))
    assert snaps[0] - 45 * DAY <= min(o[2] for o in orders)  # as far back as there is a day of history
    expected = naive(customers, orders, snaps, 30, op=">", threshold=0)
    assert written(db, "t_any") == expected
    assert result.rows == len(expected) and result.labelled == len(expected)
    assert result.positives == sum(expected.values()) and 0 < result.positives < result.rows
    keys = db.con.execute("SELECT constraint_type, constraint_column_names FROM duckdb_constraints() "
                          "WHERE table_name = 't_any' AND constraint_type = 'PRIMARY KEY'").fetchall()
    assert keys == [("PRIMARY KEY", ["task_id"])]
    types = dict(db.columns("t_any"))
    assert types == {"task_id": "BIGINT", "customer_id": "INTEGER", "snapshot": "DATE", "label": "BOOLEAN"}


@pytest.mark.parametrize(("text", "measure", "op", "threshold", "population"), [
    ("SUM(orders.amount) OVER 60 DAYS >= 100.5 FOR EACH customer ALL", "sum", ">=", 100.5, "all"),
    ("COUNT(orders.*) OVER 14 DAYS FOR customer SINCE customer.joined", "count", None, 0, "since"),
    ("SUM(orders.amount) OVER 20 DAYS FOR customer.customer_id = orders.customer_id ACTIVE TIME orders.ordered_at",
     "sum", None, 0, "active"),
    ("count(orders.*) over 7 day = 0 for customer", "count", "=", 0, "active"),
])
def test_labels_match_naive(small, text, measure, op, threshold, population):
    db, customers, orders = small
    snaps = [dt.date(2021, 3, 1), dt.date(2021, 6, 15), dt.date(2021, 12, 20), dt.date(2022, 2, 1)]
    query = parse(f"{text} AT {', '.join(map(str, snaps))}")
    result = query.write(db, "t_case", replace=True)
    window = query.window_days
    expected = naive(customers, orders, snaps, window, measure=measure, op=op, threshold=threshold, population=population)
    got = written(db, "t_case")
    assert got.keys() == expected.keys()
    for k, v in expected.items():
        assert got[k] == pytest.approx(v) if v is not None else got[k] is None, k
    assert result.labelled == sum(v is not None for v in expected.values()) < result.rows  # 2022: past the data
    assert result.label_type == ("BOOLEAN" if op else "DOUBLE")


def test_time_through_a_dimension_and_timestamps(small):
    """TPC-DS style: the events hold a date key into a date dimension; and TIMESTAMP events."""
    db, customers, orders = small
    db.execute("CREATE TABLE date_dim AS SELECT CAST(strftime(d, '%Y%m%d') AS INTEGER) AS d_date_sk, CAST(d AS DATE) AS d_date "
               "FROM range(DATE '2020-12-01', DATE '2022-03-01', INTERVAL 1 DAY) r(d)")
    db.execute("CREATE TABLE sales AS SELECT order_id, customer_id AS cust, CAST(strftime(ordered_at, '%Y%m%d') AS INTEGER) "
               "AS sold_date_sk FROM orders")
    snaps = [dt.date(2021, 5, 1), dt.date(2021, 9, 1)]
    text = ("COUNT(sales.*) OVER 30 DAYS > 1 FOR customer.customer_id = sales.cust "
            "TIME date_dim.d_date VIA sales.sold_date_sk = date_dim.d_date_sk AT 2021-05-01, 2021-09-01")
    query = parse(text)
    assert query.event_time == TimePath("sold_date_sk", "date_dim", "d_date_sk", "d_date")
    result = query.write(db, "t_dim")
    assert written(db, "t_dim") == naive(customers, orders, snaps, 30, op=">", threshold=1)
    assert result.time_columns == {}  # nothing an auto-template can filter by itself
    db.execute("CREATE TABLE visits AS SELECT customer_id, CAST(ordered_at AS TIMESTAMP) + INTERVAL 13 HOUR AS at FROM orders")
    stamped = PredictiveQuery(entity="customer", events="visits", window_days=30, op=">", threshold=0,
                              snapshots=["2021-05-01", dt.datetime(2021, 9, 1, 13, 0)]).write(db, "t_ts")
    assert dict(db.columns("t_ts"))["snapshot"] == "TIMESTAMP"
    got = written(db, "t_ts")
    orders_13h = [(o[0], o[1], dt.datetime.combine(o[2], dt.time(13)), o[3]) for o in orders]
    for (c, s), label in got.items():  # the 13:00 snapshot counts the events at 13:00 that day: [s, s + 30 days)
        inside = [o for o in orders_13h if o[1] == c and s <= o[2] < s + 30 * DAY]
        assert label == (len(inside) > 0)
    assert stamped.snapshots == (dt.datetime(2021, 5, 1), dt.datetime(2021, 9, 1, 13))


def test_a_folder_of_parquet_files_gets_a_parquet_task_table(small, tmp_path):
    db, customers, orders = small
    for table in ("customer", "orders"):
        db.execute(f"COPY {table} TO '{tmp_path / table}.parquet' (FORMAT parquet)")
    with relsql.connect(tmp_path) as folder:
        result = parse("COUNT(orders.*) OVER 30 DAYS > 0 FOR customer.customer_id AT 2021-06-01").write(folder, "task")
        assert (tmp_path / "task.parquet").exists()
        assert written(folder, "task") == naive(customers, orders, [dt.date(2021, 6, 1)], 30, op=">", threshold=0)
        assert result.rows > 0
        with pytest.raises(relsql.SchemaError, match="foreign_key"):
            parse("COUNT(orders.*) OVER 30 DAYS FOR customer.customer_id AT 2021-06-01").write(folder, "t2", foreign_key=True)


# -- writing: new tables only, constraints -------------------------------------------------------------------
def test_never_replaces_without_replace_and_never_a_table_it_reads(small):
    db, _, _ = small
    query = parse("COUNT(orders.*) OVER 30 DAYS > 0 FOR customer AT 2021-06-01")
    db.execute("CREATE TABLE IF NOT EXISTS other AS SELECT 1 AS x")
    with pytest.raises(relsql.SchemaError, match="already exists"):
        query.write(db, "OTHER")
    assert db.con.execute("SELECT * FROM other").fetchall() == [(1,)]
    with pytest.raises(relsql.SchemaError, match="reads that table"):
        query.write(db, "ORDERS", replace=True)
    query.write(db, "t_new")
    with pytest.raises(relsql.SchemaError, match="already exists.*replace=True"):
        query.write(db, "t_new")
    assert query.write(db, "t_new", replace=True).rows > 0
    with pytest.raises(relsql.SchemaError, match="cannot write a table named"):
        query.write(db, "__relsql_x")


def test_foreign_key_is_declared_on_request():
    db, _, _ = shop(n=10)
    parse("COUNT(orders.*) OVER 30 DAYS > 0 FOR customer AT 2021-06-01").write(db, "t_fk", foreign_key=True)
    catalog = db.catalog()
    assert catalog["t_fk"].primary_key == ("task_id",)
    assert [(fk.columns, fk.table, fk.references) for fk in catalog["t_fk"].foreign_keys] == \
        [(("customer_id",), "customer", ("customer_id",))]


# -- errors name the place and the fix ------------------------------------------------------------------------
@pytest.mark.parametrize(("text", "position", "fix"), [
    ("COUNT(orders.*) OVER 30 DAYZ > 0 FOR customer AT EVERY 30 DAYS", 25, "OVER 30 DAYS"),
    ("COUNT(orders.amount) OVER 30 DAYS FOR customer AT 2021-01-01", 14, "COUNT(orders.*)"),
    ("AVG(orders.*) OVER 30 DAYS FOR customer AT 2021-01-01", 1, "COUNT(<events>.*)"),
    ("COUNT(orders.*) OVER 0 DAYS FOR customer AT 2021-01-01", 22, "at least 1"),
    ("COUNT(orders.*) OVER 30 DAYS > x FOR customer AT 2021-01-01", 32, "> 0"),
    ("COUNT(orders.*) OVER 30 DAYS FOR customer AT 2021-02-30", 46, "2020-01-01"),
    ("COUNT(orders.*) OVER 30 DAYS FOR customer", 42, "AT EVERY 30 DAYS"),
    ("COUNT(orders.*) OVER 30 DAYS FOR customer AT 2021-01-01 junk", 57, "snapshots come last"),
    ("COUNT(orders.*) OVER 30 DAYS FOR customer; DROP TABLE x AT 2021-01-01", 42, "quoted"),
    ("COUNT(orders.*) OVER 30 DAYS FOR customer TIME other.t AT 2021-01-01", 48, "VIA"),
    ("COUNT(orders.*) OVER 30 DAYS FOR customer SINCE orders.t AT 2021-01-01", 49, "SINCE customer."),
])
def test_syntax_errors_name_the_position_and_the_fix(text, position, fix):
    with pytest.raises(QueryError, match=fix.replace("(", r"\(").replace(")", r"\)").replace("*", r"\*")) as caught:
        parse(text)
    assert caught.value.position == position - 1
    assert f"position {position}:" in str(caught.value)
    assert str(caught.value).splitlines()[-1].index("^") == position + 1  # the caret under it


def test_round_trip_and_odd_names():
    for text in ["COUNT(orders.*) OVER 30 DAYS > 0 FOR customer AT EVERY 30 DAYS FROM 2021-01-01 TO 2021-06-01",
                 'SUM("my orders"."the ""amount""") OVER 7 DAYS <= -2.5 FOR "Count".id = "my orders".cid ALL '
                 "AT 2021-01-01T12:30:00, '2021-02-01 00:00:00'"]:
        query = parse(text)
        assert parse(str(query)) == query
    odd = parse('SUM("my orders"."the ""amount""") OVER 7 DAYS FOR "Count" AT 2021-01-01')
    assert (odd.events, odd.value, odd.entity) == ("my orders", 'the "amount"', "Count")


def test_schema_errors_name_the_table_and_the_fix(small):
    db, _, _ = small
    cases = [
        ("COUNT(order.*) OVER 30 DAYS FOR customer AT 2021-01-01", "events table `order` does not exist"),
        ("SUM(orders.note) OVER 30 DAYS FOR customer AT 2021-01-01", "has no column `note`"),
        ("SUM(orders.ordered_at) OVER 30 DAYS FOR customer AT 2021-01-01", "not a number"),
        ("COUNT(orders.*) OVER 30 DAYS FOR customer.segment AT 2021-01-01", "not unique"),
        ("COUNT(orders.*) OVER 30 DAYS FOR customer TIME orders.amount AT 2021-01-01", "DATE or TIMESTAMP"),
        ("COUNT(orders.*) OVER 30 DAYS FOR customer SINCE customer.segment AT 2021-01-01", "creation DATE"),
        ("COUNT(orders.*) OVER 400 DAYS FOR customer AT EVERY 30 DAYS", "no snapshot fits"),
    ]
    for text, message in cases:
        with pytest.raises(relsql.SchemaError, match=message):
            parse(text).write(db, "t_err")
    db.execute("CREATE TABLE two_dates AS SELECT customer_id, ordered_at AS a, ordered_at AS b FROM orders")
    with pytest.raises(relsql.SchemaError, match=r"2 DATE/TIMESTAMP columns \(a, b\); name one"):
        parse("COUNT(two_dates.*) OVER 30 DAYS FOR customer AT 2021-06-01").write(db, "t_err")
    with pytest.raises(relsql.SchemaError, match="has a time of day"):
        PredictiveQuery(entity="customer", events="orders", window_days=3, snapshots=["2021-06-01T10:00"]).write(db, "t_err")
    assert not db.has_table("t_err")


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"window_days": 0}, "window_days must be"),
    ({"window_days": 3.0}, "window_days must be a whole number"),
    ({"op": "=>"}, "op must be one of"),
    ({"op": ">", "threshold": float("nan")}, "threshold must be a finite number"),
    ({"threshold": "0; DROP TABLE orders"}, "threshold must be a finite number"),
    ({"snapshots": None}, "exactly one of the two"),
    ({"every_days": 30}, "exactly one of the two"),
    ({"snapshots": ["yesterday"]}, r"snapshots\[0\] must be a date"),
    ({"aggregate": "sum"}, "value .* goes with aggregate='sum'"),
    ({"population": "since"}, "needs since="),
    ({"key": ("a", "b"), "event_key": "c"}, "as many columns"),
])
def test_bad_arguments_are_refused_where_they_enter(kwargs, message):
    base = {"entity": "customer", "events": "orders", "window_days": 30, "snapshots": ["2021-01-01"]}
    with pytest.raises(relsql.RelsqlError, match=message):
        PredictiveQuery(**{**base, **kwargs})


# -- end to end: an automatic template learns the task, and sees nothing of the future ------------------------
def test_auto_template_on_a_task_table_beats_the_majority():
    db, _, _ = shop(n=200)
    result = parse("COUNT(orders.*) OVER 30 DAYS > 0 FOR customer AT EVERY 45 DAYS").write(db, "task_churn")
    assert result.rows > 1000
    template = relsql.Template.auto(db, target="task_churn.label", time_column="snapshot", width=8)
    assert '"ordered_at" < p.r_time' in template.source  # the template joins only the orders before the snapshot
    model = relsql.Model(db, template, target="task_churn.label", time_column="snapshot", seed=0)
    model.fit(epochs=100, lr=0.03)
    scores = model.evaluate()
    y = model.y[model.rows["test"]].double()
    majority = max(float(y.mean()), 1 - float(y.mean()))
    assert scores["accuracy"] > majority + 0.15, (scores, majority)  # 0.83 vs 0.55 here
    assert scores["roc_auc"] > 0.75


def test_events_after_a_snapshot_do_not_reach_its_prediction():
    db, _, _ = shop(n=60, seed=2)
    cut = dt.date(2021, 7, 1)
    parse("COUNT(orders.*) OVER 30 DAYS > 0 FOR customer AT 2021-04-01, 2021-07-01, 2021-10-01").write(db, "task")
    template = relsql.Template.auto(db, target="task.label", time_column="snapshot", width=4)

    def predictions():
        net = relsql.compile(template, db, dtype=torch.float64, seed=0)
        frame = net.values("predict").sort("task_id")
        return {k: v[0] for k, v in zip(frame["task_id"].to_list(), frame[frame.columns[-1]].to_list())}

    snapshot = dict(db.con.execute("SELECT task_id, snapshot FROM task").fetchall())
    assert "linear(ag.age" in template.source  # the events' ages are read, and their weights are not held at zero
    before = predictions()
    # Give each order on or after the cut another customer, or none (drawn at random), then write the
    # table again in the same row order: every column but the key keeps its values in the same order,
    # so the encoders' whole-table statistics (means and spreads summed in scan order) stay bit for bit
    # the same, while the future (who ordered when: each later snapshot's events, their number and ages)
    # changes.
    rows = db.arrow("SELECT * FROM orders ORDER BY order_id")
    customers = rows["customer_id"].to_pylist()
    rng, everyone = random.Random(0), sorted(set(customers)) + [None]
    for i, day in enumerate(rows["ordered_at"].to_pylist()):
        if day >= cut:
            customers[i] = rng.choice(everyone)
    db.execute("DELETE FROM orders")
    db.con.register("rewritten", rows.set_column(1, "customer_id", pa.array(customers, rows["customer_id"].type)))
    db.execute("INSERT INTO orders SELECT * FROM rewritten ORDER BY order_id")
    after = predictions()
    relabelled = parse("COUNT(orders.*) OVER 30 DAYS > 0 FOR customer AT 2021-07-01").write(db, "task_after")
    old = db.con.execute("SELECT count(*) FROM task t JOIN task_after a USING (customer_id, snapshot) "
                         "WHERE t.label <> a.label").fetchone()[0]
    assert old > 0 and relabelled.rows > 0  # the labels at the cut depend on the changed future, by design
    assert before.keys() == after.keys()
    # The inputs do not: bit for bit (ages on a fixed scale; standardized over every grounding, later
    # snapshots' included, they moved earlier predictions by ~1e-4, issue 44).
    assert [before[k] for k in before if snapshot[k] <= cut] == [after[k] for k in before if snapshot[k] <= cut]
    assert max(abs(before[k] - after[k]) for k in before if snapshot[k] > cut) > 1e-3  # a later snapshot sees the change


# -- the command line --------------------------------------------------------------------------------------------
def _cli(argv):
    parser = argparse.ArgumentParser(prog="relsql")
    task_cli.add_parser(parser.add_subparsers(dest="command", required=True), "epilog")
    try:
        args = parser.parse_args(argv)
    except SystemExit as done:
        return done.code
    return args.run(args)


def test_cli_writes_the_task_and_says_what_to_run_next(tmp_path, capsys):
    path = tmp_path / "shop.duckdb"
    db, customers, orders = shop(n=30, path=path)
    db.close()
    query = "COUNT(orders.*) OVER 30 DAYS > 0 FOR customer AT EVERY 60 DAYS"
    assert _cli(["task", str(path), query, "--name", "task_churn"]) == 0
    out = capsys.readouterr().out
    assert "wrote task_churn:" in out and "positive" in out
    assert f"relsql template {path} --target task_churn.label --time-column snapshot" in out
    with pytest.raises(relsql.RelsqlError, match="already exists.*--replace"):
        _cli(["task", str(path), query, "--name", "task_churn"])
    assert _cli(["task", str(path), query, "--name", "task_churn", "--replace"]) == 0
    with pytest.raises(relsql.RelsqlError, match="not a task table"):
        _cli(["task", str(path), query, "--name", "orders", "--replace"])
    assert _cli(["task", str(path), "COUNT(orders.*) OVER 30 DAYZ FOR customer AT EVERY 60 DAYS"]) == 2
    assert "position 25: expected DAYS or DAY" in capsys.readouterr().err
    with relsql.connect(path, read_only=True) as db:
        assert db.con.execute("SELECT count(*) FROM orders").fetchone()[0] == len(orders)
