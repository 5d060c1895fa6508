"""relsql/data/spark_sql.py without a Spark session: which DuckDB functions are written with
DuckDB's meaning in Spark's SQL, and when the session's time zone matters. (Spark computing the same
values as DuckDB: tests/test_spark_dialects.py.)"""

from __future__ import annotations

import sqlglot
import sqlglot.expressions as exp

from relsql.data.spark_sql import is_utc, spark_function


def spark_text(duckdb_text: str) -> tuple[str, int]:
    """(`duckdb_text` as Spark SQL with spark_function applied, how often the time zone mattered)."""
    zoned = []

    def rewrite(node: exp.Expression) -> exp.Expression:
        written = spark_function(node, lambda arg: arg.transform(rewrite, copy=False), lambda: zoned.append(1))
        return node if written is None else written

    tree = sqlglot.parse_one(duckdb_text, read="duckdb").transform(rewrite)
    return tree.sql("spark"), len(zoned)


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


def test_utc_zones():
    assert all(is_utc(z) for z in ("UTC", "utc", "Etc/UTC", "+00:00", "Z", "GMT"))
    assert not any(is_utc(z) for z in (None, "America/New_York", "Europe/Prague", "+01:00"))
