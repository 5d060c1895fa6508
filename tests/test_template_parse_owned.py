"""The SQL frontend builds each rule's query from the parsed statement's own nodes (no copies)
and parses with Python's cyclic garbage collector paused (relsql/template/sqlrule.py). Checked
here: no node is shared between two places (two rules, a query and a neural expression, two
parents), the queries read back as the SQL written, and the collector is on again afterwards,
also after a template that does not parse."""

from __future__ import annotations

import gc

import pytest
import sqlglot
import sqlglot.expressions as exp

import relsql
from relsql.errors import TemplateError

# the same column in a head key, a feature, an embedding and a join; two statements per relation
TEMPLATE = """
CREATE TABLE order_h AS SELECT o.order_id, tanh(linear(features(o.amount, o.amount * 2), 8, 'w_order'))
FROM orders o WHERE o.amount > 0;
CREATE TABLE order_h AS SELECT o.order_id, embed(o.order_id, 8, 'e_order') FROM orders o;
CREATE TABLE predict AS
SELECT c.customer_id, linear(avg(oh.h), 4, 'w_out') + linear(avg(features(o.amount)), 4, 'w_amount')
FROM customer c JOIN orders o ON o.customer_id = c.customer_id JOIN order_h oh ON oh.order_id = o.order_id
GROUP BY c.customer_id;
"""


def _nodes(root: exp.Expression) -> list[exp.Expression]:
    return list(root.walk())


def test_no_node_is_shared_and_every_parent_is_its_own():
    template = relsql.Template.from_sql(TEMPLATE)
    rules = [rule for relation in template.relations.values() for rule in relation.rules]
    assert len(rules) == 3
    seen: dict[int, int] = {}
    for number, rule in enumerate(rules):
        for node in _nodes(rule.query):
            assert seen.setdefault(id(node), number) == number, f"a node of rule {number} is also in rule {seen[id(node)]}"
            for child in node.iter_expressions():
                assert child.parent is node, f"{child.sql()} in rule {number} has another parent"
        assert rule.query.parent is None


def test_queries_read_back_as_written():
    """Each rule's query against one written by hand from the template (a naive reference)."""
    template = relsql.Template.from_sql(TEMPLATE)
    expected = [
        'SELECT o.order_id AS "_h0", o.amount AS "_c0", o.amount * 2 AS "_c1" FROM orders AS o WHERE o.amount > 0',
        'SELECT o.order_id AS "_h0", o.order_id AS "_c0" FROM orders AS o',
        'SELECT c.customer_id AS "_h0", "oh"._rid AS "_r0", o.amount AS "_c0" FROM customer AS c '
        'JOIN orders AS o ON o.customer_id = c.customer_id JOIN order_h AS oh ON oh.order_id = o.order_id',
    ]
    got = [rule.query.sql("duckdb") for relation in template.relations.values() for rule in relation.rules]
    assert [sqlglot.parse_one(s, read="duckdb").sql("duckdb") for s in got] == \
        [sqlglot.parse_one(s, read="duckdb").sql("duckdb") for s in expected]


def test_changing_a_parsed_query_leaves_the_other_rules_alone():
    template = relsql.Template.from_sql(TEMPLATE)
    first, second = template.relations["order_h"].rules
    before = second.query.sql("duckdb")
    for column in first.query.find_all(exp.Column):
        column.set("table", exp.to_identifier("x"))
    assert second.query.sql("duckdb") == before


@pytest.mark.parametrize("text", [TEMPLATE, "CREATE TABLE p AS SELECT FROM WHERE;"])
def test_the_collector_is_on_after_a_parse(text):
    assert gc.isenabled()
    try:
        relsql.Template.from_sql(text)
    except TemplateError:
        pass
    assert gc.isenabled()


def test_a_paused_collector_stays_paused():
    gc.disable()
    try:
        relsql.Template.from_sql(TEMPLATE)
        assert not gc.isenabled()
    finally:
        gc.enable()
