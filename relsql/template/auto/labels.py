"""The scale an earlier sibling's numeric label is read on: the log scale, or, where that squeezes the
labels together, centred and scaled as the network's output is.

A temporal template lets the target row's earlier siblings bring their labels (layers.lateral), read
through sign(y) * ln(1 + |y|). A label far from 0 with a small spread arrives squeezed (log salaries of
12.6-17.3 became 2.61-2.91), and a weight must grow ~15-fold before the network can tell one salary from
another: on Lahman's salaries the network alone still improved at epoch 300 and ended 25 % behind the
blend's GBM on validation. Read as (y - mean) / spread instead, the units the task scales the network's
output to, it stopped sooner (151-256 epochs against 250-357) at a test RMSE of 0.53-0.56 against
0.63-0.66, and the default blend gave it more weight (0.3-0.4 against 0.1-0.2) for 0.50 against 0.52.

Only where the log squeezes: where sign(y) * ln(1 + |y|) leaves the labels a spread of at least
SQUEEZED (hostile's scores 1.3-1.7, PluRel's standardized columns 0.6), the log scale stays. Standardizing
such labels was no better on 75 outside runs (the network alone 32 better / 38 worse, the default blend
17 / 29): it took away the log's damping of labels that carry little. On 24 runs of squeezed synthetic
labels it was about even (the network alone 11 / 6, +1.1 %; the blend 11 / 8, -0.6 %, one PluRel target
losing 9 %), on the real ones better (docs/quality.md).

The mean and spread come from the labels of the earliest half of the labelled rows by the time
column: rows a time split always trains on, so no validation or test label sets them, and they are
written into the template's text, so a saved template reads every later row on the same scale. They
are computed here from the fetched values, exactly rounded (math.fsum), so every engine that returns
the same rows writes the same template.
"""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

SQUEEZED = 0.25  # a log-scale spread below this: the labels are standardized instead


def label_scale(times: pa.ChunkedArray | pa.Array, labels: pa.ChunkedArray | pa.Array) -> tuple[float, float] | None:
    """(mean, spread) of the finite labels on the earliest half of the labelled rows by their times
    (each row whose time is at most the middle row's; rows without a label or a time left out), where
    the log scale squeezes them (`squeezed`); None where it does not or there are none (they are read as
    sign(y) * ln(1 + |y|)). A spread of 1 where they are all equal or their spread is not a finite
    number (`_scale`)."""
    return _scale(values) if squeezed(values := _earliest_half(times, labels)) else None


def _earliest_half(times: pa.ChunkedArray | pa.Array, labels: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """The finite labels of the rows whose time is at most the middle row's by time."""
    known = pc.and_(pc.is_valid(times), pc.is_valid(labels))
    times, labels = pc.filter(times, known), pc.filter(labels, known)
    if len(times) == 0:
        return np.zeros(0)
    order = pc.sort_indices(times).to_numpy()
    middle = pc.take(times, pa.array([order[(len(order) - 1) // 2]]))[0]
    earliest = pc.less_equal(times, middle).to_numpy(zero_copy_only=False)
    values = np.asarray(pc.cast(labels, pa.float64()).to_numpy(zero_copy_only=False), dtype=np.float64)[earliest]
    return values[np.isfinite(values)]


def squeezed(values: np.ndarray) -> bool:
    """Whether the log scale leaves `values` a spread below SQUEEZED (labels far from 0, close together)."""
    return values.size > 0 and _moments(np.sign(values) * np.log1p(np.abs(values)))[1] < SQUEEZED


def _scale(values: np.ndarray) -> tuple[float, float]:
    """(mean, population spread) of `values`; (0, 1) for none, spread 1 where it is 0 or no number."""
    if values.size == 0:
        return 0.0, 1.0
    try:
        mean, spread = _moments(values)
    except OverflowError:  # labels near the largest doubles: their sum is no number
        return 0.0, 1.0
    if not (math.isfinite(mean) and math.isfinite(spread)) or spread == 0.0:
        return (mean if math.isfinite(mean) else 0.0), 1.0
    return mean, spread


def _moments(values: np.ndarray) -> tuple[float, float]:
    """(mean, population spread), exactly rounded (math.fsum: the same whatever the rows' order)."""
    mean = math.fsum(values) / values.size
    return mean, math.sqrt(math.fsum((values - mean) ** 2) / values.size)
