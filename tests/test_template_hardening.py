"""The template frontends refuse bad input with a TemplateError that names the place and the fix.

Never a raw IndexError/ValueError/RecursionError, never sqlglot's token dumps or terminal escape
codes, never relsql's internal column names.
"""

from __future__ import annotations

import re
import sys

import pytest
import torch

import relsql
from relsql.template import ir

SQL = "CREATE TABLE r AS SELECT a.id, {} AS h FROM a;"


def refused(parse, *needles: str) -> str:
    """The TemplateError `parse()` raises; its message holds every needle and nothing internal."""
    with pytest.raises(relsql.TemplateError) as info:
        parse()
    message = str(info.value)
    for needle in needles:
        assert needle in message, message
    assert "\x1b[" not in message, message
    assert not re.search(r"\b_(rid|h\d|r\d|c\d|head|rule)\b", message) or "reserved" in message, message
    return message


def sql(text: str):
    return lambda: relsql.Template.from_sql(text)


def datalog(text: str):
    return lambda: relsql.Template.from_datalog(text)


# 1. widths and shapes ---------------------------------------------------------------------
@pytest.mark.parametrize("call", [
    "linear(features(a.x), 99999999999999999999)",
    "linear(features(a.x), 16777217)",
    "embed(a.x, 16777217)",
    "bias(99999999999999999999999)",
])
def test_sql_widths_beyond_the_cap_are_refused(call):
    refused(sql(SQL.format(call)), "statement 1 (line 1)", "16777216")


def test_sql_width_as_unicode_digit_is_refused():
    refused(sql(SQL.format("bias(\u00b3)")), "statement 1")


@pytest.mark.parametrize("text, needles", [
    ("{3.5} h(X) :- a(X).", ["template:1", "integer"]),
    ("{1e3} h(X) :- a(X).", ["template:1", "integer"]),
    ("$w={3.5} h(X) :- a(X).", ["template:1", "integer"]),
    ("{99999999999999999999} h(X) :- a(X).", ["template:1", "16777216"]),
    ("{65536,65536} h(X) :- a(X).", ["template:1", "2147483648"]),
    ("{3,3,3} h(X) :- a(X).", ["template:1", "at most 2"]),
    ("[[1,2],[3]] h(X) :- a(X).", ["template:1", "ragged"]),
    ("[[[1]]] h(X) :- a(X).", ["template:1", "at most 2"]),
    ("<[[[1]]]> h(X) :- a(X).", ["template:1", "at most 2"]),
    ("[] h(X) :- a(X).", ["template:1", "empty"]),
    ("[[]] h(X) :- a(X).", ["template:1", "empty"]),
    ("[1e999] h(X) :- a(X).", ["template:1", "finite"]),
    ("{3,1} h(X) :- a(X).\nh/1 {3.5,1}", ["template:2", "integer"]),
    ("{3,1} h(X) :- a(X).\nh/1 {3,1,1}", ["template:2", "at most 2"]),
    ("h(X) :- a(X).\nh/1.5 [activation=tanh]", ["template:2", "arity"]),
])
def test_datalog_bad_weight_shapes_are_refused(text, needles):
    refused(datalog(text), *needles)


def test_same_embedding_name_with_two_widths_is_refused():
    message = refused(sql("CREATE TABLE p AS SELECT a.id, embed(a.x, 3, 'E') FROM a;\n"
                          "CREATE TABLE q AS SELECT a.id, embed(a.y, 4, 'E') FROM a;"), "'E'")
    assert "statement 1" in message and "statement 2" in message


# 2. deep nesting -----------------------------------------------------------------------------
@pytest.mark.parametrize("text", [
    SQL.format("tanh(" * 400 + "a.x" + ")" * 400),
    SQL.format("(" * 1000 + "a.x" + ")" * 1000),
    SQL.format(" + ".join(["a.x"] * 3000)),
])
def test_deeply_nested_sql_is_refused(text):
    refused(sql(text), "statement 1", "deep")


def test_deeply_nested_sql_is_refused_near_the_recursion_limit():
    def nested():
        return relsql.Template.from_sql(SQL.format("tanh(" * 20 + "a.x" + ")" * 20))

    def deep(n):
        return nested() if n == 0 else deep(n - 1)

    # With most of the stack already used, the parser's own recursion is reported, not leaked.
    frame, used = sys._getframe(), 0
    while frame is not None:
        frame, used = frame.f_back, used + 1
    depth = sys.getrecursionlimit() - used - 150
    try:
        deep(depth)
    except relsql.TemplateError as err:
        assert "deep" in str(err)


@pytest.mark.parametrize("text", [
    "h(X) :- " + "[" * 2000 + "1" + "]" * 2000 + " a(X).",
    "<" + "[" * 2000 + "1" + "]" * 2000 + "> h(X) :- a(X).",
])
def test_deeply_nested_datalog_values_are_refused(text):
    refused(datalog(text), "template:1")


