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

from relsql.compile.passes._rewrite import only_reader, producers, readers
from relsql.compile.plan import Op, Plan, make_op


def _offsets(ids: torch.Tensor, rows: int) -> torch.Tensor:
    crow = torch.zeros(rows + 1, dtype=torch.int64)
    crow[1:] = torch.cumsum(torch.bincount(ids, minlength=rows), 0)
    return crow


def _index(tensor: torch.Tensor, limit: int) -> torch.Tensor:
    """int32 where it fits: the CSR kernels read half the bytes."""
    return tensor.to(torch.int32) if limit < 2**31 - 1 else tensor


def sparse_attention(plan: Plan) -> Plan:
    made, folded, reads, made_by = 0, 0, readers(plan), producers(plan)
    absorbed: set[int] = set()  # scatters whose work the pattern does
    ops: list[Op] = []
    for op in plan.ops:
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
        following = reads.get(op.out, [])
        scatter = following[0] if len(following) == 1 else None
        if scatter is not None and scatter.kind == "scatter" and scatter.args[0] == op.out and scatter.args[1] in plan.inputs \
                and only_reader(plan, op.out, scatter, reads):
            heads = plan.inputs[scatter.args[1]].to(torch.int64)
            if heads.unique().numel() == heads.numel():  # distinct rows: a segment's softmax stays its own
                rows, row_of, target = scatter.attrs["rows"], heads[ids], scatter
                absorbed.add(scatter.out)
                folded += 1
        key = row_of * max(sources, 1) + cols
        if entries > 1 and not bool((key[1:] >= key[:-1]).all()):
            order = torch.argsort(key, stable=True)
            row_of, cols = row_of[order], cols[order]
            picked = make_op(plan, "gather", (score, plan.add_input(order)), op.note, relation="entries by (row, column)")
            ops.append(picked)
            score = picked.out
        order_t = torch.argsort(cols, stable=True)
        limit = max(rows, sources, entries)
        pattern = [_index(t, limit) for t in (_offsets(row_of, rows), cols, _offsets(cols, sources), row_of[order_t])]
        args = (score, source, *(plan.add_input(t) for t in (row_of, *pattern, order_t)))
        ops.append(Op("sparse_attention", target.out, args, dict(op.attrs), target.rows, target.shape, op.note))
        made += 1
    plan.ops = ops
    plan.log.append(f"sparse_attention: {made} attentions read their values through a sparse pattern, "
                    f"{folded} scatters folded into it")
    return plan
