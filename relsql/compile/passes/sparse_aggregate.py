"""gather → (× per-grounding scalar) → sum/avg as one CSR sparse × dense matmul.

The CSR matrix (heads × source rows) is built once from the grounding's segment offsets,
body row ids and, for avg, 1/degree; the gathered rows are never materialized.
"""

from __future__ import annotations

import torch

from relsql.compile import sparse
from relsql.compile.passes._rewrite import only_reader, producers, readers
from relsql.compile.plan import Op, Plan, make_op


def _scaled_gather(plan: Plan, slot: int, reader: Op, made_by, reads):
    """(gather op, per-grounding scale tensor or None, ops to drop) behind `slot`."""
    op = made_by.get(slot)
    if op is None or not only_reader(plan, slot, reader, reads):
        return None
    if op.kind == "gather" and plan.meta[op.args[0]].dim() == 2:
        return op, None, [op]
    if op.kind == "binary" and op.attrs.get("op") == "*" and "reshape_right" not in op.attrs:
        for column, other in (op.args, op.args[::-1]):
            scale = _input_values(plan, column, made_by)
            if scale is not None and scale.dim() == 2 and scale.shape[1] == 1 and scale.shape[0] == op.rows:
                inner = _scaled_gather(plan, other, op, made_by, reads)
                if inner is not None and inner[1] is None:
                    return inner[0], scale[:, 0], [*inner[2], op]
    return None


def _input_values(plan: Plan, slot: int, made_by) -> torch.Tensor | None:
    """The concrete per-grounding values of a slot: an input, or a gather of inputs."""
    if slot in plan.inputs:
        return plan.inputs[slot]
    op = made_by.get(slot)
    if op is not None and op.kind == "gather" and all(a in plan.inputs for a in op.args):
        return plan.inputs[op.args[0]].index_select(0, plan.inputs[op.args[1]])
    return None


def sparse_aggregate(plan: Plan) -> Plan:
    made, reads, made_by = 0, readers(plan), producers(plan)
    ops: list[Op] = []
    for op in plan.ops:
        found = None
        if op.kind == "segment" and op.attrs["kind"] in ("sum", "avg"):
            found = _scaled_gather(plan, op.args[0], op, made_by, reads)
        if found is None:
            ops.append(op)
            continue
        gather, scale, dropped = found
        source, index = gather.args
        counts, rows_of = plan.inputs.get(op.args[2]), plan.inputs.get(index)
        # a weight read as rows (a bare embedding) stays a gather
        if counts is None or rows_of is None or source in plan.param_slots:
            ops.append(op)
            continue
        index = rows_of
        values = torch.ones(index.numel(), dtype=torch.float64)
        if scale is not None:
            values = values * scale.to(torch.float64)
        if op.attrs["kind"] == "avg":
            values = values / torch.repeat_interleave(counts, counts).to(torch.float64)
        rows = torch.cat([torch.zeros(1, dtype=torch.int64), counts.cumsum(0)])
        matrix = sparse.from_csr(rows, index, values, (counts.shape[0], plan.meta[source].shape[0]))
        slot = plan.add_input(matrix)
        for d in dropped:
            ops.remove(d)
        product = make_op(plan, "spmm", (slot, source), op.note)
        ops.append(Op("spmm", op.out, product.args, {}, op.rows, op.shape, op.note))
        made += 1
    plan.ops = ops
    plan.log.append(f"sparse_aggregate: {made} gather+sum/avg pairs as CSR sparse x dense matmuls")
    return plan
