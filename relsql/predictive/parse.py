"""The one-line text form of a predictive query, tokenized and parsed by recursive descent (no eval)."""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from typing import Any

from relsql.errors import RelsqlError
from relsql.predictive.terms import QueryError, TimePath, ZonedTimeError, when

GRAMMAR = """\
query      := aggregate OVER <integer> DAYS [comparison] [rank] FOR [EACH] entity [population] [time] AT snapshots [rank]
aggregate  := COUNT(<events>.*) | SUM(<events>.<column>)
            | LIST_DISTINCT(<events>.<key column>)   (a list of the keys in the window, sorted; no comparison)
comparison := (> | >= | < | <= | = | != | <>) <number>         (absent: the label is the number itself)
rank       := RANK TOP <integer>                 (LIST_DISTINCT only: k, how many items a ranking is judged on)
entity     := <table> [.<key column> [= <events>.<foreign key column>]]
population := ACTIVE                 (default: entities with an event before the snapshot)
            | ALL                    (every entity row)
            | SINCE <table>.<column> (entities whose creation date is before the snapshot)
time       := TIME <events>.<column>                              (default: the events' one date column)
            | TIME <dim>.<date column> VIA <events>.<fk> = <dim>.<key>
snapshots  := <date> {, <date>} | EVERY <integer> DAYS [FROM <date>] [TO <date>]
<date>     := 2020-01-31 | 2020-01-31T12:00[:00] | '2020-01-31 12:00:00'
names: letters, digits, _ and $ (not first), or "double quoted" ("" for a quote); keywords in any case
the label aggregates the events with snapshot <= time < snapshot + N days; NULL if that runs past the last event
LIST_DISTINCT writes a row only where the window holds a key (or is past the data: a NULL list, to predict)"""

_TOKEN = re.compile(r"""
    (?P<space>\s+)
  | (?P<date>\d{4}-\d{2}-\d{2}(?:T\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?)?)
  | (?P<number>[+-]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?)
  | (?P<string>'(?:[^']|'')*')
  | (?P<quoted>"(?:[^"]|"")*")
  | (?P<word>[A-Za-z_][A-Za-z0-9_$]*)
  | (?P<op>>=|<=|!=|<>|[><=])
  | (?P<punct>[(),.*])
""", re.VERBOSE)


@dataclass
class _Token:
    kind: str  # date number string quoted word op punct end
    text: str
    at: int

    @property
    def word(self) -> str:
        return self.text.upper() if self.kind == "word" else ""


def _tokens(text: str) -> list[_Token]:
    out, at = [], 0
    while at < len(text):
        m = _TOKEN.match(text, at)
        if m is None:
            raise _error(text, at, f"unexpected character {text[at]!r}", "names are letters, digits and _ (or \"quoted\"); "
                         "see the grammar in relsql/predictive/parse.py")
        if m.lastgroup == "quoted" and m.group() == '""':
            raise _error(text, at, "an empty quoted name", "write the name between the quotes")
        if m.lastgroup != "space":
            out.append(_Token(m.lastgroup, m.group(), at))
        at = m.end()
    out.append(_Token("end", "", len(text)))
    return out


def _error(text: str, at: int, problem: str, fix: str) -> QueryError:
    shown = text.replace("\n", " ").replace("\t", " ")
    return QueryError(f"predictive query, position {at + 1}: {problem}; {fix}\n  {shown}\n  {' ' * at}^", at)


