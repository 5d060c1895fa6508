"""Time reaches two hops, and siblings through a parent (issue 44, items 3 and 4): in a temporal
automatic template a row's parent's other child rows (the same player's earlier salaries) join
under the time cut, never the row itself nor its later siblings, and every event row within
`hops` carries its age at the target row's time; the target row's earlier siblings bring their
labels, strictly earlier ones only. Each grounded set, age and label is checked against a plain
Python loop over the same rows; RelBench's cut (`<=`) against relsql's own (`<`) on a tie."""

from __future__ import annotations

import datetime as dt
import math
import statistics
from types import SimpleNamespace

import pandas as pd
import polars as pl
import pytest
import torch

import relsql
from relsql import relbench as rb
from relsql.ground.execute import ground
from relsql.template.auto.cuts import SIBLING_PAIRS

D = dt.date
SALARIES = [  # sid, pid, year (a date), amount (the label), team
    (1, 1, D(2001, 1, 1), 1.0, "a"), (2, 1, D(2002, 1, 1), 2.0, "b"), (3, 1, D(2002, 1, 1), 3.0, "a"),  # a tie
    (4, 1, D(2004, 1, 1), 4.0, "b"), (5, 2, D(2001, 1, 1), 5.0, "a"), (6, 2, D(2003, 1, 1), 6.0, "a"),
    (7, 3, D(2002, 1, 1), 7.0, "b"), (8, 2, D(2005, 1, 1), None, "b")]
BATTING = [  # bid, pid, day, hits
    (1, 1, D(2000, 6, 1), 10.0), (2, 1, D(2002, 1, 1), 20.0), (3, 1, D(2003, 6, 1), 30.0), (4, 2, D(2002, 6, 1), 40.0),
    (5, 2, D(2004, 6, 1), 50.0), (6, 3, D(2001, 6, 1), 60.0)]


@pytest.fixture
def league(tmp_path):
    db = relsql.connect(tmp_path / "league.duckdb")
    db.execute("""
        CREATE TABLE player(pid INT PRIMARY KEY, height DOUBLE);
        CREATE TABLE sal(sid INT PRIMARY KEY, pid INT REFERENCES player(pid), yr DATE, amount DOUBLE, team VARCHAR);
        CREATE TABLE bat(bid INT PRIMARY KEY, pid INT REFERENCES player(pid), day DATE, hits DOUBLE);
        INSERT INTO player VALUES (1, 180), (2, 190), (3, 170);""")
    db.con.executemany("INSERT INTO sal VALUES (?, ?, ?, ?, ?)", SALARIES)
    db.con.executemany("INSERT INTO bat VALUES (?, ?, ?, ?)", BATTING)
    yield db
    db.con.close()


def grounded(template: relsql.Template, db, node: str, column: int = 0) -> dict[tuple, float]:
    """{(target key, node row key): a number the lateral row gives} of one leaf node of the tree
    (`<parent>__<table>`), as grounded inside its parent's statement (the one whose rows join
    enc_<table>) and read raw: column 0 the age in seconds (it is sign(days) * ln(1 + |days|): its
    inverse gives the days back); for siblings, 1 the label (read as it is) and 2 its unknown flag."""
    parent, _, table = node.rpartition("__")
    grounding = ground(template, db)
    found = grounding.relations[f"p_{parent}"]
    assert not [k for k in grounding.feature_stats if k.startswith(f"p_{parent}#")]  # nothing standardized
    keys = found.keys.to_pydict()
    r_key = [c for c in keys if c.startswith("r_") and c != "r_time"][0]
    rule = next(r for r in found.rules if f"enc_{table}" in r.rule.refs)
    encoded = grounding.relations[f"enc_{table}"].keys.to_pydict()
    n_key = [c for c in encoded if c != "_rid"][0]
    read = rule.refs[rule.rule.refs.index(f"enc_{table}")].tolist()  # each grounding's row of enc_<table>
    values = rule.columns[column].reshape(-1).tolist()  # the lateral row's columns: age (, label, unknown)
    head = dict(zip(keys["_rid"], keys[r_key]))
    row = dict(zip(encoded["_rid"], encoded[n_key]))
    pairs = [(head[int(h)], row[int(e)]) for h, e in zip(rule.head, read)]
    assert len(set(pairs)) == len(pairs)  # one grounding per (target row, node row)
    if column:
        return dict(zip(pairs, values))
    return {pair: round(math.copysign(math.expm1(abs(a)), a) * 86400.0) for pair, a in zip(pairs, values)}


