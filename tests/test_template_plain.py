"""The parsed template a model file carries as plain data (relsql/template/plain.py), so that
Model.load need not parse the template text again: what it rebuilds equals what the parser makes
of the same text (the parser is the oracle), for hand-written templates using every construct
the SQL frontend knows and for generated ones; a model loaded through it predicts what the built
model predicts; damaged or crafted plain data is refused with a RelsqlError naming the file; and
files without it (written before it, Datalog, an edited text) load by parsing the text."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import relsql
from relsql.template import Template, plain
from relsql.template.ir import walk
from relsql.train.persist import checkpoint as files
from relsql.train.persist import saved
from tests.test_saved_state import trained
from tests.test_trainer import customers

EVERY_CONSTRUCT = """-- relsql: depth 2
CREATE TABLE order_h AS
SELECT o.order_id, /* a comment the file keeps */ layer_norm(dropout(relu(linear(features(o.amount, o.express), 6, 'w_o')
       + linear(ple(o.amount, CAST(o.order_id AS DOUBLE) / 10, 4), 6) + bias(6, 'b_o')), 0.25))
       + embed(o.express, 6, 'e_x', min_count=2) + linear(calendar(c.signup), 6) + linear(o.amount, 6) AS h
FROM orders o JOIN customer c ON c.customer_id = o.customer_id;
CREATE TABLE order_h AS
SELECT o.order_id, leaky_relu(linear(text(c.name, 6, 'words', buckets=64, tokens=16), 6), 0.1)
       + linear(bag(c.tags, 6, 'tags'), 6, 'w_tags') AS h
FROM orders o JOIN customer c USING (customer_id) WHERE o.amount > -1 AND c.name <> 'x';
CREATE TABLE near AS
SELECT c.customer_id, sum(tanh(linear(n.h, 6, 'w_near'))) + count(*) AS h
FROM customer c JOIN near n ON n.customer_id = c.customer_id - 1 GROUP BY c.customer_id;
CREATE TABLE near AS SELECT c.customer_id, linear(features(c.region), 6, 'w_base') AS h FROM customer c;
CREATE TABLE predict AS
SELECT c.customer_id, sigmoid(linear(concat(attention(sum_per_head(linear(oh.h, 4) * linear(oh.h, 4), 2),
       linear(oh.h, 4, 'w_v'), 'mean'), max(exp(linear(oh.h, 2, 'w_t', o.express))), avg(log(relu(nh.h) + 1)),
       min(gelu(oh.h - 1) * 2)), 3, 'w_out'))
FROM customer c JOIN orders o ON o.customer_id = c.customer_id JOIN order_h oh ON oh.order_id = o.order_id
     JOIN (SELECT DISTINCT customer_id FROM orders) s ON s.customer_id = c.customer_id
     JOIN near nh ON nh.customer_id = c.customer_id