# 3. encodings --------------------------------------------------------------------------------
@pytest.mark.parametrize("suffix", [".sql", ".txt"])
def test_non_utf8_template_file_is_refused(tmp_path, suffix):
    path = tmp_path / f"tpl{suffix}"
    path.write_bytes("-- caf\u00e9\nh(X) :- a(X).".encode("latin-1"))
    refused(lambda: relsql.Template.from_file(path), str(path), "UTF-8")


def test_non_utf8_datalog_import_is_refused(tmp_path):
    (tmp_path / "other.txt").write_bytes(b"\xff\xfe h(X) :- a(X).")
    (tmp_path / "main.txt").write_text("import ./other.txt\n{2} g(X) :- a(X).\n")
    refused(lambda: relsql.Template.from_file(tmp_path / "main.txt"), "other.txt", "UTF-8")


# 4. names that DuckDB folds together -----------------------------------------------------------
def test_relations_differing_only_in_case_are_refused():
    refused(sql("CREATE TABLE p AS SELECT a.id, bias(3) FROM a;\nCREATE TABLE P AS SELECT a.id, bias(3) FROM a;"),
            "`p`", "`P`", "case")


def test_datalog_predicates_differing_only_in_case_are_refused():
    refused(datalog("{2} pA(X) :- a(X).\n{2} pa(X) :- a(X).\nh(X) :- pA(X), pa(X)."), "pA", "pa")


@pytest.mark.parametrize("first, second", [("E", "e"), ("e.x", "e_x"), ("w-1", "W_1")])
def test_weight_names_that_share_a_table_name_are_refused(first, second):
    refused(sql(f"CREATE TABLE p AS SELECT a.id, embed(a.x, 3, '{first}') + embed(a.y, 3, '{second}') FROM a;"),
            f"'{first}'", f"'{second}'")


def test_datalog_weight_names_that_share_a_table_name_are_refused():
    refused(datalog("$W={2} h(X) :- a(X).\n$w={2} g(X) :- a(X)."), "W", "w")


def test_auto_template_names_do_not_collide(tmp_path):
    db = relsql.connect(tmp_path / "names.duckdb")
    db.execute("""
        CREATE TABLE t(id INT PRIMARY KEY, y DOUBLE);
        CREATE TABLE "a-b"(id INT PRIMARY KEY, t_id INT REFERENCES t(id), v DOUBLE, num VARCHAR);
        CREATE TABLE "a_b"(id INT PRIMARY KEY, t_id INT REFERENCES t(id), w DOUBLE, z DOUBLE);
        INSERT INTO t VALUES (1, 0.5), (2, 1.5);
        INSERT INTO "a-b" VALUES (1, 1, 0.1, 'p'), (2, 2, 0.2, 'q');
        INSERT INTO "a_b" VALUES (1, 1, 1.0, 2.0), (2, 1, 3.0, 4.0);
    """)
    tpl = relsql.Template.auto(db, "t.y", hops=1)
    encoders = re.findall(r"CREATE TABLE (enc_\w+) AS", tpl.source)
    assert len(encoders) == len(set(encoders)) == 3, tpl.source
    assert len({w.lower() for w in tpl.weights}) == len(tpl.weights)
    net = relsql.compile(tpl, db, dtype=torch.float64, seed=0)
    assert net()["predict"].shape == (2, 1)
    db.con.close()


# 5. reserved names -----------------------------------------------------------------------------
@pytest.mark.parametrize("key", ["_rid", "_h0", "_r1", "_c2", "_head", "_rule", "_RID"])
def test_reserved_key_names_are_refused(key):
    refused(sql(f"CREATE TABLE r AS SELECT a.id AS {key}, bias(3) FROM a;"), "reserved", "AS")


def test_reserved_key_name_from_a_bare_column_is_refused():
    refused(sql('CREATE TABLE r AS SELECT a."_rid", bias(3) FROM a;'), "reserved", "statement 1")


# 6. SQL frontend messages ----------------------------------------------------------------------
@pytest.mark.parametrize("text, where", [
    ("CREATE TABLE r AS SELECT a.id, linear(( FROM a;", "line 1"),
    ("\n\nCREATE TABLE r AS SELECT a.id, linear(a.x, 3) FROM a WHERE;", "line 3"),
    ("CREATE TABLE r AS SELECT a.id, 'unterminated FROM a;", "line 1"),
])
def test_sql_parse_errors_are_short(text, where):
    message = refused(sql(text), "does not parse", where)
    assert "Line 1, Col" not in message and "<class" not in message and len(message) < 300, message


@pytest.mark.parametrize("join", ["JOIN", "INNER JOIN", "LEFT JOIN"])
def test_join_without_on_is_refused(join):
    refused(sql(f"CREATE TABLE r AS SELECT a.id, sum(b.x) FROM a {join} b GROUP BY a.id;"),
            "statement 1", "JOIN without ON")


def test_join_without_on_in_a_subquery_is_refused():
    refused(sql("CREATE TABLE r AS SELECT s.id, sum(s.x) FROM (SELECT a.id, b.x FROM a JOIN b) s GROUP BY s.id;"),
            "JOIN without ON")


@pytest.mark.parametrize("joins", ["JOIN b USING (id) JOIN c", "JOIN (SELECT b.id FROM b JOIN c) s ON s.id = a.id",
                                   "JOIN b ON b.id = a.id JOIN c WHERE c.x > 0"])
