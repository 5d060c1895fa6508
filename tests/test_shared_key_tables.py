"""Relations whose heads are known from their SQL to be an earlier relation's reuse its key table
(relsql/ground/domains.py, `Grounder.shared_keys`). The grounding must be the one each relation
builds for itself: checked against the path that builds every key table (sharing turned off), and
against the key table's definition (every key row is some rule's head, numbered in key order),
on Template.auto's templates of a database with a composite key and a time column, and on a
hand-written template with bodies that must not share (filters only, a right join,
other key names, heads computed from columns)."""

from __future__ import annotations

import warnings

import duckdb
import pytest
import sqlglot
import torch

import relsql
from relsql.ground import domains
from relsql.ground import execute as ex


def _db(path) -> relsql.Database:
    """Airports; hourly weather keyed by (origin, hour); planes; flights with a time column that
    reference all three (the weather by the composite key); some flights name a missing plane."""
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE airport(faa VARCHAR PRIMARY KEY, alt DOUBLE, kind VARCHAR)")
    con.execute("INSERT INTO airport VALUES ('EWR', 18, 'a'), ('JFK', 13, 'b'), ('LGA', 22, 'a'), ('BOS', 9, NULL)")
    con.execute("CREATE TABLE weather(origin VARCHAR REFERENCES airport(faa), hour TIMESTAMP, temp DOUBLE, wind INTEGER, "
                "PRIMARY KEY (origin, hour))")
    con.execute("INSERT INTO weather SELECT o, TIMESTAMP '2013-01-01' + INTERVAL (h) HOUR, (h % 24) * 1.5, h % 7 "
                "FROM (VALUES ('EWR'), ('JFK'), ('LGA')) v(o), range(40) r(h)")
    con.execute("CREATE TABLE plane(tailnum VARCHAR PRIMARY KEY, seats INTEGER, maker VARCHAR)")
    con.execute("INSERT INTO plane SELECT 'N' || i, 50 + (i * 37) % 200, ['x', 'y', 'z'][1 + i % 3] FROM range(25) r(i)")
    con.execute("CREATE TABLE flight(flight_id INTEGER PRIMARY KEY, origin VARCHAR REFERENCES airport(faa), "
                "dest VARCHAR REFERENCES airport(faa), tailnum VARCHAR REFERENCES plane(tailnum), hour TIMESTAMP, "
                "dist DOUBLE, late DOUBLE, FOREIGN KEY (origin, hour) REFERENCES weather(origin, hour))")
    con.execute("INSERT INTO flight SELECT i, ['EWR', 'JFK', 'LGA'][1 + i % 3], ['BOS', 'JFK', 'LGA', 'EWR'][1 + i % 4], "
                "'N' || (i % 25), TIMESTAMP '2013-01-01' + INTERVAL (i % 40) HOUR, 100 + (i * 13) % 900, "
                "((i * 7) % 11) / 10.0 FROM range(300) r(i)")
    con.close()
    return relsql.connect(path)


