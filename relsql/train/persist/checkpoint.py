"""Training checkpoints and saved models: one file each, written atomically (a temporary file
renamed into place), so a crash never leaves half a file.

The files hold plain data only: tensors, numbers, strings, bytes (Arrow IPC for tables of
values such as embedding dictionaries and class labels), and lists/tuples/dicts of those. They
are read with `torch.load(weights_only=True)`, which refuses any other object, so loading a
file, crafted or not, cannot run code. Writing checks the same rule first, so relsql never
writes a file it would refuse to read.

Not running code is not enough: a crafted file can also exhaust the machine. So `read`, before
torch sees the file, checks what torch would do with it:
- the path is a regular file (opened non-blocking: a FIFO named like a model fails at once);
- the file is torch's zip, every record stored uncompressed (relsql never compresses; a deflated
  record could inflate a 1 MB file to gigabytes), no name twice, the records' sizes within the
  file's own size;
- its pickle is walked, opcode by opcode, without building anything: only the globals relsql's
  files use (tensor storages, dtypes, OrderedDict, bytes), and the values it builds, counted with
  every shared reference expanded (pickle's memo lets one value stand for billions: the "billion
  laughs"), at most PICKLE_VALUES; no container that holds itself;
and after loading, every tensor is backed by bytes of the file: a tensor view with stride 0 can
claim 10^10 elements of 8 bytes, which the first numpy copy would allocate.
Any value from a file shown in an error is shortened (`shown`).
"""

from __future__ import annotations

import collections
import math
import os
import pickletools
import reprlib
import tempfile
import warnings
import zipfile
from pathlib import Path

import pyarrow as pa
import torch

from relsql import textfile
from relsql.errors import RelsqlError

FORMAT = "relsql-checkpoint-2"
PLAIN = (str, int, float, bool, type(None), bytes)  # exact types: numpy's float64 is a float but pickles as numpy
PICKLE_VALUES = 500_000  # values a file's pickle may build, shared references counted each time (a model: thousands)
ZIP_RECORDS = 100_000  # records in a file's zip (one per tensor storage, plus 4)
_GLOBALS = {("collections", "OrderedDict"), ("torch._utils", "_rebuild_tensor_v2"), ("_codecs", "encode")}
_shown = reprlib.Repr()
_shown.maxstring = _shown.maxother = 80
_shown.maxlist = _shown.maxtuple = _shown.maxdict = _shown.maxset = 6
_shown.maxlevel = 3


