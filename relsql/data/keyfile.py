"""Keys a user gives: a small SQL file, its text, or Python tuples; and DuckDB's `schema.sql`.

A warehouse loaded without constraints still has keys; this is how a user states them without
touching the database. Accepted statements, one or more per file, `--` comments allowed:

    ALTER TABLE customer ADD PRIMARY KEY (c_customer_sk);
    ALTER TABLE store_sales ADD FOREIGN KEY (ss_customer_sk) REFERENCES customer (c_customer_sk);
    PRIMARY KEY customer(c_customer_sk)
    FOREIGN KEY store_sales(ss_customer_sk) REFERENCES customer(c_customer_sk)
    CREATE TABLE t (...)   -- its PRIMARY KEY / FOREIGN KEY / REFERENCES constraints

The text is only parsed (with sqlglot), never executed. `REFERENCES customer` without columns
means customer's primary key. In Python: `[("PRIMARY KEY", "customer", ["c_customer_sk"]),
("FOREIGN KEY", "store_sales", ["ss_customer_sk"], "customer", ["c_customer_sk"])]`.
`schema.sql` (written by DuckDB's `EXPORT DATABASE` beside its Parquet/CSV files) is read
leniently: statements that are not key constraints are skipped, and a broken one is skipped
with a warning rather than making the folder unreadable.
"""

from __future__ import annotations

import os
import re
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import sqlglot
import sqlglot.expressions as exp
from sqlglot.dialects.dialect import Dialect
from sqlglot.errors import ParseError, TokenError
from sqlglot.tokens import TokenType

from relsql import textfile
from relsql.errors import SchemaError

__all__ = ["GivenKey", "GivenKeys", "load", "parse", "resolve"]

_SHORT = (TokenType.PRIMARY_KEY, TokenType.FOREIGN_KEY)
_STARTS = (TokenType.ALTER, TokenType.CREATE)
_MAX_NESTING = 16  # parentheses within one statement


@dataclass(frozen=True)
class GivenKey:
    """One stated key. `references` empty: the parent's primary key."""

    kind: str  # "primary" or "foreign"
    table: str
    columns: tuple[str, ...]
    parent: str = ""
    references: tuple[str, ...] = ()
    line: int = 0  # where it was stated (a line of the file, or the entry's number in a Python list)


@dataclass
class GivenKeys:
    """Keys stated outside the database, and where they came from (for messages and `inspect`)."""

    origin: str  # "keys.sql", "the keys text", "schema.sql", "the keys list"
    keys: list[GivenKey] = field(default_factory=list)
    unit: str = "line"  # what `GivenKey.line` counts: "line" or "entry"

    def where(self, key: GivenKey) -> str:
        return f"{self.origin} {self.unit} {key.line}"

    @property
    def primary(self) -> list[GivenKey]:
        return [k for k in self.keys if k.kind == "primary"]

    @property
    def foreign(self) -> list[GivenKey]:
        return [k for k in self.keys if k.kind == "foreign"]


def load(keys: object) -> GivenKeys | None:
    """Whatever `keys=` was given, as GivenKeys: a path, the file's text, a list of tuples, or None."""
    if keys is None or isinstance(keys, GivenKeys):
        return keys
    if isinstance(keys, os.PathLike) or (isinstance(keys, str) and _looks_like_path(keys)):
        return read_file(Path(keys))
    if isinstance(keys, str):
        return parse(keys, "the keys text")
    if isinstance(keys, Sequence) and not isinstance(keys, bytes | bytearray):
        return from_tuples(keys)
    raise SchemaError(f"keys must be a path to a keys file, the file's text or a list of (\"PRIMARY KEY\", table, columns) / "
                      f"(\"FOREIGN KEY\", table, columns, parent, parent_columns) tuples, got {type(keys).__name__}")


def _looks_like_path(text: str) -> bool:
    """A single line without SQL words is a file name (so a mistyped one is reported as missing)."""
    if "\n" not in text and os.path.exists(text):
        return True
    return not ("\n" in text or ";" in text or "(" in text or re.search(r"(PRIMARY|FOREIGN)\s+KEY", text, re.IGNORECASE))


