"""Pick each remaining sum/avg reduction's kernel by measuring it on its own sizes.

Candidates: index_add (sorted scatter) and a CSR sparse × dense matmul with a
heads × groundings matrix of ones (or 1/degree). Both are exact up to the order of the terms
summed, so the choice changes the last bits of a model's numbers: it must not depend on the
machine's load. On the CPU it is a rule: CSR up to CSR_WIDTH columns (timed on these cores
forward + backward, 10^4–10^6 rows, 2–100 groundings per head: CSR was faster at widths 1–32 in
every case and the two were a coin flip at 128). On any other device (CUDA) it is timed on the
device the plan will run on, as the balance there is different.
Small reductions are left alone: timing them would cost more than it could save. A timed choice is
remembered per shape (kind, rows, heads, width, device, torch threads) for the process: a model
built again, a search's trials and a refit time nothing twice. At most MAX_SECONDS of timing per
plan; a reduction met after that takes the choice measured for the nearest size of its kind, or
index_add when none was (a database with many large child tables has dozens of reductions: timing
each, forward and backward, cost seconds of a plan's building).
"""

from __future__ import annotations

import math
import time

import torch

from relsql.compile import costs, sparse
from relsql.compile.plan import Op, Plan

MIN_ROWS = 10_000  # below this, index_add is kept without measuring
CSR_WIDTH = 64  # on the CPU: CSR for reductions up to this width, index_add for wider ones
REPEATS = 3
MAX_SECONDS = 1.0  # timing per plan, at most (then the nearest measured shape decides)
CHOICES: dict[tuple, bool] = {}  # (kind, rows, heads, width, device, threads) -> CSR faster


def _csr(counts: torch.Tensor, average: bool) -> torch.Tensor:
    rows = torch.cat([torch.zeros(1, dtype=torch.int64), counts.cumsum(0)])
    total = int(rows[-1])
    values = torch.ones(total, dtype=torch.float64)
    if average:
        values = values / torch.repeat_interleave(counts, counts).to(torch.float64)
    return sparse.from_csr(rows, torch.arange(total), values, (counts.shape[0], total))


def choose_segment_kernels(plan: Plan) -> Plan:
    changed, measured, remembered = 0, 0, 0
    ops: list[Op] = []
    started = time.perf_counter()
    for op in plan.ops:
        counts = plan.inputs.get(op.args[2]) if op.kind == "segment" else None
        ids = plan.inputs.get(op.args[1]) if op.kind == "segment" else None
        if counts is None or ids is None or op.attrs["kind"] not in ("sum", "avg") or len(op.shape) != 1 \
                or plan.meta[op.args[0]].shape[0] < MIN_ROWS:
            ops.append(op)
            continue
        rows, device = plan.meta[op.args[0]].shape[0], plan.device  # timed where the plan will run
        key = (op.attrs["kind"], rows, counts.shape[0], tuple(op.shape), str(device), torch.get_num_threads())
        faster = CHOICES.get(key) if torch.device(device).type != "cpu" else math.prod(op.shape) <= CSR_WIDTH
        if faster is None and time.perf_counter() - started > MAX_SECONDS:
            faster = bool(_nearest(key))  # none timed yet: index_add, the default
        if faster is None:
            measured += 1
            faster = CHOICES[key] = _csr_faster(op, ids, counts, rows, device)
        else:
            remembered += 1
        if faster:
            on_cpu = _csr(counts, op.attrs["kind"] == "avg")
            slot = plan.add_input(on_cpu)
            ops.append(Op("spmm", op.out, (slot, op.args[0]), {}, op.rows, op.shape, op.note))
            changed += 1
        else:
            ops.append(op)
    plan.ops = ops
    how = (f"{measured} reductions timed on {plan.device} ({remembered} chosen as an earlier timing of their shape "
           f"or size did)") if torch.device(plan.device).type != "cpu" else f"{remembered} reductions chosen by width"
    plan.log.append(f"choose_segment_kernels: {how}, {changed} faster as CSR matmuls")
    return plan


def _csr_faster(op: Op, ids: torch.Tensor, counts: torch.Tensor, rows: int, device: str) -> bool:
    """Whether the CSR product beats index_add on this reduction, forward and backward, on `device`."""
    from relsql.compile.kernels import segment_reduce

    x = torch.randn(rows, *op.shape, device=device, requires_grad=True)
    on_device = ids.to(device), counts.to(device)
    matrix, transposed = sparse.moved(_csr(counts, op.attrs["kind"] == "avg"), device, torch.float32)
    native = costs.seconds(lambda: segment_reduce(op.attrs["kind"], x, *on_device).sum().backward(), device, REPEATS)
    as_csr = costs.seconds(lambda: sparse.matmul(matrix, x, transposed).sum().backward(), device, REPEATS)
    return as_csr < native


def _nearest(key: tuple) -> bool | None:
    """The choice timed for the most similar shape (same kind, width, device and threads; nearest
    rows and heads on a log scale), or None when none was timed."""
    kind, rows, heads, width, device, threads = key
    alike = [(abs(math.log(r / rows)) + abs(math.log(max(h, 1) / max(heads, 1))), faster)
             for (k, r, h, w, d, t), faster in CHOICES.items() if (k, w, d, t) == (kind, width, device, threads)]
    return min(alike)[1] if alike else None
