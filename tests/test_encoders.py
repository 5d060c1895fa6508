"""Column encoders computed by the database: ple(...), calendar(...), embed(..., min_count=k) and
features(<expression>), each equal in float64 to a naive Python evaluator over the same rows, in
full batch, in mini-batches and in a saved model loaded on other data (statistics not recomputed)."""

from __future__ import annotations

import datetime as dt
import math
import re
import warnings
import zlib
from collections import Counter

import numpy as np
import pytest
import torch

import relsql
from relsql.compile.module import CompiledNet
from relsql.compile.planning import make_plan
from relsql.ground.execute import Presets, ground

EPOCH = dt.datetime(1970, 1, 1)
YEAR = 31_556_952.0


def make_db(first: int, last: int, shift: float = 0.0) -> relsql.Database:
    """Rows first..last-1: a numeric column with NULLs and many ties (zero-width quantile bins), a
    date with NULLs, a timestamp, a category with frequent and rare values, a binary target."""
    db = relsql.connect()
    db.execute("CREATE TABLE t(id INT PRIMARY KEY, a DOUBLE, d DATE, s TIMESTAMP, c VARCHAR, y BOOLEAN)")
    db.execute(f"""
        INSERT INTO t SELECT i,
          CASE WHEN i % 9 = 0 THEN NULL WHEN i % 4 = 0 THEN 0 ELSE (i * 37 % 101) / 7.0 + {shift} END,
          CASE WHEN i % 11 = 0 THEN NULL ELSE DATE '2019-03-05' + CAST(i * 13 AS INTEGER) END,
          TIMESTAMP '2020-06-01 00:00:00' + i * INTERVAL 7 HOUR + i * INTERVAL 11 MINUTE,
          CASE WHEN i % 10 < 3 THEN 'x' WHEN i % 10 < 7 THEN 'y' WHEN i % 10 = 7 THEN 'w' || (i % 20) ELSE 'r' || i END,
          i % 3 = 0
        FROM range({first}, {last}) r(i)""")
    return db


@pytest.fixture
def db():
    db = make_db(1, 90)
    yield db
    db.con.close()


def column(db, name: str) -> list:
    return [r[0] for r in db.con.execute(f"SELECT {name} FROM t ORDER BY id").fetchall()]


# -- naive evaluators ------------------------------------------------------------------------------
def quantile_edges(values: list, bins: int) -> list[float]:
    present = np.array([v for v in values if v is not None], dtype=np.float64)
    return list(np.quantile(present, np.linspace(0, 1, bins + 1)))


def ple(values: list, edges: list[float]) -> np.ndarray:
    """Gorishniy et al.'s piecewise-linear encoding, the first bin open below and the last above."""
    bins = len(edges) - 1
    out = np.zeros((len(values), bins + 1))
    for r, x in enumerate(values):
        if x is None:
            out[r, bins] = 1.0
            continue
        for i in range(bins):
            low, high = edges[i], edges[i + 1]
            if high <= low:
                out[r, i] = 1.0 if x >= high else 0.0
            elif i > 0 and x < low:
                out[r, i] = 0.0
            elif i < bins - 1 and x >= high:
                out[r, i] = 1.0
            else:
                out[r, i] = (x - low) / (high - low)
    return out


def seconds(value) -> float:
    if isinstance(value, dt.datetime):
        return (value - EPOCH).total_seconds()
    return (value - EPOCH.date()).days * 86400.0


def year_stats(values: list) -> tuple[float, float]:
    years = np.array([seconds(v) / YEAR + 1970 for v in values if v is not None])
    return float(years.mean()), float(years.std() or 1.0)


def calendar(values: list, timestamp: bool, mean: float, std: float) -> np.ndarray:
    rows = []
    for v in values:
        width = 10 if timestamp else 8
        if v is None:
            rows.append([0.0] * (width - 1) + [1.0])
            continue
        parts = [(v.month - 1) / 12, (v.isoweekday() % 7) / 7, (v.day - 1) / 31]
        if timestamp:
            parts.append(v.hour / 24)
        row = [f(2 * math.pi * p) for p in parts for f in (math.sin, math.cos)]
        rows.append(row + [(seconds(v) / YEAR + 1970 - mean) / std, 0.0])
    return np.array(rows)


def standardized(values: list, mean: float, std: float, nulls: bool) -> np.ndarray:
    out = [[0.0, 1.0] if v is None else [(v - mean) / std, 0.0] for v in values]
    return np.array(out if nulls else [[v] for v, _ in out])


