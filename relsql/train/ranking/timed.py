"""A timed relation: one number per (time, candidate) added to the score of every target row of that time.

In a temporal ranking task what sells changes: TPC-DS's items are replaced over the years, so a
candidate's count before the earliest snapshot (all a shared candidate tower may read) says little
about the later ones. A relation keyed by the target's time column and the referenced key, 1 wide
(e.g. `linear(log(1 + count(*)), 1)` over the events before each snapshot), adds its value to the
score of each target row with that time and that candidate (0 where it has no row): popularity as
of each snapshot, learnt, at the cost of one row per snapshot and candidate rather than per target
row and candidate as a pair relation would need.

It travels as columns of the towers: the query side gets the one-hot of its row's time, the candidate
side the relation's values per time, so the dot product adds the right value and the losses and the
exact top-k need no case of their own.
"""

from __future__ import annotations

import re

import numpy as np
import polars as pl
import pyarrow as pa
import torch
from torch import Tensor

from relsql.data.references import Reference
from relsql.errors import SchemaError
from relsql.targets import MAX_TIMES
from relsql.template.ir import Template

_BLEND = re.compile(r"^[ \t]*(?:--|%|//)[ \t]*relsql:[ \t]*blend\b", re.MULTILINE | re.IGNORECASE)


def timed_relation(template: Template, output: str, candidates: str, pairs: str | None, reference: Reference,
                   time_column: str | None) -> str | None:
    """The last relation keyed by exactly the target's time column and the referenced key (any order),
    other than the output, candidate and pair relations; None without a time column or such a relation."""
    if not time_column:
        return None
    wanted = sorted([time_column.casefold(), reference.key.casefold()])
    if len(set(wanted)) < 2 or time_column.casefold() in {k.casefold() for k in template.relations[output].keys}:
        return None
    found = [name for name, relation in template.relations.items() if name not in (output, candidates, pairs)
             and sorted(k.casefold() for k in relation.keys) == wanted]
    return found[-1] if found else None


def blends(template: Template) -> bool:
    """Whether the template asks (a `-- relsql: blend` line, which Template.auto writes) for validation to
    pick how much of the towers' dot product joins the timed relation's value (learner.TowerBlend)."""
    return bool(_BLEND.search(template.source or ""))


class TimedIndex:
    """Each output row's time (its position among the relation's distinct times, -1 if absent) and, for
    the relation's rows `rows` that have a candidate row, their (time position, candidate row)."""

    def __init__(self, row_time: np.ndarray, rows: np.ndarray, time_of: np.ndarray, candidate_of: np.ndarray,
                 times: int, m: int):
        self.row_time = torch.as_tensor(row_time, dtype=torch.long)
        self.rows = torch.as_tensor(rows, dtype=torch.long)
        self.time_of = torch.as_tensor(time_of, dtype=torch.long)
        self.candidate_of = torch.as_tensor(candidate_of, dtype=torch.long)
        self.times, self.m = times, m

    @classmethod
    def of(cls, grounding, name: str, labels: pa.Table, candidate_keys: pa.Table, reference: Reference,
           time_column: str, output_rows: int) -> TimedIndex:
        """From the grounded relation `name`, the output rows' times (`labels`: _rid, t) and the candidate
        relation's keys (key, _rid). Rows whose candidate has no candidate row are left out."""
        frame = pl.from_arrow(grounding.relations[name].keys)
        names = {c.casefold(): c for c in frame.columns}
        key = next(c for c in candidate_keys.column_names if c != "_rid")
        frame = frame.select(pl.col(names[time_column.casefold()]).alias("_time"),
                             pl.col(names[reference.key.casefold()]).alias(key), pl.col("_rid").alias("_timed"))
        times = frame["_time"].unique().sort()
        if times.len() > MAX_TIMES:
            raise SchemaError(f"the timed relation `{name}` has {times.len()} distinct {time_column} values; a timed relation "
                              f"adds one tower column per value, at most {MAX_TIMES}: key it by coarser times, or drop it")
        cands = pl.from_arrow(candidate_keys)
        try:
            frame = frame.with_columns(pl.col(key).cast(cands.schema[key], strict=True))
            stamps = pl.from_arrow(labels.select(["_rid", "t"])).with_columns(pl.col("t").cast(times.dtype, strict=True))
        except pl.exceptions.PolarsError as err:
            raise SchemaError(f"the timed relation `{name}`'s keys do not have the types of {time_column} and "
                              f"{reference.table}.{reference.key} ({' '.join(str(err).split())[:200]}); select those "
                              "columns as they are") from None
        positions = pl.DataFrame({"_time": times, "_at": np.arange(times.len(), dtype=np.int64)})
        joined = frame.join(cands.rename({"_rid": "_cand"}), on=key, how="inner").join(positions, on="_time", how="inner")
        row_time = np.full(output_rows, -1, dtype=np.int64)
        dated = stamps.join(positions, left_on="t", right_on="_time", how="inner")
        row_time[dated["_rid"].to_numpy().astype(np.int64)] = dated["_at"].to_numpy()
        return cls(row_time, joined["_timed"].to_numpy().astype(np.int64), joined["_at"].to_numpy(),
                   joined["_cand"].to_numpy(), times.len(), candidate_keys.num_rows)

    def columns(self, values: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """([output rows, times] one-hot of each row's time, [candidates, times] the values per time):
        their row-wise dot product is the value of (row's time, candidate), 0 where none."""
        device = values.device
        picked = values.reshape(-1).index_select(0, self.rows.to(device)).to(dtype)
        grid = torch.zeros((self.m, self.times), dtype=dtype, device=device)
        grid = grid.index_put((self.candidate_of.to(device), self.time_of.to(device)), picked)
        row_time = self.row_time.to(device)
        hot = torch.zeros((len(row_time), self.times), dtype=dtype, device=device)
        dated = torch.nonzero(row_time >= 0).reshape(-1)
        hot[dated, row_time[dated]] = 1.0
        return hot, grid
