"""Each table's encoder: the statement enc_<table> turning a row's own columns into one vector.

Numbers, booleans and dates are features (numbers="ple": cut into ranges at the database's
quantiles, dates by calendar parts; "standardized": the earlier standardized features), text and
small integer codes are embedded (at most SMALL_INTEGER_CATEGORIES values), long text is hashed.
Identifiers never become numbers: key columns (primary and foreign, declared or inferred) are used
only to join, and a column named like an identifier that is not a key is left out unless it holds a
code (at most SMALL_INTEGER_CATEGORIES distinct values, each on at least two rows on average)."""

from __future__ import annotations

from dataclasses import dataclass, field

import sqlglot.expressions as exp

from relsql import sql as q
from relsql.data.catalog import Column, Table
from relsql.data.coltypes import is_feature, is_flag, is_floating, is_integer, is_interval, is_text, is_time_type
from relsql.template.auto.columns import id_like
from relsql.template.auto.draft import Draft
from relsql.template.auto.names import quoted, safe

MAX_CATEGORIES = 1000  # text columns with more distinct values are skipped
SMALL_INTEGER_CATEGORIES = 10  # integer columns with at most this many values are codes
PLE_BINS = 32  # ranges per number at most (piecewise-linear encoding at the database's quantiles)
PLE_MIN_BINS = 8  # ... and at least: fewer where a table's encoded numbers would outgrow PLE_CELLS
PLE_CELLS = 1 << 24  # rows x numbers x (bins + 1) values of a table's ple encoding (float64: 128 MiB)
RARE = 3  # a code on fewer rows shares the vector of rare and unseen values
FEW_VALUES = 3  # a number with at most this many values is only embedded: quantile ranges of it would mostly be empty
NUMBER_CODES = 32  # a number with at most this many values is also embedded: a step or lookup function of it
OWN_WIDTH = 32  # the target table's second encoding, read by the prediction's own term (own_encoder)


@dataclass
class Columns:
    """A table's input columns by how they are encoded, in the table's order."""

    numeric: list[str] = field(default_factory=list)  # numbers, booleans, dates and durations
    categorical: list[str] = field(default_factory=list)  # codes and text with few values: embedded
    skipped: list[str] = field(default_factory=list)  # constant, all NULL, or of an unsupported type
    identifiers: list[str] = field(default_factory=list)  # named like identifiers, not keys, not codes
    copies: list[str] = field(default_factory=list)  # numbers with few values, also embedded
    texts: list[str] = field(default_factory=list)  # text with many values: hashed words


def encoder(draft: Draft, table: str) -> None:
    """Write enc_<table>: one `width`-wide vector per row of `table` from its own columns."""
    value, lines, source = encoding(draft, table, "t")
    lines.append(f"CREATE TABLE enc_{draft.labels[table]} AS\nSELECT {_keys(draft, table)}, {value} AS h\nFROM {source} t;\n")
    draft.out.append("\n".join(lines))


def own_encoder(draft: Draft) -> tuple[str, str] | None:
    """(own_<target>, its statement): the target row's own columns encoded again, OWN_WIDTH wide (per
    member), for the prediction's own term alone (layers.head); None where it has none to encode.
    The relations' 16-wide layer is a narrow read of a row's own columns where a GBM finds
    interactions of them: on 51 outside targets x 3 seeds the network alone reached the one-hop GBM
    in 65 runs instead of 48 at 32 wide, 57 at 64 wide, which cost more and memorised plurel_33's
    rows (docs/quality.md, "A wider read of the target row's own columns", "32 wide, not 64").
    Hashed text stays in the narrow encoding only: a second 65,537-row table read by bags of the
    same ids would keep both tables whole in training (relsql/compile/compact.py)."""
    table = draft.target
    found = columns(draft, table)
    parts = encodings(draft, table, found.numeric, found.categorical + found.copies, [], "t", OWN_WIDTH * draft.members, "own")
    if not parts:
        return None
    relation, source = f"own_{draft.labels[table]}", rows(draft, draft.schema.tables[table], found.numeric)
    return relation, (f"-- {table}: its own columns again (hashed text aside), {OWN_WIDTH * draft.members} wide, read only "
                      f"by the prediction's own term\nCREATE TABLE {relation} AS\nSELECT {_keys(draft, table)}, "
                      f"{draft.activation(' + '.join(parts))} AS h\nFROM {source} t;\n")