def frequent(values: list, min_count: int) -> dict:
    """Codes: the non-NULL values in at least min_count rows, 1, 2, ... in value order (0: the rest)."""
    counts = Counter(v for v in values if v is not None)
    return {v: i + 1 for i, v in enumerate(sorted(v for v, n in counts.items() if n >= min_count))}


# -- full batch ------------------------------------------------------------------------------------
def compiled(db, expression: str, presets: Presets | None = None) -> relsql.CompiledNet:
    template = relsql.Template.from_sql(f"CREATE TABLE f AS SELECT t.id, {expression} FROM t;")
    if presets is None:
        return relsql.compile(template, db, dtype=torch.float64)
    grounding = ground(template, db, presets=presets, progress=False)
    return CompiledNet(make_plan(template, grounding, torch.float64), grounding, torch.float64)


def test_ple_equals_naive_with_quantile_edges_from_the_database(db):
    net = compiled(db, "ple(t.a, 8)")
    values = column(db, "a")
    edges = quantile_edges(values, 8)
    stats = net.grounding.feature_stats["f#0:0"]
    assert stats["kind"] == "ple" and np.allclose(stats["edges"], edges, rtol=0, atol=1e-12)
    assert edges[0] == edges[1] == 0.0  # ties: a zero-width bin is a step
    got = net()["f"].numpy()
    assert got.shape == (89, 9)
    assert np.allclose(got, ple(values, edges), rtol=0, atol=1e-10)


def test_ple_of_several_columns_concatenates(db):
    net = compiled(db, "ple(t.a, epoch(t.s), 3)")
    a, s = column(db, "a"), [seconds(v) for v in column(db, "s")]
    expected = np.hstack([ple(a, quantile_edges(a, 3)), ple(s, quantile_edges(s, 3))])
    assert np.allclose(net()["f"].numpy(), expected, rtol=0, atol=1e-9)


def test_calendar_of_dates_and_timestamps_equals_naive(db):
    net = compiled(db, "concat(calendar(t.d), calendar(t.s))")
    d, s = column(db, "d"), column(db, "s")
    expected = np.hstack([calendar(d, False, *year_stats(d)), calendar(s, True, *year_stats(s))])
    got = net()["f"].numpy()
    assert got.shape == (89, 18)
    assert np.allclose(got, expected, rtol=0, atol=1e-9)


def test_features_takes_an_expression_such_as_an_age(db):
    net = compiled(db, "features(epoch(t.s) - epoch(t.d))")
    age = [None if d is None else seconds(s) - seconds(d) for s, d in zip(column(db, "s"), column(db, "d"))]
    present = np.array([v for v in age if v is not None])
    expected = standardized(age, present.mean(), present.std(), True)
    assert np.allclose(net()["f"].numpy(), expected, rtol=0, atol=1e-10)


def test_embed_min_count_shares_one_row_for_rare_values_and_null(db):
    net = compiled(db, "embed(t.c, 3, 'e', min_count=3)")
    values = column(db, "c")
    codes = frequent(values, 3)
    dictionary = net.dictionary("e")
    assert dictionary["value"].to_list() == [None, *codes] and dictionary["code"].to_list() == list(range(len(codes) + 1))
    table = net.named_weights()["e"].detach().numpy()
    assert table.shape == (len(codes) + 1, 3)
    expected = table[[codes.get(v, 0) for v in values]]
    assert np.array_equal(net()["f"].detach().numpy(), expected)
    assert sum(codes.get(v, 0) == 0 for v in values) > 3  # several rare values share row 0


def test_embed_without_min_count_keeps_its_meaning(db):
    net = compiled(db, "embed(t.c, 3, 'e')")
    assert net.dictionary("e")["value"].to_list() == sorted(set(column(db, "c")))


# -- mini-batches and saved models -----------------------------------------------------------------
MODEL = ("CREATE TABLE f AS SELECT t.id, linear(concat(ple(t.a, 6), calendar(t.d), calendar(t.s), "
         "embed(t.c, 3, 'e', min_count=3), features(epoch(t.s) - epoch(t.d))), 1, 'out') AS h FROM t;")


def model(db, **kwargs) -> relsql.Model:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return relsql.Model(db, relsql.Template.from_sql(MODEL), "t.y", dtype=torch.float64, progress=False, **kwargs)


