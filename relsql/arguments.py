"""Checks of the values a user passes to `Model` and `fit`, at the API boundary.

Each check returns the value in its canonical type or raises a RelsqlError that names the
argument and says what would be accepted, so nothing malformed reaches the database (several
of these values end up as literals in SQL) or fails later with a torch or numpy error.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Mapping
from pathlib import Path

import torch

from relsql.errors import RelsqlError

MAX_INT = 2**62  # far above any sensible count, far below int64's limit


def integer(name: str, value: object, *, minimum: int = 1, maximum: int = MAX_INT) -> int:
    """An int in [minimum, maximum]; bools, floats (even 3.0), strings and NaN are refused."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise RelsqlError(f"{name} must be a whole number (an int), got {value!r} ({type(value).__name__})")
    if not minimum <= int(value) <= maximum:
        bound = f"at least {minimum}" if maximum == MAX_INT else f"between {minimum} and {maximum}"
        raise RelsqlError(f"{name} must be {bound}, got {value!r}")
    return int(value)


def number(name: str, value: object, *, positive: bool = False, minimum: float | None = None) -> float:
    """A finite float (ints accepted), optionally > 0 or >= minimum."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise RelsqlError(f"{name} must be a number, got {value!r} ({type(value).__name__})")
    value = float(value)
    if not math.isfinite(value):
        raise RelsqlError(f"{name} must be a finite number, got {value!r}")
    if positive and value <= 0:
        raise RelsqlError(f"{name} must be greater than 0, got {value!r}")
    if minimum is not None and value < minimum:
        raise RelsqlError(f"{name} must be at least {minimum}, got {value!r}")
    return value


def text(name: str, value: object, *, optional: bool = False) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value:
        raise RelsqlError(f"{name} must be a non-empty string, got {value!r}")
    return value


def target(value: object) -> tuple[str, str]:
    """"table.column" → (table, column)."""
    if not isinstance(value, str):
        raise RelsqlError(f"target must be a string written table.column (e.g. 'customer.churned'), got {value!r}")
    parts = value.split(".")
    if len(parts) != 2 or not all(p.strip() for p in parts):
        raise RelsqlError(f"target must be written table.column (e.g. 'customer.churned'), got {value!r}")
    return parts[0], parts[1]


def split(value: object) -> tuple[float, float, float]:
    """Three non-negative fractions (train, validation, test) summing to 1."""
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise RelsqlError(f"split must be three fractions (train, validation, test) summing to 1, e.g. (0.7, 0.15, 0.15), "
                          f"got {value!r}; rows are split at random (seeded by `seed`) unless time_column is given")
    fractions = tuple(value)
    if len(fractions) != 3:
        raise RelsqlError(f"split must have three fractions (train, validation, test), got {len(fractions)}: {value!r}")
    checked = tuple(number(f"split[{i}]", f, minimum=0.0) for i, f in enumerate(fractions))
    if abs(sum(checked) - 1) > 1e-9:
        raise RelsqlError(f"split fractions must sum to 1, got {checked} (sum {sum(checked)})")
    return checked


def fanout(value: object, relations: Iterable[str]) -> int | dict[str, int] | None:
    """None, a positive int for every relation, or {relation: positive int} over known relations."""
    if value is None:
        return None
    if isinstance(value, Mapping):
        known = set(relations)
        checked = {}
        for relation, limit in value.items():
            if relation not in known:
                raise RelsqlError(f"fanout names relation {relation!r}, which the template does not declare; "
                                  f"it declares {sorted(known)}")
            checked[relation] = integer(f"fanout[{relation!r}]", limit)
        return checked
    return integer("fanout", value)


def store(value: object) -> Path | bool:
    """Where a model keeps its grounding store: True (a temporary folder), False (none: every
    batch grounded in the database), or a folder path."""
    if value is None or isinstance(value, bool):
        return True if value is None else value
    if isinstance(value, str | Path) and str(value).strip() and "\x00" not in str(value):
        path = Path(value)
        if path.exists() and not path.is_dir():
            raise RelsqlError(f"store {str(value)!r} is a file; give a folder for the grounding store (made if missing)")
        return path
    raise RelsqlError(f"store must be a folder path, True or False, got {value!r}")


def choice(name: str, value: object, options: tuple) -> object:
    if value not in options:
        raise RelsqlError(f"{name} must be one of {', '.join(repr(o) for o in options)}; got {value!r}")
    return value


def dtype(value: object) -> torch.dtype:
    if value not in (torch.float32, torch.float64):
        raise RelsqlError(f"dtype must be torch.float32 or torch.float64, got {value!r}")
    return value


def device(value: object) -> torch.device:
    try:
        found = torch.device(value)
    except (RuntimeError, TypeError) as err:
        raise RelsqlError(f"device must be a torch device such as 'cpu' or 'cuda:0', got {value!r} ({err})") from None
    if found.type not in ("cpu", "cuda"):
        raise RelsqlError(f"device must be 'cpu' or a CUDA device such as 'cuda:0', got {value!r}")
    if found.type == "cuda" and not torch.cuda.is_available():
        raise RelsqlError(f"device {value!r}: this machine has no CUDA GPU that torch can use; pass device='cpu'")
    return found
