"""Text values as hashed tokens, for `text(t.c, d)` (fastText-style, offline: no vocabulary, no model).

A value's tokens are its words (maximal runs of Unicode letters, digits and _, lower-cased), then
the character 3-grams of each word wrapped as `<word>` (so prefixes and suffixes count), each
hashed with CRC-32 (stable across processes and machines, unlike Python's salted `hash()`) into
one of `buckets` rows. The first `tokens` of them are kept; the rest of the row is padding, the
value `buckets` (the table's extra row, which the mean leaves out). A NULL or a value without
words is all padding: a zero vector. `bag(t.codes, d)` hashes a list column's elements the same
way (token `c <element>`), so codes never seen before still find a row.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Callable

import numpy as np
import pyarrow as pa

_WORD = re.compile(r"\w+")


def tokens(text: str) -> list[str]:
    """Words, then the 3-grams of `<word>` for each word, in order."""
    words = _WORD.findall(text.lower())
    grams = [f"<{w}>"[i:i + 3] for w in words for i in range(len(w))]
    return [f"w {w}" for w in words] + [f"g {g}" for g in grams]


def bucket(token: str, buckets: int) -> int:
    return zlib.crc32(token.encode("utf-8")) % buckets


def hashed(values: list, buckets: int, length: int, split: Callable[[str], list[str]] | None = None) -> np.ndarray:
    """(rows, length) float64 bucket ids (exact integers), padded with `buckets`; `split` makes a
    value's tokens (default: a text's words and 3-grams)."""
    split = split or tokens
    out = np.full((len(values), length), float(buckets))
    cache: dict[str, int] = {}
    for r, value in enumerate(values):
        if value is None:
            continue
        ids: list[int] = []
        for token in split(value)[:length]:
            found = cache.get(token)
            if found is None:
                found = cache[token] = bucket(token, buckets)
            ids.append(found)
        out[r, :len(ids)] = ids
    return out


def element_tokens(value: list | None) -> list[str]:
    """A list's elements (codes) as tokens, NULL elements left out: `bag(t.codes, d)`."""
    return [] if value is None else [f"c {v}" for v in value if v is not None]


def is_list(kind: pa.DataType) -> bool:
    return pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind)


def is_text(kind: pa.DataType) -> bool:
    return pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind)
