"""The groundings of the rows an explanation asks for, and nothing else.

An explanation's plan holds every value at every integration point of a pass, so it must be built
over the asked rows' groundings, not the database's: memory then follows the rows explained. A
model trained full batch keeps its whole grounding in memory; its asked part is cut out of it here
(the groundings whose head the asked rows reach, renumbered). A model trained in mini-batches
grounds its asked rows as a batch, from the database or its grounding store, with the rows of its
database-stored embeddings fetched for them. Either way each relation's `keys` carry the key
columns of its rows in local row-id order, so an attribution names its input row."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import torch

from relsql.ground import reach
from relsql.ground.execute import Grounding

ROWS_PER_PART = 4096  # asked rows explained together: one plan, one pass per group of integration points


@dataclass
class Part:
    """Some asked rows' grounding: `rids` are their row ids in it (in asked order); `external` the
    rows of database-stored embeddings it reads."""

    grounding: Grounding
    rids: np.ndarray
    external: dict[str, torch.Tensor] = field(default_factory=dict)


def parts(learner, rids: np.ndarray) -> Iterator[tuple[slice, Part]]:
    """(positions among `rids`, their Part) for the asked rows `rids` (global output row ids), at most
    ROWS_PER_PART at a time."""
    for start in range(0, len(rids), ROWS_PER_PART):
        chunk = rids[start:start + ROWS_PER_PART]
        at = slice(start, start + len(chunk))
        yield at, (_batch(learner, chunk) if learner.mini_batches else _cut(learner.net.grounding, learner.output, chunk))


def _cut(grounding: Grounding, output: str, rids: np.ndarray) -> Part:
    """The part of a whole grounding the output rows `rids` reach (all of it where they are every row)."""
    if len(np.unique(rids)) == grounding.relations[output].size:
        return Part(grounding, rids)
    asked = torch.as_tensor(rids, dtype=torch.long)
    part, new_ids = reach.cut(grounding, reach.reached(grounding, output, asked))
    return Part(part, new_ids[output][asked].numpy())


def _batch(learner, rids: np.ndarray) -> Part:
    """The asked rows grounded as one batch (as predict() grounds them), their relations' keys read."""
    batched = learner.batched
    grounding = batched.source.ground(np.asarray(rids, dtype=np.int64), 0)
    for name, relation in grounding.relations.items():
        rows = grounding.rows[name].numpy()
        keys = batched.grounder.keys(name, rows) if learner.template.relations[name].keys else pa.table({"_rid": rows})
        if not np.array_equal(keys.column("_rid").to_numpy(), rows):
            raise RuntimeError(f"the keys of {name}'s batch rows do not come back in their order")
        relation.keys = keys.set_column(keys.schema.get_field_index("_rid"), "_rid",
                                        pa.array(np.arange(len(rows), dtype=np.int64)))
    external = {weight: batched.store(weight, keys.type).fetch(keys) for weight, keys in grounding.embedding_keys.items()}
    local = np.searchsorted(grounding.rows[learner.output].numpy(), rids)
    return Part(grounding, local, external)
