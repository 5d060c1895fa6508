"""f(gather(x, i)) = gather(f(x), i) for row-wise f: ops move to whichever side of a gather the
strength setting prefers (the thesis's gather propagation).

A row-wise op (a weight, an activation, an elementwise op with a constant or with rows gathered
by the same index, a combination) computes the same rows whether it runs before or after the
gather. Before it, the op runs on the source's rows, which pays when the source has fewer rows
than the gather makes (Pigeon's compact materialization: multiply each atom once, not every
grounding's copy); pushing on also collapses chains of gathers into one gather of composed row ids.
The other way round, a gather that keeps only a few of a row-wise op's rows is pulled in front of
the op, which then computes only those rows (NeuraLogic's product template scales a 32 x 32 matrix
for 10,486 bond facts of which compression keeps 8).

`strength` bounds the moves: an op goes before a gather when rows(source) <= strength x rows(gather),
and a gather before an op otherwise.
0 switches the pass off, 1 (the default) moves only when no more rows are computed, larger values
move further (fewer gathers, more rows computed and held); `relsql.tune` tries the presets.
"""

from __future__ import annotations

import torch

from relsql.compile import sparse
from relsql.compile.passes._rewrite import only_reader, producers, readers
from relsql.compile.plan import Op, Plan, make_op

DEFAULT_STRENGTH = 1.0
PRESETS = (0.0, 1.0, 4.0, float("inf"))


def _constant_row(plan: Plan, slot: int) -> bool:
    return slot in plan.param_slots or plan.meta[slot].shape[0] == 1


def _move(plan: Plan, op: Op, made_by, reads, strength: float) -> tuple[list[int], int, int] | None:
    """(args over the sources, shared index slot, source rows) if `op` can run before its gathers."""
    row_args = {"linear": (1,), "act": (0,)}.get(op.kind, tuple(range(len(op.args))))
    if op.kind not in ("linear", "act", "binary", "combine", "sum"):
        return None
    index, source_rows, new_args = None, None, list(op.args)
    for position in row_args:
        slot = op.args[position]
        gather = made_by.get(slot)
        if gather is not None and gather.kind == "gather" and slot not in plan.param_slots \
                and only_reader(plan, slot, op, reads) and (index is None or gather.args[1] == index):
            rows = plan.meta[gather.args[0]].shape[0]
            if source_rows is not None and rows != source_rows:
                return None
            index, source_rows = gather.args[1], rows
            new_args[position] = gather.args[0]
        elif not _constant_row(plan, slot) or op.kind == "combine":
            return None  # combine broadcasts rows itself; keep it simple: all its row args gathered
    if index is None or op.rows <= 1 or source_rows > strength * op.rows:
        return None
    return new_args, index, source_rows


ROW_WISE = ("linear", "act", "binary", "combine", "sum")


def _pull_scatter(plan: Plan, op: Op, inner: Op, ops: list[Op]) -> bool:
    """gather(scatter(x, heads, n), i): the kept rows of x, scattered into len(i) rows (or just
    gathered, when every kept row is a head)."""
    heads, index = plan.inputs.get(inner.args[1]), plan.inputs.get(op.args[1])
    if heads is None or index is None:
        return False
    position = torch.full((inner.rows,), -1, dtype=torch.int64)
    position[heads] = torch.arange(heads.shape[0])
    found = position[index]
    kept = found >= 0
    if bool(kept.all()):
        ops.append(Op("gather", op.out, (inner.args[0], plan.add_input(found)), dict(op.attrs), op.rows, op.shape, op.note))
        return True
    picked = make_op(plan, "gather", (inner.args[0], plan.add_input(found[kept])), op.note, **op.attrs)
    ops.append(picked)
    ops.append(Op("scatter", op.out, (picked.out, plan.add_input(torch.nonzero(kept).reshape(-1))), {"rows": op.rows},
                  op.rows, op.shape, inner.note))
    return True


