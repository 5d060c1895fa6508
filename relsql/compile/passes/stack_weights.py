"""cat(W1 · c1, W2 · c2, ...) = cat(W1ᵀ, W2ᵀ, ...) * c: weights read as rows, one op for all.

What `stack_scatters` stacks is often one weight column per rule scaled by a constant fact
value (`{32, 1} atom_embed(A) :- c_22(A).`): as products that is a matmul per rule, forwards
and backwards. Read as rows of one stacked tensor, times the constants as a column (left out
when they are all 1), it is two kernel calls whatever the number of rules. A gather of those
rows that nothing else reads (the relation's rows in another order) is read off in that order
instead: one op less forwards and backwards.
"""

from __future__ import annotations

import torch

from relsql.compile.passes._rewrite import only_reader, producers, readers
from relsql.compile.plan import Op, Plan


def _column_times_constant(plan: Plan, part: int, cat: Op, made_by: dict[int, Op], reads) -> Op | None:
    """The op computing `part` if it is (m, 1) weight × a one-row constant (1,) read only by `cat`."""
    op = made_by.get(part)
    if op is None or op.kind != "linear" or not only_reader(plan, part, cat, reads):
        return None
    weight, value = op.args
    if weight not in plan.param_slots or value not in plan.inputs:
        return None
    w, c = plan.meta[weight], plan.inputs[value]
    return op if w.dim() == 2 and w.shape[1] == 1 and tuple(c.shape) == (1, 1) else None


def _sole_gather(plan: Plan, cat: Op, reads) -> Op | None:
    """The gather of a few constant rows that is the only reader of `cat`'s result."""
    found = reads.get(cat.out, [])
    if len(found) != 1 or cat.out in plan.outputs.values():
        return None
    gather = found[0]
    if gather.kind != "gather" or gather.args[0] != cat.out or gather.args[1] not in plan.inputs:
        return None
    return gather if gather.rows <= 4 * len(cat.args) else None


def stack_weights(plan: Plan) -> Plan:
    stacked, reads, made_by = 0, readers(plan), producers(plan)
    gone: set[int] = set()
    for op in plan.ops:
        if op.kind != "cat":
            continue
        products = [_column_times_constant(plan, part, op, made_by, reads) for part in op.args]
        if not all(products):
            continue
        scale = torch.cat([plan.inputs[p.args[1]] for p in products])
        weights = tuple(p.args[0] for p in products)
        gather = _sole_gather(plan, op, reads)
        if gather is not None:  # the rows in the gather's order, and the gather's slot
            index = plan.inputs[gather.args[1]].tolist()
            weights, scale = tuple(weights[i] for i in index), scale[index]
            gone.add(id(op))
            op = gather
        op.kind, op.args, op.attrs = "weight_rows", weights, {}
        if not bool((scale == 1).all()):
            op.args, op.attrs = (*weights, plan.add_input(scale)), {"scaled": True}
        gone.update(id(p) for p in products)
        stacked += 1
    plan.ops = [op for op in plan.ops if id(op) not in gone]
    plan.log.append(f"stack_weights: {stacked} stacks of weight columns times constants read as one tensor")
    return plan