def _keys(draft: Draft, table: str) -> str:
    """An encoder's key columns, named as `Draft.own` names them."""
    return ", ".join(f"t.{quoted(k)}" + (f" AS {quoted(name)}" if name != k else "") for k, name in draft.own(table).items())


def encoding(draft: Draft, table: str, alias: str) -> tuple[str, list[str], str]:
    """(`table`'s row encoding over its columns as `alias`.<column>, the comment lines saying what it
    reads, the FROM source the columns come from): enc_<table>'s value, or for a table without a
    key, the value its rows are encoded to inside the aggregates that read them."""
    info: Table = draft.schema.tables[table]
    found = columns(draft, table)
    parts = encodings(draft, table, found.numeric, found.categorical + found.copies, found.texts, alias)
    t = draft.labels[table]
    value = draft.activation(" + ".join(parts)) if parts else \
        f"bias({draft.width}, '{draft.weight_name(f'enc_{t}_bias')}')"
    keyed = bool(draft.schema.primary_keys.get(table))
    lines = [f"-- {table}: its own columns encoded into one {draft.width}-wide vector per row" + (
        "" if keyed else " (no key of its own: encoded inside the aggregates that read its rows)")]
    if table == draft.target:
        lines.append(f"-- (the target column {draft.column} is never an input)")
    if found.identifiers:
        lines.append(f"-- left out, named like identifiers but not keys: {', '.join(found.identifiers)}")
        draft.identifiers += [n for n in (f"{table}.{c}" for c in found.identifiers) if n not in draft.identifiers]
    if found.copies:
        lines.append(f"-- numbers with at most {NUMBER_CODES} values, also embedded (a step function of one column): "
                     f"{', '.join(found.copies)}")
    if found.texts:
        lines.append(f"-- text with more than {MAX_CATEGORIES} values, as hashed words and 3-grams: {', '.join(found.texts)}")
    nonfinite = [c for c in found.numeric if (table, c) in draft.nonfinite]
    if nonfinite:
        lines.append(f"-- numbers holding NaN or infinities, read as missing (NULL) there: {', '.join(nonfinite)}")
    if found.skipped:
        lines.append(f"-- skipped columns (constant, all NULL, high-cardinality text or unsupported types): "
                     f"{', '.join(found.skipped)}")
    if not parts:
        lines.append("-- no usable columns: a learnable constant that still tells rows exist")
    return value, lines, rows(draft, info, found.numeric)


def columns(draft: Draft, table: str) -> Columns:
    """`table`'s columns by encoding: keys only join, and the target column is never an input."""
    keys = set(draft.schema.primary_keys.get(table, ()))
    fks = {c for child, fk in draft.schema.foreign_keys if child == table for c in fk.columns}
    found = Columns()
    inputs = [col for col in draft.schema.tables[table].columns
              if not (col.name in keys or col.name in fks or (table == draft.target and col.name == draft.column))]
    count_all(draft, table, [col.name for col in inputs if _counted(col.type.upper())])
    for col in inputs:
        for kind in _kinds(draft, table, col):
            getattr(found, kind).append(col.name)
    return found


def _counted(upper: str) -> bool:
    """Whether `_kinds` reads a column of this type's counts (`distinct`, `counts`)."""
    return is_text(upper) or (is_feature(upper) and not is_flag(upper) and not is_time_type(upper))


def _kinds(draft: Draft, table: str, col: Column) -> tuple[str, ...]:
    """The `Columns` lists one column goes to."""
    upper = col.type.upper()
    text = is_text(upper)
    if is_interval(upper):
        return ("numeric",)  # a duration: its seconds (see `rows`), never a code
    integer = is_integer(upper)
    if id_like(col.name) and not draft.schema.is_value(table, col.name):
        # an identifier that is not a key: never a number; embedded only if it is a code
        # (a year named like one, `yearID`, in no key is a value: relsql.data.keys.Schema.is_value)
        return ("categorical",) if (text or integer) and is_code(draft, table, col.name) else ("identifiers",)
    values = distinct(draft, table, col.name) if text or integer else 0
    if integer and values <= SMALL_INTEGER_CATEGORIES:
        return ("categorical",)  # a code such as a type or level: embedded
    if is_feature(upper):
        return _number_kinds(draft, table, col.name, upper)
    if text:
        return ("categorical",) if values <= MAX_CATEGORIES else ("texts",) if draft.numbers == "ple" else ("skipped",)
    return ("skipped",)