def shown(value: object) -> str:
    """A value from a file, for an error message: at most a line, however big or nested it is."""
    return _shown.repr(value)


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
    included, is refused before any of it runs; and what it would cost is bounded first (see the
    module docstring)."""
    if not isinstance(path, str | os.PathLike) or not str(path) or "\x00" in str(path):
        raise RelsqlError(f"the {what} path must be a file name, got {shown(path)}")
    path = Path(path)
    with textfile.open_regular(path, what) as handle:
        _check_archive(handle, os.fstat(handle.fileno()).st_size, path, what)
        handle.seek(0)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # e.g. torch's note on the pickle protocol of a foreign file
                state = torch.load(handle, weights_only=True, map_location="cpu")
        except OSError as err:
            raise RelsqlError(f"cannot read {what} {path}: {err.strerror}") from None
        except Exception:  # any unpickling failure means: not a file relsql wrote
            raise RelsqlError(f"{path} is not a relsql {what} (relsql reads only files it wrote, which hold plain tensors "
                              "and values; this one does not load as such)") from None
    if not isinstance(state, dict) or not isinstance(state.get("format"), str) or not state["format"].startswith("relsql-"):
        raise RelsqlError(f"{path} is not a relsql {what}")
    if state["format"] != kind:
        raise RelsqlError(f"{path} is a relsql file of format {shown(state['format'])}, not a {what} of format {kind!r} "
                          "(files from older relsql versions could run code when loaded and are no longer read: "
                          "train and save again)")
    _check_tensors(state, path, what)
    return state


def _check_archive(handle, size: int, path: Path, what: str) -> None:
    """What torch would allocate and run for this file, checked without inflating or unpickling
    anything (see the module docstring)."""
    def refuse(why: str) -> RelsqlError:
        return RelsqlError(f"{path} is not a relsql {what}: {why}; relsql reads only the files it wrote")

    try:
        archive = zipfile.ZipFile(handle)
        records = archive.infolist()
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, ValueError, EOFError):
        raise refuse("it is not torch's zip format") from None
    if len(records) > ZIP_RECORDS:
        raise refuse(f"it holds {len(records):,} records, more than the {ZIP_RECORDS:,} a model has room for")
    names = [r.filename for r in records]
    if len(set(names)) != len(names):
        raise refuse("a record name appears twice")
    for record in records:
        if record.compress_type != zipfile.ZIP_STORED:
            raise refuse(f"record {shown(record.filename)} is compressed ({record.compress_size:,} bytes that would "
                         f"inflate to {record.file_size:,}); relsql writes uncompressed records and does not inflate any")
    if sum(r.file_size for r in records) > size:
        raise refuse(f"its records claim {sum(r.file_size for r in records):,} bytes, more than the file's {size:,}")
    pickles = [r for r in records if r.filename.endswith("/data.pkl") and r.filename.count("/") == 1]
    if len(pickles) != 1:
        raise refuse("it has no single data.pkl record")
    try:
        data = archive.read(pickles[0])
    except (zipfile.BadZipFile, OSError, ValueError, EOFError):
        raise refuse("its data.pkl record cannot be read") from None
    _check_pickle(data, refuse)


def _check_pickle(data: bytes, refuse) -> None:
    """Walk the pickle's opcodes as the unpickler would, building a graph of placeholders instead of
    values: refuse globals relsql's files never hold, containers that hold themselves, and more
    than PICKLE_VALUES values once every shared reference is expanded."""
    children: list[list[int]] = []  # per placeholder, the placeholders it holds

    def new(*held: int) -> int:
        if len(children) >= PICKLE_VALUES:  # each placeholder is a value at least: stop scanning at once
            raise refuse(f"its pickle builds more than {PICKLE_VALUES:,} values")
        children.append(list(held))
        return len(children) - 1

    stack: list[int] = []
    marks: list[list[int]] = []
    memo: dict[int, int] = {}
    try:
        for op, arg, _ in pickletools.genops(data):
            name = op.name
            if name in ("PROTO", "FRAME", "STOP"):
                continue
            if name == "GLOBAL":
                module, _, attribute = str(arg).partition(" ")
                if not _allowed_global(module, attribute):
                    raise refuse(f"its pickle names {shown(f'{module}.{attribute}')}, which relsql's files never hold")
                stack.append(new())
            elif name == "MARK":
                marks.append(stack)
                stack = []
            elif name in ("TUPLE", "APPENDS", "SETITEMS"):
                items, stack = stack, marks.pop()
                if name == "TUPLE":
                    stack.append(new(*items))
                else:
                    children[stack[-1]].extend(items)
            elif name in ("TUPLE1", "TUPLE2", "TUPLE3"):
                count = int(name[-1])
                items = stack[-count:]
                del stack[-count:]
                stack.append(new(*items))
            elif name in ("APPEND", "BUILD"):
                item = stack.pop()
                children[stack[-1]].append(item)
            elif name == "SETITEM":
                value, key = stack.pop(), stack.pop()
                children[stack[-1]].extend((key, value))
            elif name in ("REDUCE", "NEWOBJ"):
                args = stack.pop()
                stack[-1] = new(stack[-1], args)
            elif name == "BINPERSID":
                stack[-1] = new(stack[-1])
            elif name in ("BINPUT", "LONG_BINPUT", "PUT", "MEMOIZE"):
                memo[len(memo) if name == "MEMOIZE" else int(arg)] = stack[-1]
            elif name in ("BINGET", "LONG_BINGET", "GET"):
                stack.append(memo[int(arg)])
            elif name in ("NONE", "NEWTRUE", "NEWFALSE", "BININT", "BININT1", "BININT2", "BINFLOAT", "LONG1",
                          "BINUNICODE", "SHORT_BINSTRING", "EMPTY_TUPLE", "EMPTY_LIST", "EMPTY_DICT", "EMPTY_SET"):
                stack.append(new())
            else:  # an opcode torch's safe unpickler refuses too
                raise refuse(f"its pickle uses opcode {name}")
    except (ValueError, KeyError, IndexError):  # a truncated or malformed pickle: torch would refuse it too
        raise refuse("its pickle is malformed") from None
    _count_values(children, refuse)


def _count_values(children: list[list[int]], refuse) -> None:
    """Values each placeholder stands for with shared references expanded, bottom-up without
    recursion; a cycle (a list holding itself) or a total above PICKLE_VALUES is refused."""
    total: list[int | None] = [None] * len(children)
    for start in range(len(children)):
        if total[start] is not None:
            continue
        path, on_path = [(start, 0)], {start}
        while path:
            node, i = path[-1]
            if i < len(children[node]):
                path[-1] = (node, i + 1)
                child = children[node][i]
                if total[child] is None:
                    if child in on_path:
                        raise refuse("a container in its pickle holds itself")
                    path.append((child, 0))
                    on_path.add(child)
                continue
            path.pop()
            on_path.discard(node)
            total[node] = 1 + sum(total[c] for c in children[node])
            if total[node] > PICKLE_VALUES:
                raise refuse(f"its pickle stands for more than {PICKLE_VALUES:,} values once its shared references are "
                             "expanded (one value can repeat another billions of times)")


def _allowed_global(module: str, attribute: str) -> bool:
    """What relsql's files name: tensor storages and dtypes, OrderedDict, bytes (`_codecs.encode`)."""
    if (module, attribute) in _GLOBALS:
        return True
    if module == "torch":
        value = getattr(torch, attribute, None)
        return isinstance(value, torch.dtype) or (attribute.endswith("Storage") and isinstance(value, type))
    return False