HAND = """
CREATE TABLE enc_weather AS
SELECT w.origin, w.hour, tanh(linear(features(w.temp, w.wind), 4, 'w_enc_weather')) AS h FROM weather w;

-- every row of weather under inner and left joins, filters, grouping: enc_weather's heads
CREATE TABLE p_weather AS
SELECT e.origin, e.hour, linear(e.h, 4, 'w_pw_self') AS h FROM enc_weather e;
CREATE TABLE p_weather AS
SELECT w.origin, w.hour, avg(linear(f.dist, 4, 'w_pw_dist')) AS h
FROM weather w JOIN flight f ON f.origin = w.origin AND f.hour = w.hour LEFT JOIN airport a ON a.faa = w.origin
WHERE f.dist > 300 GROUP BY w.origin, w.hour;

CREATE TABLE h_weather AS
SELECT p.origin, p.hour, tanh(p.h) AS h FROM p_weather p;

-- only a filter: fewer heads than enc_weather (its own key table)
CREATE TABLE q_weather AS
SELECT e.origin, e.hour, linear(e.h, 4, 'w_q') AS h FROM enc_weather e WHERE e.hour >= TIMESTAMP '2013-01-01 20:00:00';

-- heads under a right join: an airport without weather gives a NULL head (its own key table)
CREATE TABLE r_weather AS
SELECT w.origin, w.hour, sum(linear(features(a.alt), 4, 'w_r')) AS h
FROM weather w RIGHT JOIN airport a ON a.faa = w.origin GROUP BY w.origin, w.hour;
CREATE TABLE r_weather AS
SELECT w.origin, w.hour, linear(features(w.temp), 4, 'w_r2') AS h FROM weather w;

-- the same rows under other key names (its own key table)
CREATE TABLE n_weather AS
SELECT e.origin AS o, e.hour AS t, linear(e.h, 4, 'w_n') AS h FROM enc_weather e;

-- a head computed from a column (its own key table)
CREATE TABLE c_weather AS
SELECT upper(e.origin) AS origin, e.hour, linear(e.h, 4, 'w_c') AS h FROM enc_weather e;

CREATE TABLE enc_flight AS
SELECT f.flight_id, tanh(linear(features(f.dist), 4, 'w_enc_flight') + embed(f.tailnum, 4, 'w_tail')) AS h FROM flight f;
CREATE TABLE x_flight AS
SELECT f.flight_id, avg(linear(h.h + q.h + r.h + n.h + c.h, 4, 'w_x')) AS h FROM flight f
JOIN h_weather h ON h.origin = f.origin AND h.hour = f.hour
JOIN q_weather q ON q.origin = f.origin AND q.hour = f.hour
JOIN r_weather r ON r.origin = f.origin AND r.hour = f.hour
JOIN n_weather n ON n.o = f.origin AND n.t = f.hour
JOIN c_weather c ON c.origin = f.origin AND c.hour = f.hour
GROUP BY f.flight_id;
CREATE TABLE predict AS
SELECT e.flight_id, linear(e.h, 1, 'w_out') AS h FROM enc_flight e;
CREATE TABLE predict AS
SELECT x.flight_id, linear(x.h, 1, 'w_out_x') AS h FROM x_flight x;
"""


def _ground(template, db, share: bool, monkeypatch) -> tuple[ex.Grounding, set[str]]:
    """The grounding, and the relations that reused an earlier key table."""
    shared: set[str] = set()
    original = ex.Grounder.shared_keys

    def recorded(self, relation, grounded):
        table, keys = original(self, relation, grounded)
        if table is not None:
            shared.add(relation.name)
        return table, keys

    with monkeypatch.context() as patch:
        patch.setattr(ex.Grounder, "shared_keys", recorded)
        if not share:
            patch.setattr(domains, "relation_domain", lambda rules: None)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return ex.ground(template, db, progress=False), shared


def _same(new: ex.Grounding, old: ex.Grounding) -> None:
    assert list(new.relations) == list(old.relations)
    for name, relation in new.relations.items():
        before = old.relations[name]
        assert relation.keys.equals(before.keys), name
        assert [r.rule.origin for r in relation.rules] == [r.rule.origin for r in before.rules], name
        for rule, was in zip(relation.rules, before.rules):
            for a, b in [(rule.head, was.head), (rule.segment_heads, was.segment_heads), (rule.offsets, was.offsets),
                         *zip(rule.refs, was.refs)]:
                assert torch.equal(a, b), (name, rule.rule.origin)
            assert rule.columns.keys() == was.columns.keys()
            for k in rule.columns:
                assert torch.equal(rule.columns[k], was.columns[k]), (name, rule.rule.origin, k)
    assert new.feature_stats == old.feature_stats
    assert new.dictionaries.keys() == old.dictionaries.keys()
    assert all(new.dictionaries[w].equals(old.dictionaries[w]) for w in new.dictionaries)


def _sort_key(value):
    return (value is not None, value)


def _defined(grounding: ex.Grounding) -> None:
    """Each key table as defined: its rows are exactly the heads of the relation's groundings
    (every row a head of some rule), distinct, and numbered 0..n-1 in key order, NULLs first."""
    for name, relation in grounding.relations.items():
        keys = [c for c in relation.keys.column_names if c != "_rid"]
        assert relation.keys.column("_rid").to_pylist() == list(range(relation.size)), name
        if not keys:
            continue
        heads = torch.cat([r.segment_heads for r in relation.rules]) if relation.rules else torch.zeros(0, dtype=torch.int64)
        assert torch.unique(heads).tolist() == list(range(relation.size)), name
        rows = list(zip(*[relation.keys.column(k).to_pylist() for k in keys]))
        assert len(set(rows)) == len(rows), name
        assert rows == sorted(rows, key=lambda row: tuple(_sort_key(v) for v in row)), name


