"""What a column's type and name say it is: a number, a time, a duration, or an identifier that
must never become a number."""

from __future__ import annotations

import re

from relsql.data.coltypes import head, is_composite, is_floating, is_list, is_number

TIME_TYPES = ("DATE", "TIMESTAMP")
_ID_NAME = re.compile(r"(?:^|_)(?:id|sk|key|uuid|guid)$", re.IGNORECASE)  # id, customer_id, ss_item_sk, row_key
_ID_CAMEL = re.compile(r"[a-z0-9](?:Id|ID|Key|SK)$")  # customerId, CustomerID, OrderKey
_ID_TPCH = re.compile(r"[a-z]{1,3}_[a-z]+key", re.IGNORECASE)  # c_custkey, o_orderkey, ps_suppkey


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


def id_like(name: str) -> bool:
    """Whether a column is named like an identifier: never a number to standardize."""
    return bool(_ID_NAME.search(name) or _ID_CAMEL.search(name) or _ID_TPCH.fullmatch(name))


def label_kind(sql_type: str) -> str | None:
    """A label an earlier sibling may bring as a number: "boolean", "number" ("float" where it may
    be NaN or infinite), or None (text, lists, dates, durations: categories and other kinds are not
    read)."""
    if is_flag(sql_type):
        return "boolean"
    if is_floating(sql_type):
        return "float"
    return "number" if is_number(sql_type) else None
