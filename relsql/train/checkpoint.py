"""Training checkpoints: everything `fit` needs to go on where it stopped, in one file written
atomically (a temporary file renamed into place), so a crash never leaves half a checkpoint."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import torch

from relsql.errors import RelsqlError

FORMAT = "relsql-checkpoint-1"


def save(path: str | Path, state: dict) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    os.close(handle)
    try:
        torch.save({"format": FORMAT, **state}, temporary)
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)
    return path


def load(path: str | Path) -> dict:
    try:
        state = torch.load(path, weights_only=False)
    except (OSError, RuntimeError) as err:
        raise RelsqlError(f"cannot read checkpoint {path}: {err}") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise RelsqlError(f"{path} is not a relsql training checkpoint")
    return state
