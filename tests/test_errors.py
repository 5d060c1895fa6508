"""Bad input gives a relsql.RelsqlError that names the place and the fix; nothing is modified."""

from __future__ import annotations

import pytest
import torch

import relsql
from relsql.datasets.neuralogic_files import import_text
from relsql.ground.execute import GroundingWarning


@pytest.fixture
def db(tmp_path):
    db = relsql.connect(tmp_path / "small.duckdb")
    db.execute("""
        CREATE TABLE node(node_id INT, label VARCHAR, x DOUBLE, tags VARCHAR[]);
        INSERT INTO node VALUES (1, 'a', 0.5, ['p']), (2, 'b', 1.5, ['q']), (3, 'a', -1.0, ['p']);
        CREATE TABLE edge(src INT, dst INT);
        INSERT INTO edge VALUES (1, 2), (2, 3), (3, 1);
        CREATE TABLE empty_edge(src INT, dst INT);
    """)
    yield db
    db.con.close()


def compile_sql(db, text):
    return relsql.compile(relsql.Template.from_sql(text), db)


NODE_H = "CREATE TABLE node_h AS SELECT n.node_id, linear(n.x, 4, 'w') FROM node n;\n"


@pytest.mark.parametrize("text, needles", [
    ("CREATE TABLE h AS SELEC n.node_id FROM node n;", ["statement 1 (line 1)", "CREATE TABLE <name> AS SELECT"]),
    ("\nCREATE TABLE h AS SELECT n.node_id, (n.x FROM node n;", ["does not parse", "line 2"]),
    ("SELECT 1;", ["statement 1", "CREATE TABLE"]),
    ("CREATE TABLE h AS SELECT n.node_id, frobnicate(n.x) FROM node n;", ["statement 1", "unknown function frobnicate"]),
    (NODE_H + "CREATE TABLE g AS SELECT e.dst, sum(x.h) FROM edge e JOIN node_h x ON x.node_id = e.src;",
     ["statement 2 (line 2)", "GROUP BY"]),
    (NODE_H + "CREATE TABLE g AS SELECT e.dst, x.h + sum(x.h) FROM edge e JOIN node_h x ON x.node_id = e.src GROUP BY e.dst;",
     ["statement 2", "inside an aggregate"]),
    (NODE_H + "CREATE TABLE g AS SELECT e.dst, sum(max(x.h)) FROM edge e JOIN node_h x ON x.node_id = e.src GROUP BY e.dst;",
     ["nested"]),
    (NODE_H + "CREATE TABLE g AS SELECT e.dst, sum(x.h) FROM edge e JOIN node_h x ON x.h = e.src GROUP BY e.dst;",
     ["join or filter condition"]),
    ("CREATE TABLE h AS SELECT n.node_id, linear(n.x, 0) FROM node n;", ["positive integer"]),
    ("CREATE TABLE h AS SELECT n.node_id, linear(n.x, 4, 'w') FROM node n;\n"
     "CREATE TABLE g AS SELECT n.node_id, embed(n.label, 4, 'w') FROM node n;", ["'w'", "shared name"]),
])
def test_bad_sql_templates_are_rejected_at_parse_time(text, needles):
    with pytest.raises(relsql.TemplateError) as info:
        relsql.Template.from_sql(text)
    for needle in needles:
        assert needle in str(info.value), str(info.value)


@pytest.mark.parametrize("text, error, needles", [
    ("CREATE TABLE h AS SELECT n.node_id, linear(n.x, 4) FROM nodes n;", relsql.SchemaError, ["statement 1", "nodes"]),
    ("CREATE TABLE h AS SELECT n.node_id, linear(n.weight, 4) FROM node n;", relsql.SchemaError, ["statement 1", "weight"]),
    ("CREATE TABLE h AS SELECT n.node_id, linear(n.label, 4) FROM node n;", relsql.SchemaError, ["statement 1", "embed"]),
    ("CREATE TABLE h AS SELECT n.label, linear(n.x, 4) FROM node n;", relsql.GroundingError,
     ["several rows share one head key", "GROUP BY"]),
    (NODE_H + "CREATE TABLE g AS SELECT n.node_id, linear(x.h, 4, 'w') FROM node n JOIN node_h x ON x.node_id = n.node_id;",
     relsql.ShapeError, ["g statement 2", "linear"]),
    ("CREATE TABLE h AS SELECT n.node_id, linear(n.x, 4, 'a') + linear(n.x, 3, 'b') FROM node n;", relsql.ShapeError,
     ["statement 1"]),
])
def test_bad_sql_templates_are_rejected_at_compile_time(db, text, error, needles):
    before = db.arrow("SELECT * FROM node ORDER BY node_id")
    with pytest.raises(error) as info:
        compile_sql(db, text)
    for needle in needles:
        assert needle in str(info.value), str(info.value)
    assert db.arrow("SELECT * FROM node ORDER BY node_id").equals(before)
    assert db.tables() == ["edge", "empty_edge", "node"]