def _number_kinds(draft: Draft, table: str, column: str, upper: str) -> tuple[str, ...]:
    """The `Columns` lists a number, boolean or date column goes to."""
    if is_flag(upper) or is_time_type(upper):
        return ("numeric",)
    values, present = counts(draft, table, column)
    if values == 0 or (values == 1 and present == draft.sizes.table_rows(table)):
        return ("skipped",)  # constant or all NULL: nothing to learn from
    if values <= FEW_VALUES:
        return ("categorical",)  # a few values (a flag, a level): embedded, not cut into ranges
    return ("numeric", "copies") if few_values(draft, table, column) else ("numeric",)


def encodings(draft: Draft, table: str, numeric: list[str], codes: list[str], texts: list[str], alias: str = "t",
              width: int | None = None, prefix: str = "enc") -> list[str]:
    """The terms of a table's encoder. numbers="ple": numbers cut into ranges at the database's
    quantiles (a learnable function of each, not only a slope), dates by calendar parts and
    year, booleans as 0/1, codes embedded with one shared vector for rare and unseen values,
    long text hashed; numbers="standardized": the earlier encoder (standardized numbers,
    plain embeddings). On bench.quality --quick, "ple" beat "standardized" on all 4 targets
    (docs/quality.md). `width` and `prefix` (of the weights' names): the template's width and
    "enc" unless own_encoder asks for others."""
    t, w, name = draft.labels[table], width or draft.width, draft.weight_name
    types = {c.name: c.type.upper() for c in draft.schema.tables[table].columns}

    def read(names: list[str]) -> str:
        return ", ".join(f"{alias}.{quoted(c)}" for c in names)

    parts = []
    if draft.numbers == "standardized":
        if numeric:
            parts.append(f"linear(features({read(numeric)}), {w}, '{name(f'{prefix}_{t}_num')}')")
        return parts + [f"embed({alias}.{quoted(c)}, {w}, '{name(f'{prefix}_{t}_{safe(c)}')}')" for c in codes]
    flags = [c for c in numeric if is_flag(types[c])]
    dates = [c for c in numeric if is_time_type(types[c]) and c not in flags]
    numbers = [c for c in numeric if c not in flags and c not in dates]
    if numbers:
        bins = ple_bins(draft.sizes.table_rows(table), len(numbers))
        parts.append(f"linear(ple({read(numbers)}, {bins}), {w}, '{name(f'{prefix}_{t}_num')}')")
    if flags:
        parts.append(f"linear(features({read(flags)}), {w}, '{name(f'{prefix}_{t}_flags')}')")
    if dates:
        parts.append(f"linear(calendar({read(dates)}), {w}, '{name(f'{prefix}_{t}_dates')}')")
    parts += [f"embed({alias}.{quoted(c)}, {w}, '{name(f'{prefix}_{t}_{safe(c)}')}', min_count={RARE})" for c in codes]
    parts += [f"text({alias}.{quoted(c)}, {w}, '{name(f'{prefix}_{t}_{safe(c)}')}')" for c in texts]
    return parts


def ple_bins(rows: int, numbers: int) -> int:
    """Ranges per number for a table of `rows` rows and `numbers` ple columns: PLE_BINS, halved
    while the encoding (one float64 per row, number and range, plus a NULL flag) would pass
    PLE_CELLS, never below PLE_MIN_BINS. Fine ranges let the network read a number as finely as a
    GBM splits it: on 28 outside targets x 3 seeds, 32 against the former 8 lowered the network's
    own test error by 3.5 % on average (62 runs better, 19 worse); 64 gained little more at 3x the
    extra CPU (docs/quality.md). The bound keeps a table of millions of rows at the former memory."""
    bins = PLE_BINS
    while bins > PLE_MIN_BINS and rows * numbers * (bins + 1) > PLE_CELLS:
        bins //= 2
    return bins


