"""Names in the generated text: quoted identifiers, and the relation and weight names it invents,
which must never collide (the database compares identifiers case-insensitively)."""

from __future__ import annotations

import functools
import re

import sqlglot.expressions as exp


@functools.lru_cache(maxsize=4096)
def quoted(name: str) -> str:
    """A table or column name as a quoted DuckDB identifier (remembered: a template quotes each
    name many times, and sqlglot's generator costs ~0.2 ms a call)."""
    return exp.to_identifier(name, quoted=True).sql("duckdb")


def safe(name: str) -> str:
    """A name as letters, digits and _ (lower case): part of generated relation and weight names."""
    return re.sub(r"[^0-9A-Za-z]+", "_", name).strip("_").lower() or "t"


class Names:
    """Hands out generated names, never one twice: a taken name gets a numeric suffix. Compared in
    lower case, as the database compares identifiers (tables "a-b" and "a_b" both sanitize to a_b)."""

    def __init__(self, taken=()):
        self.taken = {n.lower() for n in taken}

    def __call__(self, base: str) -> str:
        name, n = base, 1
        while name.lower() in self.taken:
            n += 1
            name = f"{base}_{n}"
        self.taken.add(name.lower())
        return name


def distinct(names: list[str]) -> list[str]:
    """`names` made distinct (case-insensitively) by suffixing repeats."""
    allocate = Names()
    return [allocate(n) for n in names]
