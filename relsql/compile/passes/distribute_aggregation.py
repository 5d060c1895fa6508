"""avg(W·x + b) = W·avg(x) + b: a sum/avg over a sum of terms becomes the sum of the terms'
aggregations, so that linear_across_aggregation can move each weight after the aggregation.

A readout that pools node vectors into graph vectors (GIN's last MLP layer, GraphSAGE's root
term) otherwise multiplies every node by the weight and then averages; applied to the pooled
rows instead, the GEMM shrinks by the pooling factor (19,580 nodes -> 600 graphs on ENZYMES),
forwards and backwards. PyG cannot do this: the layer and the pooling are separate modules.

Only where it pays: the aggregation at least halves the rows and one term is a weight that
linear_across_aggregation will move. A bias row (a term with one row) needs no aggregation:
avg of a constant row is the row (zero for an empty segment), sum is the count times the row.
"""

from __future__ import annotations

import torch

from relsql.compile.passes._rewrite import movable, only_reader, producers, readers, sum_terms
from relsql.compile.plan import Op, Plan, make_op


def _flatten(plan: Plan, slot: int, reader: Op, made_by, reads, sums: list[Op]) -> list[int]:
    """The terms of the sum behind `slot`, nested sums read only by their parent opened up."""
    op = made_by.get(slot)
    terms = sum_terms(op) if op is not None and only_reader(plan, slot, reader, reads) else None
    if terms is None or len(set(terms)) != len(terms):
        return [slot]
    sums.append(op)
    return [t for term in terms for t in _flatten(plan, term, op, made_by, reads, sums)]


def _row_term(plan: Plan, op: Op, counts: torch.Tensor, row: int, ops: list[Op]) -> int:
    """What aggregating a broadcast row gives per segment: the row, scaled by count (sum) or by
    whether the segment has groundings (avg)."""
    scale = counts if op.attrs["kind"] == "sum" else (counts > 0)
    if op.attrs["kind"] == "avg" and bool(scale.all()):
        return row
    column = plan.add_input(scale.to(plan.meta[row].dtype).reshape(-1, 1))
    scaled = make_op(plan, "binary", (column, row), op.note, op="*")
    ops.append(scaled)
    return scaled.out


def distribute_aggregation(plan: Plan) -> Plan:
    made, reads, made_by = 0, readers(plan), producers(plan)
    ops: list[Op] = []
    for op in plan.ops:
        if op.kind != "segment" or op.attrs["kind"] not in ("sum", "avg") or op.args[2] not in plan.inputs:
            ops.append(op)
            continue
        sums: list[Op] = []
        source = plan.meta[op.args[0]]
        terms = _flatten(plan, op.args[0], op, made_by, reads, sums)
        full = [t for t in terms if tuple(plan.meta[t].shape) == tuple(source.shape)]
        rows = [t for t in terms if tuple(plan.meta[t].shape) == (1, *source.shape[1:])]
        if not sums or len(full) + len(rows) != len(terms) or op.rows * 2 > source.shape[0] \
                or not any(movable(plan, made_by.get(t), reads) for t in full):
            ops.append(op)
            continue
        for total in sums:
            ops.remove(total)
        parts = []
        for term in full:
            aggregated = make_op(plan, "segment", (term, *op.args[1:]), op.note, **op.attrs)
            ops.append(aggregated)
            parts.append(aggregated.out)
        parts += [_row_term(plan, op, plan.inputs[op.args[2]], row, ops) for row in rows]
        ops.append(Op("sum", op.out, tuple(parts), {}, op.rows, op.shape, op.note))
        made += 1
    plan.ops = ops
    plan.log.append(f"distribute_aggregation: {made} sums/averages of sums taken term by term")
    return plan
