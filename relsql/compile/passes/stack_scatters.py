"""scatter(a, i) + scatter(b, j) + ... = scatter(cat(a, b, ...), cat(i, j, ...)): one placement.

A relation written as many rules that each fill a few of its rows (NeuraLogic's one rule per
atom type: `atom_embed(A) :- c_22(A)`, ...) is otherwise a scatter per rule plus a chain of
additions, each a kernel call forwards and backwards. Stacked, the rules' rows are placed
once; where they fill every row exactly once the placement is a permutation (a gather), or
nothing at all when the rules already come in row order.
"""

from __future__ import annotations

import torch

from relsql.compile.passes._rewrite import only_reader, producers, readers
from relsql.compile.plan import Op, Plan, make_op


def _stackable(plan: Plan, op: Op, made_by: dict[int, Op], reads) -> list[Op]:
    found = []
    for slot in op.args:
        scatter = made_by.get(slot)
        if scatter is not None and scatter.kind == "scatter" and scatter.args[1] in plan.inputs \
                and scatter.args[0] not in plan.param_slots and only_reader(plan, slot, op, reads) \
                and scatter.rows == op.rows and scatter.shape == op.shape \
                and tuple(plan.meta[scatter.args[0]].shape[1:]) == op.shape and scatter not in found:
            found.append(scatter)
    return found


def _placement(plan: Plan, stacked: Op, index: torch.Tensor, rows: int, out: int, note: str) -> Op | None:
    """The op putting the stacked rows in place (writing `out`), or None if they already are."""
    if index.numel() == rows and bool(torch.bincount(index, minlength=rows).eq(1).all()):
        if torch.equal(index, torch.arange(rows, dtype=index.dtype)):
            return None
        inverse = torch.empty_like(index)
        inverse[index] = torch.arange(rows, dtype=index.dtype)
        return Op("gather", out, (stacked.out, plan.add_input(inverse)), {}, rows, stacked.shape, note)
    return Op("scatter", out, (stacked.out, plan.add_input(index)), {"rows": rows}, rows, stacked.shape, note)


def stack_scatters(plan: Plan) -> Plan:
    stacked_sums, reads, made_by = 0, readers(plan), producers(plan)
    ops: list[Op] = []
    gone: set[int] = set()
    for op in plan.ops:
        scatters = _stackable(plan, op, made_by, reads) if op.kind == "sum" else []
        if len(scatters) < 2:
            ops.append(op)
            continue
        parts = [s.args[0] for s in scatters]
        stacked = make_op(plan, "cat", tuple(parts), op.note, row_count=sum(plan.meta[p].shape[0] for p in parts))
        ops.append(stacked)
        index = torch.cat([plan.inputs[s.args[1]] for s in scatters])
        rest = [a for a in op.args if a not in {s.out for s in scatters}]
        target = op.out if not rest else plan.new_slot()
        placed = _placement(plan, stacked, index, op.rows, target, op.note)
        if placed is not None:
            ops.append(placed)
            plan.meta[target] = torch.empty((op.rows, *op.shape), dtype=plan.meta[op.out].dtype, device="meta")
        elif not rest:  # the stack is the relation: write it into the sum's slot
            stacked.out, plan.meta[op.out] = op.out, plan.meta[stacked.out]
        if rest:
            ops.append(Op("sum", op.out, (stacked.out if placed is None else target, *rest), {}, op.rows, op.shape, op.note))
        gone.update(id(s) for s in scatters)
        stacked_sums += 1
    plan.ops = [op for op in ops if id(op) not in gone]
    plan.log.append(f"stack_scatters: {stacked_sums} sums of per-rule scatters placed as one stacked tensor")
    return plan
