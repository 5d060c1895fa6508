"""What a column's type and name say it is: a number, a time, a duration, or an identifier that
must never become a number."""

from __future__ import annotations

import re

FEATURE_TYPES = ("INT", "DECIMAL", "NUMERIC", "DOUBLE", "FLOAT", "REAL", "BOOL", "DATE", "TIMESTAMP")
TIME_TYPES = ("DATE", "TIMESTAMP")
_ID_NAME = re.compile(r"(?:^|_)(?:id|sk|key|uuid|guid)$", re.IGNORECASE)  # id, customer_id, ss_item_sk, row_key
_ID_CAMEL = re.compile(r"[a-z0-9](?:Id|ID|Key|SK)$")  # customerId, CustomerID, OrderKey
_ID_TPCH = re.compile(r"[a-z]{1,3}_[a-z]+key", re.IGNORECASE)  # c_custkey, o_orderkey, ps_suppkey


def is_time_type(sql_type: str) -> bool:
    """A DATE or TIMESTAMP column (of any precision or zone)."""
    return any(t in sql_type.upper() for t in TIME_TYPES)


def is_interval(sql_type: str) -> bool:
    """A duration column (INTERVAL: pandas timedelta, polars Duration, PostgreSQL INTERVAL): a number
    of seconds to an encoder, though its name holds "INT"."""
    return sql_type.upper().startswith("INTERVAL")


def id_like(name: str) -> bool:
    """Whether a column is named like an identifier: never a number to standardize."""
    return bool(_ID_NAME.search(name) or _ID_CAMEL.search(name) or _ID_TPCH.fullmatch(name))


def label_kind(sql_type: str) -> str | None:
    """A label an earlier sibling may bring as a number: "boolean", "number", or None (text, lists,
    dates, durations: categories and other kinds are not read)."""
    upper = sql_type.upper()
    if "[]" in upper or is_interval(upper) or is_time_type(upper):
        return None
    if upper.startswith("BOOL"):
        return "boolean"
    return "number" if any(t in upper for t in ("INT", "DECIMAL", "NUMERIC", "DOUBLE", "FLOAT", "REAL")) else None
