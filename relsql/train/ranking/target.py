"""A ranking target's labels: for each labelled target row, the candidate rows it references.

The target column holds one key of the referenced table (a foreign key) or a list of them. Each
key becomes the row id of that row in the candidate relation (the template's tower keyed by the
referenced table's key): the positives, kept as a CSR array per labelled row. A row whose target
is NULL is prediction-only; an empty list has nothing to learn or judge from and is left out, as
RelBench leaves out entities without interactions. A NULL inside a list, or a key with no
candidate row, is a SchemaError naming the rows and the fix.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from relsql.data.engine import Database
from relsql.data.references import Reference
from relsql.errors import SchemaError
from relsql.template.ir import Template
from relsql.train.ranking.pairs import pair_relation
from relsql.train.ranking.timed import timed_relation
from relsql.train.task.ranking import RankingTask
from relsql.train.task.split import split_rows
from relsql.train.task.target import Target


class RankingTarget(Target):
    """`table.column` referencing `reference.table`, ranked by relation `candidates`.

    `offsets`/`items`: per labelled row (in `labelled` order) its positives' candidate row ids."""

    def __init__(self, table: str, column: str, output: str, keys: list[str], time_column: str | None,
                 fractions: tuple[float, float, float], seed: int, reference: Reference, candidates: str,
                 pair_relation: str | None = None):
        super().__init__(table, column, output, keys, time_column, fractions, seed)
        self.reference, self.candidates = reference, candidates
        self.pair_relation = pair_relation  # the relation whose value adds to a pair's score (pairs.py), or None
        self.timed_relation: str | None = None  # the relation keyed by (time, candidate) (timed.py), or None
        self.candidate_keys: pa.Table | None = None  # the candidate relation's key column and _rid
        self.offsets = np.zeros(1, dtype=np.int64)
        self.items = np.zeros(0, dtype=np.int64)
        self.to_predict = np.zeros(0, dtype=np.int64)  # output rows whose target is NULL (recommend()'s default)

    def label(self, db: Database, labels: pa.Table, task: RankingTask | None, split: dict | None,
              dtype: torch.dtype, device: torch.device) -> None:
        """Positives, labelled rows and split from `labels` (Target.read: _rid, y[, t])."""
        self.task = task if isinstance(task, RankingTask) else RankingTask(candidates=self.candidates)
        self.task.pairs = self.pair_relation or ""
        self.positions = labels.column("_rid").to_numpy()
        column = labels.column("y").combine_chunks()
        self.to_predict = self.positions[pc.is_null(column).to_numpy(zero_copy_only=False)]  # NULL: no label yet
        rows, items = self.positives(column)
        counts = np.bincount(rows, minlength=labels.num_rows)
        labelled = counts > 0
        self.labelled = self.positions[labelled]
        order = np.argsort(rows, kind="stable")
        self.items = items[order]
        self.offsets = np.concatenate([[0], np.cumsum(counts[labelled])]).astype(np.int64)
        if split is None:
            times = labels.column("t").filter(pa.array(labelled)) if self.time_column else None
            split = split_rows(int(labelled.sum()), self.fractions, self.seed, times)
            self.check_splits(db, split, int(labelled.sum()))
        self.rows = {k: np.asarray(v, dtype=np.int64) for k, v in split.items()}
        self.y = torch.zeros(len(self.labelled), dtype=dtype, device=device)

    def positives(self, column: pa.Array) -> tuple[np.ndarray, np.ndarray]:
        """(label row, candidate row id) per distinct positive, label rows in `labels` order."""
        if pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
            values = pc.list_flatten(column)
            parents = pc.list_parent_indices(column).to_numpy(zero_copy_only=False).astype(np.int64)
            if values.null_count:
                raise SchemaError(f"target {self.name} has NULLs inside its lists (in {values.null_count} places); a list "
                                  "holds the keys a row references: drop the NULLs (list_filter(x, v -> v IS NOT NULL)) or "
                                  "make the whole list NULL for a row to predict")
        else:
            valid = pc.is_valid(column).to_numpy(zero_copy_only=False)
            values, parents = column.filter(pa.array(valid)), np.flatnonzero(valid).astype(np.int64)
        keys = self.candidate_keys.column(self.reference.key).combine_chunks()
        try:
            found = pc.index_in(values.cast(keys.type), value_set=keys)
        except (pa.ArrowException, TypeError, ValueError):
            raise SchemaError(f"target {self.name} has type {column.type}, which cannot hold keys of "
                              f"{self.reference.table}.{self.reference.key} ({keys.type})") from None
        if found.null_count:
            missing = values.filter(pc.is_null(found)).unique().to_pylist()
            raise SchemaError(f"target {self.name} references {len(missing)} key(s) with no row in the candidate relation "
                              f"`{self.candidates}` (keyed by {self.reference.table}.{self.reference.key}), e.g. "
                              f"{sorted(missing, key=str)[:5]}: delete those keys from the target, or make `{self.candidates}` "
                              f"cover every row of `{self.reference.table}`")
        rids = self.candidate_keys.column("_rid").to_numpy()[found.to_numpy(zero_copy_only=False).astype(np.int64)]
        pairs = np.unique(np.stack([parents, rids.astype(np.int64)], axis=1), axis=0)  # a key listed twice counts once
        return pairs[:, 0], pairs[:, 1]

    def truth(self, split: str) -> tuple[np.ndarray, np.ndarray]:
        """(offsets, candidate row ids) of a split's rows' positives, in the split's row order."""
        return self.truth_of(self.rows[split])

    def truth_of(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(offsets, candidate row ids) of labelled rows `positions`, in that order."""
        starts, ends = self.offsets[positions], self.offsets[positions + 1]
        counts = ends - starts
        offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        index = np.repeat(starts - offsets[:-1], counts) + np.arange(offsets[-1])
        return offsets, self.items[index]

    def pairs(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(output row id, candidate row id) of every positive of labelled rows `positions`."""
        offsets, items = self.truth_of(positions)
        return np.repeat(self.labelled[positions], np.diff(offsets)), items


def candidate_relation(template: Template, reference: Reference, output: str) -> str:
    """The template's last relation keyed by exactly the referenced table's key: the candidate tower."""
    folded = reference.key.casefold()
    found = [name for name, relation in template.relations.items()
             if name != output and [k.casefold() for k in relation.keys] == [folded]]
    if not found:
        raise SchemaError(f"ranking `{reference.table}` rows needs a candidate tower: a relation keyed by "
                          f"{reference.table}.{reference.key}, as wide as the output relation `{output}`, e.g. "
                          f"`CREATE TABLE {reference.table}_h AS SELECT c.{reference.key}, tanh(embed(c.{reference.key}, 32)) "
                          f"AS h FROM {reference.table} c`; or name one with candidates=")
    return found[-1]


def ranking_target(template: Template, table: str, column: str, output: str, reference: Reference, candidates: str | None,
                   time_column: str | None, fractions: tuple[float, float, float], seed: int, loading=None,
                   pairs: str | None = None) -> RankingTarget:
    """The target of Model(...) on a column that references `reference.table`; the candidate relation
    is `candidates`, the saved model's, or the template's last one keyed by the referenced key; the
    pair relation `pairs`, the saved model's, or the last one keyed by both (pairs.py), if any; the
    timed relation the last one keyed by the time column and the referenced key (timed.py), if any."""
    if candidates is None and loading is not None:
        candidates = loading.task.candidates
    if candidates is None:
        candidates = candidate_relation(template, reference, output)
    elif candidates not in template.relations or candidates == output:
        raise SchemaError(f"candidates=`{candidates}` is not a relation of the template other than the output `{output}`; "
                          f"it declares {list(template.relations)}")
    if pairs is None and loading is not None and getattr(loading.task, "pairs", ""):
        pairs = loading.task.pairs
    pair = pair_relation(template, output, candidates, reference, pairs)
    made = RankingTarget(table, column, output, template.relations[output].keys, time_column, fractions, seed,
                         reference, candidates, pair)
    made.timed_relation = timed_relation(template, output, candidates, pair, reference, time_column)
    return made
