"""A loaded model's predict(keys=) makes its small embedding dictionaries and the asked keys from
typed literals (relsql/ground/inline.py) instead of registered Arrow tables, reads the
dictionaries back one query per value type (`BatchGrounder._read_dictionaries`) and codes an
ungrouped rule's fixed embeddings in Python (`_coded_here`, `_codes`): the rows DuckDB reads equal
those of the registered table, and predictions and dictionaries equal the built model's, with
rare values (the rare row 0), NULLs, quotes and backslashes in the embedded columns."""

from __future__ import annotations

import duckdb
import numpy as np
import polars as pl
import pyarrow as pa
import pytest
import torch

import relsql
from relsql.data.duckdb import fetch_arrow
from relsql.ground import inline
from tests.tables import insert_rows

TEXTS = ["it's", "back\\slash", "ünï 字", "a'; DROP TABLE players; --", "", None]

TEMPLATE = """
CREATE TABLE event_h AS
SELECT e.event_id,
       tanh(linear(features(e.x), 4, 'w_x') + embed(e.kind, 4, 'w_kind', min_count=2)
            + embed(e.code, 4, 'w_code', min_count=2) + embed(e.flag, 4, 'w_flag', min_count=1))
FROM events e;
CREATE TABLE player_h AS
SELECT p.pid, tanh(embed(p.team, 4, 'w_team', min_count=1) + embed(p.born, 4, 'w_born', min_count=2)
                   + embed(p.hand, 4, 'w_hand'))
FROM players p;
CREATE TABLE kinds AS
SELECT e.pid, avg(tanh(embed(e.kind, 4, 'w_kind', min_count=2))) FROM events e GROUP BY e.pid;
CREATE TABLE predict AS
SELECT p.pid, linear(k.h, 3, 'w_k') FROM players p JOIN kinds k ON k.pid = p.pid;
CREATE TABLE predict AS
SELECT p.pid, linear(avg(eh.h), 3, 'w_out')
FROM players p JOIN events e ON e.pid = p.pid JOIN event_h eh ON eh.event_id = e.event_id GROUP BY p.pid;
CREATE TABLE predict AS
SELECT p.pid, linear(ph.h, 3, 'w_p') FROM players p JOIN player_h ph ON ph.pid = p.pid;
"""

# the dictionaries a loaded model makes from literals: min_count, so fixed by the file (w_hand has none);
# w_kind is coded in Python for event_h, looked up in SQL for the grouped `kinds` (so made as a table too)
LITERAL = {"w_kind", "w_code", "w_flag", "w_team", "w_born"}


def test_rows_query_reads_as_the_registered_table():
    """The oracle: DuckDB's own reading of the same Arrow table registered."""
    table = pa.table({
        "s": pa.array(TEXTS, pa.large_string()),
        "i": pa.array([-(2**63), 2**62, 0, None, 7, -1], pa.int64()),
        "u": pa.array([2**64 - 1, 0, None, 3, 4, 5], pa.uint64()),
        "t": pa.array([1, None, -128, 127, 0, 2], pa.int8()),
        "b": pa.array([True, False, None, True, True, False]),
    })
    con = duckdb.connect()
    con.register("registered", table)
    want = fetch_arrow(con, "SELECT * FROM registered")
    query = inline.rows_query(table)
    assert query is not None
    got = fetch_arrow(con, query.sql("duckdb"))
    assert got.schema == want.schema
    assert got.to_pylist() == want.to_pylist()


@pytest.mark.parametrize("table", [
    pa.table({"s": pa.array([], pa.string())}),  # no rows: VALUES needs one
    pa.table({"x": pa.array([1.5, 2.0])}),  # a type not written as literals
    pa.table({"s": pa.array(["nul\x00inside"])}),  # text DuckDB's literal cannot hold
])
def test_rows_query_declines(table):
    assert inline.rows_query(table) is None


def test_rows_query_limit():
    table = pa.table({"i": pa.array(range(10), pa.int32())})
    assert inline.rows_query(table, limit=9) is None
    assert inline.rows_query(table, limit=10) is not None


def _build(path):
    rng = np.random.default_rng(11)
    db = relsql.connect(path)
    db.execute("CREATE TABLE players(pid INT PRIMARY KEY, team VARCHAR, hand VARCHAR, born INT, won BOOLEAN)")
    db.execute("CREATE TABLE events(event_id INT PRIMARY KEY, pid INT, x DOUBLE, kind VARCHAR, code BIGINT, flag BOOLEAN)")
    players, events = [], []
    for pid in range(60):
        players.append((pid, TEXTS[pid % len(TEXTS)], ["L", "R", None][pid % 3], 1950 + pid % 7 if pid % 11 else None,
                        None if pid % 10 == 0 else bool(rng.random() < 0.5)))
        for _ in range(int(rng.integers(1, 4))):
            e = len(events)
            events.append((e, pid, float(rng.normal()), ["x'y", "z", "w\\", None][e % 4] if e else "once",
                           [2**40, -5, None, 12][e % 4], [True, False, None][e % 3]))
    insert_rows(db, "players", players)
    insert_rows(db, "events", events)
    return db


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    folder = tmp_path_factory.mktemp("load_rows_literals")
    db = _build(folder / "p.duckdb")
    model = relsql.Model(db, relsql.Template.from_sql(TEMPLATE), target="players.won", seed=2, dtype=torch.float64,
                         progress=False)
    model.fit(epochs=2, hybrid=False)
    path = model.save(folder / "m.pt")
    expected = model.predict()
    dictionaries = {w: t for w, t in model.learner.presets().dictionaries.items()}
    db.con.close()
    return folder, path, expected, dictionaries


@pytest.mark.parametrize("literals", [True, False])
def test_loaded_predict_keys_as_the_built_model(saved, monkeypatch, literals):
    folder, path, expected, dictionaries = saved
    if not literals:  # every table registered, as before: the same answers
        monkeypatch.setattr(inline, "MAX_ROWS", 0)
    db = relsql.connect(folder / "p.duckdb", read_only=True)
    loaded = relsql.Model.load(path, db)
    asked = expected.filter(pl.col("pid") % 4 != 1).sort("pid", descending=True).select("pid")
    got = loaded.predict(keys=asked)
    want = asked.join(expected, on="pid", how="left")
    assert got["pid"].to_list() == asked["pid"].to_list()
    np.testing.assert_allclose(got["probability"].to_numpy(), want["probability"].to_numpy(), rtol=0, atol=1e-12)
    assert got["split"].to_list() == want["split"].to_list()
    grounder = loaded.learner.pending.rows_batched.grounder
    assert grounder.sizes["predict"] == asked.height < expected.height
    assert set(grounder._small_kinds) | set(grounder._pending) == (LITERAL if literals else set())
    coded = {w for rules in grounder.prepared.values() for p in rules for w in p.coded.values()}
    if literals:  # VARCHAR's two read in one query; every fixed embedding's codes looked up in Python, w_hand's in SQL
        assert set(grounder._small_kinds) == {"w_kind"} and set(grounder._pending) == LITERAL - {"w_kind"}
        assert grounder._small_kinds["w_kind"] == grounder._pending["w_team"] == "VARCHAR"
        assert coded == LITERAL
    else:
        assert coded == set()
    assert set(grounder.dictionary_tables) == set(dictionaries)
    for weight, table in grounder.dictionary_tables.items():
        built = dictionaries[weight]
        assert table.schema.field("value").type == built.schema.field("value").type, weight
        assert table.column("value").to_pylist() == built.column("value").to_pylist(), weight
        assert table.column("code").to_pylist() == built.column("code").to_pylist(), weight
    db.close()
