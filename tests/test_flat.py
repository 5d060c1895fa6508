"""relsql/train/gbm/flat.py: the one-hop features the database computes equal a naive Python evaluation
over the same tiny tables (float64, 1e-9): own columns, parent columns, per-child count/mean/min/max,
codes for text, epoch seconds for dates, NaN for NULL; keys, identifiers, the target and its copies
never enter; with a time column only earlier child rows count."""

from __future__ import annotations

import datetime as dt
import math

import numpy as np
import pyarrow as pa
import pytest
import sqlglot.expressions as exp

import relsql
from relsql.train.gbm import flat

SCHEMA = """
CREATE TABLE region(region_id INT PRIMARY KEY, area DOUBLE, climate VARCHAR);
CREATE TABLE customer(customer_id INT PRIMARY KEY, region_id INT REFERENCES region(region_id), age DOUBLE, vip BOOLEAN,
                      segment VARCHAR, badge_id INT, since DATE, churned BOOLEAN, churn_copy BOOLEAN);
CREATE TABLE orders(order_id INT PRIMARY KEY, customer_id INT REFERENCES customer(customer_id), amount DOUBLE, qty INT,
                    placed DATE, rush BOOLEAN);
CREATE TABLE visit(visit_id INT PRIMARY KEY, customer_id INT REFERENCES customer(customer_id), minutes DOUBLE);
"""


@pytest.fixture(scope="module")
def db():
    rng = np.random.default_rng(0)
    db = relsql.connect()
    for statement in SCHEMA.split(";")[:-1]:
        db.execute(statement)
    regions = [(r, None if r == 2 else float(rng.normal()), ["cold", "warm", None][r % 3]) for r in range(4)]
    db.con.executemany("INSERT INTO region VALUES (?, ?, ?)", regions)
    customers = []
    for c in range(12):
        churned = bool(rng.random() < 0.5)
        customers.append((c, None if c == 5 else c % 4, None if c == 3 else float(rng.normal()), bool(c % 2),
                          ["a", "b", "c"][c % 3], c * 7, dt.date(2020, 1, 1) + dt.timedelta(days=int(rng.integers(0, 300))),
                          churned, churned))
    db.con.executemany("INSERT INTO customer VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", customers)
    orders = [(o, int(rng.integers(0, 10)), None if o % 7 == 0 else float(rng.normal() * 10), int(rng.integers(1, 5)),
               dt.date(2020, 1, 1) + dt.timedelta(days=int(rng.integers(0, 300))), bool(rng.random() < 0.3)) for o in range(60)]
    db.con.executemany("INSERT INTO orders VALUES (?, ?, ?, ?, ?, ?)", orders)  # customers 10, 11 have none
    db.con.executemany("INSERT INTO visit VALUES (?, ?, ?)", [(v, v % 12, float(v)) for v in range(30)])
    return db, regions, customers, orders


def epoch(day: dt.date) -> float:
    return float((day - dt.date(1970, 1, 1)).days * 86400)


def naive(regions, customers, orders, visits, time: bool) -> dict[int, list[float]]:
    """Every customer's features, by hand, in flat.Flat.names order (checked in the test)."""
    region = {r[0]: r for r in regions}
    out = {}
    for c in customers:
        key, region_id, age, vip, segment, _badge, since = c[:7]
        row = [math.nan if age is None else age, float(vip), float(["a", "b", "c"].index(segment))]
        row += [] if time else [epoch(since)]  # the target's time column is no feature of a temporal target
        r = region.get(region_id)
        row += [math.nan, math.nan] if r is None else [math.nan if r[1] is None else r[1],
                                                       math.nan if r[2] is None else float(["cold", "warm"].index(r[2]))]
        mine = [o for o in orders if o[1] == key and (not time or o[4] < since)]
        row.append(float(len(mine)))
        for values in ([o[2] for o in mine], [float(o[3]) for o in mine], [epoch(o[4]) for o in mine],
                       [float(o[5]) for o in mine]):
            present = [v for v in values if v is not None]
            row += [np.mean(present), min(present), max(present)] if present else [math.nan] * 3
        if not time:
            mine = [v for v in visits if v[1] == key]
            row += [float(len(mine)), np.mean([v[2] for v in mine]), min(v[2] for v in mine), max(v[2] for v in mine)]
        out[key] = row
    return out


