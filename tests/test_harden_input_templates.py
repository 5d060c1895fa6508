"""A template may only read the database's tables (issue 42, item 5): its SQL runs on the user's
database at every grounding, and a template can come from a file or a saved model. Functions that
change the database or the session, or read files, the network or the engine's state, and table
"names" that are file paths or URLs are a TemplateError at parse time naming the statement, the function
and the fix (a name with a file suffix only at grounding, where the database lacks such a table:
tests/test_hostile_types_and_names.py); ordinary SQL (range, generate_series, date and number functions, subqueries over
tables) still parses, and so do the templates shipped in relsql/sql_templates/."""

from __future__ import annotations

from pathlib import Path

import pytest

import relsql
from relsql.errors import TemplateError

ROOT = Path(__file__).parent.parent
STATEMENT = "CREATE TABLE h AS SELECT o.id, linear(features({value}), 2) FROM {source} o{where};"

REFUSED = {  # (value, source, where) -> the function or table named in the error
    "nextval": ("o.amount + 0 * nextval('s')", "orders", "", "nextval()"),
    "currval in WHERE": ("o.amount", "orders", " WHERE currval('s') > 0", "currval()"),
    "setval": ("setval('s', 5)", "orders", "", "setval()"),
    "setseed": ("o.amount", "orders", " WHERE setseed(0.5) IS NULL", "setseed()"),
    "read_csv in FROM": ("o.amount", "read_csv('/etc/passwd')", "", "read_csv()"),
    "read_parquet in a subquery": ("o.amount", "orders", " WHERE o.id IN (SELECT 1 FROM read_parquet('x.parquet'))",
                                   "read_parquet()"),
    "read_text as a value": ("length(read_text('/etc/passwd'))", "orders", "", "read_text()"),
    "glob": ("o.amount", "glob('*')", "", "glob()"),
    "sqlite_scan": ("o.amount", "sqlite_scan('a.db', 't')", "", "sqlite_scan()"),
    "query": ("o.amount", "query('SELECT 1 AS id')", "", "query()"),
    "duckdb_secrets": ("o.amount", "duckdb_secrets()", "", "duckdb_secrets()"),
    "pragma_table_info": ("o.amount", "(SELECT * FROM pragma_table_info('orders'))", "", "pragma_table_info()"),
    "getenv": ("o.amount", "orders", " WHERE getenv('HOME') IS NOT NULL", "getenv()"),
    "current_setting": ("o.amount", "orders", " WHERE current_setting('threads') > 0", "current_setting()"),
    "a file as a table": ("o.amount", "'/etc/passwd.csv'", "", "`/etc/passwd.csv`"),
    "a URL as a table": ("o.amount", "'https://example.com/x.parquet'", "", "`https://example.com/x.parquet`"),
}


@pytest.mark.parametrize("case", REFUSED)
def test_a_template_that_would_do_more_than_read_tables_is_refused(case):
    value, source, where, named = REFUSED[case]
    with pytest.raises(TemplateError) as err:
        relsql.Template.from_sql(STATEMENT.format(value=value, source=source, where=where))
    text = str(err.value)
    assert text.startswith("statement 1 (line 1)") and named in text and "only read the database's tables" in text, text


ALLOWED = {
    "a table": ("o.amount", "orders", ""),
    "a schema-qualified table": ("o.amount", "main.orders", ""),
    "range": ("o.amount", "range(10)", ""),
    "generate_series": ("o.amount", "generate_series(1, 3)", ""),
    "unnest": ("o.amount", "unnest([1, 2])", ""),
    "date and number functions": ("abs(o.amount) + date_part('year', o.d) + epoch(o.t)", "orders", ""),
    "a subquery over a table": ("o.amount", "orders", " WHERE o.id IN (SELECT id FROM returns WHERE upper(r) = 'X')"),
}


@pytest.mark.parametrize("case", ALLOWED)
def test_ordinary_sql_still_parses(case):
    value, source, where = ALLOWED[case]
    template = relsql.Template.from_sql(STATEMENT.format(value=value, source=source, where=where))
    assert "h" in template.relations


@pytest.mark.parametrize("path", sorted(relsql.sql_templates.FOLDER.glob("*.sql")), ids=lambda p: p.name)
def test_shipped_templates_still_parse(path):
    assert relsql.Template.from_file(path).relations