def _pull_gathers(plan: Plan, strength: float) -> int:
    """gather(f(x, ...), i) = f(gather(x, i), ...): a gather that keeps few of an op's rows goes
    before the op, so the op computes only the rows kept (one sweep; returns how many).
    f is a row-wise op, a scatter of rows into a relation, or a sparse product (its rows are picked)."""
    pulled, reads, made_by = 0, readers(plan), producers(plan)
    ops: list[Op] = []
    for op in plan.ops:
        inner = made_by.get(op.args[0]) if op.kind in ("gather", "slice") else None
        if inner is None or inner.kind not in (*ROW_WISE, "scatter", "spmm") or inner not in ops \
                or not only_reader(plan, inner.out, op, reads) or inner.rows <= strength * op.rows:
            ops.append(op)
            continue
        if op.kind == "slice":  # consecutive rows: a gather like any other from here on
            start = op.attrs["start"]
            index = plan.add_input(torch.arange(start, start + op.rows))
            op = Op("gather", op.out, (op.args[0], index), {"relation": "slice"}, op.rows, op.shape, op.note)
        if inner.kind == "scatter":
            done = _pull_scatter(plan, op, inner, ops)
        elif inner.kind == "spmm":
            matrix, index = plan.inputs.get(inner.args[0]), plan.inputs.get(op.args[1])
            done = matrix is not None and index is not None and len(inner.args) == 2 and matrix.layout == sparse.CSR
            if done:
                rows = plan.add_input(sparse.select_rows(matrix, index))
                ops.append(Op("spmm", op.out, (rows, inner.args[1]), {}, op.rows, op.shape, inner.note))
        else:
            done = _pull_row_wise(plan, op, inner, ops)
        if done:
            ops.remove(inner)
            pulled += 1
        else:
            ops.append(op)
    plan.ops = ops
    return pulled


def _pull_row_wise(plan: Plan, op: Op, inner: Op, ops: list[Op]) -> bool:
    row_args = {"linear": (1,), "act": (0,)}.get(inner.kind, tuple(range(len(inner.args))))
    rows = [p for p in row_args if plan.meta[inner.args[p]].shape[0] == inner.rows and inner.args[p] not in plan.param_slots]
    if any(p not in rows and not _constant_row(plan, inner.args[p]) for p in row_args):
        return False
    args = list(inner.args)
    for position in rows:
        gathered = make_op(plan, "gather", (inner.args[position], op.args[1]), op.note, **op.attrs)
        ops.append(gathered)
        args[position] = gathered.out
    ops.append(Op(inner.kind, op.out, tuple(args), dict(inner.attrs), op.rows, op.shape, inner.note))
    return True


def propagate_gathers(plan: Plan, strength: float = DEFAULT_STRENGTH) -> Plan:
    if strength <= 0:
        plan.log.append("propagate_gathers: off (strength 0)")
        return plan
    pulled = 0
    for _ in range(len(plan.ops)):  # each sweep pulls gathers one op further; stop when none move
        found = _pull_gathers(plan, strength)
        pulled += found
        if not found:
            break
    moved, composed, reads, made_by = 0, 0, readers(plan), producers(plan)
    ops: list[Op] = []
    for op in plan.ops:
        inner = made_by.get(op.args[0]) if op.kind == "gather" else None
        if inner is not None and inner.kind == "gather" and op.args[1] in plan.inputs and inner.args[1] in plan.inputs:
            # gather(gather(x, i), j) = gather(x, i[j]); the inner gather stays if others read it
            if only_reader(plan, inner.out, op, reads):
                ops.remove(inner)
            index = plan.add_input(plan.inputs[inner.args[1]][plan.inputs[op.args[1]]])
            new = Op("gather", op.out, (inner.args[0], index), dict(op.attrs), op.rows, op.shape, op.note)
            ops.append(new)
            made_by[op.out] = new
            reads.setdefault(inner.args[0], []).append(new)
            composed += 1
            continue
        found = _move(plan, op, made_by, reads, strength)
        if found is None:
            ops.append(op)
            continue
        args, index, source_rows = found
        for slot in set(op.args) - set(args):
            ops.remove(made_by[slot])
        before = make_op(plan, op.kind, tuple(args), op.note, row_count=source_rows, **op.attrs)
        gather = Op("gather", op.out, (before.out, index), {"relation": "propagated"}, op.rows, op.shape, op.note)
        ops.extend([before, gather])
        made_by[before.out], made_by[op.out] = before, gather
        reads[before.out] = [gather]
        for a in args:
            reads.setdefault(a, []).append(before)
        moved += 1
    plan.ops = ops
    plan.log.append(f"propagate_gathers: {pulled} gathers pulled before row-wise ops, {moved} row-wise ops moved "
                    f"before their gathers, {composed} gather chains composed")
    return plan