def statistics(db) -> dict:
    """What the model is built with, computed naively from the building database's rows."""
    a, d, s, c = column(db, "a"), column(db, "d"), column(db, "s"), column(db, "c")
    age = np.array([seconds(x) - seconds(y) for x, y in zip(s, d) if y is not None])
    return {"edges": quantile_edges(a, 6), "d": year_stats(d), "s": year_stats(s), "codes": frequent(c, 3),
            "age": (age.mean(), age.std())}


def naive_probability(db, stats: dict, weights: dict) -> np.ndarray:
    d, s = column(db, "d"), column(db, "s")
    age = [None if y is None else seconds(x) - seconds(y) for x, y in zip(s, d)]
    table = weights["e"].detach().numpy()
    x = np.hstack([ple(column(db, "a"), stats["edges"]), calendar(d, False, *stats["d"]), calendar(s, True, *stats["s"]),
                   table[[stats["codes"].get(v, 0) for v in column(db, "c")]], standardized(age, *stats["age"], True)])
    return 1 / (1 + np.exp(-(x @ weights["out"].detach().numpy().T)[:, 0]))


def test_mini_batches_and_a_saved_model_on_other_data_equal_naive(db, tmp_path):
    full, batched = model(db), model(db, batch_size=7)
    weights = full.net.named_weights()
    assert all(torch.equal(weights[n], w) for n, w in batched.net.named_weights().items())
    stats = statistics(db)
    expected = naive_probability(db, stats, weights)
    for m in (full, batched):
        assert np.allclose(m.predict()["probability"].to_numpy(), expected, rtol=0, atol=1e-10)
    path = full.save(tmp_path / "m.relsql")
    other = make_db(60, 160, shift=40.0)  # new categories, values beyond the bins, other dates
    try:
        for batch_size in (None, 9):
            loaded = relsql.Model.load(path, other, batch_size=batch_size)
            got = loaded.predict()["probability"].to_numpy()
            assert np.allclose(got, naive_probability(other, stats, weights), rtol=0, atol=1e-10)
            assert not np.allclose(got, naive_probability(other, statistics(other), weights), rtol=0, atol=1e-6)
    finally:
        other.con.close()


def test_unseen_categories_read_the_rare_row_not_zeros(db, tmp_path):
    net = compiled(db, "embed(t.c, 3, 'e', min_count=3)")
    other = make_db(200, 230)
    try:
        again = compiled(other, "embed(t.c, 3, 'e', min_count=3)",
                         Presets(net.grounding.dictionaries, net.grounding.feature_stats))
        again.set_named_weights({"e": net.named_weights()["e"].detach()})
        table = net.named_weights()["e"].detach().numpy()
        codes = frequent(column(db, "c"), 3)
        unseen = [v for v in column(other, "c") if v not in codes]
        assert unseen
        expected = table[[codes.get(v, 0) for v in column(other, "c")]]
        assert np.array_equal(again()["f"].detach().numpy(), expected)
        assert again.dictionary("e").height == len(codes) + 1  # the dictionary did not grow
    finally:
        other.con.close()


# -- refusals --------------------------------------------------------------------------------------
@pytest.mark.parametrize("expression, error, match", [
    ("ple(t.c, 4)", relsql.SchemaError, r"ple\(t.c\).*numeric"),
    ("calendar(t.a)", relsql.SchemaError, r"calendar\(t.a\).*date or timestamp"),
])
def test_wrong_column_kinds_are_refused(db, expression, error, match):
    with pytest.raises(error, match=match):
        compiled(db, expression)


@pytest.mark.parametrize("expression", [
    "ple(t.a, 0)", "ple(t.a)", "ple(t.a, 5000)", "calendar()", "features(3)", "features(sum(t.a))",
    "embed(t.c, 3, min_count=0)", "embed(t.c, 3, storage='database', min_count=2)", "embed(t.c, 3, colour=2)",
])
def test_bad_arguments_are_template_errors(expression):
    with pytest.raises(relsql.TemplateError):
        relsql.Template.from_sql(f"CREATE TABLE f AS SELECT t.id, {expression} FROM t;")


def test_damaged_saved_edges_are_refused(db):
    net = compiled(db, "ple(t.a, 4)")
    stats = {k: {**v, "edges": [3.0, 1.0, 2.0, 4.0, 5.0]} for k, v in net.grounding.feature_stats.items()}
    with pytest.raises(relsql.RelsqlError, match="bin edges are damaged"):
        compiled(db, "ple(t.a, 4)", Presets({}, stats))


def test_infinite_values_are_refused(db):
    db.execute("UPDATE t SET a = 'inf'::DOUBLE WHERE id = 5")
    with pytest.raises(relsql.SchemaError, match="infinite"):
        compiled(db, "ple(t.a, 4)")


