"""A @ gather(x, index) = (A·P) @ x: the matrix reads the source rows directly.

Isomorphic compression evaluates one representative grounding per class and aggregates with a
multiplicity matrix; when the representative's value is just a row of a relation, picking the
representatives is a gather that folds into the matrix's column indices. Deduplicated columns
(distinct rows + gather) fold the same way, so the product runs over the distinct rows.
"""

from __future__ import annotations

from relsql.compile import sparse
from relsql.compile.passes._rewrite import only_reader, producers, readers
from relsql.compile.plan import Op, Plan


def gather_into_sparse(plan: Plan) -> Plan:
    made, reads, made_by = 0, readers(plan), producers(plan)
    ops: list[Op] = []
    for op in plan.ops:
        if op.kind != "spmm" or len(op.args) != 2 or op.args[0] not in plan.inputs \
                or plan.inputs[op.args[0]].layout != sparse.CSR:
            ops.append(op)
            continue
        matrix, source, reader, removed = plan.inputs[op.args[0]], op.args[1], op, True
        gather = made_by.get(source)
        while gather is not None and gather.kind == "gather" and gather.args[1] in plan.inputs:
            matrix = sparse.select_columns(matrix, plan.inputs[gather.args[1]], plan.meta[gather.args[0]].shape[0])
            removed = removed and only_reader(plan, gather.out, reader, reads) and gather in ops
            if removed:
                ops.remove(gather)  # else others still read the gathered rows
            reader, source = gather, gather.args[0]
            gather = made_by.get(source)
            made += 1
        if source == op.args[1]:
            ops.append(op)
        else:
            ops.append(Op("spmm", op.out, (plan.add_input(matrix), source), {}, op.rows, op.shape, op.note))
    plan.ops = ops
    plan.log.append(f"gather_into_sparse: {made} gathers folded into sparse matrices")
    return plan
