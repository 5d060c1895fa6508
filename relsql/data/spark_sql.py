"""DuckDB's functions written with DuckDB's meaning in Spark's SQL: what lets one template (and the
SQL relsql builds for it) compute the same numbers on either engine.

relsql's SQL is DuckDB's: templates are parsed as DuckDB SQL and the encoders (relsql/ground/
encoders.py) and the automatic templates write DuckDB's functions. sqlglot's DuckDB -> Spark
translation keeps the names but not always the meaning, so these are written here instead
(`spark_function`; SparkDatabase applies it to every statement):

- `epoch(t)` (sqlglot's TimeToUnix): DuckDB's seconds WITH their fractions; sqlglot writes
  Spark's `unix_timestamp`, whole seconds. Here: `unix_micros(CAST(t AS TIMESTAMP)) / 1e6`, the
  same double division DuckDB makes. A DATE or a TIMESTAMP without time zone counts from
  midnight in Spark's session time zone, where DuckDB counts in UTC: equal when the session's
  `spark.sql.session.timeZone` is UTC (SparkDatabase warns once otherwise).
- `dayofweek(d)`: DuckDB counts Sunday 0 ... Saturday 6, Spark Sunday 1 ... Saturday 7 (sqlglot
  keeps the name): `dayofweek(d) - 1`. `isodow(d)` (Monday 1 ... Sunday 7): `weekday(d) + 1`
  (sqlglot's `dayofweek(d) % 7 + 1` gives Sunday 2).
- `log(x)`: base 10 in DuckDB, the natural logarithm in Spark: `log10(x)`.
- `list_value(...)`: Spark's `array(...)`; `isfinite(x)`: `abs(x) < Infinity` (NaN is above
  every number in Spark's order, so it is not finite, as in DuckDB).
- `list_distinct(l)` drops NULLs in DuckDB, `array_distinct` keeps one: `array_compact(array_distinct(l))`;
  `list_sort(l)` (ascending, NULLs last in both): `array_sort(l)` (a predictive query's LIST_DISTINCT).
"""

from __future__ import annotations

from collections.abc import Callable

import sqlglot.expressions as exp

from relsql import sql as q

UTC_ZONES = frozenset({"UTC", "ETC/UTC", "Z", "+00:00", "GMT", "ETC/GMT", "UCT", "ZULU", "UNIVERSAL"})
_DOUBLE = exp.DataType.Type.DOUBLE


def spark_function(node: exp.Expression, rewrite: Callable[[exp.Expression], exp.Expression],
                   zoned: Callable[[], None]) -> exp.Expression | None:
    """Spark's expression for DuckDB's function `node`, its arguments passed through `rewrite`
    (a replacement is not visited again); None where `node` is none of them. `zoned` is called
    when the expression written depends on the session's time zone."""
    name = str(node.this).lower() if isinstance(node, exp.Anonymous) else None
    if name == "epoch" or isinstance(node, exp.TimeToUnix):
        zoned()
        micros = exp.Anonymous(this="unix_micros", expressions=[
            exp.Cast(this=rewrite(_argument(node)), to=exp.DataType(this=exp.DataType.Type.TIMESTAMP))])
        return exp.Div(this=micros, expression=q.real(1e6))
    if name == "dayofweek" or isinstance(node, exp.DayOfWeek):
        return exp.paren(exp.Sub(this=exp.Anonymous(this="dayofweek", expressions=[rewrite(_argument(node))]),
                                 expression=q.integer(1)), copy=False)
    if name == "isodow" or isinstance(node, exp.DayOfWeekIso):
        return exp.paren(exp.Add(this=exp.Anonymous(this="weekday", expressions=[rewrite(_argument(node))]),
                                 expression=q.integer(1)), copy=False)
    if isinstance(node, exp.Log) and node.args.get("expression") is None:
        return exp.Anonymous(this="log10", expressions=[rewrite(node.this)])
    if name == "list_value":
        return exp.Array(expressions=[rewrite(e) for e in node.expressions])
    if name == "list_distinct" or isinstance(node, exp.ArrayDistinct):
        return exp.Anonymous(this="array_compact", expressions=[
            exp.Anonymous(this="array_distinct", expressions=[rewrite(_argument(node))])])
    if name == "list_sort" and len(node.expressions) == 1:
        return exp.Anonymous(this="array_sort", expressions=[rewrite(_argument(node))])
    if name == "isfinite":
        return exp.LT(this=exp.Abs(this=exp.Cast(this=rewrite(_argument(node)), to=exp.DataType(this=_DOUBLE))),
                      expression=exp.Cast(this=exp.Literal.string("Infinity"), to=exp.DataType(this=_DOUBLE)))
    return None


def _argument(node: exp.Expression) -> exp.Expression:
    """The one argument of a function call, typed (`this`) or not (the first of `expressions`)."""
    return node.expressions[0] if isinstance(node, exp.Anonymous) else node.this


def is_utc(zone: str | None) -> bool:
    """Whether a session time zone setting names UTC (or a zone always at its offset 0)."""
    return zone is not None and zone.strip().upper() in UTC_ZONES