GROUP BY c.customer_id;
"""


def every_construct_db() -> relsql.Database:
    db = customers(60)
    db.execute("ALTER TABLE customer ADD COLUMN name VARCHAR")
    db.execute("ALTER TABLE customer ADD COLUMN tags VARCHAR[]")
    db.execute("UPDATE customer SET name = 'customer ' || (customer_id % 5), tags = ['a', CAST(region AS VARCHAR)]")
    return db


def assert_same_ir(built, parsed) -> None:
    """Field by field, the body queries compared as trees and as the SQL the database receives."""
    assert built.language == parsed.language and built.source == parsed.source
    assert built.weights == parsed.weights
    assert list(built.relations) == list(parsed.relations)
    for name, relation in parsed.relations.items():
        other = built.relations[name]
        assert (other.keys, other.activation, other.offset) == (relation.keys, relation.activation, relation.offset)
        assert len(other.rules) == len(relation.rules), name
        for a, b in zip(other.rules, relation.rules):
            assert a.query == b.query and a.query.sql("duckdb") == b.query.sql("duckdb"), (name, b.origin)
            assert a.query.sql("duckdb", comments=True) == b.query.sql("duckdb", comments=True)
            assert a == b, (name, b.origin)
    assert built.relations == parsed.relations and built.order() == parsed.order()


def round_trip(text: str):
    dumped = plain.dumps(Template.from_sql(text))
    assert dumped is not None
    return plain.loads(dumped, source=text, language="sql")


def auto_templates() -> list[str]:
    db = customers(80)
    return [Template.auto(db, "customer.churned", layer=layer).source for layer in ("sage", "rgcn", "gat", "hgt")]


def test_the_rebuilt_ir_equals_the_parsed_one_for_every_construct():
    parsed = Template.from_sql(EVERY_CONSTRUCT)
    kinds = {type(e).__name__ for rel in parsed.relations.values() for rule in rel.rules for e in walk(rule.expr)}
    assert kinds == {"LayerNorm", "Dropout", "Apply", "Features", "Encode", "Param", "Embed", "Text", "Act", "Binary",
                     "Agg", "Attention", "Combine", "Ref", "Column", "Const"}  # the template does use them all
    assert {"near_level0", "near_level1"} <= set(parsed.relations)  # the recursive relation, unrolled to depth 2
    assert_same_ir(round_trip(EVERY_CONSTRUCT), parsed)


@pytest.mark.parametrize("index", range(4))
def test_the_rebuilt_ir_equals_the_parsed_one_for_generated_templates(index):
    text = auto_templates()[index]
    assert_same_ir(round_trip(text), Template.from_sql(text))


def test_the_rebuilt_ir_equals_the_parsed_one_for_a_generated_lahman_template(tmp_path):
    """Lahman (real public data, two seasons): the template Template.auto writes for a team target."""
    from tests.test_keys_real_schemas import load_lahman

    db = relsql.connect(load_lahman(tmp_path / "lahman.duckdb", years=(2013, 2014)), read_only=True)
    text = Template.auto(db, "teams.W").source
    parsed = Template.from_sql(text)
    assert sum(len(r.rules) for r in parsed.relations.values()) > 20
    assert_same_ir(round_trip(text), parsed)


def test_datalog_templates_have_no_plain_form_and_are_parsed():
    """A Datalog rule's body query is built from the schema when grounded: its file keeps only the text."""
    text = "h(X) :- {2, 1} a(X).\nout(X) :- {1, 2} h(X).\n"
    parsed = Template.from_datalog(text)
    assert plain.dumps(parsed) is None and saved.template_ir(parsed) == {}
    read = saved.saved_template({"language": "datalog", "template": text}, "model file x.pt")
    assert read.source == parsed.source and read.weights == parsed.weights
    assert [(r.name, r.keys, [(u.refs, u.expr, u.origin) for u in r.rules]) for r in read.relations.values()] == \
        [(r.name, r.keys, [(u.refs, u.expr, u.origin) for u in r.rules]) for r in parsed.relations.values()]


def test_a_model_of_every_construct_loads_through_its_plain_ir_and_predicts_as_built(tmp_path, monkeypatch):
    m = relsql.Model(every_construct_db(), Template.from_sql(EVERY_CONSTRUCT), "customer.churned", seed=3,
                     progress=False)
    m.fit(epochs=1, lr=0.05)
    path = m.save(tmp_path / "every.pt")
    assert "template_ir" in files.read(path, saved.FORMAT, "model file")
    monkeypatch.setattr(Template, "from_sql", None)  # not called: the text is not parsed
    assert relsql.Model.load(path, m.db).predict().equals(m.predict())


def model_file(tmp_path: Path) -> tuple[relsql.Model, dict, Path]:
    m = trained("binary")
    path = m.save(tmp_path / "m.pt")
    state = files.read(path, saved.FORMAT, "model file")
    assert isinstance(state.get("template_ir"), str)
    return m, state, path


def test_a_model_loads_through_its_plain_ir_and_predicts_as_built(tmp_path, monkeypatch):
    m, _, path = model_file(tmp_path)

    def no_parse(*args, **kwargs):
        raise AssertionError("the template text was parsed")

    with monkeypatch.context() as patched:
        patched.setattr(Template, "from_sql", no_parse)
        loaded = relsql.Model.load(path, m.db)
    assert loaded.predict().equals(m.predict())
    assert loaded.evaluate("test") == m.evaluate("test")
    assert_same_ir(loaded.template, Template.from_sql(m.template.source))


def rewritten(state: dict, tmp_path: Path, change, name: str = "t.pt") -> Path:
    """The file with its plain IR changed by `change` (a function editing the decoded JSON)."""
    data = json.loads(state["template_ir"])
    change(data)
    return files.write(tmp_path / name, saved.FORMAT, {**state, "template_ir": json.dumps(data)}, "model file")


def _first_rule(data: dict) -> dict:
    return data["relations"][-1]["rules"][0]


def _column_node(data: object):
    """The first sqlglot Column node of a plain query, found by a walk of the plain data."""
    stack = [data]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if node.get("@") == "Column":
                return node
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    raise AssertionError("no column")


def _replace(node: dict, by: dict) -> None:
    node.clear()
    node.update(by)


