"""Train/validation/test splits of the labelled target rows: seeded random or by time."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from relsql.errors import RelsqlError


def split_rows(count: int, fractions: tuple[float, float, float], seed: int,
               times: pa.Array | pa.ChunkedArray | list | None = None) -> dict[str, np.ndarray]:
    """Positions 0..count-1 into train/val/test; with `times`, earliest rows train, latest test."""
    if len(fractions) != 3 or any(f < 0 for f in fractions) or abs(sum(fractions) - 1) > 1e-9:
        raise RelsqlError(f"split fractions must be three non-negative numbers summing to 1, got {fractions}")
    if times is not None:
        times = times if isinstance(times, pa.Array | pa.ChunkedArray) else pa.array(times)
        if times.null_count:
            raise RelsqlError("the time column has NULLs on labelled rows; fill them or filter those rows out")
        order = pc.sort_indices(times).to_numpy().astype(np.int64)  # a stable sort: ties keep row order
    else:
        order = np.random.default_rng(seed).permutation(count)
    n_train = int(round(fractions[0] * count))
    n_val = int(round(fractions[1] * count))
    wanted = [f > 0 for f in fractions]
    if count >= sum(wanted):  # rounding must not leave a split that was asked for empty (3 rows: 1/1/1)
        n_test = count - n_train - n_val
        sizes = [n_train, n_val, n_test]
        for i in range(3):
            if wanted[i] and sizes[i] == 0:
                donor = max(range(3), key=lambda j: sizes[j])
                sizes[donor] -= 1
                sizes[i] = 1
        n_train, n_val = sizes[0], sizes[1]
    return {"train": order[:n_train], "val": order[n_train:n_train + n_val], "test": order[n_train + n_val:]}