def test_a_hand_written_template_shares_only_where_the_heads_are_the_same(tmp_path, monkeypatch):
    db = _db(tmp_path / "f.duckdb")
    template = relsql.Template.from_sql(HAND)
    new, shared = _ground(template, db, True, monkeypatch)
    old, none = _ground(template, db, False, monkeypatch)
    assert none == set()
    assert shared == {"p_weather", "h_weather"}  # and not q_, r_, n_, c_weather or the others
    _same(new, old)
    _defined(new)
    sizes = {n: r.size for n, r in new.relations.items()}
    assert sizes["p_weather"] == sizes["h_weather"] == sizes["enc_weather"] == 120
    assert sizes["q_weather"] < 120 and sizes["r_weather"] == 121


@pytest.mark.parametrize("time_column", [None, "hour"])
def test_template_auto_grounds_and_predicts_as_with_a_key_table_per_relation(tmp_path, monkeypatch, time_column):
    db = _db(tmp_path / "f.duckdb")
    template = relsql.Template.auto(db, target="flight.late", **({"time_column": time_column} if time_column else {}))
    new, shared = _ground(template, db, True, monkeypatch)
    old, _ = _ground(template, db, False, monkeypatch)
    assert shared  # Template.auto's h_ / p_ relations read their x_ / enc_ relation row for row
    _same(new, old)
    _defined(new)
    predictions = []
    for share in (True, False):
        with monkeypatch.context() as patch:
            if not share:
                patch.setattr(domains, "relation_domain", lambda rules: None)
            model = relsql.Model(db, template, target="flight.late", time_column=time_column, seed=3, progress=False)
            predictions.append(model.predict())
    assert predictions[0].equals(predictions[1])


def _domain(sql: str, relations=None):
    return domains.rule_domain(sqlglot.parse_one(sql, read="duckdb"), 2, relations or {})


def test_rule_domains_read_from_the_sql():
    relations = {"r": (["a", "b"], ("relation", "r")), "later": None}
    assert _domain('SELECT t.a AS "_h0", t.b AS "_h1" FROM T t') == (("table", "t", ("a", "b")), True)
    assert _domain('SELECT "T".A AS "_h0", t.b AS "_h1" FROM t') == (("table", "t", ("a", "b")), True)
    assert _domain('SELECT DISTINCT t.a AS "_h0", t.b AS "_h1" FROM s.t AS t') == (("table", "s.t", ("a", "b")), True)
    assert _domain('SELECT x.a AS "_h0", x.b AS "_h1" FROM r x', relations) == (("relation", "r"), True)
    within = ['SELECT t.a AS "_h0", t.b AS "_h1" FROM t WHERE t.a > 1',
              'SELECT t.a AS "_h0", t.b AS "_h1" FROM t JOIN u ON u.a = t.a GROUP BY t.a, t.b',
              'SELECT t.a AS "_h0", t.b AS "_h1" FROM t LEFT JOIN u ON u.a = t.a',
              'SELECT t.a AS "_h0", t.b AS "_h1" FROM t SEMI JOIN u ON u.a = t.a',
              'SELECT t.a AS "_h0", t.b AS "_h1" FROM t ASOF JOIN u ON u.a >= t.a',
              'SELECT t.a AS "_h0", t.b AS "_h1" FROM t LIMIT 3',
              'SELECT DISTINCT ON (t.a) t.a AS "_h0", t.b AS "_h1" FROM t']
    for sql in within:
        assert _domain(sql) == (("table", "t", ("a", "b")), False), sql
    nothing = ['SELECT t.a AS "_h0", t.b AS "_h1" FROM t RIGHT JOIN u ON u.a = t.a',
               'SELECT t.a AS "_h0", t.b AS "_h1" FROM t FULL OUTER JOIN u ON u.a = t.a',
               'SELECT t.a AS "_h0", t.b AS "_h1" FROM t POSITIONAL JOIN u',
               'SELECT t.a AS "_h0", t.b AS "_h1" FROM t GROUP BY ROLLUP (t.a, t.b)',
               'SELECT t.a AS "_h0", t.b AS "_h1" FROM t GROUP BY GROUPING SETS ((t.a), (t.a, t.b))',
               'SELECT t.a AS "_h0", u.b AS "_h1" FROM t JOIN u ON u.a = t.a',
               'SELECT t.a + 1 AS "_h0", t.b AS "_h1" FROM t',
               'SELECT t.a AS "_h0", t.b AS "_h1" FROM (SELECT * FROM t) t',
               'WITH t AS (SELECT 1 AS a, 2 AS b) SELECT t.a AS "_h0", t.b AS "_h1" FROM t',
               'SELECT t.a AS "_h0", t.b AS "_h1" FROM t UNION ALL SELECT t.a, t.b FROM t',
               'SELECT t.a AS "_h0", t.b AS "_h1" FROM t TABLESAMPLE (10 PERCENT)',
               'SELECT t.a AS "_h0" FROM t']
    for sql in nothing:
        assert _domain(sql) is None, sql
    assert _domain('SELECT x.b AS "_h0", x.a AS "_h1" FROM r x', relations) is None  # not the keys in order
    assert _domain('SELECT x.a AS "_h0", x.b AS "_h1" FROM later x', relations) is None  # not grounded yet
    cover, within_ = (("table", "t", ("a", "b")), True), (("table", "t", ("a", "b")), False)
    assert domains.relation_domain([within_, cover]) == ("table", "t", ("a", "b"))
    assert domains.relation_domain([within_, within_]) is None
    assert domains.relation_domain([cover, None]) is None
    assert domains.relation_domain([cover, (("table", "u", ("a", "b")), True)]) is None
    assert domains.relation_domain([]) is None