TAMPERED = {
    "wrong type": lambda d: _first_rule(d).update(n_columns="3"),
    "missing field": lambda d: _first_rule(d).pop("grouped"),
    "unknown query node": lambda d: _column_node(_first_rule(d)["query"]).update({"@": "__class__"}),
    "unknown query argument": lambda d: _column_node(_first_rule(d)["query"]).update(evil="x"),
    "unknown expression node": lambda d: _first_rule(d)["expr"].update({"@": "Exec"}),
    "unknown activation": lambda d: d["relations"][0].update(activation="system"),
    "column out of range": lambda d: d["relations"][0]["rules"][0].update(n_columns=0),  # order_h reads 2 columns
    "reference to no relation": lambda d: _first_rule(d).update(refs=["nowhere"]),
    "undeclared weight": lambda d: d["weights"].pop(),
    "a query reading a file": lambda d: _replace(_column_node(_first_rule(d)["query"]), {
        "@": "Anonymous", "this": "read_text", "expressions": [{"@": "Literal", "this": "/etc/passwd", "is_string": True}]}),
    # sqlglot prints these as they are: SQL text there would pass the reads-only check unseen
    "SQL text as an unquoted name": lambda d: _column_node(_first_rule(d)["query"])["this"].update(
        this="x FROM read_text('/etc/passwd') --", quoted=False),
    "SQL text as a number": lambda d: _replace(_column_node(_first_rule(d)["query"]), {
        "@": "Literal", "this": "1 FROM read_text('/etc/passwd') --", "is_string": False}),
    "SQL text as a function name": lambda d: _replace(_column_node(_first_rule(d)["query"]), {
        "@": "Anonymous", "this": "read_text('/etc/passwd') --", "expressions": []}),
    "SQL text as a join kind": lambda d: _first_rule(d)["query"]["joins"][0].update(kind="JOIN read_text('x')"),
    "a number where text belongs": lambda d: _column_node(_first_rule(d)["query"])["this"].update(this=5),
    "an aggregate in an ungrouped rule": lambda d: d["relations"][0]["rules"][0].update(
        expr={"@": "Agg", "kind": "sum", "arg": d["relations"][0]["rules"][0]["expr"]}),
    "not a select": lambda d: _first_rule(d)["query"].update({"@": "Delete"}),
    "shape not a width": lambda d: d["weights"][0].update(shape=["3"]),
}


def test_a_tampered_plain_ir_is_refused_with_a_relsql_error(tmp_path):
    m, state, _ = model_file(tmp_path)
    for name, change in TAMPERED.items():
        path = rewritten(state, tmp_path, change)
        with pytest.raises(relsql.RelsqlError, match=r"t\.pt is damaged: its parsed template") as caught:
            relsql.Model.load(path, m.db)
            raise AssertionError(f"not refused: {name}")
        assert "Traceback" not in str(caught.value) and "save it" in str(caught.value), name
    for junk in ("not json", "[1, 2]", json.dumps({**json.loads(state["template_ir"]), "relations": []})):
        path = files.write(tmp_path / "t.pt", saved.FORMAT, {**state, "template_ir": junk}, "model file")
        with pytest.raises(relsql.RelsqlError, match=r"t\.pt is damaged"):
            relsql.Model.load(path, m.db)


def test_the_untampered_copy_loads(tmp_path):
    """The rewriting itself changes nothing: the tampered cases fail for their change alone."""
    m, state, _ = model_file(tmp_path)
    path = rewritten(state, tmp_path, lambda d: None)
    assert relsql.Model.load(path, m.db).predict().equals(m.predict())


def test_files_without_a_usable_plain_ir_parse_their_text(tmp_path, monkeypatch):
    m, state, _ = model_file(tmp_path)
    older = dict(state)
    del older["template_ir"]  # a file written before plain IRs
    edited = {**state, "template": "-- edited by hand\n" + state["template"]}  # the IR no longer fits the text
    other = rewritten(state, tmp_path, lambda d: d.update(sqlglot="0.0.0"), "other.pt")  # another sqlglot wrote it
    parses = []
    real = Template.from_sql.__func__

    def counted(cls, text, **kwargs):
        parses.append(text)
        return real(cls, text, **kwargs)

    monkeypatch.setattr(Template, "from_sql", classmethod(counted))
    for name, contents in (("older.pt", older), ("edited.pt", edited)):
        files.write(tmp_path / name, saved.FORMAT, contents, "model file")
    for name in ("older.pt", "edited.pt", other.name):
        loaded = relsql.Model.load(tmp_path / name, m.db)
        assert loaded.predict().equals(m.predict()), name
    assert parses == [state["template"], edited["template"], state["template"]]
    assert relsql.Model.load(tmp_path / "edited.pt", m.db).template.source == edited["template"]
