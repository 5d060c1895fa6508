"""Leakage checks (relsql/train/task/leakage.py): columns that copy the label."""

from __future__ import annotations

import duckdb

import relsql


def test_copies_of_the_label_are_found_across_number_types_without_failing_comparisons(monkeypatch):
    """A 0/1 integer copy of a boolean label counts as a copy; a text column is never compared with
    it (the comparison would fail, and Spark logs every failed job)."""
    from relsql.train.task.leakage import copies_of

    db = relsql.connect()
    db.execute("CREATE TABLE c AS SELECT i AS id, i % 3 = 0 AS churned, (i % 3 = 0)::INTEGER AS flag01, "
               "i % 2 AS other, 'x' || i AS note FROM range(50) t(i)")
    failures = []
    arrow = db.arrow

    def counted(query):
        try:
            return arrow(query)
        except Exception as err:
            failures.append(err)
            raise

    monkeypatch.setattr(db, "arrow", counted)
    assert copies_of(db, "c", "churned") == {"flag01"}
    assert failures == []


# -- an earlier row's label (Template.auto's siblings): accepted only in its one shape -----------------------
def _sibling_reads(value: str, time_column: str | None = "ts") -> list[str]:
    """The target reads of a template whose second statement gives each row its group's other rows'
    `value` (a lateral row's column, as Template.auto writes it)."""
    from relsql.train.task.leakage import target_reads

    db = relsql.connect()
    db.execute("CREATE TABLE t AS SELECT i AS id, DATE '2020-01-01' + i::INTEGER AS ts, i % 4 AS g, i * 0.5 AS y "
               "FROM range(20) r(i)")
    template = relsql.Template.from_sql(f"""
CREATE TABLE base AS SELECT t.id, t.ts, linear(features(t.g), 2, 'w_base') AS h FROM t;
CREATE TABLE sib AS
SELECT p.id, p.ts, avg(linear(ag.v, 2, 'w_sib')) AS h
FROM base p JOIN t q ON q.id = p.id JOIN t x ON x.g = q.g AND x.id <> p.id
CROSS JOIN LATERAL (SELECT {value} AS v) ag
GROUP BY p.id, p.ts;
""")
    return target_reads(template, db, "t", "y", time_column)


def test_an_earlier_rows_label_is_accepted_only_under_a_strict_cut_by_the_heads_time():
    earlier = "CASE WHEN x.ts < p.ts THEN x.y ELSE 0 END"
    assert _sibling_reads(earlier) == []
    assert _sibling_reads(earlier, time_column=None)  # no time: not known to be earlier
    assert _sibling_reads("x.y")  # a read inside a lateral row is a read (it was not seen before)
    assert _sibling_reads("CASE WHEN x.ts <= p.ts THEN x.y ELSE 0 END")  # the same time: the row's own label too
    assert _sibling_reads("CASE WHEN x.ts < DATE '2030-01-01' THEN x.y ELSE 0 END")  # not the head's time
    assert _sibling_reads("CASE WHEN x.ts < p.ts THEN 0 ELSE x.y END")  # the later rows' branch
    assert _sibling_reads("CASE WHEN q.ts < p.ts THEN x.y ELSE 0 END")  # another row's time
    assert _sibling_reads("CASE WHEN x.g < p.ts THEN x.y ELSE 0 END", time_column="ts")  # not the time column
    assert _sibling_reads("CASE WHEN x.ts < p.ts THEN x.y ELSE 0 END + x.y")  # a second read, outside


def _naive_copies(con, table: str, column: str, candidates: list[str]) -> set[str]:
    """A column per query, compared in Python: equal to `column` on every row where it is not NULL."""
    copies = set()
    for name in candidates:
        pairs = con.execute(f'SELECT "{name}", "{column}" FROM {table}').fetchall()
        if all(a == b and (a is None) == (b is None) for a, b in pairs if b is not None):
            copies.add(name.casefold())
    return copies


def test_one_query_finds_the_copies_a_query_per_column_finds(monkeypatch):
    """All candidate columns are counted in one statement; where that statement fails, a query per
    column decides, as it did for every column before. Both agree with a comparison in Python."""
    from relsql.train.task.leakage import copies_of

    db = relsql.connect()
    db.execute("CREATE TABLE t AS SELECT i AS id, CASE WHEN i % 5 = 0 THEN NULL ELSE i % 4 END AS y, "
               "i % 4 AS Copy, CASE WHEN i % 5 = 0 THEN NULL ELSE i % 4 END AS same_nulls, "
               "CASE WHEN i = 7 THEN 9 ELSE i % 4 END AS one_off, (i % 4)::DOUBLE AS as_double, "
               "CASE WHEN i % 5 = 1 THEN NULL ELSE i % 4 END AS missing, 'x' AS note FROM range(60) t(i)")
    numbers = ["id", "Copy", "same_nulls", "one_off", "as_double", "missing"]
    naive = _naive_copies(db.con, "t", "y", numbers)
    assert naive == {"copy", "same_nulls", "as_double"}
    queries = []
    arrow = db.arrow
    monkeypatch.setattr(db, "arrow", lambda query: queries.append(query) or arrow(query))
    assert copies_of(db, "t", "y") == naive
    assert len(queries) == 1

    def first_fails(query):
        queries.append(query)
        if len(queries) == 1:
            raise duckdb.ConversionException("a pair that cannot be compared")
        return arrow(query)

    queries.clear()
    monkeypatch.setattr(db, "arrow", first_fails)
    assert copies_of(db, "t", "y") == naive
    assert len(queries) == 1 + len(numbers)
    db.execute("CREATE TABLE e AS SELECT * FROM t WHERE false")  # no labelled rows: every candidate is a copy, as before
    monkeypatch.setattr(db, "arrow", arrow)
    assert copies_of(db, "e", "y") == {name.casefold() for name in numbers}
