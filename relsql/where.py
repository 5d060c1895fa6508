"""A user's `where` condition on one table's rows: `predict(where=...)`, `write_predictions(where=...)`
and the CLI's `--where`.

The text is parsed by sqlglot and checked node by node (one boolean expression; no statement,
subquery, other table, aggregate, window, parameter or function sqlglot does not know), its columns
are replaced by quoted references to the table's real columns, and the database evaluates the
rebuilt AST: the user's text is never pasted into SQL, and nothing but a filter over the table can
run. Before sqlglot sees it, the text is bounded (MAX_WHERE_CHARS characters, MAX_WHERE_NESTING
levels of brackets, CASE and prefix operators such as NOT), since sqlglot's parser recurses once per
level. It sits below relsql.train and relsql.cli, which both use it (parse_condition alone needs no
database: the CLI checks --where with it before the model is loaded).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl
import sqlglot
import sqlglot.expressions as exp
from sqlglot.errors import SqlglotError
from sqlglot.tokens import Tokenizer, TokenType

from relsql import sql as q
from relsql.errors import RelsqlError

if TYPE_CHECKING:
    from relsql.data.engine import Database

__all__ = ["MAX_WHERE_CHARS", "MAX_WHERE_NESTING", "WhereError", "condition", "parse_condition", "where_keys"]

# nodes a condition on one table's row never needs; each would reach beyond that row
REFUSED = {
    exp.Query: "a query", exp.Subquery: "a subquery", exp.Exists: "a subquery (EXISTS)", exp.Table: "a table",
    exp.AggFunc: "an aggregate", exp.Window: "a window function", exp.Placeholder: "a parameter",
    exp.Parameter: "a parameter", exp.Star: "*", exp.Anonymous: "a function sqlglot does not know",
    exp.ReadCSV: "a file reader", exp.ReadParquet: "a file reader",
}
BOOLEAN_NODES = (exp.Predicate, exp.Connector, exp.Not, exp.Boolean, exp.Xor)
# a condition on one row is short; choosing many rows is what keys= is for
MAX_WHERE_CHARS = 10_000
MAX_WHERE_NESTING = 32  # brackets, CASE ... END and runs of NOT / - / + / ~: sqlglot recurses once per level
_OPENS = {TokenType.L_PAREN, TokenType.L_BRACKET, TokenType.L_BRACE, TokenType.CASE}
_CLOSES = {TokenType.R_PAREN, TokenType.R_BRACKET, TokenType.R_BRACE, TokenType.END}
_PREFIX = {TokenType.NOT, TokenType.DASH, TokenType.PLUS, TokenType.TILDE}


class WhereError(RelsqlError):
    """A `where` condition that is not a boolean expression over the target table's columns."""


def _named(table: str) -> str:
    return f"`{table}`" if table else "the target table"


def _fix(table: str) -> str:
    return (f"write one condition on the columns of {_named(table)}, e.g. \"spend > 100 AND tier = 'gold'\" "
            "(no statements, subqueries or other tables)")


def _shown(text: object) -> str:
    """The user's condition for a message, clipped (a 10,000-character condition is not repeated whole)."""
    shown = repr(text)
    return shown if len(shown) <= 120 else f"{shown[:100]}... ({len(text) if isinstance(text, str) else len(shown)} characters)"


def _nesting_fix(table: str) -> str:
    return (f"write the condition with at most {MAX_WHERE_NESTING} levels of parentheses, CASE and repeated NOT or "
            f"signs (NOT NOT x is x), on the columns of {_named(table)}")


def _check_size(text: str, table: str) -> None:
    """Refuse a condition too long, or nested too deeply, for sqlglot's recursive parser, before it
    runs: counted on sqlglot's tokens (its tokenizer is a loop, not a recursion)."""
    if len(text) > MAX_WHERE_CHARS:
        raise WhereError(f"where is {len(text):,} characters long, more than the limit of {MAX_WHERE_CHARS:,} for a "
                         f"condition; to score many chosen rows pass their keys (predict(keys=...), a frame of "
                         f"{_named(table)}'s key columns), or shorten the condition")
    try:
        tokens = Tokenizer().tokenize(text)
    except (SqlglotError, ValueError) as err:
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise WhereError(f"where {_shown(text)} is not valid SQL ({first[:200]}); {_fix(table)}") from None
    depth = run = 0
    for token in tokens:
        kind = token.token_type
        run = run + 1 if kind in _PREFIX else 0
        if kind in _OPENS:
            depth += 1
        elif kind in _CLOSES:
            depth = max(depth - 1, 0)
        if depth + run > MAX_WHERE_NESTING:
            raise WhereError(f"where {_shown(text)} nests more than {MAX_WHERE_NESTING} levels deep (at character "
                             f"{token.start + 1}); {_nesting_fix(table)}")


