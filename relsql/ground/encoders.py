"""Column encoders the database computes, for `ple(...)`, `calendar(...)` and `embed(..., min_count=k)`.

Each encoder's statistics (quantile edges, the year's mean and spread, the frequent values) are
computed once over the rule's groundings when a model is built, and kept with it (the grounding's
`feature_stats` and dictionaries), so a saved model encodes another database's rows exactly as it
encoded the rows it learned from. The year's mean and spread and the frequent values come from
SQL; a ple column's quantile edges are computed here (`quantile_edges`) from its numbers. The
encodings are SQL expressions over the grounding row `g`, except ple where the groundings are
read in bulk: the database sends the number and `ple_values` encodes it (equal to `ple_sql`).

- `ple`: piecewise-linear encoding (Gorishniy et al. 2022). With edges b_0 <= ... <= b_k (the
  quantiles 0, 1/k, ..., 1 of the column), component i is 0 for x < b_i, 1 for x >= b_{i+1} and
  (x - b_i) / (b_{i+1} - b_i) between; the first component is not cut below (x < b_0 gives a
  negative value) nor the last one above (x > b_k gives more than 1), so values beyond the range
  the model saw stay apart. A bin of zero width is a step: 1 from its edge on. A NULL is all 0
  and a last indicator component 1 (0 otherwise): k + 1 numbers per column.
- `calendar`: sin and cos of the month ((month - 1) / 12 of a turn), the day of the week
  (DuckDB's dayofweek, Sunday 0, / 7), the day of the month ((day - 1) / 31) and, for
  timestamps, the hour (/ 24); then the time in years (epoch seconds / 31,556,952 + 1970)
  standardized with the database's mean and population spread; then a NULL indicator (a NULL
  is all 0 and the indicator 1): 8 numbers per date, 10 per timestamp.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pyarrow as pa
import sqlglot.expressions as exp

from relsql import sql as q
from relsql.errors import RelsqlError, SchemaError

SECONDS_PER_YEAR = 31_556_952.0  # the Gregorian calendar's mean year, 365.2425 days
DOUBLE = exp.DataType.build(exp.DataType.Type.DOUBLE)


def double(value: exp.Expression) -> exp.Expression:
    return exp.Cast(this=value, to=exp.DataType(this=exp.DataType.Type.DOUBLE))  # exp.cast() costs 5x (re-checks, copies)


def _call(name: str, *args: exp.Expression) -> exp.Expression:
    return exp.Anonymous(this=name, expressions=list(args))


def null_indicator(number: exp.Expression) -> exp.Expression:
    """1.0 for a NULL, 0.0 otherwise."""
    return double(exp.Is(this=number.copy(), expression=exp.Null()))


def ple_number(raw: exp.Expression, kind: pa.DataType, label: str) -> exp.Expression:
    """The number `ple` cuts: numeric columns as DOUBLE, dates and timestamps as epoch seconds."""
    if pa.types.is_date(kind) or pa.types.is_timestamp(kind):
        return double(_call("epoch", raw))
    if pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_decimal(kind):
        return double(raw)
    raise SchemaError(f"{label} needs a numeric, date or timestamp column, got {kind}; use embed(...) for "
                      "categorical columns")


def quantile_edges(numbers: np.ndarray, bins: int) -> list[float] | None:
    """The quantiles 0, 1/bins, ..., 1 of `numbers` (float64, finite, no NULLs; None when there are
    none), interpolated as DuckDB 1.5's quantile_cont does: at rank r = (n - 1) * q between the
    sorted values lo (rank floor r) and hi (rank ceil r), lo * (1 - d) + hi * d with d = r - floor r.
    Equal to `quantile_cont(x, [0, 1/bins, ...])` of duckdb 1.5.5 bit for bit (checked on 1,500
    random columns); duckdb 2 interpolates otherwise in the last bit, and Spark has no
    quantile_cont: computed here, a ple column's edges are the same whichever engine grounds it."""
    n = len(numbers)
    if n == 0:
        return None
    ranks = [(n - 1) * (i / bins) for i in range(bins + 1)]
    positions = sorted({math.floor(r) for r in ranks} | {math.ceil(r) for r in ranks})
    ordered = np.partition(np.asarray(numbers, dtype=np.float64), positions)  # each position holds its order statistic
    edges = []
    for rank in ranks:
        below, above = math.floor(rank), math.ceil(rank)
        if below == above:
            edges.append(float(ordered[below]))
        else:
            low, high, d = float(ordered[below]), float(ordered[above]), rank - below
            edges.append(low * (1 - d) + high * d)
    return edges