def rows(draft: Draft, info: Table, numeric: list[str]) -> str:
    """The encoder's FROM: the table itself, or a subquery reading each INTERVAL column as its
    seconds (`epoch`, DuckDB's 30-day months: features() takes numbers, and a duration is one) and
    each floating-point column holding NaN or an infinity with those values as missing (NULL): no
    quantile or scale can hold them, and ple refuses them."""
    durations = {c.name for c in info.columns if c.name in numeric and is_interval(c.type)}
    nonfinite = {c.name for c in info.columns if c.name in numeric and (info.name, c.name) in draft.nonfinite}
    if not durations and not nonfinite:
        return quoted(info.name)

    def read_as(name: str) -> exp.Expression:
        if name in durations:
            return exp.alias_(exp.Anonymous(this="epoch", expressions=[q.col(name)]), q.ident(name))
        if name in nonfinite:
            finite = exp.Anonymous(this="isfinite", expressions=[q.col(name)])
            return exp.alias_(exp.Case(ifs=[exp.If(this=finite, true=q.col(name))]), q.ident(name))
        return q.col(name)
    read = [read_as(c.name) for c in info.columns
            if not (info.name == draft.target and c.name == draft.column)]  # the target is never an input
    return exp.Subquery(this=exp.select(*read).from_(q.ident(info.name))).sql("duckdb")


def distinct(draft: Draft, table: str, column: str) -> int:
    """A column's distinct values (NULL not counted)."""
    if (table, column) in draft.counted:
        return draft.counted[table, column][0]
    count = exp.select(exp.Count(this=exp.Distinct(expressions=[exp.column(exp.to_identifier(column, quoted=True))])))
    return draft.db.scalar(count.from_(exp.Table(this=exp.to_identifier(table, quoted=True))))[0]


def few_values(draft: Draft, table: str, column: str) -> bool:
    """A number taking few distinct values (a level, a rating, a rounded amount), each on two or
    more rows on average: its effect may be any function of the value, which an embedding of
    the value learns directly and a weighted sum of the standardized number cannot."""
    values, present = counts(draft, table, column)
    return 2 < values <= NUMBER_CODES and 2 * values <= present


def is_code(draft: Draft, table: str, column: str) -> bool:
    """Few distinct values, each on at least two rows on average: a code, not an identifier."""
    values, present = counts(draft, table, column)
    return 0 < values <= SMALL_INTEGER_CATEGORIES and 2 * values <= present


def counts(draft: Draft, table: str, column: str) -> tuple[int, int]:
    """(distinct values, non-NULL rows) of a column, one query per column (`draft.counted`)."""
    if (table, column) in draft.counted:
        return draft.counted[table, column]
    col = exp.column(exp.to_identifier(column, quoted=True))
    query = exp.select(exp.Count(this=exp.Distinct(expressions=[col.copy()])), exp.Count(this=col.copy()))
    table_sql = exp.Table(this=exp.to_identifier(table, quoted=True))
    draft.counted[table, column] = draft.db.scalar(query.from_(table_sql))
    return draft.counted[table, column]


def count_all(draft: Draft, table: str, columns: list[str]) -> None:
    """`counts` of several columns of one table in one query (one scan, one statement: a query a
    column cost Lahman's Template.auto ~2 s CPU for 390 of them); the same counts, exact."""
    columns = [c for c in columns if (table, c) not in draft.counted]
    if not columns:
        return
    types = {c.name: c.type for c in draft.schema.tables[table].columns}
    floats = [c for c in columns if is_floating(types.get(c, ""))]
    read = []
    for column in columns:
        col = exp.column(exp.to_identifier(column, quoted=True))
        read += [exp.Count(this=exp.Distinct(expressions=[col])), exp.Count(this=col.copy())]
    for column in floats:  # NaN and infinities: non-NULL values that are not finite
        col = exp.column(exp.to_identifier(column, quoted=True))
        finite = exp.Case(ifs=[exp.If(this=exp.Anonymous(this="isfinite", expressions=[col.copy()]), true=q.integer(1))])
        read.append(exp.Sub(this=exp.Count(this=col), expression=exp.Count(this=finite)))
    query = exp.select(*read, copy=False).from_(exp.Table(this=exp.to_identifier(table, quoted=True)), copy=False)
    row = draft.db.scalar(query)
    for i, column in enumerate(columns):
        draft.counted[table, column] = (row[2 * i], row[2 * i + 1])
    draft.nonfinite |= {(table, c) for c, bad in zip(floats, row[2 * len(columns):]) if bad}
