"""Small constant matrices are multiplied as dense ones.

A CSR product pays a fixed cost per call (MKL's sparse path, and a Python autograd function for
its backward) that a small dense GEMM does not: torch runs a dense matmul's backward in C++. For
NeuraLogic's compressed templates (188 molecules over ~100 distinct groundings) that fixed cost
was a fifth of an epoch. A product stays sparse once the dense GEMM would do more than `LIMIT`
multiply-adds, where measured CPU times of the two cross (188 × 139 × 32 was even).
"""

from __future__ import annotations

import math

from relsql.compile import costs, sparse
from relsql.compile.passes._rewrite import matrix_position
from relsql.compile.plan import Plan


def dense_small_matrices(plan: Plan) -> Plan:
    made, dense = 0, {}
    limit = costs.for_device(plan.device).dense_limit  # multiply-adds of the dense product: 2**17 on these CPUs
    for op in plan.ops:
        at = matrix_position(op)
        if at is None:
            continue
        slot = op.args[at]
        matrix = plan.inputs.get(slot)
        if matrix is None or matrix.layout != sparse.CSR:
            continue
        width = math.prod(plan.meta[op.args[-1]].shape[1:])
        if matrix.shape[0] * matrix.shape[1] * width > limit:
            continue
        if slot not in dense:
            dense[slot] = plan.add_input(matrix.to_dense())
        op.args = (*op.args[:at], dense[slot], *op.args[at + 1:])
        made += 1
    plan.log.append(f"dense_small_matrices: {made} small sparse matmuls run as dense GEMMs")
    return plan