def test_an_earlier_relation_without_rows_is_not_shared(tmp_path, monkeypatch):
    """A relation without groundings has an empty key table: the next one with its heads builds its own."""
    db = _db(tmp_path / "f.duckdb")
    template = relsql.Template.from_sql("""
CREATE TABLE enc_weather AS
SELECT w.origin, w.hour, tanh(linear(features(w.temp), 4, 'w_e')) AS h FROM weather w WHERE w.temp > 1000;
CREATE TABLE h_weather AS SELECT e.origin, e.hour, tanh(e.h) AS h FROM enc_weather e;
CREATE TABLE enc_plane AS SELECT p.tailnum, tanh(linear(features(p.seats), 4, 'w_p')) AS h FROM plane p;
CREATE TABLE h_plane AS SELECT e.tailnum, tanh(e.h) AS h FROM enc_plane e;
CREATE TABLE predict AS SELECT f.flight_id, linear(h.h, 1, 'w_o') AS h FROM flight f JOIN h_plane h ON h.tailnum = f.tailnum;
""")
    grounding, shared = _ground(template, db, True, monkeypatch)
    assert grounding.relations["enc_weather"].size == grounding.relations["h_weather"].size == 0
    assert shared == {"h_plane"}
    old, _ = _ground(template, db, False, monkeypatch)
    _same(grounding, old)
    _defined(grounding)


def test_an_output_with_an_earlier_relations_heads_keeps_its_own_key_table(tmp_path):
    """The output reads every flight (enc_flight's heads), but training reads its key table by name
    (the labels, the key checks, the flat baselines): it is not shared, and the Model trains and
    predicts every flight, as the path that shares nothing does."""
    template = """
CREATE TABLE enc_flight AS
SELECT f.flight_id, tanh(linear(features(f.dist), 4, 'w_enc_flight')) AS h FROM flight f;
CREATE TABLE predict AS
SELECT e.flight_id, linear(e.h, 1, 'w_out') AS late FROM enc_flight e;
"""
    predictions = []
    for share in (True, False):
        db = _db(tmp_path / f"o{share}.duckdb")
        original = ex.Grounder.shared_keys
        if not share:
            def own_keys(self, relation, grounded, shared=original):
                shared(self, relation, grounded)  # records the relation's domain, as grounding does
                return None, None
            ex.Grounder.shared_keys = own_keys
        try:
            model = relsql.Model(db, relsql.Template.from_sql(template), target="flight.late", seed=1, progress=False)
            model.fit(epochs=3)
            predictions.append(model.predict())
        finally:
            ex.Grounder.shared_keys = original
        assert db.arrow(f"SELECT count(*) AS n FROM {db.sql(db.temp_table('k', 'predict'))}").column("n")[0].as_py() == 300
        db.close()
    shared, own = predictions
    assert len(shared) == 300 and shared.equals(own)
