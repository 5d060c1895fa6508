"""A ranking model's answers: the k best candidates per target row, as a frame or a table."""

from __future__ import annotations

import numpy as np
import polars as pl

from relsql.data.duckdb import free_name
from relsql.errors import RelsqlError
from relsql.train.learner.results import chosen_rows
from relsql.train.task.ranking import checked_k


def recommend(learner, k: int, keys: object = None, where: object = None) -> pl.DataFrame:
    """Per chosen target row (default: those whose target is NULL, the rows to predict; an empty
    list is a label with nothing in it), its k best candidates: the target table's key columns, the
    candidate's key under the target column's name, `rank` (1..k) and `score` (the towers' dot
    product), best first."""
    k = checked_k(k)
    rows = chosen_rows(learner, keys, where)
    if keys is None and where is None:
        rows = rows.filter(pl.col("_rid").is_in(learner.goal.to_predict.tolist()))
    rids = rows["_rid"].to_numpy().astype(np.int64)
    scores, index = learner.rank(rids, k)
    scores, index = scores.cpu().double().numpy(), index.cpu().numpy()
    width = index.shape[1] if index.ndim == 2 else 0
    candidates = learner.goal.candidate_keys.sort_by("_rid")
    key_values = candidates.column(learner.goal.reference.key).combine_chunks()
    frame = rows.drop("_rid")
    name = learner.goal.column
    if name.casefold() in {c.casefold() for c in frame.columns}:
        raise RelsqlError(f"the target column `{name}` is also a key column of `{learner.table}`: recommend() names the "
                          "recommended keys after the target column, so rename one of them")
    repeated = frame[np.repeat(np.arange(frame.height), width).tolist()] if width else frame.head(0)
    taken = {c.casefold() for c in frame.columns} | {name.casefold()}
    picked = (pl.from_arrow(key_values.take(index.reshape(-1))) if width
              else pl.Series(name, [], dtype=pl.from_arrow(key_values).dtype))
    return repeated.with_columns(
        pl.Series(name, picked),
        pl.Series(free_name("rank", taken), np.tile(np.arange(1, width + 1), len(rids)), dtype=pl.Int64),
        pl.Series(free_name("score", taken), scores.reshape(-1), dtype=pl.Float64))
