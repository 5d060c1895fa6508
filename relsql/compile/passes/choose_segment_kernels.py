"""Pick each remaining sum/avg reduction's kernel by measuring it on its own sizes.

Candidates: index_add (sorted scatter) and a CSR sparse × dense matmul with a
heads × groundings matrix of ones (or 1/degree). Both are exact; which is faster depends on
the sizes, the width and the machine, so it is timed (forward + backward, on the device the plan
will run on) rather than guessed.
Small reductions are left alone: timing them would cost more than it could save.
"""

from __future__ import annotations

import torch

from relsql.compile import costs, sparse
from relsql.compile.plan import Op, Plan

MIN_ROWS = 10_000  # below this, index_add is kept without measuring
REPEATS = 3


def _csr(counts: torch.Tensor, average: bool) -> torch.Tensor:
    rows = torch.cat([torch.zeros(1, dtype=torch.int64), counts.cumsum(0)])
    total = int(rows[-1])
    values = torch.ones(total, dtype=torch.float64)
    if average:
        values = values / torch.repeat_interleave(counts, counts).to(torch.float64)
    return sparse.from_csr(rows, torch.arange(total), values, (counts.shape[0], total))


def choose_segment_kernels(plan: Plan) -> Plan:
    from relsql.compile.kernels import segment_reduce

    changed, measured = 0, 0
    ops: list[Op] = []
    for op in plan.ops:
        counts = plan.inputs.get(op.args[2]) if op.kind == "segment" else None
        ids = plan.inputs.get(op.args[1]) if op.kind == "segment" else None
        if counts is None or ids is None or op.attrs["kind"] not in ("sum", "avg") or len(op.shape) != 1 \
                or plan.meta[op.args[0]].shape[0] < MIN_ROWS:
            ops.append(op)
            continue
        measured += 1
        rows, device = plan.meta[op.args[0]].shape[0], plan.device  # timed where the plan will run
        x = torch.randn(rows, *op.shape, device=device, requires_grad=True)
        on_device = ids.to(device), counts.to(device)
        on_cpu = _csr(counts, op.attrs["kind"] == "avg")
        matrix, transposed = sparse.moved(on_cpu, device, torch.float32)
        native = costs.seconds(lambda: segment_reduce(op.attrs["kind"], x, *on_device).sum().backward(), device, REPEATS)  # noqa: B023
        as_csr = costs.seconds(lambda: sparse.matmul(matrix, x, transposed).sum().backward(), device, REPEATS)  # noqa: B023
        if as_csr < native:
            slot = plan.add_input(on_cpu)
            ops.append(Op("spmm", op.out, (slot, op.args[0]), {}, op.rows, op.shape, op.note))
            changed += 1
        else:
            ops.append(op)
    plan.ops = ops
    plan.log.append(f"choose_segment_kernels: {measured} reductions timed on {plan.device}, {changed} faster as CSR matmuls")
    return plan
