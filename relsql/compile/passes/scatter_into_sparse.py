"""scatter(A @ x, heads, rows) = A' @ x, where A' puts row i of A at row heads[i].

A rule that grounds only some rows of its relation scatters its per-head results into the
relation's rows; when those results come from a sparse matmul, the scatter folds into the
matrix (the missing heads become empty rows) and costs nothing at run time.
"""

from __future__ import annotations

from relsql.compile import sparse
from relsql.compile.passes._rewrite import only_reader, producers, readers
from relsql.compile.plan import Op, Plan


def scatter_into_sparse(plan: Plan) -> Plan:
    made, reads, made_by = 0, readers(plan), producers(plan)
    ops: list[Op] = []
    for op in plan.ops:
        product = made_by.get(op.args[0]) if op.kind == "scatter" else None
        heads = plan.inputs.get(op.args[1]) if op.kind == "scatter" else None
        matrix = plan.inputs.get(product.args[0]) if product is not None and product.kind == "spmm" else None
        if matrix is None or heads is None or len(product.args) != 2 or not only_reader(plan, product.out, op, reads) \
                or matrix.layout != sparse.CSR or heads.unique().numel() != heads.numel():
            ops.append(op)
            continue
        placed = plan.add_input(sparse.place_rows(matrix, heads, op.attrs["rows"]))
        ops.remove(product)
        ops.append(Op("spmm", op.out, (placed, product.args[1]), {}, op.rows, op.shape, op.note))
        made += 1
    plan.ops = ops
    plan.log.append(f"scatter_into_sparse: {made} scatters folded into their sparse matrices")
    return plan