# -- text ------------------------------------------------------------------------------------------
def naive_text_ids(value: str | None, buckets: int, length: int) -> list[int]:
    """Words (runs of letters, digits, _; lower case), then each `<word>`'s 3-grams, CRC-32 hashed."""
    if value is None:
        return []
    words = re.findall(r"\w+", value.lower())
    grams = [("<" + w + ">")[i:i + 3] for w in words for i in range(len(w))]
    names = ["w " + w for w in words] + ["g " + g for g in grams]
    return [zlib.crc32(n.encode("utf-8")) % buckets for n in names][:length]


def naive_text(values: list, table: np.ndarray, buckets: int, length: int) -> np.ndarray:
    out = np.zeros((len(values), table.shape[1]))
    for r, value in enumerate(values):
        ids = naive_text_ids(value, buckets, length)
        if ids:
            out[r] = sum(table[i] for i in ids) / len(ids)
    return out


@pytest.fixture
def texts():
    db = relsql.connect()
    db.execute("CREATE TABLE t(id INT PRIMARY KEY, note VARCHAR, y BOOLEAN)")
    db.execute("""INSERT INTO t SELECT i, CASE WHEN i % 13 = 0 THEN NULL WHEN i % 17 = 0 THEN '!!' ELSE
                  concat_ws(' ', ['red', 'Blue', 'green', 'ÉTÉ'][i % 4 + 1], 'item_' || (i % 7), ['a', 'bb'][i % 2 + 1]) END,
                  i % 4 = 0 FROM range(1, 70) r(i)""")
    yield db
    db.con.close()


def test_text_is_the_mean_of_hashed_word_and_trigram_vectors(texts):
    net = compiled(texts, "text(t.note, 4, 'tx', buckets=97, tokens=9)")
    table = net.named_weights()["tx"].detach().numpy()
    assert table.shape == (98, 4)
    values = column(texts, "note")
    got = net()["f"].detach().numpy()
    assert np.allclose(got, naive_text(values, table, 97, 9), rtol=0, atol=1e-12)
    assert not got[[v is None or v == "!!" for v in values]].any()  # no words: a zero vector


TEXT_MODEL = "CREATE TABLE f AS SELECT t.id, linear(tanh(text(t.note, 5, 'tx', buckets=61)), 1, 'out') AS h FROM t;"


def test_text_in_mini_batches_and_a_saved_model_equals_naive(texts, tmp_path):
    def build(**kwargs):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return relsql.Model(texts, relsql.Template.from_sql(TEXT_MODEL), "t.y", dtype=torch.float64, progress=False,
                                **kwargs)

    full, batched = build(), build(batch_size=8)
    weights = full.net.named_weights()
    hidden = np.tanh(naive_text(column(texts, "note"), weights["tx"].detach().numpy(), 61, 128))
    expected = 1 / (1 + np.exp(-(hidden @ weights["out"].detach().numpy().T)[:, 0]))
    for m in (full, batched, relsql.Model.load(full.save(tmp_path / "t.relsql"), texts, batch_size=5)):
        assert np.allclose(m.predict()["probability"].to_numpy(), expected, rtol=0, atol=1e-10)


def test_text_of_a_number_is_refused(db):
    with pytest.raises(relsql.SchemaError, match=r"text\(t.a\) needs a text column"):
        compiled(db, "text(t.a, 4)")


@pytest.mark.parametrize("expression", ["text(t.c)", "text(t.c, 0)", "text(t.c, 4, colour=3)", "text(t.c, 4, tokens=5000)"])
def test_bad_text_arguments_are_template_errors(expression):
    with pytest.raises(relsql.TemplateError):
        relsql.Template.from_sql(f"CREATE TABLE f AS SELECT t.id, {expression} FROM t;")


# -- lists -----------------------------------------------------------------------------------------
@pytest.fixture
def lists():
    db = relsql.connect()
    db.execute("CREATE TABLE t(id INT PRIMARY KEY, xs DOUBLE[], codes INTEGER[], y BOOLEAN)")
    db.execute("""INSERT INTO t SELECT i,
                  CASE WHEN i % 11 = 0 THEN NULL WHEN i % 7 = 0 THEN [] ELSE [i * 0.5, (i * 13 % 17) - 8.0, sin(i)] END,
                  CASE WHEN i % 9 = 0 THEN NULL ELSE [i % 5, i % 3 + 10, NULL, i % 5] END, i % 2 = 0
                  FROM range(1, 60) r(i)""")
    yield db
    db.con.close()