def read_file(path: Path) -> GivenKeys:
    """A keys file's text, bounded (a keys file is never larger than a few kilobytes of SQL)."""
    return parse(textfile.read_text(path, "keys file", SchemaError), path.name)


def from_tuples(entries: Sequence) -> GivenKeys:
    """`("PRIMARY KEY", table, columns)` and `("FOREIGN KEY", table, columns, parent[, parent_columns])`."""
    given = GivenKeys("the keys list", unit="entry")
    for number, entry in enumerate(entries, 1):
        where = f"keys list entry {number} ({entry!r})"
        if not isinstance(entry, Sequence) or isinstance(entry, str) or len(entry) < 3:
            raise SchemaError(f"{where}: write (\"PRIMARY KEY\", table, columns) or "
                              "(\"FOREIGN KEY\", table, columns, parent, parent_columns)")
        kind = str(entry[0]).upper().replace("_", " ").split()
        if kind in (["PRIMARY", "KEY"], ["PK"]) and len(entry) == 3:
            given.keys.append(GivenKey("primary", _name(entry[1], where), _names(entry[2], where), line=number))
        elif kind in (["FOREIGN", "KEY"], ["FK"]) and len(entry) in (4, 5):
            references = _names(entry[4], where) if len(entry) == 5 and entry[4] else ()
            given.keys.append(GivenKey("foreign", _name(entry[1], where), _names(entry[2], where),
                                       _name(entry[3], where), references, number))
        else:
            raise SchemaError(f"{where}: the first item must be \"PRIMARY KEY\" (3 items) or \"FOREIGN KEY\" (4 or 5 items)")
    return given


