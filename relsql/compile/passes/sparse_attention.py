"""attention(score, gather(x, index)) reads x's rows in place, through a CSR pattern.

A grounding's value is usually a row of a relation (GAT's W h of the source node, computed
once per node); the plain attention op takes it gathered per grounding, an (n, H*C) copy, and
a scatter of the heads' results into the relation's rows follows. Here the groundings become
the entries of a sparse pattern: the gathers fold into its column indices (as in
gather_into_sparse), a scatter into distinct rows folds into its row indices, and its transpose
for the backward pass is computed once (kernels.sparse_attention). Entries are ordered by
(row, column), so each row's columns are sorted (a repeated edge stays a repeated column: each
grounding keeps its own softmax weight); the scores are gathered into that order when it differs.
"""

from __future__ import annotations

import torch

from relsql.compile import sparse
from relsql.compile.passes._rewrite import only_reader, producers, readers, sum_terms
from relsql.compile.plan import Op, Plan, make_op


def _offsets(ids: torch.Tensor, rows: int) -> torch.Tensor:
    crow = torch.zeros(rows + 1, dtype=torch.int64)
    crow[1:] = torch.cumsum(torch.bincount(ids, minlength=rows), 0)
    return crow


def _index(tensor: torch.Tensor, limit: int) -> torch.Tensor:
    """int32 where it fits: the CSR kernels read half the bytes."""
    return tensor.to(torch.int32) if limit < 2**31 - 1 else tensor


def _scatter(plan: Plan, op: Op, reads: dict[int, list[Op]]) -> Op | None:
    """The scatter that places op's results into distinct rows of its relation, if that is all
    that reads them (distinct: each segment's softmax stays its own)."""
    scatter = next(iter(reads.get(op.out, [])), None)
    if scatter is None or scatter.kind != "scatter" or scatter.args[0] != op.out or scatter.args[1] not in plan.inputs \
            or not only_reader(plan, op.out, scatter, reads):
        return None
    heads = plan.inputs[scatter.args[1]]
    return scatter if heads.unique().numel() == heads.numel() else None


def _addend(plan: Plan, op: Op, reads: dict[int, list[Op]]) -> tuple[Op, int] | None:
    """(the sum, its other term) where op's result is one of two terms of the same shape added
    (GAT's bias): the kernel adds it in place, no third (rows, H*C) tensor is written."""
    total = next(iter(reads.get(op.out, [])), None)
    terms = sum_terms(total) if total is not None else None
    if terms is None or len(terms) != 2 or terms.count(op.out) != 1 or not only_reader(plan, op.out, total, reads):
        return None
    other = terms[1] if terms[0] == op.out else terms[0]
    if total.rows != op.rows or tuple(total.shape) != tuple(op.shape) \
            or tuple(plan.meta[other].shape) not in ((op.rows, *op.shape), (1, *op.shape)):
        return None
    return total, other


def sparse_attention(plan: Plan) -> Plan:
    made, folded, added, reads, made_by = 0, 0, 0, readers(plan), producers(plan)
    pending: dict[int, Op] = {}  # slot of the op the new one replaces -> the new op
    absorbed: set[int] = set()  # ops whose work the new op does
    ops: list[Op] = []
    for op in plan.ops:
        if op.out in pending:
            ops.append(pending.pop(op.out))
            continue
        if op.out in absorbed:
            continue
        if op.kind != "attention" or op.args[2] not in plan.inputs or op.args[3] not in plan.inputs:
            ops.append(op)
            continue
        score, value, ids_slot, counts_slot = op.args
        ids = plan.inputs[ids_slot].to(torch.int64)
        entries = ids.shape[0]
        cols, source = torch.arange(entries), value
        gather = made_by.get(source)
        while gather is not None and gather.kind == "gather" and gather.args[1] in plan.inputs \
                and gather.args[0] not in plan.param_slots:
            cols = plan.inputs[gather.args[1]].to(torch.int64)[cols]
            source = gather.args[0]
            gather = made_by.get(source)
        sources = plan.meta[source].shape[0]
        rows, row_of, target = plan.inputs[counts_slot].shape[0], ids, op
        scatter = _scatter(plan, op, reads)
        if scatter is not None:
            rows, row_of, target = scatter.attrs["rows"], plan.inputs[scatter.args[1]].to(torch.int64)[ids], scatter
            folded += 1
        addend = _addend(plan, target, reads)
        key = row_of * max(sources, 1) + cols
        if not sparse.is_sorted(key):
            order = torch.argsort(key, stable=True)
            row_of, cols = row_of[order], cols[order]
            scored = made_by.get(score)
            if scored is not None and scored.kind == "gather" and scored.args[1] in plan.inputs \
                    and scored.args[0] not in plan.param_slots and only_reader(plan, score, op, reads):
                # the scores are themselves gathered (groundings computed in type order): one gather
                order, score = plan.inputs[scored.args[1]].to(torch.int64)[order], scored.args[0]  # dead_code drops that gather
            picked = make_op(plan, "gather", (score, plan.add_input(order)), op.note, relation="entries by (row, column)")
            ops.append(picked)
            score = picked.out
        order_t = torch.argsort(cols, stable=True)
        limit = max(rows, sources, entries)
        pattern = [_index(t, limit) for t in (_offsets(row_of, rows), cols, _offsets(cols, sources), row_of[order_t])]
        args = (score, source, *(plan.add_input(t) for t in (row_of, *pattern, order_t)))
        if addend is not None:
            if target is not op:
                absorbed.add(target.out)
            target, args = addend[0], (*args, addend[1])
            added += 1
        new = Op("sparse_attention", target.out, args, dict(op.attrs), target.rows, target.shape, op.note)
        if target is op:
            ops.append(new)
        else:  # at the place of the op it replaces: the added term is computed by then
            pending[target.out] = new
        made += 1
    plan.ops = ops
    plan.log.append(f"sparse_attention: {made} attentions read their values through a sparse pattern, "
                    f"{folded} scatters and {added} added terms folded into it")
    return plan
