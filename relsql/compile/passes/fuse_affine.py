"""c + x W^T and c + A @ x as one kernel each: products fused with the terms added to them.

`linear(x, d) + bias(d)`, a layer's self term next to its neighbour term, an MLP's hidden
layer: each is a matmul whose output is immediately added to; torch.addmm does both in one
kernel (the addition happens inside the GEMM or the sparse product), one op instead of two
in both passes.
"""

from __future__ import annotations

from relsql.compile import sparse
from relsql.compile.passes._rewrite import is_matrix_on_vectors, only_reader, producers, readers, sum_terms
from relsql.compile.plan import Op, Plan, make_op


def _fusable(plan: Plan, term: int, op: Op, made_by, reads) -> Op | None:
    """The product behind `term` if it can take an addend: a weight on vectors or a sparse matmul."""
    product = made_by.get(term)
    if product is None or not only_reader(plan, term, op, reads) or product.rows != op.rows or product.shape != op.shape:
        return None
    if product.kind == "linear" and is_matrix_on_vectors(plan, *product.args):
        return product
    if product.kind == "spmm" and len(product.args) == 2 and product.args[0] in plan.inputs \
            and plan.inputs[product.args[0]].layout == sparse.CSR:
        return product
    return None


def fuse_affine(plan: Plan) -> Plan:
    fused, reads, made_by = 0, readers(plan), producers(plan)
    ops: list[Op] = []
    for op in plan.ops:
        terms = sum_terms(op) or []
        products = {}
        for term in terms:
            product = _fusable(plan, term, op, made_by, reads)
            if product is not None and terms.count(term) == 1:
                products[term] = product
        rest = [t for t in terms if t not in products]
        addends = [t for t in rest if tuple(plan.meta[t].shape[1:]) == op.shape]
        if not products or len(addends) != len(rest) or (not rest and len(products) == 1):
            ops.append(op)
            continue
        todo = list(products.values())
        if not rest:
            accumulated = todo.pop(0).out
        elif len(rest) == 1:
            accumulated = rest[0]
        else:
            total = make_op(plan, "sum", tuple(rest), op.note)
            ops.append(total)
            accumulated = total.out
        for product in todo:
            ops.remove(product)
        for i, product in enumerate(todo):
            if product.kind == "linear":
                kind, args = "affine", (accumulated, product.args[1], product.args[0])
            else:
                kind, args = "addspmm", (accumulated, *product.args)
            if i == len(todo) - 1:
                ops.append(Op(kind, op.out, args, {}, op.rows, op.shape, op.note))
            else:
                step = make_op(plan, kind, args, op.note)
                ops.append(step)
                accumulated = step.out
        fused += len(todo)
    plan.ops = ops
    plan.log.append(f"fuse_affine: {fused} products fused with the terms added to them (addmm)")
    return plan
