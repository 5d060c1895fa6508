"""ple() encoded where the groundings are read (relsql/ground/encoders.py `ple_values`), not in SQL:
the database sends one DOUBLE per value and the reader expands it over the bin edges. Checked
against a naive per-value evaluator (Python floats), against the database's own `ple_sql` (bit
for bit, NaN included), through `column_values` and the store's `PartWriter`, and for a whole
grounding: the bulk path (numbers) against the demand path (SQL) and the naive evaluator. Also the
text hashing that copies repeated values and hashes per word: equal to hashing token by token."""

from __future__ import annotations

import math
import random
import warnings
import zlib
from decimal import Decimal

import numpy as np
import pyarrow as pa
import pytest
import sqlglot.expressions as exp

import relsql
from relsql import sql as q
from relsql.errors import SchemaError
from relsql.ground import encoders
from relsql.ground import text as hashing
from relsql.ground.demand import BatchGrounder
from relsql.ground.execute import Presets, ground
from relsql.ground.parts import PartWriter, column_values
from relsql.template import ir
from tests.test_encoders import ple

naive_ple = ple  # the per-value reference evaluator of tests/test_encoders.py


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal as float64 bit patterns (NaN equal to NaN, 0.0 not equal to -0.0)."""
    return a.shape == b.shape and np.array_equal(np.asarray(a, np.float64).view(np.int64),
                                                 np.asarray(b, np.float64).view(np.int64))


def numbers_and_nulls(values: list) -> tuple[np.ndarray, np.ndarray]:
    return (np.array([0.0 if v is None else v for v in values], dtype=np.float64),
            np.array([v is None for v in values]))


CASES = {
    # edges from a column with ties: zero-width bins at the start, inside and at the end
    "ties": ([0.0, 0.0, 0.0, 1.0, 2.0, 2.0, 2.0, 5.0, 5.0],
             [0.0, 0.0, 0.0, 0.5, 1.0, 1.5, 2.0, 2.0, 3.0, 4.99, 5.0, 5.0, 7.0, -3.0, None, None]),
    # 17-digit widths (0.945 - 0.761 = 0.18399999999999994): the SQL literals DuckDB misread
    "fractions": ([0.761, 0.945, 0.967, 0.974, 0.977, 0.979, 0.982, 0.984, 0.991],
                  [0.761, 0.8, 0.9449999, 0.945, 0.96, 0.98, 0.983, 0.991, 0.999, 0.5, None, 0.97700000000000001]),
    # values far beyond the edges, both ways (finite), and signed zeros
    "extremes": ([-1.0, -0.5, 0.0, 0.25, 1.0],
                 [-1e300, 1e300, -1.0, -0.0, 0.0, 1.0, 1.0000000000000002, -0.9999999999999999, 5e-324, None]),
    # one bin: open on both sides
    "one bin": ([2.0, 6.0], [0.0, 2.0, 4.0, 6.0, 10.0, None]),
    # a column with two distinct values: most bins zero-width
    "few values": ([1.0, 1.0, 1.0, 1.0, 3.0], [1.0, 3.0, 1.0, 2.0, 0.0, 4.0, None]),
    # a single value everywhere: every bin zero-width
    "constant": ([7.0, 7.0, 7.0], [7.0, 6.0, 8.0, None]),
    # all NULL: edges all 0 (ple_stats of no values)
    "all null": ([0.0, 0.0, 0.0], [None, None]),
    # subnormal differences: (x - low) / width underflows to -0.0 below a bin, which the SQL makes 0.0
    "underflow": ([0.0, 1e-310, 1e10, 2e10], [1e-310 - 5e-324, 1e-310, 5e-324, -5e-324, 1e10 - 1, 2e10]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_ple_values_equal_the_naive_evaluator_bit_for_bit(case):
    edges, values = CASES[case]
    numbers, nulls = numbers_and_nulls(values)
    got = encoders.ple_values(numbers, nulls, edges)
    assert got.flags.c_contiguous and got.shape == (len(values), len(edges))
    assert same_bits(got, naive_ple(values, edges))
    assert same_bits(encoders.ple_values(numbers, None, edges)[~nulls], got[~nulls])


def test_ple_values_of_random_columns_equal_the_naive_evaluator():
    rng = np.random.default_rng(5)
    for trial in range(40):
        size = int(rng.integers(1, 400))
        distinct = int(rng.integers(1, 12))
        pool = rng.normal(0, 10.0 ** rng.integers(-3, 6), distinct)
        values = [None if rng.random() < 0.1 else float(rng.choice(pool)) for _ in range(size)]
        present = np.array([v for v in values if v is not None] or [0.0])
        bins = int(rng.integers(1, 17))
        edges = [float(e) for e in np.maximum.accumulate(np.quantile(present, np.linspace(0, 1, bins + 1)))]
        numbers, nulls = numbers_and_nulls(values)
        assert same_bits(encoders.ple_values(numbers, nulls, edges), naive_ple(values, edges)), trial


def test_ple_values_across_blocks_equal_the_naive_evaluator():
    """A column longer than the block `ple_values` encodes at a time (two full blocks and a part):
    NULLs and signed zeros at the blocks' first and last rows land in their own rows; a NaN there
    is encoded as it is alone (the naive evaluator has no NaN)."""
    block = encoders._PLE_BLOCK
    rng = np.random.default_rng(11)
    values: list = [float(v) for v in rng.normal(0.0, 3.0, 2 * block + 37).round(1)]
    ends = (0, block - 1, block, 2 * block - 1, 2 * block, 2 * block + 36)
    for i, v in zip(ends, (None, -0.0, -0.0, None, 0.0, None)):
        values[i] = v
    edges = [-4.0, -1.0, 0.0, 0.0, 0.7, 2.5, 6.0]
    numbers, nulls = numbers_and_nulls(values)
    got = encoders.ple_values(numbers, nulls, edges)
    assert got.flags.c_contiguous and got.shape == (len(values), len(edges))
    assert same_bits(got, naive_ple(values, edges))
    numbers[list(ends)] = math.nan
    nulls[list(ends)] = False
    with_nan = encoders.ple_values(numbers, nulls, edges)
    alone = encoders.ple_values(np.array([math.nan]), None, edges)
    assert same_bits(with_nan[list(ends)], np.repeat(alone, len(ends), axis=0))
    rest = np.setdiff1d(np.arange(len(values)), ends)
    assert same_bits(with_nan[rest], got[rest])


def database_ple(con, values: list, edges: list[float]) -> np.ndarray:
    """`ple_sql` evaluated by DuckDB over a column holding `values` (None: NULL; NaN kept)."""
    def literal(v):
        if v is None:
            return "NULL"
        return f"'{v}'::DOUBLE" if not math.isfinite(v) else encoders.exact_real(v).sql("duckdb")

    rows = ", ".join(f"({i}, {literal(v)})" for i, v in enumerate(values))
    con.execute(f"CREATE OR REPLACE TEMP TABLE v AS SELECT * FROM (VALUES {rows}) r(i, x)")
    expression = encoders.ple_sql(encoders.double(q.col("x")), edges)
    rows = con.execute(f"SELECT {expression.sql('duckdb')} FROM v ORDER BY i").fetchall()
    return np.array([r[0] for r in rows], dtype=np.float64)


@pytest.mark.parametrize("case", list(CASES))
def test_the_database_encodes_as_ple_values_does(case):
    import duckdb

    edges, values = CASES[case]
    values = values + [float("nan"), float("inf"), float("-inf")]
    numbers, nulls = numbers_and_nulls(values)
    con = duckdb.connect()
    try:
        assert same_bits(database_ple(con, values, edges), encoders.ple_values(numbers, nulls, edges))
    finally:
        con.close()


def test_exact_real_literals_read_back_exactly():
    import duckdb

    rng = random.Random(3)
    values = [rng.uniform(-1, 1) * 10 ** rng.randint(-300, 300) for _ in range(3000)]
    values += [0.18399999999999994, 0.09874999999999999, -0.0, 0.0, 5e-324, -1.7976931348623157e308]
    con = duckdb.connect()
    try:
        got = con.execute("SELECT " + ", ".join(encoders.exact_real(v).sql("duckdb") for v in values)).fetchone()
        plain = con.execute("SELECT " + ", ".join(q.real(v).sql("duckdb") for v in values)).fetchone()
    finally:
        con.close()
    assert all(g == v and math.copysign(1, g) == math.copysign(1, v) for g, v in zip(got, values))
    if int(duckdb.__version__.split(".")[0]) < 2:  # what the exponent form is for: duckdb 1 reads 17 digits as a DECIMAL
        assert sum(p != v for p, v in zip(plain, values)) > 0
    with pytest.raises(relsql.RelsqlError):
        encoders.exact_real(float("inf"))


def test_quantile_edges_equal_duckdbs_quantile_cont():
    """Bit for bit on duckdb 1.x (whose interpolation `quantile_edges` follows); duckdb 2 interpolates
    otherwise in the last bit."""
    import duckdb

    rng = np.random.default_rng(11)
    con = duckdb.connect()
    exact = int(duckdb.__version__.split(".")[0]) < 2
    try:
        for trial in range(120):
            n = int(rng.choice([1, 2, 3, 7, 100, 2500]))
            kind = trial % 4
            if kind == 0:
                x = rng.normal(0, 10.0 ** rng.integers(-6, 9), n)
            elif kind == 1:
                x = np.round(rng.gamma(1, 50, n), int(rng.integers(0, 4)))
            elif kind == 2:
                x = rng.integers(-1000, 1000, n) / 7
            else:
                x = rng.choice(rng.normal(size=4), n)
            bins = int(rng.integers(1, 20))
            levels = exp.Array(expressions=[encoders.exact_real(i / bins) for i in range(bins + 1)])
            con.execute("CREATE OR REPLACE TEMP TABLE q AS SELECT unnest($1::DOUBLE[]) AS x", [x.tolist()])
            found = con.execute(f"SELECT quantile_cont(x, {levels.sql('duckdb')}) FROM q").fetchone()[0]
            edges = encoders.quantile_edges(x, bins)
            if exact:
                assert edges == list(found), trial
            else:
                assert np.allclose(edges, found, rtol=1e-15, atol=0), trial
            assert np.allclose(edges, np.quantile(x, np.linspace(0, 1, bins + 1)), rtol=0, atol=1e-14 * np.abs(x).max())
    finally:
        con.close()
    assert encoders.quantile_edges(np.zeros(0), 4) is None


def test_ple_column_stats_refuse_infinite_values_and_count_nulls():
    bad, _ = encoders.ple_column_stats(pa.array([1.0, float("inf"), None, float("nan")]), 4)
    assert bad == 2
    bad, stats = encoders.ple_column_stats(pa.chunked_array([pa.array([3, None, 1], pa.int32()), pa.array([2], pa.int32())]), 2)
    assert bad == 0 and stats["nulls"] is True and stats["edges"] == [1.0, 2.0, 3.0] and stats["kind"] == "ple"
    assert encoders.ple_column_stats(pa.nulls(3), 2)[1]["edges"] == [0.0, 0.0, 0.0]


# -- column_values and the store's writer -----------------------------------------------------------
def a_rule() -> ir.Rule:
    template = relsql.Template.from_sql("CREATE TABLE f AS SELECT t.id, ple(t.a, 4) AS h FROM t;")
    return next(iter(template.relations.values())).rules[0]


EDGES = [0.0, 1.0, 1.0, 2.5, 4.0]
VALUES = [0.5, None, 1.0, 3.0, -2.0, 9.0, None, 2.5]


@pytest.mark.parametrize("array", [
    pa.array(VALUES, pa.float64()),
    pa.chunked_array([pa.array(VALUES[:3], pa.float64()), pa.array(VALUES[3:], pa.float64())]),
    pa.array([None if v is None else v for v in VALUES], pa.float32()),
    pa.array([None if v is None else Decimal(str(v)) for v in VALUES], pa.decimal128(6, 2)),
])
def test_column_values_encode_a_number_column_over_edges(array):
    got = column_values(array, a_rule(), 0, embedded=False, edges=EDGES)
    assert same_bits(got, naive_ple(VALUES, EDGES))


def test_column_values_of_integers_and_of_nulls_only():
    rule = a_rule()
    ints = [3, None, 0, 1, 7]
    assert same_bits(column_values(pa.array(ints, pa.int64()), rule, 0, False, EDGES), naive_ple(ints, EDGES))
    assert same_bits(column_values(pa.nulls(3), rule, 0, False, EDGES), naive_ple([None] * 3, EDGES))


def test_column_values_without_edges_keep_reading_lists_and_refuse_lists_with_edges():
    rule = a_rule()
    encoded = naive_ple(VALUES, EDGES)
    lists = pa.array(encoded.tolist(), pa.list_(pa.float64()))
    assert same_bits(column_values(lists, rule, 0, embedded=False), encoded)
    with pytest.raises(SchemaError, match="its number"):
        column_values(lists, rule, 0, embedded=False, edges=EDGES)


def test_a_part_writer_with_edges_writes_what_it_writes_for_the_database_encoded_lists(tmp_path):
    template = relsql.Template.from_sql("CREATE TABLE f AS SELECT t.id, ple(t.a, 4) AS h FROM t;")
    relation = next(iter(template.relations.values()))
    rule = relation.rules[0]
    heads = pa.array(np.arange(len(VALUES)), pa.int64())
    raw = pa.record_batch({"_head": heads, "_r0": heads, "_c0": pa.array(VALUES, pa.float64())})
    encoded = pa.record_batch({"_head": heads, "_r0": heads,
                               "_c0": pa.array(naive_ple(VALUES, EDGES).tolist(), pa.list_(pa.float64()))})
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    numbers = PartWriter(relation, rule, str(tmp_path / "a"), "s", edges={0: EDGES})(None, [raw.slice(0, 3), raw.slice(3)])
    lists = PartWriter(relation, rule, str(tmp_path / "b"), "s")(None, [encoded])
    assert numbers["columns"] == lists["columns"] == {"0": ["value", 5]}
    assert (tmp_path / "a" / "s.c0").read_bytes() == (tmp_path / "b" / "s.c0").read_bytes()


# -- a whole grounding -------------------------------------------------------------------------------
@pytest.fixture
def db():
    """Fractions whose quantile widths have 17 digits, ties (zero-width bins), NULLs, a date."""
    db = relsql.connect()
    db.execute("CREATE TABLE t(id INT PRIMARY KEY, a DOUBLE, b INTEGER, d DATE, y BOOLEAN)")
    db.execute("""INSERT INTO t SELECT i,
                  CASE WHEN i % 13 = 0 THEN NULL ELSE round(0.75 + (i * 37 % 101) / 400.0, 3) END,
                  CASE WHEN i % 5 = 0 THEN NULL WHEN i % 3 = 0 THEN 0 ELSE i % 4 END,
                  CASE WHEN i % 7 = 0 THEN NULL ELSE DATE '2001-01-01' + CAST(i * 5 AS INTEGER) END,
                  i % 2 = 0 FROM range(1, 240) r(i)""")
    yield db
    db.con.close()


TEMPLATE = "CREATE TABLE f AS SELECT t.id, ple(t.a, t.b, t.d, 8) AS h FROM t;"


def test_a_grounding_reads_ple_columns_as_numbers_and_equals_the_naive_evaluator(db):
    template = relsql.Template.from_sql(TEMPLATE)
    grounding = ground(template, db, progress=False)
    rule = grounding.relations["f"].rules[0]
    rows = db.con.execute("SELECT id, a, b, epoch(d) FROM t ORDER BY id").fetchall()
    ids = grounding.relations["f"].keys.column("id").to_pylist()
    by_id = {r[0]: r[1:] for r in rows}
    heads = rule.head.numpy()
    for k in range(3):
        stats = grounding.feature_stats[f"f#0:{k}"]
        column = [by_id[ids[h]][k] for h in heads]
        column = [None if v is None else float(v) for v in column]
        present = np.array([v for v in column if v is not None])
        assert np.allclose(stats["edges"], np.quantile(present, np.linspace(0, 1, 9)), rtol=1e-15, atol=0)
        assert same_bits(rule.columns[k].numpy(), naive_ple(column, stats["edges"])), k


def test_the_bulk_grounding_equals_the_demand_grounding_that_encodes_in_sql(db):
    template = relsql.Template.from_sql(TEMPLATE)
    bulk = ground(template, db, progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        grounder = BatchGrounder(template, db, "f", progress=False)
    assert grounder.feature_stats == bulk.feature_stats
    assert any(isinstance(c, exp.Anonymous) and c.name.lower() == "list_value" for p in grounder.prepared["f"]
               for c in p.columns)  # the demand path still encodes in the database
    rows = np.arange(grounder.sizes["f"])
    batch = grounder.ground(rows)
    for k in range(3):
        assert same_bits(batch.relations["f"].rules[0].columns[k].numpy(), bulk.relations["f"].rules[0].columns[k].numpy())
    # a saved model's edges (presets) give the same numbers again
    again = ground(template, db, presets=Presets({}, bulk.feature_stats), progress=False)
    for k in range(3):
        assert same_bits(again.relations["f"].rules[0].columns[k].numpy(), bulk.relations["f"].rules[0].columns[k].numpy())


# -- text --------------------------------------------------------------------------------------------
def token_by_token(values: list, buckets: int, length: int, split=hashing.tokens) -> np.ndarray:
    out = np.full((len(values), length), float(buckets))
    for r, value in enumerate(values):
        if value is None:
            continue
        ids = [zlib.crc32(t.encode("utf-8")) % buckets for t in list(split(value, length))[:length]]
        out[r, :len(ids)] = ids
    return out


@pytest.mark.parametrize("length", [1, 3, 9, 128])
def test_hashed_texts_equal_hashing_each_token(length):
    rng = random.Random(length)
    words = ["John", "Smith", "san", "José", "ÉTÉ", "o'brien", "x_1", "New", "York", "a", "", "!!", "东京", "mc-donald"]
    values = [None if rng.random() < 0.1 else " ".join(rng.choice(words) for _ in range(rng.randint(0, 6)))
              for _ in range(300)]
    values += ["word " * 3000, "Ab" * 40_000, None, "same", "same", "Same"]
    assert np.array_equal(hashing.hashed(values, 997, length), token_by_token(values, 997, length))


def test_hashed_codes_of_lists_equal_hashing_each_element():
    values = [[1, 2, None, 2], None, [], [1, 2, None, 2], [7], ["a", "b"]]
    expected = token_by_token(values, 31, 3, hashing.element_tokens)
    assert np.array_equal(hashing.hashed(values, 31, 3, hashing.element_tokens), expected)