def _name(value: object, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise SchemaError(f"{where}: a table or column name must be non-empty text, got {value!r}")
    return value


def _names(value: object, where: str) -> tuple[str, ...]:
    """Columns: one name, or a list of names."""
    if isinstance(value, str):
        return (_name(value, where),)
    if isinstance(value, Sequence) and value:
        return tuple(_name(v, where) for v in value)
    raise SchemaError(f"{where}: columns must be a name or a non-empty list of names, got {value!r}")


# -- SQL text -------------------------------------------------------------------------------------------------------
def parse(text: str, origin: str, *, strict: bool = True) -> GivenKeys:
    """Keys from SQL text; `strict=False` (DuckDB's schema.sql) skips what is not a key and warns on errors."""
    given = GivenKeys(origin)
    for line, statement, short in _statements(text, origin):
        try:
            given.keys.extend(_keys_of(statement, short, line, origin, strict))
        except SchemaError as err:
            if strict:
                raise
            warnings.warn(f"{err}; its keys are not used", stacklevel=2)
    return given


def _statements(text: str, origin: str) -> list[tuple[int, str, bool]]:
    """(first line, text, is a short form) of each statement. Statements end at `;`; a short form
    (`PRIMARY KEY t(c)`) also ends at its line's end, and ALTER/CREATE at a line starting another."""
    try:
        tokens = Dialect.get_or_raise("duckdb").tokenize(text)
    except TokenError as err:
        raise SchemaError(f"{origin}: cannot read it as SQL ({str(err).splitlines()[0]}); check its quotes") from None
    found, start, depth = [], None, 0
    for index, token in enumerate(tokens):
        if start is not None and depth == 0 and token.line > tokens[index - 1].line and (
                token.token_type in _STARTS or token.token_type in _SHORT and tokens[start].token_type in _SHORT):
            found.append((start, index))
            start = None
        if token.token_type == TokenType.SEMICOLON:
            if start is not None:
                found.append((start, index))
            start, depth = None, 0
            continue
        if start is None:
            start = index
        depth += {TokenType.L_PAREN: 1, TokenType.R_PAREN: -1}.get(token.token_type, 0)
        if depth > _MAX_NESTING:  # sqlglot parses nesting by recursion: refuse before it runs out of stack
            raise SchemaError(f"{origin} line {tokens[start].line}: parentheses nested more than {_MAX_NESTING} deep; a key "
                              "statement needs two or three levels (`CREATE TABLE t (c DECIMAL(10, 2) REFERENCES p (k))`)")
    if start is not None:
        found.append((start, len(tokens)))
    return [(tokens[a].line, text[tokens[a].start:tokens[b - 1].end + 1], tokens[a].token_type in _SHORT) for a, b in found]


def _keys_of(statement: str, short: bool, line: int, origin: str, strict: bool) -> list[GivenKey]:
    where = f"{origin} line {line}"
    sql = _expand_short(statement, where) if short else statement
    try:
        tree = sqlglot.parse_one(sql, read="duckdb")
    except (ParseError, TokenError) as err:
        if not strict and not short and not statement.lstrip().upper().startswith(("ALTER", "CREATE TABLE")):
            return []
        raise SchemaError(f"{where}: cannot parse {_clip(statement)!r} ({_why(err)}); write "
                          "`ALTER TABLE t ADD PRIMARY KEY (c);` or `PRIMARY KEY t(c)`") from None
    if isinstance(tree, exp.Alter) and tree.args.get("kind", "").upper() == "TABLE":
        table = tree.this.name
    elif isinstance(tree, exp.Create) and str(tree.args.get("kind", "")).upper() == "TABLE" and isinstance(tree.this, exp.Schema):
        table = tree.this.this.name
    elif strict:
        raise SchemaError(f"{where}: {_clip(statement)!r} states no key; write `ALTER TABLE t ADD PRIMARY KEY (c);`, "
                          "`ALTER TABLE t ADD FOREIGN KEY (c) REFERENCES p (k);` or the short forms `PRIMARY KEY t(c)` / "
                          "`FOREIGN KEY t(c) REFERENCES p(k)`")
    else:
        return []
    keys = _constraints(tree, table, line)
    if strict and not keys and not isinstance(tree, exp.Create):  # a key-less CREATE TABLE of a DDL dump is fine
        raise SchemaError(f"{where}: {_clip(statement)!r} states no PRIMARY KEY or FOREIGN KEY; remove the line or add one")
    return keys


def _expand_short(statement: str, where: str) -> str:
    """`PRIMARY KEY t(c)` → `ALTER TABLE t ADD PRIMARY KEY (c)` (text for the parser only)."""
    tokens = Dialect.get_or_raise("duckdb").tokenize(statement)
    paren = next((i for i, t in enumerate(tokens) if t.token_type == TokenType.L_PAREN), None)
    if paren is None or paren < 2:
        form = "PRIMARY KEY t(c)" if tokens[0].token_type == TokenType.PRIMARY_KEY else "FOREIGN KEY t(c) REFERENCES p(k)"
        raise SchemaError(f"{where}: cannot parse {_clip(statement)!r}; write `{form}`")
    table = statement[tokens[1].start:tokens[paren - 1].end + 1]
    return f"ALTER TABLE {table} ADD {tokens[0].text} {statement[tokens[paren].start:]}"


def _constraints(tree: exp.Expression, table: str, line: int) -> list[GivenKey]:
    """PRIMARY KEY / FOREIGN KEY / REFERENCES constraints anywhere in an ALTER or CREATE TABLE."""
    keys = []
    for node in tree.find_all(exp.PrimaryKey, exp.ForeignKey, exp.ColumnDef):
        if isinstance(node, exp.PrimaryKey):
            keys.append(GivenKey("primary", table, tuple(_ident(e) for e in node.expressions), line=line))
        elif isinstance(node, exp.ForeignKey):
            keys.append(_foreign(table, tuple(_ident(e) for e in node.expressions), node.args.get("reference"), line))
        else:
            for constraint in node.args.get("constraints") or ():
                kind = constraint.args.get("kind")
                if isinstance(kind, exp.PrimaryKeyColumnConstraint):
                    keys.append(GivenKey("primary", table, (node.name,), line=line))
                elif isinstance(kind, exp.Reference):
                    keys.append(_foreign(table, (node.name,), kind, line))
    return keys


def _foreign(table: str, columns: tuple[str, ...], reference: exp.Reference | None, line: int) -> GivenKey:
    target = reference.this if reference is not None else None
    if isinstance(target, exp.Schema):
        return GivenKey("foreign", table, columns, target.this.name, tuple(_ident(e) for e in target.expressions), line)
    return GivenKey("foreign", table, columns, target.name if target is not None else "", (), line)


def _ident(node: exp.Expression) -> str:
    return node.name if isinstance(node, exp.Identifier | exp.Column) else node.sql("duckdb")


def _why(err: Exception) -> str:
    """sqlglot's first complaint, without its token dump."""
    errors = getattr(err, "errors", None) or [{}]
    return str(errors[0].get("description") or str(err).splitlines()[0]).split(" but got ")[0]


def _clip(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= 80 else flat[:77] + "..."


# -- against a database ------------------------------------------------------------------------------------------------
def resolve(given: GivenKeys, columns: Mapping[str, Sequence[str]], *, strict: bool = True,
            rename: Mapping[str, str] | None = None) -> GivenKeys:
    """The keys with the database's spelling of each name (exact, else the one case-insensitive
    match); a table or column that does not exist is a SchemaError naming the line (or, not
    strict, a warning and the key is dropped). `rename` maps names as written to table names."""
    kept = []
    for key in given.keys:
        try:
            kept.append(_resolve_key(given, key, columns, rename or {}))
        except SchemaError as err:
            if strict:
                raise
            warnings.warn(f"{err}; the key is not used", stacklevel=2)
    return replace(given, keys=kept)


def _resolve_key(given: GivenKeys, key: GivenKey, columns: Mapping[str, Sequence[str]], rename: Mapping[str, str]) -> GivenKey:
    where = given.where(key)
    table = _match(rename.get(key.table, key.table), list(columns), f"{where}: table `{key.table}`", "tables")
    names = tuple(_match(c, list(columns[table]), f"{where}: `{table}` has no column `{c}`;", "columns") for c in key.columns)
    if len(set(names)) != len(names):
        raise SchemaError(f"{where}: a column is named twice in ({', '.join(key.columns)}); name each once")
    if key.kind == "primary":
        return replace(key, table=table, columns=names)
    if not key.parent:
        raise SchemaError(f"{where}: the foreign key names no referenced table; add `REFERENCES parent(column)`")
    parent = _match(rename.get(key.parent, key.parent), list(columns), f"{where}: referenced table `{key.parent}`", "tables")
    references = tuple(_match(c, list(columns[parent]), f"{where}: `{parent}` has no column `{c}`;", "columns")
                       for c in key.references)
    if references and len(references) != len(names):
        raise SchemaError(f"{where}: {len(names)} column(s) reference {len(references)} column(s) of `{parent}`; "
                          "name as many on both sides")
    return replace(key, table=table, columns=names, parent=parent, references=references)


def _match(name: str, known: list[str], what: str, kind: str) -> str:
    if name in known:
        return name
    folded = [k for k in known if k.casefold() == name.casefold()]
    if len(folded) == 1:
        return folded[0]
    if what.endswith(";"):  # a missing column
        raise SchemaError(f"{what} its {kind}: {', '.join(known)}")
    raise SchemaError(f"{what} does not exist; {kind}: {', '.join(known) or 'none'}")


def attach(db, keys: object) -> None:
    """`connect(keys=...)`: parse and check the keys now, so that a bad line fails at once;
    the database handle is closed if they are wrong."""
    try:
        given = load(keys)
        with db.frozen_schema():
            columns = {table: [c for c, _ in db.columns(table)] for table in db.tables()}
        db.given_keys = resolve(given, columns)
    except BaseException:
        db.close()
        raise