def _check_tensors(state: object, path: Path, what: str) -> None:
    """Every tensor in the loaded state is dense and backed by its storage's bytes (which the zip
    checks bound by the file's size): a view claiming more elements than its storage holds (a
    stride of 0) is refused before any copy of it is made."""
    seen, todo = set(), [state]
    while todo:
        value = todo.pop()
        if id(value) in seen:
            continue
        seen.add(id(value))
        if isinstance(value, dict):
            todo.extend(value.keys())
            todo.extend(value.values())
        elif isinstance(value, list | tuple):
            todo.extend(value)
        elif isinstance(value, torch.Tensor):
            if value.layout != torch.strided or value.is_quantized or value.device.type != "cpu":
                raise RelsqlError(f"{path} is not a relsql {what}: it holds a {value.layout} tensor")
            needed = value.numel() * value.element_size()
            if needed > value.untyped_storage().nbytes():
                raise RelsqlError(f"{path} is damaged: a tensor of shape {tuple(value.shape)} claims {needed:,} bytes, "
                                  f"but its storage holds {value.untyped_storage().nbytes():,}; relsql reads only the "
                                  "files it wrote")


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
        raise RelsqlError(f"{where} is damaged: it has no {shown(name)}")
    value = state[name]
    if not isinstance(value, types):
        raise RelsqlError(f"{where} is damaged: {shown(name)} is a {type(value).__name__}")
    return value


FLAGS_OFF = ("differentiable", "capturable", "maximize", "amsgrad")  # relsql never turns these on (it does turn on fused)


def is_number(value: object) -> bool:
    """A plain int or float as the loop writes them (not a bool, a string or a tensor a damaged file may hold)."""
    return type(value) in (int, float)


def _setting_fits(key: str, value: object, default: object) -> bool:
    """Whether an optimizer setting read from a file is of the type and range torch's default for it has."""
    if key in FLAGS_OFF:  # off as relsql builds it: False, or None where torch's default is None
        return value is False or (value is None and default is None)
    if isinstance(default, bool):  # torch's kernels take a bool there, not None
        return type(value) is bool
    if default is None:
        return value in (True, False, None)
    if isinstance(default, int | float):
        return is_number(value) and math.isfinite(value) and value >= 0
    if isinstance(default, tuple):
        return type(value) is tuple and len(value) == len(default) and all(
            is_number(v) and math.isfinite(v) for v in value)
    return True


def check_optimizer(optimizer: torch.optim.Optimizer, where: str) -> None:
    """An optimizer state read from a file: hyper-parameters of the types and ranges torch's own
    defaults have, and per-parameter buffers shaped like their parameter, finite. A damaged file
    then fails here, clearly, instead of inside torch's update kernels."""

    def damaged(what: str) -> RelsqlError:
        return RelsqlError(f"{where} is damaged: its optimizer state has {what}; start without resume=True")

    for group in optimizer.param_groups:
        for key, default in optimizer.defaults.items():
            if not _setting_fits(key, group.get(key), default):
                raise damaged(f"{key}={group.get(key)!r}")
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
