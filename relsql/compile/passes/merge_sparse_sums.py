"""A @ x + B @ x + x = (A + B + I) @ x: sums of aggregations over one source become one matmul.

GIN's (1 + eps)·x_i + Σ_j x_j, a relation written as several statements over the same rows,
or a self term next to a neighbour term without a weight of its own: the matrices are added at
compile time, so the sum and all but one product disappear from the run. Gathers of one source
summed in a rule body (NeuraLogic's `sum` combination over atoms of one predicate, as in
graphlet templates) become one matmul by a matrix of counts, even without another product.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from relsql.compile import sparse
from relsql.compile.passes._rewrite import only_reader, producers, readers, sum_terms
from relsql.compile.plan import Op, Plan, make_op


@dataclass
class _Term:
    slot: int
    source: int
    kind: str  # spmm | gather | identity
    matrix: torch.Tensor | None = None  # spmm: its matrix; gather: its row ids
    producer: Op | None = None  # the op that disappears when merged


def _classify(plan: Plan, term: int, op: Op, made_by, reads) -> _Term:
    producer = made_by.get(term)
    alone = producer is not None and only_reader(plan, term, op, reads)
    if alone and producer.kind == "spmm" and len(producer.args) == 2 and producer.args[0] in plan.inputs \
            and plan.inputs[producer.args[0]].layout == sparse.CSR:
        return _Term(term, producer.args[1], "spmm", plan.inputs[producer.args[0]], producer)
    if producer is not None and producer.kind == "gather" and producer.args[1] in plan.inputs \
            and producer.args[0] not in plan.param_slots:  # a gather others read stays for them
        return _Term(term, producer.args[0], "gather", plan.inputs[producer.args[1]], producer if alone else None)
    return _Term(term, term, "identity")


def _matrix(term: _Term, rows: int) -> torch.Tensor:
    if term.kind == "spmm":
        return term.matrix
    if term.kind == "gather":
        return sparse.selection(term.matrix, rows)
    return sparse.identity(rows)


def merge_sparse_sums(plan: Plan) -> Plan:
    merged, reads, made_by = 0, readers(plan), producers(plan)
    ops: list[Op] = []
    for op in plan.ops:
        slots = sum_terms(op) or (list(op.args) if op.kind == "combine" and op.attrs["kind"] == "sum" else None)
        groups: dict[int, list[_Term]] = {}
        for slot in slots or []:
            if plan.meta[slot].shape[0] == op.rows and tuple(plan.meta[slot].shape[1:]) == op.shape:
                term = _classify(plan, slot, op, made_by, reads)
                groups.setdefault(term.source, []).append(term)
        products: dict[int, tuple[int, int]] = {}  # term slot -> (matrix slot, source)
        for source, members in groups.items():
            if len(members) < 2 or not (any(m.kind == "spmm" for m in members)
                                        or all(m.kind == "gather" and m.producer is not None for m in members)):
                continue
            rows = plan.meta[source].shape[0]
            matrices = [_matrix(m, rows) for m in members]
            if any(tuple(m.shape) != (op.rows, rows) for m in matrices):
                continue
            matrix = plan.add_input(sparse.add(matrices))
            for m in members:
                if m.producer is not None:
                    ops.remove(m.producer)
                products[m.slot] = (matrix, source)
            merged += 1
        if not products:
            ops.append(op)
            continue
        remaining, made = [], {}
        for slot in slots:
            if slot not in products:
                remaining.append(slot)
            elif products[slot] not in made:
                made[products[slot]] = None
                remaining.append(products[slot])
        if len(remaining) == 1:  # the whole sum is one product
            ops.append(Op("spmm", op.out, remaining[0], {}, op.rows, op.shape, op.note))
            continue
        args = []
        for item in remaining:
            if isinstance(item, tuple):
                product = make_op(plan, "spmm", item, op.note)
                ops.append(product)
                item = product.out
            args.append(item)
        if op.kind == "combine":  # it may still broadcast scalar or one-row terms
            op.args = tuple(args)
            ops.append(op)
        else:
            ops.append(Op("sum", op.out, tuple(args), {}, op.rows, op.shape, op.note))
    plan.ops = ops
    plan.log.append(f"merge_sparse_sums: {merged} sums over one source as a single sparse matmul")
    return plan