def parse_condition(text: object, table: str = "") -> exp.Expression:
    """`text` parsed as exactly one expression, with every node a filter may hold (no columns checked
    yet); `table` names the target table in messages ("" before it is known)."""
    if not isinstance(text, str) or not text.strip():
        raise WhereError(f"where must be a SQL condition on {_named(table)} (a non-empty string), "
                         f"got {_shown(text)}; {_fix(table)}")
    _check_size(text, table)
    try:
        parsed = [p for p in sqlglot.parse(text, read="duckdb") if p is not None]
    except SqlglotError as err:
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise WhereError(f"where {_shown(text)} is not valid SQL ({first[:200]}); {_fix(table)}") from None
    except RecursionError:  # a nesting the token count above did not foresee
        raise WhereError(f"where {_shown(text)} nests too deeply for the parser; {_nesting_fix(table)}") from None
    if len(parsed) != 1:
        raise WhereError(f"where {_shown(text)} holds {len(parsed)} statements; {_fix(table)}")
    condition = parsed[0]
    if not isinstance(condition, exp.Condition):
        raise WhereError(f"where {_shown(text)} is a statement ({type(condition).__name__.upper()}), "
                         f"not a condition; {_fix(table)}")
    for node in condition.walk():
        for kind, what in REFUSED.items():
            if isinstance(node, kind):
                raise WhereError(f"where {_shown(text)} contains {what} (`{node.sql('duckdb')[:60]}`); {_fix(table)}")
    inner = condition.unnest() if isinstance(condition, exp.Paren) else condition
    if not isinstance(inner, (*BOOLEAN_NODES, exp.Column)):
        raise WhereError(f"where {_shown(text)} is not a condition (it is {type(inner).__name__}); {_fix(table)}")
    return condition


def _resolve(column: exp.Column, text: str, table: str, columns: dict[str, str], folded: dict[str, list[str]]) -> str:
    """The table's real name of a column the condition names (quoted: exact; unquoted: ignoring case)."""
    parts = [p.name for p in column.parts]
    if len(parts) > 2 or (len(parts) == 2 and parts[0].casefold() != table.casefold()):
        raise WhereError(f"where {_shown(text)} names `{'.'.join(parts)}`, not a column of `{table}`; {_fix(table)}")
    identifier = column.this
    name = identifier.name
    if identifier.quoted and name in columns:
        return name
    matches = [] if identifier.quoted else folded.get(name.casefold(), [])
    if len(matches) == 1:
        return matches[0]
    if len(matches) > 1:
        raise WhereError(f"where {_shown(text)}: `{name}` matches columns {matches} of `{table}` that differ only in case; "
                         "quote the one you mean")
    raise WhereError(f"where {_shown(text)}: `{table}` has no column `{name}`; its columns: {', '.join(columns)}")


def condition(db: Database, table: str, text: object, alias: str = "t") -> exp.Expression:
    """The checked condition with each column a quoted reference `alias."column"` of `table`."""
    parsed = parse_condition(text, table)
    columns = dict(db.columns(table))
    folded: dict[str, list[str]] = {}
    for name in columns:
        folded.setdefault(name.casefold(), []).append(name)
    inner = parsed.unnest() if isinstance(parsed, exp.Paren) else parsed
    if isinstance(inner, exp.Column):
        name = _resolve(inner, text, table, columns, folded)
        if columns[name].upper() != "BOOLEAN":
            raise WhereError(f"where {_shown(text)} is column `{name}` of type {columns[name]}, not a condition; {_fix(table)}")

    def quote(node: exp.Expression) -> exp.Expression:
        if isinstance(node, exp.Column):
            return q.col(_resolve(node, text, table, columns, folded), alias)
        return node

    return parsed.transform(quote)


def where_keys(db: Database, table: str, keys: list[str], text: object) -> pl.DataFrame:
    """The key columns of the rows of `table` that satisfy `text` (evaluated by the database)."""
    rebuilt = condition(db, table, text)
    query = (exp.select(*[q.col(k, "t") for k in keys])
             .from_(exp.alias_(exp.Table(this=q.ident(table)), q.ident("t"), table=True))
             .where(rebuilt))
    try:
        found = db.arrow(query)
    except Exception as err:  # the engine's own verdict on a well-formed condition (a type mismatch, ...)
        message = " ".join(str(err).split())[:300]
        raise WhereError(f"the database could not evaluate where {_shown(text)} on `{table}`: {message}; {_fix(table)}") from None
    return pl.from_arrow(found)
