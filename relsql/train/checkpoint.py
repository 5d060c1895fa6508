"""Training checkpoints and saved models: one file each, written atomically (a temporary file
renamed into place), so a crash never leaves half a file.

The files hold plain data only: tensors, numbers, strings, bytes (Arrow IPC for tables of
values such as embedding dictionaries and class labels), and lists/tuples/dicts of those. They
are read with `torch.load(weights_only=True)`, which refuses any other object, so loading a
file, crafted or not, cannot run code. Writing checks the same rule first, so relsql never
writes a file it would refuse to read.
"""

from __future__ import annotations

import collections
import math
import os
import tempfile
import warnings
from pathlib import Path

import pyarrow as pa
import torch

from relsql.errors import RelsqlError

FORMAT = "relsql-checkpoint-2"
PLAIN = (str, int, float, bool, type(None), bytes)  # exact types: numpy's float64 is a float but pickles as numpy


def save(path: str | Path, state: dict) -> Path:
    return write(path, FORMAT, state, "training checkpoint")


def load(path: str | Path) -> dict:
    return read(path, FORMAT, "training checkpoint")


def writable(path: str | Path, what: str) -> Path:
    """`path` as a file relsql may create or replace: not a folder, in a folder that exists and
    is writable. Checked before long work, so a bad path fails at once, not after training."""
    if not isinstance(path, str | os.PathLike) or not str(path):
        raise RelsqlError(f"the {what} path must be a file name, got {path!r}")
    path = Path(path)
    if path.is_dir():
        raise RelsqlError(f"the {what} path {path} is a folder; give a file name inside it, e.g. {path / 'model.pt'}")
    parent = path.parent
    if not parent.is_dir():
        raise RelsqlError(f"cannot write the {what} {path}: folder {parent} does not exist; create it first")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise RelsqlError(f"cannot write the {what} {path}: folder {parent} is not writable")
    return path


def _check_plain(value: object, where: str) -> None:
    if type(value) in PLAIN or isinstance(value, torch.Tensor | torch.dtype):
        return
    if type(value) in (dict, collections.OrderedDict):
        for key, item in value.items():
            _check_plain(key, where)
            _check_plain(item, f"{where}[{key!r}]")
        return
    if type(value) in (list, tuple):
        for i, item in enumerate(value):
            _check_plain(item, f"{where}[{i}]")
        return
    raise TypeError(f"relsql would write {where} of type {type(value).__name__}, which its files do not hold")


def write(path: str | Path, kind: str, state: dict, what: str = "file") -> Path:
    """`state` tagged with format `kind`, in one file that appears whole or not at all."""
    path = writable(path, what)
    state = {"format": kind, **state}
    _check_plain(state, "state")
    try:
        handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    except OSError as err:
        raise RelsqlError(f"cannot write the {what} {path}: {err.strerror}") from None
    os.close(handle)
    try:
        torch.save(state, temporary)
        os.replace(temporary, path)
    except OSError as err:
        raise RelsqlError(f"cannot write the {what} {path}: {err.strerror}; nothing was replaced") from None
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)
    return path


def read(path: str | Path, kind: str, what: str) -> dict:
    """A file written by `write` with format `kind`; a RelsqlError naming `what` otherwise.

    Only plain data is unpickled (weights_only=True): a file holding anything else, code
    included, is refused before any of it runs."""
    if not isinstance(path, str | os.PathLike) or not str(path):
        raise RelsqlError(f"the {what} path must be a file name, got {path!r}")
    path = Path(path)
    if path.is_dir():
        raise RelsqlError(f"{path} is a folder, not a relsql {what}")
    if not path.exists():
        raise RelsqlError(f"{what} {path} does not exist; check the path")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. torch's note on the pickle protocol of a foreign file
            state = torch.load(path, weights_only=True, map_location="cpu")
    except OSError as err:
        raise RelsqlError(f"cannot read {what} {path}: {err.strerror}") from None
    except Exception:  # any unpickling failure means: not a file relsql wrote
        raise RelsqlError(f"{path} is not a relsql {what} (relsql reads only files it wrote, which hold plain tensors "
                          "and values; this one does not load as such)") from None
    if not isinstance(state, dict) or not isinstance(state.get("format"), str) or not state["format"].startswith("relsql-"):
        raise RelsqlError(f"{path} is not a relsql {what}")
    if state["format"] != kind:
        raise RelsqlError(f"{path} is a relsql file of format {state['format']!r}, not a {what} of format {kind!r} "
                          "(files from older relsql versions could run code when loaded and are no longer read: "
                          "train and save again)")
    return state


def table_bytes(table: pa.Table) -> bytes:
    """An Arrow table as IPC stream bytes: typed values (dates, decimals, ...) without pickling."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def bytes_table(data: object, where: str) -> pa.Table:
    if not isinstance(data, bytes):
        raise RelsqlError(f"{where} is damaged: expected Arrow data, got {type(data).__name__}")
    try:
        return pa.ipc.open_stream(pa.py_buffer(data)).read_all()
    except (pa.ArrowException, OSError, ValueError) as err:
        raise RelsqlError(f"{where} is damaged: {err}") from None


def field(state: dict, name: str, types: type | tuple[type, ...], where: str) -> object:
    """`state[name]`, checked to be of `types`: a damaged or crafted file fails with a clear error."""
    if name not in state:
        raise RelsqlError(f"{where} is damaged: it has no {name!r}")
    value = state[name]
    if not isinstance(value, types):
        raise RelsqlError(f"{where} is damaged: {name!r} is a {type(value).__name__}")
    return value


FLAGS_OFF = ("differentiable", "capturable", "maximize")  # relsql never turns these on (it does turn on fused)


def check_optimizer(optimizer: torch.optim.Optimizer, where: str) -> None:
    """An optimizer state read from a file: hyper-parameters of the types and ranges torch's own
    defaults have, and per-parameter buffers shaped like their parameter, finite. A damaged file
    then fails here, clearly, instead of inside torch's update kernels."""

    def damaged(what: str) -> RelsqlError:
        return RelsqlError(f"{where} is damaged: its optimizer state has {what}; start without resume=True")

    for group in optimizer.param_groups:
        for key, default in optimizer.defaults.items():
            value = group.get(key)
            if key in FLAGS_OFF:
                if value not in (False, None):
                    raise damaged(f"{key}={value!r}")
            elif isinstance(default, bool) or default is None:
                if value not in (True, False, None):
                    raise damaged(f"{key}={value!r}")
            elif isinstance(default, int | float):
                if type(value) not in (int, float) or not math.isfinite(value) or value < 0:
                    raise damaged(f"{key}={value!r}")
            elif isinstance(default, tuple):
                if type(value) is not tuple or len(value) != len(default) or not all(
                        type(v) in (int, float) and math.isfinite(v) for v in value):
                    raise damaged(f"{key}={value!r}")
        for parameter in group["params"]:
            for name, buffer in optimizer.state.get(parameter, {}).items():
                if buffer is None and name == "momentum_buffer":  # SGD without momentum
                    continue
                if not isinstance(buffer, torch.Tensor) or not buffer.is_floating_point() or not torch.isfinite(buffer).all():
                    raise damaged(f"a {name!r} that is not a finite float tensor")
                if name == "step":
                    if buffer.numel() != 1 or float(buffer) < 0:
                        raise damaged(f"a step of {buffer.tolist()}")
                elif buffer.shape != parameter.shape:
                    raise damaged(f"a {name!r} of shape {tuple(buffer.shape)} for a parameter of shape {tuple(parameter.shape)}")