def test_numeric_lists_through_features_of_list_aggregates(lists):
    net = compiled(lists, "features(list_avg(t.xs), list_min(t.xs), list_max(t.xs), len(t.xs))")
    xs = column(lists, "xs")
    parts = [[None if not x else f(x) for x in xs] for f in (np.mean, min, max)] + [[None if x is None else len(x) for x in xs]]
    expected = []
    for values in parts:
        present = np.array([v for v in values if v is not None], dtype=float)
        expected.append(standardized(values, present.mean(), present.std(), True))
    assert np.allclose(net()["f"].numpy(), np.hstack(expected), rtol=0, atol=1e-10)


def naive_bag(values: list, table: np.ndarray, buckets: int) -> np.ndarray:
    out = np.zeros((len(values), table.shape[1]))
    for r, value in enumerate(values):
        ids = [zlib.crc32(f"c {v}".encode()) % buckets for v in value or [] if v is not None]
        if ids:
            out[r] = sum(table[i] for i in ids) / len(ids)
    return out


def test_bag_of_codes_is_the_mean_of_hashed_element_vectors(lists, tmp_path):
    template = "CREATE TABLE f AS SELECT t.id, linear(bag(t.codes, 3, 'codes', buckets=31), 1, 'out') AS h FROM t;"
    net = compiled(lists, "bag(t.codes, 3, 'codes', buckets=31)")
    table = net.named_weights()["codes"].detach().numpy()
    assert np.allclose(net()["f"].detach().numpy(), naive_bag(column(lists, "codes"), table, 31), rtol=0, atol=1e-12)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        full = relsql.Model(lists, relsql.Template.from_sql(template), "t.y", dtype=torch.float64, progress=False)
        batched = relsql.Model(lists, relsql.Template.from_sql(template), "t.y", dtype=torch.float64, progress=False,
                               batch_size=6)
    weights = full.net.named_weights()
    hidden = naive_bag(column(lists, "codes"), weights["codes"].detach().numpy(), 31)
    expected = 1 / (1 + np.exp(-(hidden @ weights["out"].detach().numpy().T)[:, 0]))
    for m in (full, batched, relsql.Model.load(full.save(tmp_path / "b.relsql"), lists, batch_size=4)):
        assert np.allclose(m.predict()["probability"].to_numpy(), expected, rtol=0, atol=1e-10)


def test_bag_of_a_scalar_column_is_refused(db):
    with pytest.raises(relsql.SchemaError, match=r"bag\(t.c\) needs a list column"):
        compiled(db, "bag(t.c, 4)")


# -- default-size tables ---------------------------------------------------------------------------
@pytest.mark.parametrize("fn", ["text", "bag"])
def test_default_buckets_train_in_full_and_mini_batches_and_reload(fn, texts, lists, tmp_path):
    """The default 2**16 buckets make a table larger than shape inference builds in full (it stands
    in one row), so its padding id must still be a row there; trained models then equal the naive
    evaluator with their own weights, batched or not, and after save/load."""
    db, col, naive = (texts, "note", lambda v, w: naive_text(v, w, 2**16, 128)) if fn == "text" \
        else (lists, "codes", lambda v, w: naive_bag(v, w, 2**16))
    template = relsql.Template.from_sql(f"CREATE TABLE f AS SELECT t.id, linear({fn}(t.{col}, 3, 'tb'), 1, 'out') AS h FROM t;")
    values = column(db, col)
    for batch_size in (None, 10):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            m = relsql.Model(db, template, "t.y", dtype=torch.float64, progress=False)
            before = m.net.named_weights()["tb"].detach().clone()
            m.fit(epochs=3, batch_size=batch_size, lr=0.1)
        weights = m.net.named_weights()
        assert weights["tb"].shape == (2**16 + 1, 3)
        assert not torch.equal(weights["tb"], before)  # the table trained
        hidden = naive(values, weights["tb"].detach().numpy())
        expected = 1 / (1 + np.exp(-(hidden @ weights["out"].detach().numpy().T)[:, 0]))
        got = m.predict()["probability"].to_numpy()
        assert np.allclose(got, expected, rtol=0, atol=1e-10)
        path = m.save(tmp_path / f"{fn}{batch_size}.relsql")
        for load_batch in (None, 7):
            loaded = relsql.Model.load(path, db, batch_size=load_batch).predict()["probability"].to_numpy()
            assert np.allclose(loaded, got, rtol=0, atol=1e-12)