def ple_column_stats(column: pa.Array | pa.ChunkedArray, bins: int) -> tuple[int, dict]:
    """(the count of infinite or NaN values, the `ple_stats`) of a column of numbers as read from
    the database (the ple number, DOUBLE, NULLs kept): its quantile edges and whether it has NULLs."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if pa.types.is_null(column.type):
        return 0, ple_stats(None, bins, len(column) > 0)
    if not pa.types.is_float64(column.type):
        column = column.cast(pa.float64())
    nulls = column.null_count
    numbers = np.asarray((column.drop_null() if nulls else column).to_numpy(zero_copy_only=False), dtype=np.float64)
    bad = int(numbers.size - np.count_nonzero(np.isfinite(numbers)))
    if bad:
        return bad, {}
    return 0, ple_stats(quantile_edges(numbers, bins), bins, nulls)


def ple_stats(edges: list | None, bins: int, nulls: bool) -> dict:
    """Statistics kept for a `ple` column (mean/std stay neutral: what every feature entry has)."""
    values = [0.0] * (bins + 1) if edges is None else [float(e) for e in edges]
    # the interpolation of quantiles: on a column with few distinct values its edges can step back
    # in the last bit (..676, ..675, ..676); a running maximum keeps them ascending (a tie is a step)
    values = [float(v) for v in np.maximum.accumulate(np.asarray(values, dtype=np.float64))]
    return {"mean": 0.0, "std": 1.0, "nulls": bool(nulls), "kind": "ple", "edges": values}


def checked_edges(stats: dict, bins: int, label: str) -> list[float]:
    """A `ple` entry's edges, checked (a saved model's become typed literals in SQL): bins + 1
    finite numbers, ascending."""
    edges = stats.get("edges")
    if stats.get("kind") != "ple" or not isinstance(edges, list) or len(edges) != bins + 1 \
            or not all(isinstance(e, int | float) and not isinstance(e, bool) and math.isfinite(e) for e in edges) \
            or any(b < a for a, b in zip(edges, edges[1:])):
        raise RelsqlError(f"{label}: the saved bin edges are damaged (expected {bins + 1} ascending finite numbers); "
                          "rebuild the model")
    return [float(e) for e in edges]


def ple_sql(number: exp.Expression, edges: list[float]) -> exp.Expression:
    """The piecewise-linear encoding of `number` over `edges` and its NULL indicator, as one list."""
    bins = len(edges) - 1
    parts = [_ple_component(number, edges[i], edges[i + 1], first=i == 0, last=i == bins - 1) for i in range(bins)]
    return _call("list_value", *parts, null_indicator(number))


_NEGATIVE_ZERO = np.array(-0.0).view(np.int64)
_PLE_BLOCK = 8192  # rows encoded at a time: one block of all bins (~600 kB) stays in cache


def ple_values(numbers: np.ndarray, nulls: np.ndarray | None, edges: list[float]) -> np.ndarray:
    """`ple_sql` computed here: the (G, bins + 1) float64 encoding of `numbers` (float64; the rows
    where `nulls` is True are NULL, their number ignored) over `edges`.

    Equal to the database's result bit for bit: the same two float64 operations, (x - low) / width
    with width = high - low (the SQL's literal, read exactly: `exact_real`), then the SQL's cases
    as a clip to [0, 1], which changes nothing else: rounding is monotone, so x >= high gives a
    quotient >= 1 and x < low one <= 0; a quotient of -0.0 (x = -0.0 at low = 0.0, kept, or an
    underflow below low, which the SQL makes 0.0) is set as the SQL sets it. The first bin is not
    cut below, the last not above; a zero-width bin is a step (1 from its edge on); a NULL is all 0
    with the indicator 1. A NaN compares as the databases compare it (DuckDB and Spark order NaN
    above every number): 1 in every bin but the last, where it stays NaN."""
    numbers = np.asarray(numbers, dtype=np.float64)
    rows, bins = numbers.shape[0], len(edges) - 1
    out = np.empty((rows, bins + 1), dtype=np.float64)
    block = np.empty((bins + 1, min(rows, _PLE_BLOCK)), dtype=np.float64)
    for start in range(0, rows, _PLE_BLOCK):
        stop = min(start + _PLE_BLOCK, rows)
        part = block[:, :stop - start]
        _ple_block(numbers[start:stop], None if nulls is None else nulls[start:stop], edges, part)
        out[start:stop] = part.T
    return out


def _ple_block(numbers: np.ndarray, nulls: np.ndarray | None, edges: list[float], out: np.ndarray) -> None:
    """`ple_values` of a block of rows, written into `out` (bins + 1, rows): a contiguous row per
    component, small enough to stay in cache while every bin is computed and then transposed."""
    bins = len(edges) - 1
    nan = np.isnan(numbers)
    nan = np.flatnonzero(nan) if nan.any() else None
    null = np.flatnonzero(nulls) if nulls is not None and nulls.any() else None
    for i in range(bins):
        low, high = float(edges[i]), float(edges[i + 1])
        part = out[i]
        if high <= low:  # a zero-width bin: a step at its edge
            part[:] = numbers >= high
            if nan is not None:
                part[nan] = 1.0
        else:
            with np.errstate(over="ignore"):  # ±1e308 apart, or a subnormal width: the database's result is inf too
                np.subtract(numbers, low, out=part)
                np.divide(part, high - low, out=part)
            first, last = i == 0, i == bins - 1
            if not first:  # which sign of zero a clip returns is the library's: set those as the SQL does
                signed = np.flatnonzero(part.view(np.int64) == _NEGATIVE_ZERO)
            if first and not last:
                np.minimum(part, 1.0, out=part)
            elif last and not first:
                np.maximum(part, 0.0, out=part)
            elif not first:
                np.clip(part, 0.0, 1.0, out=part)
            if not first and signed.size:
                part[signed] = np.where(numbers[signed] < low, 0.0, -0.0)
            if nan is not None and not last:
                part[nan] = 1.0
        if null is not None:
            part[null] = 0.0
    out[bins] = 0.0
    if null is not None:
        out[bins, null] = 1.0


def exact_real(value: float) -> exp.Expression:
    """A DOUBLE literal the database reads as exactly `value`: q.real's checks, written with an
    exponent (`CAST(1.8399999999999994e-01 AS DOUBLE)`). DuckDB reads a plain literal of 17 digits
    (`0.18399999999999994`, what repr writes) as a DECIMAL and casts it to the double beside it
    (0.1839999999999999): 3% of random doubles; with an exponent the literal is a DOUBLE, read exactly."""
    q.real(value)  # the checks: a finite number, never text
    value = float(value)
    number: exp.Expression = exp.Literal(this=f"{abs(value):.16e}", is_string=False)  # Literal.number rewrites the text
    if math.copysign(1.0, value) < 0:
        number = exp.Neg(this=number)
    return exp.Cast(this=number, to=exp.DataType(this=exp.DataType.Type.DOUBLE))


def _ple_component(number: exp.Expression, low: float, high: float, first: bool, last: bool) -> exp.Expression:
    one, zero = q.real(1.0), q.real(0.0)
    if high <= low:  # a bin of zero width (ties at a quantile): a step at its edge
        return exp.Coalesce(this=exp.Case(ifs=[exp.If(this=exp.GTE(this=number.copy(), expression=exact_real(high)), true=one)],
                                          default=zero.copy()), expressions=[zero.copy()])
    inside = exp.Div(this=exp.paren(exp.Sub(this=number.copy(), expression=exact_real(low))), expression=exact_real(high - low))
    cases = []
    if not first:
        cases.append(exp.If(this=exp.LT(this=number.copy(), expression=exact_real(low)), true=zero.copy()))
    if not last:
        cases.append(exp.If(this=exp.GTE(this=number.copy(), expression=exact_real(high)), true=one.copy()))
    value = exp.Case(ifs=cases, default=inside) if cases else inside
    return exp.Coalesce(this=value, expressions=[zero.copy()])


def is_time(kind: pa.DataType) -> bool:
    return pa.types.is_date(kind) or pa.types.is_timestamp(kind)


def calendar_year(raw: exp.Expression) -> exp.Expression:
    """The time in (fractional) years: epoch seconds / the mean Gregorian year + 1970."""
    return exp.Add(this=exp.Div(this=double(_call("epoch", raw)), expression=q.real(SECONDS_PER_YEAR)),
                   expression=q.real(1970.0))


def calendar_stats(mean: float | None, std: float | None, nulls: bool) -> dict:
    """Statistics kept for a `calendar` column: the year's mean and population spread."""
    return {"mean": float(mean or 0.0), "std": float(std) if std else 1.0, "nulls": bool(nulls), "kind": "calendar"}


def calendar_sql(raw: exp.Expression, timestamp: bool, stats: dict) -> exp.Expression:
    """Cyclic month, day of week, day of month (and hour), the standardized year, a NULL indicator."""
    turn = q.real(2.0 * math.pi)
    parts = []
    cycles: list[tuple[Callable[[], exp.Expression], float]] = [
        (lambda: exp.Sub(this=_call("month", raw.copy()), expression=q.integer(1)), 12.0),
        (lambda: _call("dayofweek", raw.copy()), 7.0),
        (lambda: exp.Sub(this=_call("day", raw.copy()), expression=q.integer(1)), 31.0),
    ]
    if timestamp:
        cycles.append((lambda: _call("hour", raw.copy()), 24.0))
    for part, period in cycles:
        angle = exp.Div(this=exp.Mul(this=turn.copy(), expression=double(part())), expression=q.real(period))
        for fn in ("sin", "cos"):
            parts.append(exp.Coalesce(this=_call(fn, angle.copy()), expressions=[q.real(0.0)]))
    year = exp.Div(this=exp.paren(exp.Sub(this=calendar_year(raw), expression=q.real(stats["mean"]))),
                   expression=q.real(stats["std"]))
    parts.append(exp.Coalesce(this=year, expressions=[q.real(0.0)]))
    parts.append(null_indicator(raw))
    return _call("list_value", *parts)


def checked_kind(stats: dict, kind: str, label: str) -> dict:
    """A saved entry made by the same encoder (a template and its saved statistics belong together)."""
    if stats.get("kind") != kind:
        raise RelsqlError(f"{label}: the saved statistics are for {stats.get('kind') or 'features'}, not {kind}; "
                          "the saved model is damaged: rebuild it")
    if kind == "calendar" and not (np.isfinite(stats["mean"]) and np.isfinite(stats["std"]) and stats["std"] > 0):
        raise RelsqlError(f"{label}: the saved year statistics are damaged; rebuild the model")
    return stats


def frequent_dictionary(source: exp.Expression, column: str, min_count: int) -> exp.Select:
    """(value, code) for `embed(..., min_count=k)`: code 0 is the shared row of rare values, unseen
    values and NULL (value NULL); the non-NULL values in at least k groundings get 1, 2, ... in value order."""
    # copy=False: sqlglot's builders copy the whole query so far, `source` included, at each step
    counted = exp.select(q.alias(q.col(column), "v"), copy=False).from_(source.copy(), copy=False).where(
        exp.Not(this=exp.Is(this=q.col(column), expression=exp.Null())), copy=False).group_by(q.col(column), copy=False).having(
        exp.GTE(this=exp.Count(this=exp.Star()), expression=q.integer(min_count)), copy=False)
    code = exp.Window(this=exp.RowNumber(), order=exp.Order(expressions=[exp.Ordered(this=q.col("v", "n"))]))
    frequent = exp.select(q.col("v", "n"), q.alias(code, "code"), copy=False).from_(
        q.alias(exp.Subquery(this=counted), "n", table=True), copy=False)
    return exp.union(exp.select(exp.Null(), q.integer(0)), frequent, distinct=False, copy=False)


def rare_lookup(lookup: exp.Select) -> exp.Expression:
    """A code lookup where a value without a code reads the rare row 0."""
    return exp.Coalesce(this=exp.Subquery(this=lookup), expressions=[q.integer(0)])