class _Parser:
    def __init__(self, text: str):
        self.text = text
        self.tokens = _tokens(text)
        self.i = 0

    @property
    def peek(self) -> _Token:
        return self.tokens[self.i]

    def fail(self, expected: str, fix: str, token: _Token | None = None) -> QueryError:
        token = token or self.peek
        found = "the end of the query" if token.kind == "end" else repr(token.text)
        return _error(self.text, token.at, f"expected {expected}, found {found}", fix)

    def keyword(self, *words: str, fix: str = "") -> str:
        if self.peek.word in words:
            self.i += 1
            return self.tokens[self.i - 1].word
        raise self.fail(" or ".join(words), fix or f"write {words[0]} here (grammar: relsql.predictive.GRAMMAR)")

    def accept(self, *words: str) -> str | None:
        if self.peek.word in words:
            self.i += 1
            return self.tokens[self.i - 1].word
        return None

    def punct(self, symbol: str, fix: str) -> None:
        if self.peek.kind in ("punct", "op") and self.peek.text == symbol:
            self.i += 1
            return
        raise self.fail(f"'{symbol}'", fix)

    def name(self, what: str, fix: str) -> tuple[str, _Token]:
        token = self.peek
        if token.kind == "word":
            self.i += 1
            return token.text, token
        if token.kind == "quoted":
            self.i += 1
            return token.text[1:-1].replace('""', '"'), token
        raise self.fail(what, fix)

    def dotted(self, what: str, fix: str) -> tuple[str, str, _Token]:
        table, token = self.name(f"{what} (table.column)", fix)
        self.punct(".", fix)
        column, _ = self.name(f"{what}'s column after the dot", fix)
        return table, column, token

    def integer(self, what: str, fix: str) -> int:
        token = self.peek
        if token.kind == "number" and token.text.isdigit() and int(token.text) >= 1:
            self.i += 1
            return int(token.text)
        raise self.fail(f"{what} (a whole number of at least 1)", fix)

    def days(self, fix: str) -> None:
        self.keyword("DAYS", "DAY", fix=fix)

    def date(self, fix: str) -> dt.date:
        token = self.peek
        if token.kind in ("date", "string"):
            self.i += 1
            raw = token.text[1:-1].replace("''", "'") if token.kind == "string" else token.text
            try:
                return when(raw, "date")
            except ZonedTimeError as err:  # a valid time, but with an offset: say why it is refused
                raise _error(self.text, token.at, f"{token.text} has a time zone, but the events' times hold none",
                             f"write it in the data's own clock without an offset, e.g. '{err.local}'") from None
            except RelsqlError:
                raise _error(self.text, token.at, f"{token.text} is not a valid date", fix) from None
        raise self.fail("a date such as 2020-01-31", fix)

    def rank(self, fields_: dict[str, Any], head: str) -> None:
        """RANK TOP k, if it is here (after the window, or last): LIST_DISTINCT's only, once."""
        token = self.peek
        if not self.accept("RANK"):
            return
        if head != "LIST_DISTINCT":
            raise _error(self.text, token.at, f"RANK TOP ranks the keys of a LIST_DISTINCT query, not a {head}",
                         "remove RANK TOP k, or write LIST_DISTINCT(<events>.<key column>)")
        if "k" in fields_:
            raise _error(self.text, token.at, "a second RANK TOP", "give RANK TOP k once")
        self.keyword("TOP", fix="write RANK TOP 10")
        fields_["k"] = self.integer("k, how many items to rank", "write e.g. RANK TOP 10 (k must be at least 1)")

    def parse(self) -> dict[str, Any]:  # noqa: C901 - the query grammar, clause by clause
        fields_: dict[str, Any] = {}
        head = self.keyword("COUNT", "SUM", "LIST_DISTINCT",
                            fix="start with COUNT(<events>.*), SUM(<events>.<column>) or LIST_DISTINCT(<events>.<key column>)")
        self.punct("(", f"write {head}(<events>.{'*' if head == 'COUNT' else '<column>'})")
        events, _ = self.name("the events table", "write e.g. COUNT(orders.*)")
        self.punct(".", f"write {head}({events}.{'*' if head == 'COUNT' else '<column>'})")
        if head == "COUNT":
            self.punct("*", f"COUNT counts events: write COUNT({events}.*)")
        elif head == "SUM":
            fields_["aggregate"] = "sum"
            fields_["value"], _ = self.name("the column to sum", f"write SUM({events}.<numeric column>)")
        else:
            fields_["aggregate"] = "list_distinct"
            fields_["value"], _ = self.name("the key column to list", f"write LIST_DISTINCT({events}.<key column>), e.g. "
                                            f"LIST_DISTINCT({events}.item_id)")
        self.punct(")", "close the parenthesis")
        self.keyword("OVER", fix="give the label's window: OVER 30 DAYS")
        fields_["window_days"] = self.integer("the window's length in days", "write e.g. OVER 30 DAYS")
        self.days("write e.g. OVER 30 DAYS")
        if self.peek.kind == "op" and head == "LIST_DISTINCT":
            raise _error(self.text, self.peek.at, f"LIST_DISTINCT gives a list of keys, not a number to compare with "
                         f"{self.peek.text}", f"remove the comparison (for a yes/no label write COUNT({events}.*) "
                         f"OVER {fields_['window_days']} DAYS > 0)")
        if self.peek.kind == "op":
            op = self.peek.text
            self.i += 1
            token = self.peek
            if token.kind != "number":
                raise self.fail(f"a number after {op}", f"compare with a number, e.g. {op} 0")
            self.i += 1
            fields_["op"] = op
            fields_["threshold"] = int(token.text) if re.fullmatch(r"[+-]?\d+", token.text) else float(token.text)
        self.rank(fields_, head)
        self.keyword("FOR", fix="name the entity: FOR customer (after the window and an optional comparison such as > 0)")
        if self.peek.word == "EACH" and self.tokens[self.i + 1].kind in ("word", "quoted"):
            self.i += 1
        entity, _ = self.name("the entity table", "write e.g. FOR customer")
        if self.peek.kind == "punct" and self.peek.text == ".":
            self.i += 1
            fields_["key"], _ = self.name("the entity's key column", f"write FOR {entity}.<key column>")
            if self.peek.kind == "op" and self.peek.text == "=":
                self.i += 1
                table, column, token = self.dotted("the events' foreign key",
                                                   f"write FOR {entity}.{fields_['key']} = {events}.<column>")
                if table.casefold() != events.casefold():
                    raise _error(self.text, token.at, f"the foreign key must be a column of the events table `{events}`",
                                 f"write {events}.<column>")
                fields_["event_key"] = column
        population = self.accept("ACTIVE", "ALL", "SINCE")
        if population == "SINCE":
            table, column, token = self.dotted("the entity's creation column", f"write SINCE {entity}.<date column>")
            if table.casefold() != entity.casefold():
                raise _error(self.text, token.at, f"SINCE names a column of the entity table `{entity}`",
                             f"write SINCE {entity}.<date column>")
            fields_["since"] = column
        elif population:
            fields_["population"] = population.lower()
        if self.accept("TIME"):
            table, column, token = self.dotted("the events' time column", f"write TIME {events}.<date column>")
            if self.accept("VIA"):
                fk_table, fk, fk_token = self.dotted("the events' foreign key to the dimension",
                                                     f"write VIA {events}.<fk> = {table}.<key>")
                if fk_table.casefold() != events.casefold():
                    raise _error(self.text, fk_token.at, f"VIA starts at a column of the events table `{events}`",
                                 f"write VIA {events}.<fk> = {table}.<key>")
                self.punct("=", f"write VIA {events}.{fk} = {table}.<key>")
                dim, key, dim_token = self.dotted("the dimension's key", f"write VIA {events}.{fk} = {table}.<key>")
                if dim.casefold() != table.casefold():
                    raise _error(self.text, dim_token.at, f"the key must be a column of `{table}`, the table TIME names",
                                 f"write = {table}.<key>")
                fields_["event_time"] = TimePath(fk, table, key, column)
            elif table.casefold() != events.casefold():
                raise _error(self.text, token.at, f"TIME {table}.{column} is not a column of the events table `{events}`",
                             f"write TIME {events}.<column>, or TIME {table}.{column} VIA {events}.<fk> = {table}.<key>")
            else:
                fields_["event_time"] = column
        self.keyword("AT", fix="give the snapshots: AT 2020-01-01, 2020-07-01 or AT EVERY 30 DAYS")
        if self.accept("EVERY"):
            fields_["every_days"] = self.integer("the days between snapshots", "write e.g. AT EVERY 30 DAYS")
            self.days("write e.g. AT EVERY 30 DAYS")
            if self.accept("FROM"):
                fields_["start"] = self.date("write FROM 2020-01-01")
            if self.accept("TO"):
                fields_["end"] = self.date("write TO 2020-12-31")
        else:
            dates = [self.date("write AT 2020-01-01 (dates separated by commas) or AT EVERY 30 DAYS")]
            while self.peek.kind == "punct" and self.peek.text == ",":
                self.i += 1
                dates.append(self.date("write a date after the comma, e.g. 2020-07-01"))
            fields_["snapshots"] = tuple(dates)
        self.rank(fields_, head)
        if self.peek.kind != "end":
            raise self.fail("the end of the query",
                            "the snapshots come last (then only RANK TOP k); remove the rest or move it before AT")
        return {"entity": entity, "events": events, **fields_}


def parse_fields(text: str) -> dict[str, Any]:
    """The fields of a `PredictiveQuery` from its one-line text form (grammar: `GRAMMAR`), read
    without eval; a syntax error names the position (1-based) and the fix. The fields' own checks
    are the query's (relsql.predictive.query.parse builds it)."""
    if not isinstance(text, str) or not text.strip():
        raise QueryError("predictive query is empty; write e.g. COUNT(orders.*) OVER 30 DAYS > 0 FOR customer AT EVERY 30 DAYS")
    return _Parser(text).parse()


