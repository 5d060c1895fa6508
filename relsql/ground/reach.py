"""The part of a grounding that some output rows reach: the groundings whose head they depend on,
and the rows those groundings read, renumbered.

Two readers. An explanation builds its plan over the rows it is asked about (relsql/explain/asked.py).
A model's plan reads one output, so a row of an inner relation that no output row depends on is
computed every epoch for nothing: a parent table's rows no target row references (Lahman's batting
seasons after every salary, flights' destination airports where only the three origins are read)
or child rows every time cut leaves out (relsql/train/learner/learner.py plans over `live`).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import torch

from relsql.ground.execute import Grounding, RelationGrounding, RuleGrounding


def reached(grounding: Grounding, output: str, rids: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per relation, a mask of the rows the output rows `rids` depend on (dependency order:
    every reader comes after what it reads, so one pass from the last relation backwards)."""
    masks = {name: torch.zeros(g.size, dtype=torch.bool) for name, g in grounding.relations.items()}
    masks[output][rids] = True
    for name in reversed(list(grounding.relations)):
        for rg in grounding.relations[name].rules:
            taken = masks[name][rg.head]
            for ref, rows in zip(rg.rule.refs, rg.refs):
                masks[ref][rows[taken]] = True
    return masks


def cut(grounding: Grounding, masks: dict[str, torch.Tensor], keep_empty: bool = False) -> tuple[Grounding, dict]:
    """The grounding restricted to the rows of `masks` (reached), each relation's rows renumbered in
    their order; returns it and, per relation, each old row's new id (-1 where cut). `keep_empty`:
    a relation none of whose rows is reached stays, with no rows (a plan reads every relation of the
    template); else it is left out."""
    local = {name: torch.cumsum(mask.long(), 0) - 1 for name, mask in masks.items()}
    relations = {}
    for name, relation in grounding.relations.items():
        mask = masks[name]
        kept = torch.nonzero(mask).flatten()
        if not len(kept) and not keep_empty:
            continue
        keys = relation.keys.sort_by("_rid").take(pa.array(kept.numpy()))
        keys = keys.set_column(keys.schema.get_field_index("_rid"), "_rid", pa.array(np.arange(len(kept), dtype=np.int64)))
        part = RelationGrounding(name, keys)
        for rg in relation.rules:
            taken = mask[rg.head]
            if not bool(taken.any()):
                continue
            heads = mask[rg.segment_heads]
            counts = (rg.offsets[1:] - rg.offsets[:-1])[heads]
            part.rules.append(RuleGrounding(
                rg.rule, local[name][rg.head[taken]],
                [local[ref][rows[taken]] for ref, rows in zip(rg.rule.refs, rg.refs)],
                {k: column[taken] for k, column in rg.columns.items()},
                local[name][rg.segment_heads[heads]], torch.cat([torch.zeros(1, dtype=torch.long), torch.cumsum(counts, 0)])))
        relations[name] = part
    new_ids = {name: torch.where(masks[name], local[name], -1) for name in masks}
    return Grounding(relations, grounding.dictionaries, grounding.feature_stats, grounding.seconds), new_ids


def live(grounding: Grounding, output: str, least: float = 0.0) -> Grounding:
    """The grounding a plan of `output` alone needs: every output row, and what it depends on. The
    grounding itself where fewer than `least` of its groundings would go (a copy saves nothing then)."""
    masks = reached(grounding, output, torch.arange(grounding.relations[output].size))
    total = sum(rg.size for relation in grounding.relations.values() for rg in relation.rules)
    dead = sum(int((~masks[name][rg.head]).sum()) for name, relation in grounding.relations.items() for rg in relation.rules)
    if not dead or dead < least * total:
        return grounding
    return cut(grounding, masks, keep_empty=True)[0]
