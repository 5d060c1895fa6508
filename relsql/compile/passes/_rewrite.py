"""Small helpers the optimizer passes share: who produces and who reads each slot."""

from __future__ import annotations

from collections import defaultdict

from relsql.compile.plan import Op, Plan


def producers(plan: Plan) -> dict[int, Op]:
    return {op.out: op for op in plan.ops}


def weight_dependent(plan: Plan) -> set[int]:
    """Slots whose value depends on a weight: only their products run backward (and a product of
    constants is folded at compile time anyway)."""
    found = set(plan.param_slots)
    for op in plan.ops:
        if op.kind == "param" or any(a in found for a in op.args):
            found.add(op.out)
    return found


def readers(plan: Plan) -> dict[int, list[Op]]:
    found: dict[int, list[Op]] = defaultdict(list)
    for op in plan.ops:
        for arg in op.args:
            found[arg].append(op)
    return found


def only_reader(plan: Plan, slot: int, reader: Op, reads: dict[int, list[Op]]) -> bool:
    """`reader` is the single consumer of `slot`, and the slot is no relation's output."""
    return reads.get(slot, []) == [reader] and slot not in plan.outputs.values()


def sum_terms(op: Op) -> list[int] | None:
    """The slots an op adds up (a sum, or a binary + without reshaping), else None."""
    if op.kind == "sum" or (op.kind == "binary" and op.attrs.get("op") == "+" and "reshape_right" not in op.attrs):
        return list(op.args)
    return None


def redirect(plan: Plan, mapping: dict[int, int]) -> None:
    """Make every read of slot a read of mapping[a] instead (ops and relation outputs)."""
    def resolve(slot: int) -> int:
        while slot in mapping:
            slot = mapping[slot]
        return slot

    for op in plan.ops:
        op.args = tuple(resolve(a) for a in op.args)
    plan.outputs = {name: resolve(slot) for name, slot in plan.outputs.items()}


def is_matrix_on_vectors(plan: Plan, weight: int, value: int) -> bool:
    """A (m, n) weight applied to rows of n-vectors: a plain matmul that commutes with row ops."""
    w, x = plan.meta[weight], plan.meta[value]
    return w.dim() == 2 and x.dim() == 2 and x.shape[1] == w.shape[1] and w.shape[1] != 1


def matrix_position(op: Op) -> int | None:
    """Where a sparse product keeps its matrix: spmm(matrix, ...), addspmm(c, matrix, ...)."""
    return {"spmm": 0, "addspmm": 1}.get(op.kind)


def movable(plan: Plan, linear: Op | None, reads: dict[int, list[Op]]) -> bool:
    """A weight on vectors, read by one op only, that does not narrow them: worth moving."""
    if linear is None or linear.kind != "linear" or len(reads.get(linear.out, [])) != 1 or linear.out in plan.outputs.values():
        return False
    weight, x = linear.args
    return is_matrix_on_vectors(plan, weight, x) and plan.meta[weight].shape[0] >= plan.meta[weight].shape[1]


def move_across(ops: list[Op], op: Op, inner: Op, first: Op, outer_kind: str, outer_arg: int) -> None:
    """Exchange two ops of a chain: `inner` (read only by `op`) is dropped, `first` computes the
    other factor on the inner input, and an `outer_kind` op of (`outer_arg`, first) takes
    `op`'s place and slot. The linear-moving passes rewrite W·agg(x) <-> agg(W·x) this way."""
    ops.remove(inner)
    ops.append(first)
    ops.append(Op(outer_kind, op.out, (outer_arg, first.out), {}, op.rows, op.shape, op.note))