def signed_log(y: float | None) -> float:
    """A label on the log scale: sign(y) * ln(1 + |y|), 0 where NULL."""
    return 0.0 if y is None else math.copysign(math.log1p(abs(y)), y)


def reader(rows: list[tuple]):
    """How a sibling's label is read, from the (time, label) rows: the labels of the rows up to the middle
    row's time (the earliest half, every time split's training rows) decide. Where their log scale
    spreads them less than 0.25, as z = (y - their mean) / their spread, within 4 of 0 as it is and beyond
    it sign(z) * (4 + ln(|z| - 3)); else on the log scale. 0 where NULL."""
    rows = sorted((t, y) for t, y in rows if y is not None and t is not None)
    middle = rows[(len(rows) - 1) // 2][0]
    values = [y for t, y in rows if t <= middle and math.isfinite(y)]
    if statistics.pstdev([signed_log(y) for y in values]) >= 0.25:
        return signed_log
    mean, spread = statistics.fmean(values), statistics.pstdev(values) or 1.0

    def scaled(y: float | None) -> float:
        if y is None:
            return 0.0
        z = (y - mean) / spread
        return z if abs(z) <= 4 else math.copysign(4 + math.log(abs(z) - 3), z)
    scaled.scale = (mean, spread)
    return scaled


def seconds(later: D, earlier: D) -> float:
    return (later - earlier).days * 86400.0


def test_siblings_are_earlier_rows_of_the_same_parent_never_the_row_itself(league):
    tpl = relsql.Template.auto(league, "sal.amount", time_column="yr")
    assert "-- player__sal: the child rows of player in sal" in tpl.source
    got = grounded(tpl, league, "player__sal")
    naive = {}
    for sid, pid, yr, _, _ in SALARIES:  # a loop over the rows: same player, strictly earlier, not itself
        for other, opid, oyr, _, _ in SALARIES:
            if opid == pid and oyr < yr and other != sid:
                naive[sid, other] = seconds(yr, oyr)
    assert got == naive
    assert (3, 2) not in got and (2, 3) not in got  # a tie at the same time is not earlier under relsql's cut
    amount = {sid: a for sid, _, _, a, _ in SALARIES}
    labels, unknown = grounded(tpl, league, "player__sal", 1), grounded(tpl, league, "player__sal", 2)
    assert reader([(yr, a) for _, _, yr, a, _ in SALARIES]) is signed_log  # 1-7: spread apart on the log scale
    assert labels == pytest.approx({pair: signed_log(amount[pair[1]]) for pair in naive}, abs=1e-12)
    assert unknown == {pair: float(amount[pair[1]] is None) for pair in naive}
    assert "(as (label -" not in tpl.source
    header = tpl.source.split("\n\n")[0]  # what the header says the siblings bring is what they bring
    assert "siblings: other sal rows sharing a parent row join under that cut, never the target row itself; " \
        "their amount only where strictly earlier than the target row's time" in header


def test_siblings_of_a_text_target_bring_no_label_and_the_header_says_so(league):
    tpl = relsql.Template.auto(league, "sal.team", time_column="yr")
    assert "player__sal" in tpl.source and "AS label" not in tpl.source
    assert "never the target row itself; never their team" in tpl.source.split("\n\n")[0]


def test_age_reaches_two_hops(league):
    """Batting rows reached through the player (two hops) carry their age at the salary's time."""
    tpl = relsql.Template.auto(league, "sal.amount", time_column="yr")
    got = grounded(tpl, league, "player__bat")
    naive = {(sid, bid): seconds(yr, day) for sid, pid, yr, _, _ in SALARIES
             for bid, bpid, day, _ in BATTING if bpid == pid and day < yr}
    assert got == naive


@pytest.mark.slow  # Model's first use
@pytest.mark.parametrize("shift", [0, 1000])
def test_same_time_or_later_labels_never_reach_a_prediction(league, shift):
    """Weights fixed: changing the labels of every row from 2002 on (the row's own, its same-time
    sibling's, later ones) leaves every prediction up to 2002 bit for bit the same, and moves
    those whose earlier siblings' labels changed; Model's leakage check accepts the template, on the
    log scale and scaled."""
    league.execute(f"UPDATE sal SET amount = amount + {shift}")
    tpl = relsql.Template.auto(league, "sal.amount", time_column="yr")
    if shift:  # labels of 1001-1007: squeezed together on the log scale, read scaled
        assert 'CASE WHEN y."yr" < p.r_time THEN coalesce((CASE WHEN isfinite((CAST(y."amount" AS DOUBLE) - 1003.6) / ' \
            in tpl.source
    else:  # a DOUBLE label: NaN and infinities read as unknown, as NULL is
        assert 'CASE WHEN y."yr" < p.r_time THEN coalesce(sign((CASE WHEN isfinite(y."amount") THEN y."amount" END))' \
            in tpl.source

    def predictions():
        frame = relsql.compile(tpl, league, dtype=torch.float64, seed=0).values("predict").sort("sid")
        return dict(zip(frame["sid"].to_list(), (v[0] for v in frame[frame.columns[-1]].to_list())))

    before = predictions()
    league.execute("UPDATE sal SET amount = 100 - coalesce(amount, 7) WHERE yr >= DATE '2002-01-01'")
    after = predictions()
    year = {sid: yr for sid, _, yr, _, _ in SALARIES}
    assert {s: before[s] for s in before if year[s] <= D(2002, 1, 1)} == {s: after[s] for s in after if year[s] <= D(2002, 1, 1)}
    assert before[4] != after[4] and before[8] != after[8]  # their earlier siblings 2, 3 and 6 changed
    assert before[6] == after[6]  # its one earlier sibling (5, 2001) did not
    relsql.Model(league, tpl, target="sal.amount", time_column="yr")  # not refused as reading its target
    with pytest.raises(relsql.SchemaError, match="reads the target"):
        relsql.Model(league, tpl, target="sal.amount")  # without a time the read is not known to be earlier


def test_nan_infinite_and_huge_labels_read_as_unknown_or_finite(league):
    """A sibling's NaN or infinite label is unknown (0, flag 1), as NULL is; one near the largest double
    stays a finite number above every smaller label's (the log tail), never an overflow."""
    league.execute("""UPDATE sal SET amount = 'NaN'::DOUBLE WHERE sid = 1; UPDATE sal SET amount = 'inf'::DOUBLE WHERE sid = 5;
                      UPDATE sal SET amount = 1e308 WHERE sid = 2; UPDATE sal SET amount = 9e307 WHERE sid = 3""")
    tpl = relsql.Template.auto(league, "sal.amount", time_column="yr")
    labels, unknown = grounded(tpl, league, "player__sal", 1), grounded(tpl, league, "player__sal", 2)
    assert labels[2, 1] == labels[6, 5] == 0.0 and unknown[2, 1] == unknown[6, 5] == 1.0  # NaN, infinity
    assert unknown[4, 2] == unknown[4, 3] == 0.0 and all(math.isfinite(v) for v in labels.values())
    assert labels[4, 2] > labels[4, 3] > 4  # 1e308 above 9e307, both on the tail


def test_labels_squeezed_on_the_log_scale_are_read_scaled(league):
    """Labels of 1001-1007 are 6.9-6.9 on the log scale: read as (y - mean) / spread of the earliest half's
    (2001-2002: 1001, 1002, 1003, 1007; 1005 is NaN now), which the statement's comment says; a huge later
    label reads finite, on the tail beyond 4, and the NaN one as unknown."""
    league.execute("UPDATE sal SET amount = amount + 1000; UPDATE sal SET amount = 1e308 WHERE sid = 6; "
                   "UPDATE sal SET amount = 'NaN'::DOUBLE WHERE sid = 5")
    rows = league.arrow("SELECT sid, yr, amount FROM sal").to_pylist()
    read = reader([(r["yr"], r["amount"]) for r in rows])
    assert read is not signed_log and read.scale == pytest.approx((1003.25, statistics.pstdev([1001, 1002, 1003, 1007])))
    tpl = relsql.Template.auto(league, "sal.amount", time_column="yr")
    assert "(as (label - 1003.25) / 2.27761: the earliest half of the labelled rows' mean and spread)" in tpl.source
    labels, unknown = grounded(tpl, league, "player__sal", 1), grounded(tpl, league, "player__sal", 2)
    amount = {r["sid"]: r["amount"] for r in rows}
    assert labels.keys() == unknown.keys() and len(labels) == 8
    for (sid, other), value in labels.items():
        if math.isnan(amount[other]):
            assert (value, unknown[sid, other]) == (0.0, 1.0)
        else:
            assert value == pytest.approx(read(amount[other]), abs=1e-12) and unknown[sid, other] == 0.0
    assert 4 < labels[8, 6] < 720  # 1e308: on the tail, finite


def test_the_label_scale_reads_only_the_earliest_half_of_the_labelled_rows(league):
    """The mean and spread a sibling's label is scaled by come from the rows up to the middle row's time
    (2002 here): later labels, the ones a time split validates and tests on, leave the template as it
    was; an early one changes it."""
    league.execute("UPDATE sal SET amount = amount + 1000")
    source = relsql.Template.auto(league, "sal.amount", time_column="yr").source
    assert "(as (label - 1003.6) / 2.15407:" in source
    league.execute("UPDATE sal SET amount = amount + 7 WHERE yr > DATE '2002-01-01'")
    assert relsql.Template.auto(league, "sal.amount", time_column="yr").source == source
    league.execute("UPDATE sal SET amount = 1011 WHERE sid = 1")
    assert "(as (label - 1005.6) / " in relsql.Template.auto(league, "sal.amount", time_column="yr").source


def test_the_scale_of_the_earliest_half():
    """The earliest half by time (up to the middle row's time, ties included, NaN left out); the log
    scale's spread that decides; a mean and spread that are numbers, or (mean, 1) and (0, 1)."""
    import numpy as np
    import pyarrow as pa

    from relsql.template.auto.labels import _earliest_half, _scale, squeezed
    assert _earliest_half(pa.array([], pa.int64()), pa.array([], pa.float64())).size == 0
    assert _earliest_half(pa.array([3, 1, 2]), pa.array([9.0, 5.0, 6.0])).tolist() == [5.0, 6.0]  # times 1, 2
    assert _earliest_half(pa.array([1, 1, 1, 3]), pa.array([2.0, float("nan"), 6.0, 8.0])).tolist() == [2.0, 6.0]
    assert squeezed(np.array([1001.0, 1003.0])) and not squeezed(np.array([1.0, 3.0])) and not squeezed(np.zeros(0))
    assert _scale(np.array([2.0, 6.0])) == (4.0, 2.0) and _scale(np.zeros(0)) == (0.0, 1.0)
    assert _scale(np.array([5.0, 5.0])) == (5.0, 1.0)  # no spread: read as the distance from the mean
    assert _scale(np.array([1e308, 1e308])) == (0.0, 1.0)  # their sum is no double


def test_no_siblings_without_a_time_cut(league):
    tpl = relsql.Template.auto(league, "sal.amount")
    assert "player__sal" not in tpl.source


def test_a_parent_with_many_children_reads_no_siblings(league):
    """The (row, sibling) pairs grow with the square of a parent's child rows: past SIBLING_PAIRS
    times the table's rows the path is left out and listed."""
    n = 2 * SIBLING_PAIRS
    league.con.executemany("INSERT INTO sal VALUES (?, 3, ?, 1.0, 'a')",
                           [(100 + i, D(1990, 1, 1) + dt.timedelta(days=i)) for i in range(n)])
    tpl = relsql.Template.auto(league, "sal.amount", time_column="yr")
    assert "player__sal" not in tpl.source
    assert "sal (via sal -> player -> sal)" in tpl.source


# -- RelBench's cut ----------------------------------------------------------------------------------------------
def _table(df, fkeys=None, pkey=None, time=None):
    return SimpleNamespace(df=df, fkey_col_to_pkey_table=fkeys or {}, pkey_col=pkey, time_col=time)


DAYS = [pd.Timestamp("2020-01-01") + pd.Timedelta(days=d) for d in range(40)]
ORDERS = [(0, 0, DAYS[5]), (1, 0, DAYS[10]), (2, 1, DAYS[10]), (3, 1, DAYS[20]), (4, 0, DAYS[21]), (5, 1, DAYS[30])]


class _Task:
    """A churn-like entity task: customers at a date (train days 10 and 20); customer 0 twice on day 30."""

    entity_col, entity_table, target_col, time_col, task_type = "customer_id", "customers", "y", "date", "regression"
    rows = {"train": [(0, DAYS[10]), (1, DAYS[10]), (0, DAYS[20]), (1, DAYS[20])], "val": [(0, DAYS[30]), (0, DAYS[30])],
            "test": [(0, DAYS[35]), (1, DAYS[35])]}

    def get_table(self, split, mask_input_cols=False):
        rows = self.rows[split]
        return _table(pd.DataFrame({"customer_id": [c for c, _ in rows], "date": [d for _, d in rows],
                                    "y": [float(i) for i in range(len(rows))]}))


def _relbench_db():
    tables = SimpleNamespace(table_dict={
        "customers": _table(pd.DataFrame({"customer_id": [0, 1], "age": [30.0, 40.0]}), pkey="customer_id"),
        "orders": _table(pd.DataFrame({"order_id": [o for o, _, _ in ORDERS], "customer_id": [c for _, c, _ in ORDERS],
                                       "date": [d for _, _, d in ORDERS], "amount": [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]}),
                         {"customer_id": "customers"}, "order_id", "date")})
    return rb.from_relbench(tables, tasks={"task": _Task()})


@pytest.mark.parametrize("relbench", [True, False])
def test_relbench_tasks_see_events_at_their_timestamp(relbench):
    """An order placed at exactly a task row's date is visible to it under RelBench's cut (`<=`), and
    not under relsql's own (`<`: the same database with the task unmarked); task rows of the same
    customer at the same date are siblings under `<=`, never the row itself."""
    db = _relbench_db()
    if not relbench:
        db.relbench_tasks = {}
    tpl = relsql.Template.auto(db, "task.y", time_column="date", time_columns=rb.time_columns(db))
    task = db.arrow("SELECT id, customer_id, date, y FROM task").to_pylist()
    later = (lambda a, b: a <= b) if relbench else (lambda a, b: a < b)
    orders = grounded(tpl, db, "customers__orders")
    naive = {(t["id"], o): seconds(t["date"], d) for t in task for o, c, d in ORDERS
             if c == t["customer_id"] and later(d.to_pydatetime(), t["date"])}
    assert orders == naive
    assert ((0, 1) in orders) is relbench  # task row 0 (customer 0, day 10) and order 1 (day 10): the tie
    siblings = grounded(tpl, db, "customers__task") if "-- customers__task:" in tpl.source else {}
    naive = {(t["id"], s["id"]): seconds(t["date"], s["date"]) for t in task for s in task
             if s["customer_id"] == t["customer_id"] and later(s["date"], t["date"]) and s["id"] != t["id"]}
    assert siblings == naive
    assert ((4, 5) in siblings) is relbench  # the two task rows of customer 0 on day 30: a tie between siblings
    if siblings:  # a sibling's label only when strictly earlier, even under `<=`; else 0 and unknown
        y = {t["id"]: t["y"] for t in task}
        time = {t["id"]: t["date"] for t in task}
        labels, unknown = grounded(tpl, db, "customers__task", 1), grounded(tpl, db, "customers__task", 2)
        read = reader([(t["date"], t["y"]) for t in task])
        assert labels == pytest.approx({(r, s): read(y[s]) if time[s] < time[r] else 0.0 for r, s in naive}, abs=1e-12)
        assert unknown == {(r, s): 0.0 if time[s] < time[r] else 1.0 for r, s in naive}
    assert "at or before" in tpl.source if relbench else "earlier than its date" in tpl.source


# -- earlier siblings' labels: learned where they are the signal ----------------------------------------------
@pytest.mark.slow  # trains
def test_a_label_planted_as_the_previous_siblings_is_learned(tmp_path):
    """Each unit's events carry one label, drawn once per unit: an event's label is its previous
    sibling's, and nothing else tells it (the events' own columns are noise). The naive reference,
    the previous sibling's label, is right on every test row; relsql, reading earlier siblings'
    labels, comes near it, far above the majority."""
    import random

    rng = random.Random(0)
    units, events = 60, []
    for u in range(units):
        label = rng.random() < 0.5
        for i in range(8):
            events.append((len(events), u, D(2020, 1, 1) + dt.timedelta(days=10 * i + rng.randrange(5)), rng.random(), label))
    db = relsql.connect(tmp_path / "planted.duckdb")
    db.execute("CREATE TABLE unit(uid INT PRIMARY KEY); CREATE TABLE ev(eid INT PRIMARY KEY, uid INT REFERENCES unit(uid), "
               "day DATE, noise DOUBLE, y BOOLEAN)")
    db.con.executemany("INSERT INTO unit VALUES (?)", [(u,) for u in range(units)])
    db.con.executemany("INSERT INTO ev VALUES (?, ?, ?, ?, ?)", events)
    tpl = relsql.Template.auto(db, "ev.y", time_column="day", width=8)
    assert "-- unit__ev: the child rows of unit in ev" in tpl.source
    model = relsql.Model(db, tpl, target="ev.y", time_column="day", seed=0, progress=False)
    model.fit(epochs=60, lr=0.03, hybrid=False)
    test = model.predict().filter(pl.col("split") == "test")
    truth = {eid: label for eid, _, _, _, label in events}
    by_unit: dict[int, list] = {}
    for eid, uid, day, _, label in events:
        by_unit.setdefault(uid, []).append((day, eid, label))
    previous = {}  # the naive reference: each event's previous sibling's label
    for rows in by_unit.values():
        rows.sort()
        previous.update({eid: rows[i - 1][2] for i, (_, eid, _) in enumerate(rows) if i})
    eids, predicted = test["eid"].to_list(), test["prediction"].to_list()
    assert len(eids) > 50
    reference = sum(previous.get(e) == truth[e] for e in eids) / len(eids)
    ours = sum(bool(p) == truth[e] for e, p in zip(eids, predicted)) / len(eids)
    majority = max(sum(truth[e] for e in eids), sum(not truth[e] for e in eids)) / len(eids)
    assert reference == 1.0 and majority < 0.75
    assert ours > 0.95, (ours, majority)
