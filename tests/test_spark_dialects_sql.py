"""relsql/data/spark_sql.py without a Spark session: which DuckDB functions are written with
DuckDB's meaning in Spark's SQL, and when the session's time zone matters. (Spark computing the same
values as DuckDB: tests/test_spark_dialects.py.)"""

from __future__ import annotations

import sqlglot
import sqlglot.expressions as exp

from relsql.data.spark_sql import is_utc, spark_function


def spark_text(duckdb: str | exp.Expression) -> tuple[str, int]:
    """(DuckDB's SQL text or tree as Spark SQL with spark_function applied, how often the time zone
    mattered)."""
    zoned = []

    def rewrite(node: exp.Expression) -> exp.Expression:
        written = spark_function(node, lambda arg: arg.transform(rewrite, copy=False), lambda: zoned.append(1))
        return node if written is None else written

    tree = sqlglot.parse_one(duckdb, read="duckdb") if isinstance(duckdb, str) else duckdb
    return tree.transform(rewrite).sql("spark"), len(zoned)


def test_functions_whose_meaning_differs_are_rewritten():
    text, zoned = spark_text("SELECT epoch(t), dayofweek(d), isodow(d), log(x), log(2, x), ln(x), list_value(1, x) FROM s")
    assert "UNIX_TIMESTAMP" not in text and text.count("UNIX_MICROS(CAST(t AS TIMESTAMP)) / CAST(1000000.0 AS DOUBLE)") == 1
    assert "(DAYOFWEEK(d) - 1)" in text and "(WEEKDAY(d) + 1)" in text
    assert "LOG10(x)" in text and "LOG(2, x)" in text and "LN(x)" in text  # only one-argument log is DuckDB's base 10
    assert "ARRAY(1, x)" in text
    assert zoned == 1  # only epoch depends on the session's time zone


def test_nested_functions_are_rewritten_inside_each_other():
    text, zoned = spark_text("SELECT isfinite(epoch(a) - epoch(b)) AND dayofweek(c) = 0 FROM s")
    assert text.count("UNIX_MICROS") == 2 and "ABS(CAST(" in text and "(DAYOFWEEK(c) - 1) = 0" in text
    assert zoned == 2


def test_lists_are_sorted_and_deduplicated_as_duckdb_does():
    """list_distinct drops NULLs (array_distinct keeps one), parsed from text or built by relsql's
    predictive queries (the function by name); one-argument list_sort is array_sort (both ascending,
    NULLs last); a list_sort given an order is left to sqlglot."""
    text, _ = spark_text("SELECT list_distinct(l), list_sort(list_distinct(l)), list_sort(l, 'DESC') FROM s")
    assert text.count("ARRAY_COMPACT(ARRAY_DISTINCT(l))") == 2 and "ARRAY_SORT(ARRAY_COMPACT(" in text
    built = exp.select(exp.Anonymous(this="list_sort", expressions=[exp.Anonymous(this="list_distinct", expressions=[
        exp.ArrayAgg(this=exp.column("v"))])])).from_("s")
    assert spark_text(built)[0] == "SELECT ARRAY_SORT(ARRAY_COMPACT(ARRAY_DISTINCT(COLLECT_LIST(v)))) FROM s"


def test_utc_zones():
    assert all(is_utc(z) for z in ("UTC", "utc", "Etc/UTC", "+00:00", "Z", "GMT"))
    assert not any(is_utc(z) for z in (None, "America/New_York", "Europe/Prague", "+01:00"))