def test_a_statement_without_groundings_is_an_empty_aggregate(db):
    """A statement whose joins meet no row warns and adds nothing (a time cut can leave a statement
    empty in one database and not in another); the relation's other statements still count."""
    text = ("CREATE TABLE h AS SELECT n.node_id, linear(n.x, 2, 'a') FROM node n;\n"
            "CREATE TABLE h AS SELECT e.dst AS node_id, sum(linear(e.src, 2, 'b')) FROM empty_edge e GROUP BY e.dst;")
    with pytest.warns(GroundingWarning, match=r"h, statement 2 \(line 2\): the statement has no groundings"):
        net = compile_sql(db, text)
    alone = compile_sql(db, "CREATE TABLE h AS SELECT n.node_id, linear(n.x, 2, 'a') FROM node n;")
    alone.load_state_dict({k: v for k, v in net.state_dict().items() if k in alone.state_dict()})
    assert torch.equal(net()["h"], alone()["h"])


def test_a_target_relation_without_rows_is_refused(db):
    db.execute("CREATE TABLE label(node_id INT, y DOUBLE); INSERT INTO label VALUES (1, 0.5), (2, 1.0), (3, 0.0);")
    text = "CREATE TABLE predict AS SELECT e.dst AS node_id, sum(linear(e.src, 1, 'b')) FROM empty_edge e GROUP BY e.dst;"
    with pytest.raises(relsql.RelsqlError, match="no rows|no groundings"):
        relsql.Model(db, relsql.Template.from_sql(text), target="label.y")


def test_empty_database_names_the_missing_table(tmp_path):
    db = relsql.connect(tmp_path / "empty.duckdb")
    with pytest.raises(relsql.SchemaError, match="node"):
        compile_sql(db, "CREATE TABLE h AS SELECT n.node_id, linear(n.x, 4) FROM node n;")


@pytest.mark.parametrize("text, needles", [
    ("h(X) :- a(X", ["template:1", "ends early"]),
    ("h(X) :- a(Y).", ["head variable X", "body"]),
    ("{3,3} h(X) :- {3,0} a(X).", ["positive"]),
    ("h(X) :- a(X). [activation=frob]", ["unknown transformation `frob`"]),
    ("h(X) :- a(X). [colour=red]", ["unknown rule metadata `colour`"]),
    ("h(X) :- a(X).\nh/2 [activation=tanh]", ["h/2", "no rule derives h/2"]),
    ("h(X) :- a(X).\nq/1 [activation=tanh]", ["q/1", "no rule derives q"]),
    ("h(X) :- $w={3,3} a(X).\ng(X) :- $w={2,2} a(X).", ["$w", "shape"]),
    ("h(X) :- g(X).\ng(X) :- h(X).", ["recursive", "h -> g -> h"]),
    ("h(X) :- a(X) ; b(X).", ["template:1", "';'"]),
])
def test_bad_datalog_templates(text, needles):
    with pytest.raises(relsql.TemplateError) as info:
        relsql.Template.from_datalog(text).order()
    for needle in needles:
        assert needle in str(info.value), str(info.value)


def test_datalog_weight_shape_mismatch_names_the_rule(tmp_path):
    db = relsql.connect(tmp_path / "d.duckdb")
    import_text(db.con, "a(x). b(x).", "1.0 h(x).", one_sample_per_line=False)
    tpl = relsql.Template.from_datalog("{3,1} e(X) :- a(X).\n{2,2} h(X) :- {2,2} e(X).")
    with pytest.raises(relsql.ShapeError, match=r"h rule 2 \(template:2\)"):
        relsql.compile(tpl, db, dtype=torch.float64)


def test_datalog_non_numeric_value_column(tmp_path):
    db = relsql.connect(tmp_path / "d.duckdb")
    db.execute("CREATE TABLE a(sample BIGINT, a0 VARCHAR, value VARCHAR); INSERT INTO a VALUES (0, 'x', 'high');")
    with pytest.raises(relsql.SchemaError, match="rule 1"):
        relsql.compile(relsql.Template.from_datalog("{2,1} h(X) :- a(X)."), db)


def test_datalog_missing_argument_columns(tmp_path):
    db = relsql.connect(tmp_path / "d.duckdb")
    db.execute("CREATE TABLE a(sample BIGINT, a0 VARCHAR); INSERT INTO a VALUES (0, 'x');")
    with pytest.raises(relsql.SchemaError, match="a has 2 arguments"):
        relsql.compile(relsql.Template.from_datalog("h(X) :- a(X, Y)."), db)


def test_datalog_rule_without_groundings_warns_and_contributes_nothing(tmp_path):
    db = relsql.connect(tmp_path / "d.duckdb")
    import_text(db.con, "a(x). a(y).", "1.0 h(x).", one_sample_per_line=False)
    tpl = relsql.Template.from_datalog("h(X) :- a(X).\nh(X) :- missing(X).")
    with pytest.warns(UserWarning, match="rule 2"):
        net = relsql.compile(tpl, db, dtype=torch.float64)
    assert net()["h"].reshape(-1).tolist() == [1.0, 1.0]


def test_errors_are_relsql_errors():
    for cls in (relsql.TemplateError, relsql.SchemaError, relsql.GroundingError, relsql.ShapeError, relsql.SourceError):
        assert issubclass(cls, relsql.RelsqlError)