@pytest.mark.parametrize("time", [False, True])
def test_one_hop_features_equal_a_naive_evaluation(db, time):
    db, regions, customers, orders = db
    visits = [(v, v % 12, float(v)) for v in range(30)]
    spec = flat.plan(db, "customer", "churned", time_column="since" if time else None)
    names = ["age", "vip", "segment", *([] if time else ["since"]), "region(region_id).area", "region(region_id).climate",
             "count(orders(customer_id))",
             "avg(orders.amount)", "min(orders.amount)", "max(orders.amount)", "avg(orders.qty)", "min(orders.qty)",
             "max(orders.qty)", "avg(orders.placed)", "min(orders.placed)", "max(orders.placed)", "avg(orders.rush)",
             "min(orders.rush)", "max(orders.rush)"]
    if not time:  # visits have no time: left out of a temporal target's features
        names += ["count(visit(customer_id))", "avg(visit.minutes)", "min(visit.minutes)", "max(visit.minutes)"]
    assert spec.names == names  # no key, no identifier (badge_id), no target, no copy of it, no time column
    wanted = [7, 3, 99, 0, 11, 5]  # any order; 99 is no customer
    db.register("__relsql_rows", pa.table({"customer_id": wanted, "_rid": [0, 1, 2, 3, 4, 5]}))
    try:
        rids, matrix = spec.matrix(db, exp.Table(this=exp.to_identifier("__relsql_rows", quoted=True)))
    finally:
        db.unregister("__relsql_rows")
    expected = naive(regions, customers, orders, visits, time)
    assert rids.tolist() == [0, 1, 2, 3, 4, 5] and matrix.dtype == np.float64
    for rid, key in zip(rids, wanted):
        if key == 99:
            assert np.isnan(matrix[rid]).all()
            continue
        assert np.allclose(matrix[rid], expected[key], rtol=1e-9, atol=1e-9, equal_nan=True), (key, matrix[rid], expected[key])
    # the matrix comes settled (every number within SETTLED_BITS of mantissa), though the means do not fit them
    assert np.array_equal(flat.settled(matrix), matrix, equal_nan=True)
    means = np.array([v for key in wanted if key != 99 for v in expected[key]])
    assert not np.array_equal(flat.settled(means), means, equal_nan=True)
    again = flat.Flat.from_plain(spec.to_plain())
    assert again == spec


def test_damaged_descriptions_are_refused(db):
    spec = flat.plan(db[0], "customer", "churned")
    plain = spec.to_plain()
    with pytest.raises(relsql.RelsqlError, match="damaged"):
        flat.Flat.from_plain({**plain, "own": [{"name": 3, "kind": "number", "codes": []}]})
    with pytest.raises(relsql.RelsqlError, match="damaged"):
        flat.Flat.from_plain({k: v for k, v in plain.items() if k != "parents"})


def test_features_are_settled_to_a_mantissa_of_fewer_bits_with_their_range_kept():
    """Two sums of the same terms in another order (a database's threads) differ in the last
    place; settled, they are one number again: at 24 bits numpy's own float32 rounding wherever a
    float32 holds the value; beyond its range the exponent, infinities and NaN kept; at the
    default's bits within 2^-(bits + 1) of the value."""
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.normal(size=2000) * 10.0 ** rng.integers(-30, 30, 2000), [0.0, -0.0, 1.0, 2.0 ** -126]])
    assert np.array_equal(flat.settled(x, 24), x.astype(np.float32).astype(np.float64))
    settled = flat.settled(x)
    assert np.all(np.abs(settled - x) <= np.abs(x) * 2.0 ** -flat.SETTLED_BITS) and not np.array_equal(settled, x)
    third = 1 / 3  # far from a rounding boundary: its neighbours one unit in the last place away settle with it
    neighbours = np.array([third, np.nextafter(third, math.inf), np.nextafter(third, -math.inf)])
    assert len(set(neighbours.tolist())) == 3 and len(set(flat.settled(neighbours).tolist())) == 1
    huge = np.array([1e308, -1e308, 5e-324, math.inf, -math.inf, math.nan])
    out = flat.settled(huge)
    assert np.isfinite(out[:3]).all() and abs(out[0] / 1e308 - 1) < 2.0 ** -30 and out[2] == 5e-324
    assert out[3] == math.inf and out[4] == -math.inf and math.isnan(out[5])
