"""What a column's SQL type name says of its values, read one way everywhere (keys, encoders, the GBM's
features, time columns).

Type names come from DuckDB (`DECIMAL(18,4)`, `STRUCT(a INTEGER, b VARCHAR)`, `INTEGER[]`,
`MAP(VARCHAR, INTEGER)`), PostgreSQL (`double precision`) and Spark (`array<int>`). Matching a
number's name anywhere in the string would read `STRUCT(a INTEGER)` or `MAP(VARCHAR, INTEGER)`
as integers and `INTERVAL` as one too: only the type's head (before any parenthesis or element
type) says what a value is.
"""

from __future__ import annotations

import re

# DuckDB's integers (TINYINT ... UHUGEINT and their INT1-INT128 aliases), PostgreSQL's and Spark's
_INTEGER = re.compile(r"U?(?:TINY|SMALL|BIG|HUGE)?INT(?:EGER)?\d*|LONG|SHORT|SIGNED|(?:SMALL|BIG)?SERIAL\d*")
_FLOATING = re.compile(r"DOUBLE(?: PRECISION)?|FLOAT\d*|REAL")  # the numbers that can be NaN or infinite
_FRACTION = re.compile(r"DECIMAL|NUMERIC|DOUBLE(?: PRECISION)?|FLOAT\d*|REAL")
_COMPOSITES = ("STRUCT", "MAP", "UNION", "ROW")
TIME_TYPES = ("DATE", "TIMESTAMP")


def head(sql_type: str) -> str:
    """The type's name without its parameters or element types, upper case: `DECIMAL(18,4)` ->
    `DECIMAL`, `TIMESTAMP WITH TIME ZONE` stays whole."""
    upper = sql_type.strip().upper()
    for mark in ("(", "<", "["):
        upper = upper.split(mark, 1)[0]
    return upper.strip()


def is_list(sql_type: str) -> bool:
    """A list or array column (`INTEGER[]`, `VARCHAR[3]`, Spark's `array<int>`)."""
    upper = sql_type.strip().upper()
    return upper.endswith("]") or upper.startswith("ARRAY") or upper.startswith("LIST")


def element(sql_type: str) -> str:
    """A list's element type (`BIGINT[]`, `INTEGER[3]`, Spark's `array<bigint>`); any other type
    as it is."""
    text = sql_type.strip()
    if text.endswith("]") and "[" in text:
        return text[:text.rindex("[")].strip()
    if text.upper().startswith("ARRAY<") and text.endswith(">"):
        return text[len("ARRAY<"):-1].strip()
    return text


def is_composite(sql_type: str) -> bool:
    """A struct, map or union column, or a list of them: no one number, time or code to read."""
    return head(sql_type).startswith(_COMPOSITES)


def is_nested(sql_type: str) -> bool:
    """A list, struct, map or union column: never a key, and not comparable with one."""
    return is_list(sql_type) or is_composite(sql_type)


def is_interval(sql_type: str) -> bool:
    """A duration (INTERVAL), though its name holds "INT"."""
    return head(sql_type).startswith("INTERVAL")


def is_number(sql_type: str) -> bool:
    """A plain number: integer, decimal or floating point; not a duration, list, struct or map."""
    if is_nested(sql_type) or is_interval(sql_type):
        return False
    name = head(sql_type)
    return bool(_INTEGER.fullmatch(name) or _FRACTION.fullmatch(name))


def is_floating(sql_type: str) -> bool:
    """A floating-point column (FLOAT, DOUBLE, REAL): the numbers that can be NaN or infinite."""
    return not is_nested(sql_type) and bool(_FLOATING.fullmatch(head(sql_type)))


def is_integer(sql_type: str) -> bool:
    """An integer column (of any width, signed or not)."""
    return not is_nested(sql_type) and bool(_INTEGER.fullmatch(head(sql_type)))


def is_time_type(sql_type: str) -> bool:
    """A DATE or TIMESTAMP column (of any precision or zone); not a list of them."""
    return not is_list(sql_type) and head(sql_type).startswith(TIME_TYPES)


def is_flag(sql_type: str) -> bool:
    """A BOOLEAN column."""
    return not is_list(sql_type) and head(sql_type).startswith("BOOL")


def is_feature(sql_type: str) -> bool:
    """A number, boolean or time: a value an encoder reads as numbers (durations apart)."""
    return is_number(sql_type) or is_flag(sql_type) or is_time_type(sql_type)


def is_text(sql_type: str) -> bool:
    """Text or an enum, or a list of them (embedded word by word); not a struct or map holding text."""
    return not is_composite(sql_type) and any(k in head(sql_type) for k in ("CHAR", "TEXT", "STRING", "ENUM"))
