"""A model's net run over demand-grounded mini-batches (relsql/ground/demand.py).

A batch is a set of output rows (global row ids). Preparing it — reading its groundings from the
grounding store (relsql/ground/store/; or grounding them in the database, without a store) and
planning the vectorized ops — happens in the model's database worker thread; its
database-stored embeddings are read there too, after the previous batch's update was applied.
The forward pass runs the batch's plan with the model's weights.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import torch

from relsql.compile import members
from relsql.compile.passes import (
    RULES,
    choose_segment_kernels,
    compress_groundings,
    deduplicate_rows,
    reorder_rows,
    shared_aggregation,
)
from relsql.compile.plan import Plan
from relsql.compile.reuse import Trace, raw_tensors
from relsql.ground.demand import BatchGrounder, BatchGrounding
from relsql.ground.store import GroundingStore
from relsql.train.embeddings.embeddings import DatabaseEmbedding, EmbeddingTable
from relsql.train.embeddings.swapped import SwappedEmbedding
from relsql.train.feed import guards
from relsql.train.feed.shapes import BatchPlans

KEPT_BYTES = 64 * 2**20  # prepared batches kept for a repeat (see Batched.traced), at most about this many bytes

# No kernel timing per batch (nor row renumbering, which times too), and no isomorphic compression: a
# batch's plan runs once, and finding its row classes cost 6x the rest of planning (TPC-H, 16,384
# orders) for one forward and backward. Nor shared partial sums: their greedy and timing cost more than one step saves.
# Nor value deduplication: its distinct-row count (a torch.unique per column, 0.6 ms of a TPC-H batch's
# 2.5 ms plan) differs from batch to batch, so a plan replayed per shape (relsql/compile/reuse.py) would
# have to redo it every time.
PASSES = tuple(rule for rule in RULES if rule not in (choose_segment_kernels, compress_groundings, deduplicate_rows,
                                                      reorder_rows, shared_aggregation))


def _positions(ordered: torch.Tensor, rids: np.ndarray) -> torch.Tensor:
    """Where each of `rids` sits in the ascending global ids `ordered` (numpy on the CPU: a
    third of torch's call overhead per batch)."""
    if ordered.device.type != "cpu":
        return torch.searchsorted(ordered, torch.as_tensor(np.asarray(rids, dtype=np.int64), device=ordered.device))
    return torch.from_numpy(np.searchsorted(ordered.numpy(), np.asarray(rids, dtype=np.int64)))


@dataclass
class Batch:
    rids: np.ndarray  # global row ids of the batch's output rows, in batch order
    plan: Plan
    rows: torch.Tensor  # the plan's output row of each rid
    embedding_keys: dict[str, pa.Array]  # per database-stored embedding, its batch rows' keys in code order
    embedding_codes: dict[str, np.ndarray]  # their codes in the grounding store (read from one)
    grounding: BatchGrounding | None = None  # None where another process prepared the batch (relsql/train/feed/batch_process.py)


class Batched:
    """Prepares batches and runs them; owns the model's database-stored embeddings."""

    def __init__(self, grounder: BatchGrounder, template, output: str, dtype: torch.dtype, seed: int,
                 embedding_optimizer: str = "adagrad", embedding_lr: float = 0.1, store: GroundingStore | None = None,
                 device: str | torch.device = "cpu"):
        self.grounder, self.template, self.output, self.dtype, self.seed = grounder, template, output, dtype, seed
        self.device = torch.device(device).type  # batches are planned for the device they run on
        self.grounding_store = store
        self.source = store if store is not None else grounder  # where a batch's groundings come from
        self.embedding_optimizer, self.embedding_lr = embedding_optimizer, embedding_lr
        self.stores: dict[str, EmbeddingTable] = {}
        self.plans = BatchPlans(template, dtype, PASSES, [output], self.device)  # one plan per batch shape, replayed
        self.replay = True  # False: each batch planned afresh (a prediction of a few rows: recording costs 2-3x a plan)
        self.kept: OrderedDict[tuple, tuple[Batch, Trace | None, int]] = OrderedDict()  # (rids, sample) -> batch, oldest first
        self.kept_bytes = 0
        self.kept_lock = threading.Lock()  # prediction's worker thread may prepare while training's does

    def prepare(self, rids: np.ndarray, sample: int = 0) -> Batch:
        """Ground and plan a batch (store or database, and torch work; no weights involved)."""
        return self.traced(rids, sample)[0]

    def traced(self, rids: np.ndarray, sample: int = 0) -> tuple[Batch, Trace | None]:
        """The batch, and the recorded plan its plan fills (None: planned afresh).

        A batch of the same rows asked again (fit's validation batches every epoch, an unshuffled
        Loader's) is the one prepared before: read from a grounding store, whose files do not
        change, with no fan-out sampling (else `sample` reseeds it), the last KEPT_BYTES of them."""
        key = self._key(rids, sample)
        with self.kept_lock:
            if key in self.kept:
                self.kept.move_to_end(key)
                return self.kept[key][:2]
        batch, trace = self._traced(rids, sample)
        if key is not None:
            with self.kept_lock:
                self._keep(key, batch, trace)
        return batch, trace

    def _key(self, rids: np.ndarray, sample: int) -> tuple | None:
        if self.grounding_store is None or not self.replay:
            return None
        fanout = self.grounding_store.fanout
        return np.asarray(rids, dtype=np.int64).tobytes(), sample if fanout else 0

    def _keep(self, key: tuple, batch: Batch, trace: Trace | None) -> None:
        size = sum(t.element_size() * t.numel() for t in raw_tensors(batch.grounding)) * 2  # and the plan's own
        if size > KEPT_BYTES:
            return
        self.kept[key] = (batch, trace, size)
        self.kept_bytes += size
        while self.kept_bytes > KEPT_BYTES:
            self.kept_bytes -= self.kept.popitem(last=False)[1][2]

    def _traced(self, rids: np.ndarray, sample: int) -> tuple[Batch, Trace | None]:
        grounding = self.source.ground(rids, sample)
        if self.grounding_store is None:  # a category the tables gained after the build has no row to look up;
            guards.check_codes(grounding, self.template)  # the store range-checks every code it reads (GroundingStore._codes)
        plan, trace = self.plans.traced(grounding) if self.replay else (self.plans.fresh(grounding), None)
        return Batch(np.asarray(rids), plan, _positions(grounding.rows[self.output], rids), grounding.embedding_keys,
                     grounding.embedding_codes, grounding), trace

    def store(self, weight: str, key_type: pa.DataType) -> EmbeddingTable:
        """A database-stored embedding's table: updated per step where the database has
        transactions, else replaced whole when training ranks write it back."""
        if weight not in self.stores:
            width = self.template.weights[weight].shape[1]
            kind = DatabaseEmbedding if self.grounder.db.transactional else SwappedEmbedding
            self.stores[weight] = kind(self.grounder.db, weight, width, key_type, seed=self.seed,
                                       optimizer=self.embedding_optimizer, lr=self.embedding_lr)
        return self.stores[weight]

    def fetch(self, batch: Batch) -> dict[str, torch.Tensor]:
        """The batch's rows of every database-stored embedding, as leaves that collect gradients."""
        found = {}
        for weight, keys in batch.embedding_keys.items():
            values = self.store(weight, keys.type).fetch(keys)
            found[weight] = values.to(self.dtype).requires_grad_(True)
        return found

    def update(self, batch: Batch, external: dict[str, torch.Tensor]) -> None:
        """Apply each embedding's gradient (a relation: key, gradient) as an optimizer step in SQL."""
        for weight, values in external.items():
            if values.grad is not None:
                self.stores[weight].update(batch.embedding_keys[weight], values.grad)

    @staticmethod
    def outputs(net, head, batch: Batch, external: dict[str, torch.Tensor], output: str) -> torch.Tensor:
        """The model's outputs for the batch's rows, in batch order."""
        device = next(iter(net.weights.values())).device if len(net.weights) else torch.device("cpu")
        external = {k: v.to(device) if v.device != device else v for k, v in external.items()}
        value = net.run(batch.plan, external)[output]
        value = head(value.reshape(value.shape[0], -1))
        return members.rows(value, batch.rows.to(device))
