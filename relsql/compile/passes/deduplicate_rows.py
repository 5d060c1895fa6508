"""Identical rows of a per-grounding column are stored once and gathered.

Value deduplication: a database column joined into every grounding (one-hot labels, codes,
repeated measurements) often has few distinct rows; keeping only those lets the weight that
follows multiply each distinct row once (with linear_before_gather) and the aggregation run
as a sparse matmul.
"""

from __future__ import annotations

import torch

from relsql.compile import compress
from relsql.compile.passes._rewrite import redirect
from relsql.compile.plan import Plan, make_op

MAX_SHARE = 0.5  # deduplicate when at most this share of the rows is distinct


def deduplicate_rows(plan: Plan) -> Plan:
    mapping: dict[int, int] = {}
    new_ops = []
    read = {a for op in plan.ops for a in op.args}
    for slot, tensor in list(plan.inputs.items()):
        if slot not in read or tensor.layout != torch.strided or not tensor.is_floating_point() or tensor.dim() != 2 \
                or tensor.shape[0] < 16:
            continue
        limit = int(MAX_SHARE * tensor.shape[0])
        inverse = plan.row_classes[slot] if slot in plan.row_classes else compress.classes_of(tensor, limit)
        if inverse is not None and int(inverse.max()) + 1 > limit:
            inverse = None  # too many distinct rows to gain
        if inverse is None:
            continue
        count = int(inverse.max()) + 1
        distinct = tensor[compress.representatives(inverse, count)]
        rows = plan.add_input(distinct)
        index = plan.add_input(inverse)
        gather = make_op(plan, "gather", (rows, index), "deduplicated column")
        new_ops.append(gather)
        mapping[slot] = gather.out
    redirect(plan, mapping)
    plan.ops = new_ops + plan.ops
    plan.log.append(f"deduplicate_rows: {len(mapping)} per-grounding columns stored as distinct rows + gather")
    return plan
