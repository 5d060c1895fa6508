"""Text values as hashed tokens, for `text(t.c, d)` (fastText-style, offline: no vocabulary, no model).

A value's tokens are its words (maximal runs of Unicode letters, digits and _, lower-cased), then
the character 3-grams of each word wrapped as `<word>` (so prefixes and suffixes count), each
hashed with CRC-32 (stable across processes and machines, unlike Python's salted `hash()`) into
one of `buckets` rows. The first `tokens` of them are kept; the rest of the row is padding, the
value `buckets` (the table's extra row, which the mean leaves out). A NULL or a value without
words is all padding: a zero vector. `bag(t.codes, d)` hashes a list column's elements the same
way (token `c <element>`), so codes never seen before still find a row.

Only the first MAX_TEXT_CHARS characters of a value are read (ordinary text reaches the most
tokens text() keeps, 4096, well before), and a value's tokens are made only up to the `tokens`
kept: a megabyte of text costs no more than its first page.
"""

from __future__ import annotations

import itertools
import re
import zlib
from collections.abc import Callable, Iterable, Iterator

import numpy as np
import pyarrow as pa

_WORD = re.compile(r"\w+")
MAX_TEXT_CHARS = 65_536  # characters of one value read by text(); the rest is not looked at


def tokens(text: str, length: int | None = None) -> list[str]:
    """Words, then the 3-grams of `<word>` for each word, in order: the first `length` of them (None:
    all), from the value's first MAX_TEXT_CHARS characters."""
    text = text[:MAX_TEXT_CHARS].lower()
    words = [m.group() for m in itertools.islice(_WORD.finditer(text), length)]
    out = [f"w {w}" for w in words]
    if length is None or len(out) < length:  # 3-grams only where the words leave room
        grams = (f"g {wrapped[i:i + 3]}" for wrapped in (f"<{w}>" for w in words) for i in range(len(wrapped) - 2))
        out += itertools.islice(grams, None if length is None else length - len(out))
    return out


def bucket(token: str, buckets: int) -> int:
    return zlib.crc32(token.encode("utf-8")) % buckets


def hashed(values: list, buckets: int, length: int,
           split: Callable[[object, int], Iterable[str]] | None = None) -> np.ndarray:
    """(rows, length) float64 bucket ids (exact integers), padded with `buckets`; `split(value,
    length)` makes a value's first `length` tokens (default: a text's words and 3-grams).

    A value seen before copies its row (names and cities repeat: Lahman's People has 95k texts);
    a text's ids are made per word, once (`_text_ids`), not per token: the same ids as hashing
    `tokens(value, length)` one by one."""
    out = np.full((len(values), length), float(buckets))
    cache: dict = {}
    rows: dict = {}  # value -> the row that holds its ids
    for r, value in enumerate(values):
        if value is None:
            continue
        try:
            first = rows.setdefault(value, r)
        except TypeError:  # an unhashable value (a list for bag()): made again each time
            first = r
        if first != r:
            out[r] = out[first]
            continue
        if split is None:
            ids = _text_ids(value, buckets, length, cache)
        else:
            ids = []
            for token in itertools.islice(split(value, length), length):
                found = cache.get(token)
                if found is None:
                    found = cache[token] = bucket(token, buckets)
                ids.append(found)
        out[r, :len(ids)] = ids
    return out


def _text_ids(text: str, buckets: int, length: int, cache: dict) -> list[int]:
    """The bucket ids of `tokens(text, length)`: the words' ids, then their 3-grams' ids, the first
    `length` of them; `cache` keeps per word its id and its 3-grams' ids."""
    words = [m.group() for m in itertools.islice(_WORD.finditer(text[:MAX_TEXT_CHARS].lower()), length)]
    known = []
    for word in words:
        found = cache.get(word)
        if found is None:
            wrapped = f"<{word}>"
            found = cache[word] = (bucket(f"w {word}", buckets),
                                   [_gram_id(f"g {wrapped[i:i + 3]}", buckets, cache) for i in range(len(wrapped) - 2)])
        known.append(found)
    ids = [word_id for word_id, _ in known]
    for _, grams in known:
        room = length - len(ids)
        if room <= 0:
            break
        ids.extend(grams[:room])
    return ids


def _gram_id(token: str, buckets: int, cache: dict) -> int:
    """A 3-gram token's id, hashed once: 3-grams repeat across words (People's 35k distinct texts
    make 190k of them). Kept in the words' cache under the token itself ("g ..." has a space, so no
    word, a run of \\w, is ever that key)."""
    found = cache.get(token)
    if found is None:
        found = cache[token] = bucket(token, buckets)
    return found


def element_tokens(value: list | None, length: int | None = None) -> Iterator[str]:
    """A list's elements (codes) as tokens, NULL elements left out, up to `length` of them: `bag(t.codes, d)`."""
    return itertools.islice((f"c {v}" for v in value or () if v is not None), length)


def is_list(kind: pa.DataType) -> bool:
    return pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind)


def is_text(kind: pa.DataType) -> bool:
    return pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind)
