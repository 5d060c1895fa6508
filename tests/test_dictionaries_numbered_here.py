"""An embedding dictionary that only one column reads is numbered in Python from the values grounding
read (relsql/ground/execute.py `code_here`, `number_here`) instead of built and looked up in SQL: the
same (value, code) rows and the same codes as a plain reference numbering, and the SQL path wherever
Python could number differently (shared dictionaries, a grouped rule, floating-point values, a text
collation)."""

from __future__ import annotations

import collections

import duckdb

import relsql
from relsql.ground import execute
from tests.tables import insert_rows

WORDS = ["b", "a", "B", "é", "Z", "a", None, "b", "é", "b", "zz", "Z", "a", None, "B", "é", "q", "Z"]


def _db(path) -> relsql.Database:
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE item(item_id INTEGER PRIMARY KEY, word VARCHAR, level BIGINT, ok BOOLEAN, ratio DOUBLE, "
                "y DOUBLE)")
    rows = [(i, w, [3, 1, 2, 1, None, 7][i % 6], [True, False, None][i % 3], [0.5, 0.25, -0.0, 0.0][i % 4], float(i % 5))
            for i, w in enumerate(WORDS)]
    insert_rows(con, "item", rows)
    con.execute("CREATE TABLE tag(tag_id INTEGER PRIMARY KEY, item_id INTEGER REFERENCES item(item_id), word VARCHAR)")
    insert_rows(con, "tag", [(i, i % len(WORDS), ["a", "x", "b", "x"][i % 4]) for i in range(30)])
    con.close()
    return relsql.connect(path)


def _reference(values: list, min_count: int) -> dict:
    """Code of each value: 0 for NULL and values on fewer than `min_count` rows, else 1, 2, ... in
    the order of the values' UTF-8 bytes (numbers and booleans: their order)."""
    counts = collections.Counter(v for v in values if v is not None)
    frequent = sorted((v for v, n in counts.items() if n >= min_count),
                      key=lambda v: v.encode() if isinstance(v, str) else v)
    return {v: i + 1 for i, v in enumerate(frequent)}


ENCODER = ("CREATE TABLE enc AS SELECT t.item_id, embed(t.word, 4, 'w_word', min_count=2) + embed(t.level, 4, 'w_level', "
           "min_count=2) + embed(t.ok, 4, 'w_ok', min_count=1) + embed(t.ratio, 4, 'w_ratio', min_count=1) AS h FROM item t;\n"
           "CREATE TABLE predict AS SELECT e.item_id, linear(e.h, 1, 'out') AS h FROM enc e;")


def _codes(grounding, relation: str, k: int) -> list[int]:
    return grounding.relations[relation].rules[0].columns[k].tolist()


def test_codes_and_dictionaries_match_a_reference_numbering(tmp_path):
    db = _db(tmp_path / "d.duckdb")
    grounding = execute.ground(relsql.Template.from_sql(ENCODER), db, progress=False)
    for k, (column, min_count) in enumerate([("word", 2), ("level", 2), ("ok", 1)]):
        values = [r[0] for r in db.con.execute(f'SELECT "{column}" FROM item ORDER BY item_id').fetchall()]
        codes = _reference(values, min_count)
        assert _codes(grounding, "enc", k) == [codes.get(v, 0) for v in values], column
        table = grounding.dictionaries[f"w_{column}"]
        assert table.column("code").to_pylist() == list(range(len(codes) + 1))
        assert table.column("value").to_pylist() == [None, *sorted(codes, key=codes.get)]
    assert grounding.dictionaries["w_word"].column("value").to_pylist() == [None, "B", "Z", "a", "b", "é"]
    # numbered in Python: no dictionary table for them; the DOUBLE column's (-0.0 and 0.0 are one value to DuckDB) in SQL
    assert not any(db.temp_exists(db.temp_table("d", w)) for w in ("w_word", "w_level", "w_ok"))
    assert db.temp_exists(db.temp_table("d", "w_ratio"))
    assert grounding.dictionaries["w_ratio"].num_rows == 4  # NULL, 0 (-0.0 too), 0.25, 0.5
    assert list(grounding.dictionaries) == ["w_word", "w_level", "w_ok", "w_ratio"]  # in the order of first use


def test_the_same_codes_as_the_sql_path(tmp_path, monkeypatch):
    db = _db(tmp_path / "d.duckdb")
    template = relsql.Template.from_sql(ENCODER)
    here = execute.ground(template, db, progress=False)
    monkeypatch.setattr(execute.Grounder, "code_here", lambda *args, **kwargs: False)
    other = _db(tmp_path / "e.duckdb")
    sql = execute.ground(template, other, progress=False)
    assert list(here.dictionaries) == list(sql.dictionaries)
    for weight in sql.dictionaries:
        assert here.dictionaries[weight].equals(sql.dictionaries[weight]), weight
    for k in range(4):
        assert _codes(here, "enc", k) == _codes(sql, "enc", k)


def test_a_dictionary_two_statements_read_stays_in_sql(tmp_path):
    db = _db(tmp_path / "d.duckdb")
    text = ("CREATE TABLE enc AS SELECT t.item_id, embed(t.word, 4, 'w_word', min_count=2) AS h FROM item t;\n"
            "CREATE TABLE tags AS SELECT g.tag_id, embed(g.word, 4, 'w_word', min_count=2) AS h FROM tag g;\n"
            "CREATE TABLE predict AS SELECT e.item_id, linear(e.h, 1, 'out') AS h FROM enc e;\n"
            "CREATE TABLE predict AS SELECT g.item_id, avg(linear(s.h, 1, 'out2')) AS h FROM tag g "
            "JOIN tags s ON s.tag_id = g.tag_id GROUP BY g.item_id;")
    grounding = execute.ground(relsql.Template.from_sql(text), db, progress=False)
    assert db.temp_exists(db.temp_table("d", "w_word"))
    codes = _reference(WORDS, 2)  # fixed by the first statement's values: "x" is unseen there
    assert _codes(grounding, "tags", 0) == [codes.get(["a", "x", "b", "x"][i % 4], 0) for i in range(30)]


def test_a_text_collation_keeps_the_sql_path(tmp_path):
    db = _db(tmp_path / "d.duckdb")
    db.con.execute("SET default_collation = 'nocase'")
    grounding = execute.ground(relsql.Template.from_sql(ENCODER), db, progress=False)
    assert db.temp_exists(db.temp_table("d", "w_word"))
    words = grounding.dictionaries["w_word"].column("value").to_pylist()
    assert len(words) == 1 + len({w.lower() for w in WORDS if w is not None and
                                  sum(x is not None and x.lower() == w.lower() for x in WORDS) >= 2})


def test_a_grouped_rule_keeps_the_sql_path(tmp_path):
    db = _db(tmp_path / "d.duckdb")
    text = ("CREATE TABLE predict AS SELECT g.item_id, avg(embed(g.word, 4, 'w_tag', min_count=2)) AS h FROM tag g "
            "GROUP BY g.item_id;")
    execute.ground(relsql.Template.from_sql(text), db, progress=False)
    assert db.temp_exists(db.temp_table("d", "w_tag"))
