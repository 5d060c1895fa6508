"""Arrow columns read from the database become torch tensors here: the index tensors of a
grounding (relsql/ground/execute.py, demand.py). Kept out of relsql.data.duckdb, which reads and writes
tables and has no use for torch."""

from __future__ import annotations

import warnings

import numpy as np
import pyarrow as pa
import torch


def to_tensor(column: pa.ChunkedArray | pa.Array, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Arrow column → torch tensor, zero-copy for single-chunk numeric columns without NULLs."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    array = column.to_numpy(zero_copy_only=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # read-only numpy buffers: never written to
        tensor = torch.from_numpy(np.asarray(array))
    return tensor if dtype is None else tensor.to(dtype)
