"""scatter(A @ x, heads, rows) = A' @ x, where A' puts row i of A at row heads[i].

A rule that grounds only some rows of its relation scatters its per-head results into the
relation's rows; when those results come from a sparse matmul, the scatter folds into the
matrix (the missing heads become empty rows) and costs nothing at run time.

`scatter_through_weights`, later in the pipeline, also looks through a weight applied after the
product: W·0 = 0, so scatter(W(A @ x)) = W(A' @ x) (a neighbour mean whose weight
`linear_across_aggregation` moved after it). It runs after `stack_scatters`, which serves the
scatters of many one-row rules better (one stacked tensor, not a product per rule).
"""

from __future__ import annotations

from relsql.compile import sparse
from relsql.compile.passes._rewrite import only_reader, producers, readers
from relsql.compile.plan import Op, Plan, make_op


def scatter_into_sparse(plan: Plan) -> Plan:
    made = _fold(plan, through_weights=False)
    plan.log.append(f"scatter_into_sparse: {made} scatters folded into their sparse matrices")
    return plan


def scatter_through_weights(plan: Plan) -> Plan:
    made = _fold(plan, through_weights=True)
    plan.log.append(f"scatter_through_weights: {made} scatters of weighted sparse products folded into their matrices")
    return plan


def _fold(plan: Plan, through_weights: bool) -> int:
    made, reads, made_by = 0, readers(plan), producers(plan)
    ops: list[Op] = []
    for op in plan.ops:
        product = made_by.get(op.args[0]) if op.kind == "scatter" else None
        weight = None
        if through_weights and product is not None and product.kind == "linear" and only_reader(plan, product.out, op, reads):
            weight, product = product, made_by.get(product.args[1])
        heads = plan.inputs.get(op.args[1]) if op.kind == "scatter" else None
        matrix = plan.inputs.get(product.args[0]) if product is not None and product.kind == "spmm" else None
        if matrix is None or heads is None or len(product.args) != 2 \
                or not only_reader(plan, product.out, op if weight is None else weight, reads) \
                or matrix.layout != sparse.CSR or heads.unique().numel() != heads.numel():
            ops.append(op)
            continue
        placed = plan.add_input(sparse.place_rows(matrix, heads, op.attrs["rows"]))
        ops.remove(product)
        if weight is None:
            ops.append(Op("spmm", op.out, (placed, product.args[1]), {}, op.rows, op.shape, op.note))
        else:
            ops.remove(weight)
            moved = make_op(plan, "spmm", (placed, product.args[1]), product.note)
            ops.extend([moved, Op("linear", op.out, (weight.args[0], moved.out), dict(weight.attrs), op.rows, op.shape,
                                  weight.note)])
        made += 1
    plan.ops = ops
    return made
