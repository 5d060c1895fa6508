"""Narrow weights on one input as one product; in front of a constant's product, reassociated.

GAT's attention logits are two (heads, C) weights on the same W x (a_src · W x, a_dst · W x):
two GEMMs of a handful of columns forwards, and backwards two (rows, C) outer products of the
logits' gradients plus the additions that accumulate them into W x's gradient: on CPU these
(rows, C) writes cost more than the GEMMs. Stacked, the weights are one (K, C) matrix and one
product, read back as column slices (views). When W x is itself a weight times a constant (a
first layer on node features), A (W x) = (A W) x: the logits are computed from the constant,
and their backward writes no (rows, C) gradient at all (the constant needs none), only the
(K, D) gradient of A W, which flows on to A and W through a (K, C) x (C, D) product.
"""

from __future__ import annotations

import torch

from relsql.compile.passes._rewrite import is_matrix_on_vectors, producers
from relsql.compile.plan import Op, Plan

NARROW = 16  # at most this many output columns per weight, and twice that stacked: score columns, not layers


def _narrow(plan: Plan, op: Op, made_by: dict[int, Op]) -> bool:
    """A plain weight (k, C), k small, applied to rows of C-vectors."""
    if op.kind != "linear":
        return False
    weight, x = op.args
    param = made_by.get(weight)
    return param is not None and param.kind == "param" and is_matrix_on_vectors(plan, weight, x) \
        and plan.meta[weight].shape[0] <= NARROW


def _constant_product(plan: Plan, op: Op | None, width: int) -> tuple[int, int] | None:
    """(W, x) where op is W x with W a weight of the graph and x a constant (no gradient) whose
    rows are at most twice as wide as W x's: reading x instead costs about the same."""
    if op is None or op.kind != "linear":
        return None
    weight, x = op.args
    if weight not in plan.param_slots or x not in plan.inputs or not plan.inputs[x].is_floating_point() \
            or not is_matrix_on_vectors(plan, weight, x):
        return None
    return (weight, x) if plan.meta[x].shape[1] <= 2 * width else None


def _weight_op(plan: Plan, kind: str, args: tuple[int, ...], shape: tuple[int, int], note: str, **attrs) -> Op:
    """An op computing a weight from weights: a weight slot (no row dimension), shape given."""
    slot = plan.new_slot()
    plan.meta[slot] = torch.empty(shape, dtype=plan.meta[args[0]].dtype, device="meta")
    plan.param_slots.add(slot)
    return Op(kind, slot, args, attrs, rows=1, shape=shape, note=note)


def stack_narrow_linears(plan: Plan) -> Plan:
    made_by = producers(plan)
    groups: dict[int, list[Op]] = {}
    for op in plan.ops:
        if _narrow(plan, op, made_by):
            groups.setdefault(op.args[1], []).append(op)
    stacked = reassociated = 0
    for x, group in groups.items():
        widths = [plan.meta[op.args[0]].shape[0] for op in group]
        if sum(widths) > 2 * NARROW:
            continue
        inner = _constant_product(plan, made_by.get(x), plan.meta[x].shape[1])
        if len(group) == 1 and inner is None:
            continue
        note, params = group[0].note, [made_by[op.args[0]] for op in group]
        new: list[Op] = []
        weight, width = group[0].args[0], sum(widths)
        if len(group) > 1:
            new.append(_weight_op(plan, "cat", tuple(op.args[0] for op in group), (width, plan.meta[x].shape[1]), note))
            weight = new[-1].out
            stacked += 1
        source = x
        if inner is not None:
            w, source = inner
            new.append(_weight_op(plan, "matmul", (weight, w), (width, plan.meta[w].shape[1]), note))
            weight = new[-1].out
            reassociated += 1
        if len(group) == 1:
            group[0].args = (weight, source)
        else:
            product = Op("linear", plan.new_slot(), (weight, source), {}, group[0].rows, (width,), note)
            plan.meta[product.out] = torch.empty((group[0].rows, width), dtype=plan.meta[x].dtype, device="meta")
            new.append(product)
            start = 0
            for op, k in zip(group, widths):
                op.kind, op.args, op.attrs = "columns", (product.out,), {"start": start, "width": k}
                start += k
        # the group's weights are read from here on: those made later (no arguments) move up
        at = plan.ops.index(group[0])
        later = [p for p in dict.fromkeys(params) if plan.ops.index(p) > at]
        ops = [op for op in plan.ops if all(op is not p for p in later)]
        at = ops.index(group[0])
        plan.ops = ops[:at] + later + new + ops[at:]
    plan.log.append(f"stack_narrow_linears: {stacked} groups of narrow weights on one input stacked into one product, "
                    f"{reassociated} moved in front of a constant's weight")
    return plan
