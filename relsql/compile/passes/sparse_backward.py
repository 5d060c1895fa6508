"""Each sparse matmul gets its matrix's transpose, computed once, for the backward pass.

torch's own backward of a CSR × dense product transposes the matrix (a sort of every entry)
on every call; with the transpose stored beside the matrix, the backward is one more sparse
matmul (relsql/compile/sparse.py: _CsrMatmul). Runs last, after the passes that change matrices.
"""

from __future__ import annotations

from relsql.compile import sparse
from relsql.compile.passes._rewrite import matrix_position, weight_dependent
from relsql.compile.plan import Plan


def sparse_backward(plan: Plan) -> Plan:
    made, transposes, trainable = 0, {}, weight_dependent(plan)
    for op in plan.ops:
        at = matrix_position(op)
        if at is None or len(op.args) != at + 2 or op.args[-1] not in trainable:
            continue
        matrix = plan.inputs.get(op.args[at])
        if matrix is None or matrix.layout != sparse.CSR:
            continue
        if op.args[at] not in transposes:
            transposes[op.args[at]] = plan.add_input(sparse.transpose(matrix))
        op.args = (*op.args[: at + 1], transposes[op.args[at]], op.args[-1])
        made += 1
    plan.log.append(f"sparse_backward: {made} sparse matmuls with a stored transpose for the backward pass")
    return plan
