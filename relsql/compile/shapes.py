"""Output shapes of plan ops, without running them on the real sizes.

The row count follows a rule per op kind; the rest of the shape (and every shape error) comes
from running the op's own kernel on one-row stand-ins, so NeuraLogic's shape rules live only
in the kernels. Stand-ins are small real tensors rather than meta tensors: torch's meta
kernels for elementwise ops import torch._dynamo, which costs over a second per process.
"""

from __future__ import annotations

import functools
import math
import os
import warnings

import torch

from relsql.compile.ops import op_kind, run_op
from relsql.errors import ShapeError
from relsql.template.ir import MAX_ELEMENTS

MAX_FULL_PARAM = 1 << 16  # a larger weight is an embedding table: only its row shape matters here
_RESULTS: dict[tuple, tuple[tuple[int, ...], torch.dtype]] = {}  # stand-in signature -> (row shape, dtype)


@functools.cache
def memory_bytes() -> int | None:
    """This machine's physical memory, where the OS says (a tensor larger than it cannot be made)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def check_size(shape: tuple[int, ...], dtype: torch.dtype, what: str, fix: str) -> None:
    """Refuse a tensor before torch tries to allocate it: more elements than a template's weight may
    have (ir.MAX_ELEMENTS, the rule `linear` and `embed` widths are checked by), or more bytes than
    this machine's memory. `what` names the statement, `fix` says what to make smaller."""
    elements = math.prod(int(d) for d in shape)
    size = elements * (torch.finfo(dtype).bits // 8 if dtype.is_floating_point else torch.iinfo(dtype).bits // 8)
    memory = memory_bytes()
    if elements > MAX_ELEMENTS or (memory is not None and size > memory):
        limit = f"relsql's limit of {MAX_ELEMENTS} (2**31) elements per tensor" if elements > MAX_ELEMENTS \
            else f"this machine's memory ({memory / 2**30:.1f} GiB)"
        raise ShapeError(f"{what}: a {' x '.join(str(int(d)) for d in shape)} tensor of {size} bytes ({size / 2**30:.1f} GiB) "
                         f"is more than {limit}; {fix}")


def _rows(kind: str, args: list[torch.Tensor], attrs: dict, is_param: list[bool]) -> int:
    """The op's row count: its kind's rule, else the one row count its data arguments share."""
    rule = op_kind(kind).rows
    if rule is not None:
        return rule(args, attrs)
    counts = {a.shape[0] for a, p in zip(args, is_param) if not p and a.dim() > 0} - {1}
    if len(counts) > 1:
        raise ValueError(f"row counts {sorted(counts)} differ")
    return counts.pop() if counts else 1


def _stand_in(kind: str, position: int, arg: torch.Tensor, attrs: dict, is_param: bool,
              dtype: torch.dtype) -> torch.Tensor:
    entry = op_kind(kind)
    if arg.layout != torch.strided or position in entry.matrices:  # a constant matrix, cast like the data
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # sparse CSR is beta
            return torch.sparse_csr_tensor(torch.tensor([0, 1]), torch.tensor([0]), torch.zeros(1, dtype=dtype), (1, 1))
    if not arg.is_floating_point():
        if position in entry.counts:
            return torch.ones(1, dtype=arg.dtype)  # counts: one grounding in the one segment
        if position in entry.offsets:
            return torch.tensor([0, 1], dtype=arg.dtype)  # offsets: one entry in the one row
        return torch.zeros(1, dtype=arg.dtype)  # row ids / segment ids
    if is_param:
        if arg.numel() > MAX_FULL_PARAM and arg.dim() >= 1:
            return torch.zeros((1, *arg.shape[1:]), dtype=arg.dtype)
        return torch.zeros(arg.shape, dtype=arg.dtype)
    rows = attrs["width"] if kind == "dense_reduce" else 1
    return torch.zeros((rows, *arg.shape[1:]), dtype=arg.dtype)


def infer(kind: str, args: list[torch.Tensor], attrs: dict, is_param: list[bool], rows: int | None = None) -> torch.Tensor:
    """A meta tensor with the op's output shape and dtype; ValueError/RuntimeError if it does not fit."""
    rows = _rows(kind, args, attrs, is_param) if rows is None else rows
    key = _signature(kind, args, attrs, is_param)
    found = _RESULTS.get(key) if key is not None else None
    if found is None:
        data = [a.dtype for a in args if a.layout == torch.strided and a.is_floating_point()]
        dtype = data[-1] if data else torch.get_default_dtype()
        small = [_stand_in(kind, i, a, attrs, p, dtype) for i, (a, p) in enumerate(zip(args, is_param))]
        found = _run_small(kind, small, attrs)
        if key is not None:
            if len(_RESULTS) > 4096:
                _RESULTS.clear()
            _RESULTS[key] = found
    shape, out_dtype = found
    return torch.empty((rows, *shape), dtype=out_dtype, device="meta")


def _run_small(kind: str, small: list[torch.Tensor], attrs: dict) -> tuple[tuple[int, ...], torch.dtype]:
    small_attrs = {**attrs, "rows": 1} if kind in ("scatter", "broadcast") else attrs
    if kind == "slice":
        small_attrs = {**attrs, "start": 0, "rows": 1}
    if kind == "bag":  # a large table stands in as one row: its padding id must be a row of the stand-in
        small_attrs = {**attrs, "pad": small[0].shape[0] - 1}
    out = run_op(kind, small, small_attrs)
    return tuple(out.shape[1:]), out.dtype


def _signature(kind: str, args: list[torch.Tensor], attrs: dict, is_param: list[bool]) -> tuple | None:
    """What the stand-in run depends on, read off the arguments before any stand-in is made
    (plans repeat a few op shapes hundreds of times); None where an attribute is not a plain
    value, so such ops always run."""
    if any(isinstance(v, torch.Tensor) for v in attrs.values()):
        return None
    try:
        frozen = tuple(sorted(attrs.items()))
        hash(frozen)
    except TypeError:
        return None
    return kind, frozen, tuple((tuple(a.shape) if p else tuple(a.shape[1:]), a.dtype, a.layout, p)
                               for a, p in zip(args, is_param))
