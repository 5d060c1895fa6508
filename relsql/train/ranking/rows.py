"""Key frames to rows: (target row keys, candidate key) pairs as (output row, candidate row) ids.

Hard negatives (hard.py) and the pair relation (pairs.py) both name pairs by key values; both need
the output relation's and the candidate relation's row ids, with the keys cast to those relations'
types first. Hard negatives keep what matches nothing (to refuse it with examples); a pair
relation's rows that match nothing can never be scored and are dropped.
"""

from __future__ import annotations

import polars as pl

from relsql.errors import SchemaError


def key_rows(frame: pl.DataFrame, out_keys: pl.DataFrame, cand_keys: pl.DataFrame, name: str, *,
             keep_unmatched: bool, mismatch: str) -> pl.DataFrame:
    """`frame` (the output's key columns, candidate key column `name`, others) with `_out` and `_cand`,
    the output row and candidate row of each of its rows. `out_keys`/`cand_keys`: the relations' key
    columns and `_rid` (`cand_keys`' key column named `name`). Key columns that cannot be cast to the
    relations' types are a SchemaError starting with `mismatch`. `keep_unmatched`: rows matching
    nothing stay, with a null id (a left join); else they are dropped."""
    keys = [c for c in out_keys.columns if c != "_rid"]
    try:
        frame = frame.with_columns([pl.col(k).cast(out_keys.schema[k], strict=True) for k in keys]
                                   + [pl.col(name).cast(cand_keys.schema[name], strict=True)])
    except pl.exceptions.PolarsError as err:
        raise SchemaError(f"{mismatch} ({' '.join(str(err).split())[:200]})") from None
    how = "left" if keep_unmatched else "inner"
    return (frame.join(out_keys.rename({"_rid": "_out"}), on=keys, how=how, nulls_equal=True)
            .join(cand_keys.rename({"_rid": "_cand"}), on=name, how=how))
