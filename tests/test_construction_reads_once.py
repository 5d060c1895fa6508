"""What a construction reads once: an `embed(..., min_count=k)` dictionary made and filled in one
statement (its codes and types against a naive Python count and the column's own type), and the
catalog and relsql's table marks read once per `frozen_schema` block, never across blocks (a table
changed or written between two constructions is seen by the second)."""

from __future__ import annotations

import warnings
from collections import Counter

import duckdb
import pyarrow as pa
import pytest

import relsql
from relsql.data.keys import schema
from relsql.ground.execute import ground
from relsql.template import ir

ROWS = {  # id: (a VARCHAR, b INTEGER, c DECIMAL(6,2)); NULLs, values at exactly min_count and one below
    1: ("x", 7, "1.50"), 2: ("x", 7, "1.50"), 3: ("y", 7, "1.50"), 4: ("y", None, "2.25"), 5: (None, 3, "2.25"),
    6: (None, 3, "2.25"), 7: ("z", 3, None), 8: ("w", 9, None), 9: ("w", 9, None), 10: ("v", None, "9.00"),
    11: ("x", 1, "0.10"), 12: ("y", 1, "0.10"),
}
TEMPLATE = ("CREATE TABLE f AS SELECT t.id, linear(concat(embed(t.a, 2, 'ea', min_count=2), embed(t.b, 2, 'eb', "
            "min_count=3), embed(t.c, 2, 'ec', min_count=2)), 1, 'out') AS h FROM t;")


@pytest.fixture
def db():
    con = duckdb.connect()
    con.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, a VARCHAR, b INTEGER, c DECIMAL(6,2), y DOUBLE)")
    con.executemany("INSERT INTO t VALUES (?, ?, ?, CAST(? AS DECIMAL(6,2)), ?)",
                    [(i, a, b, c, float(i)) for i, (a, b, c) in ROWS.items()])
    return relsql.connect(con)


def frequent(values: list, min_count: int) -> dict:
    """The codes by hand: non-NULL values in at least min_count rows get 1, 2, ... in value order."""
    counts = Counter(v for v in values if v is not None)
    return {v: i + 1 for i, v in enumerate(sorted(v for v, n in counts.items() if n >= min_count))}


def test_frequent_dictionaries_equal_a_naive_count_with_the_columns_types(db):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        template = relsql.Template.from_sql(TEMPLATE)
        grounding = ground(template, db, progress=False)
    types = db.arrow("SELECT a, b, c FROM t LIMIT 0").schema
    raw = db.arrow("SELECT id, a, b, c FROM t").to_pydict()
    rule = template.relations["f"].rules[0]
    coded = {weight: k for k, weight in ir.coded_columns(rule).items()}
    relation = grounding.relations["f"]
    ids = relation.keys.column("id").to_pylist()  # in row-id order
    (rule_grounding,) = relation.rules
    heads = [ids[h] for h in rule_grounding.head.tolist()]
    for weight, column, min_count in [("ea", "a", 2), ("eb", "b", 3), ("ec", "c", 2)]:
        codes = frequent(raw[column], min_count)
        assert len(codes) >= 2  # the data gives each column several frequent values, rare ones and NULLs
        table = grounding.dictionaries[weight]
        assert table.schema == pa.schema([("value", types.field(column).type), ("code", pa.int32())])
        assert table.column("value").to_pylist() == [None, *codes]
        assert table.column("code").to_pylist() == list(range(len(codes) + 1))
        by_id = dict(zip(raw["id"], raw[column]))
        got = rule_grounding.columns[coded[weight]].tolist()
        assert got == [codes.get(by_id[i], 0) for i in heads]  # rare values and NULL read row 0


def test_catalog_is_read_once_within_a_block_and_again_in_the_next(db):
    with db.frozen_schema():
        first = db.catalog()
        first.tables.pop("t")  # the caller's own dict: the block's reading is not changed by it
        again = db.catalog()
        assert again["t"].rows == len(ROWS) and again.names == ["t"]
    db.con.execute("INSERT INTO t VALUES (100, 'x', 7, 1.5, 1.0)")
    db.con.execute("CREATE TABLE u (k INTEGER)")
    with db.frozen_schema():  # a new construction: the table's new row and the new table are seen
        after = db.catalog()
        assert after["t"].rows == len(ROWS) + 1 and after.names == ["t", "u"]
    assert db.catalog()["t"].rows == len(ROWS) + 1  # outside a block, always read


def test_written_kinds_equal_each_tables_mark_and_are_read_again_after_a_write(db):
    db.write_table("plain", pa.table({"k": [1, 2]}))
    db.write_table("p", pa.table({"id": [1, 2], "pred": [0.5, 0.25]}), kind="predictions")
    db.con.execute("CREATE TABLE own (k INTEGER)")
    db.con.execute("COMMENT ON TABLE own IS 'a comment of the user''s'")
    db.con.execute("CREATE VIEW v AS SELECT id FROM t")
    marked = {name: db.written_kind(name) for name in db.tables() if db.written_kind(name) is not None}
    assert marked == {"plain": "table", "p": "predictions"}
    with db.frozen_schema():
        assert db.written_kinds() == marked
        assert schema(db, db.catalog(), infer=False).outputs == ["p"]
        db.write_table("q", pa.table({"id": [1], "pred": [1.0]}), kind="predictions")  # not seen inside this block
        assert "q" not in db.written_kinds()
    with db.frozen_schema():
        assert db.written_kinds() == {**marked, "q": "predictions"}
        assert sorted(schema(db, db.catalog(), infer=False).outputs) == ["p", "q"]
