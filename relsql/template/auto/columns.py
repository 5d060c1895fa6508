"""What a column's name says it is (an identifier that must never become a number), and what an
earlier sibling's label is read as; its type is read by relsql/data/coltypes.py."""

from __future__ import annotations

import re

from relsql.data.coltypes import is_flag, is_floating, is_number

_ID_NAME = re.compile(r"(?:^|_)(?:id|sk|key|uuid|guid)$", re.IGNORECASE)  # id, customer_id, ss_item_sk, row_key
_ID_CAMEL = re.compile(r"[a-z0-9](?:Id|ID|Key|SK)$")  # customerId, CustomerID, OrderKey
_ID_TPCH = re.compile(r"[a-z]{1,3}_[a-z]+key", re.IGNORECASE)  # c_custkey, o_orderkey, ps_suppkey


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