def test_a_later_or_inner_join_without_on_is_refused(joins):
    refused(sql(f"CREATE TABLE r AS SELECT a.id, sum(a.x) FROM a {joins} GROUP BY a.id;"),
            "statement 1", "JOIN without ON")


@pytest.mark.parametrize("joins", ["ASOF JOIN b ON a.t >= b.t", "JOIN LATERAL (SELECT 1 AS x) l", ", b JOIN c ON c.id = b.id",
                                   "JOIN generate_series(1, 3) g(x) ON g.x = a.id", "POSITIONAL JOIN b",
                                   "JOIN (SELECT b.id FROM b JOIN c ON c.id = b.id) s ON s.id = a.id"])
def test_joins_that_need_no_on_or_have_one_parse(joins):
    tpl = relsql.Template.from_sql(f"CREATE TABLE r AS SELECT a.id, sum(a.x) FROM a {joins} GROUP BY a.id;")
    assert len(tpl.relations["r"].rules) == 1


def test_cross_and_comma_joins_still_work():
    db = relsql.connect()
    db.execute("CREATE TABLE a(id INT, x DOUBLE); INSERT INTO a VALUES (1, 1.0), (2, 2.0);"
               "CREATE TABLE b(x DOUBLE); INSERT INTO b VALUES (3.0), (4.0);")
    for join in ["CROSS JOIN b", ", b", "JOIN b USING (x)", "NATURAL JOIN b"]:
        tpl = relsql.Template.from_sql(f"CREATE TABLE r AS SELECT a.id, sum(b.x) FROM a {join} GROUP BY a.id;")
        assert len(tpl.relations["r"].rules) == 1
    net = relsql.compile(relsql.Template.from_sql("CREATE TABLE r AS SELECT a.id, sum(b.x) FROM a CROSS JOIN b GROUP BY a.id;"),
                         db, dtype=torch.float64)
    assert net()["r"].flatten().tolist() == [7.0, 7.0]


# 7. very wide Datalog rules ----------------------------------------------------------------------
def test_datalog_rule_with_too_many_body_literals_is_refused():
    body = ", ".join(f"e(X0,Y{i})" for i in range(ir.MAX_BODY_LITERALS + 1))
    refused(datalog(f"h(X0) :- {body}."), "template:1", str(ir.MAX_BODY_LITERALS), "split")


def test_datalog_rule_at_the_body_literal_limit_parses():
    body = ", ".join(f"e(X0,Y{i})" for i in range(ir.MAX_BODY_LITERALS))
    assert len(relsql.Template.from_datalog(f"h(X0) :- {body}.").relations["h"].rules) == 1


# 8. template facts (supported since #18 part 4; oracle tests in tests/test_neuralogic_language.py) -----
@pytest.mark.parametrize("text, fact", [
    ("h(X) :- f(X), a(X).\n{3} f(a).", "f"),
    ("h(X) :- a(X).\n\nf(a).", "f"),
])
def test_template_facts_are_relations_without_a_sample_key(text, fact):
    template = relsql.Template.from_datalog(text)
    assert template.relations[fact].keys == ["a0"]


def test_datalog_docstring_describes_template_facts():
    from relsql.template import datalog as frontend

    assert "Template facts: `{3} f(a).`" in frontend.__doc__


# the shared checks keep the embedding tables' naming ----------------------------------------------
def test_storage_name_matches_the_embedding_tables():
    from relsql.train.embeddings.embeddings import table_suffix

    for name in ["e.x", "w-1", "caf\u00e9", "a b", "A_1"]:
        assert ir.storage_name(name) == table_suffix(name).lower()


def test_auto_template_refuses_line_breaks_in_names():
    db = relsql.connect()
    db.execute('CREATE TABLE t(id INT PRIMARY KEY, y DOUBLE); INSERT INTO t VALUES (1, 0.5);'
               'CREATE TABLE "x\nCREATE TABLE predict AS SELECT 1 AS id, bias(1) FROM t; --"'
               '(id INT PRIMARY KEY, t_id INT REFERENCES t(id)); ')
    with pytest.raises(relsql.SchemaError, match="line break"):
        relsql.Template.auto(db, "t.y", hops=1)


def test_comments_after_the_last_statement_are_comments():
    """sqlglot hands a comment after the last `;` back as an empty statement; the template is the
    statements around it, the same as without the comments."""
    plain = ("CREATE TABLE r AS SELECT a.id, relu(linear(a.x, 2)) AS h FROM a;\n"
             "CREATE TABLE s AS SELECT a.id, r.h AS h FROM a JOIN r ON r.id = a.id;")
    commented = "-- before\n" + plain.replace(";\n", "; -- after the first\n") + "\n-- after the last\n/* and a block */\n"
    bare, annotated = relsql.Template.from_sql(plain), relsql.Template.from_sql(commented)
    assert list(annotated.relations) == list(bare.relations) == ["r", "s"]
    assert [len(r.rules) for r in annotated.relations.values()] == [1, 1]
    refused(sql("-- only a comment\n"), "empty")
