"""Training checkpoints: everything `fit` needs to go on where it stopped, in one file written
atomically (a temporary file renamed into place), so a crash never leaves half a checkpoint.
Saved models use the same writer and reader with their own format tag."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import torch

from relsql.errors import RelsqlError

FORMAT = "relsql-checkpoint-1"


def save(path: str | Path, state: dict) -> Path:
    return write(path, FORMAT, state)


def load(path: str | Path) -> dict:
    return read(path, FORMAT, "training checkpoint")


def write(path: str | Path, kind: str, state: dict) -> Path:
    """`state` tagged with format `kind`, in one file that appears whole or not at all."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    os.close(handle)
    try:
        torch.save({"format": kind, **state}, temporary)
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)
    return path


def read(path: str | Path, kind: str, what: str) -> dict:
    """A file written by `write` with format `kind`; a RelsqlError naming `what` otherwise."""
    try:
        state = torch.load(path, weights_only=False)
    except (OSError, RuntimeError) as err:
        raise RelsqlError(f"cannot read {what} {path}: {err}") from None
    if not isinstance(state, dict) or state.get("format") != kind:
        raise RelsqlError(f"{path} is not a relsql {what}")
    return state
