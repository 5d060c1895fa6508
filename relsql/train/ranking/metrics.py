"""MAP@k, recall@k, NDCG@k, MRR and precision@k of ranked predictions against sets of true ids.

The definitions are RelBench's link-prediction ones (its MAP@k divides by min(k, |truth|)),
computed for all rows at once with numpy: a (row, id) pair is a hit when the id is in the row's
truth. A true id listed twice counts once; a predicted id repeated in a row counts at its first
rank only; -1 marks an empty slot (fewer than k candidates). Rows with no truth are skipped.
"""

from __future__ import annotations

import numpy as np

from relsql.errors import RelsqlError
from relsql.train.task.ranking import MAX_K

NO_ITEM = -1


def ranking_scores(predicted: np.ndarray, truth_offsets: np.ndarray, truth_ids: np.ndarray, k: int) -> dict[str, float]:
    """Mean over rows with a non-empty truth of f"map@{k}", f"recall@{k}", f"ndcg@{k}", "mrr" and
    f"precision@{k}"; "rows" is how many rows were counted (nan metrics when none).

    predicted: [n, w] candidate ids per row, best first (only the first k columns count; a row
    shorter than k is padded with -1); truth of row i: truth_ids[truth_offsets[i]:truth_offsets[i+1]].
    """
    return Judge(truth_offsets, truth_ids, k)(predicted)


class Judge:
    """ranking_scores against one truth, prepared once: validation judges several rankings of the same
    rows each epoch (one per blend share), and the truth's sorting is most of a judgement's cost."""

    def __init__(self, truth_offsets: np.ndarray, truth_ids: np.ndarray, k: int):
        _check_k(k)
        truth_offsets, truth_ids = _checked_truth(truth_offsets, truth_ids)
        self.k, self.n = int(k), len(truth_offsets) - 1
        truth_rows, truth_ids = _distinct_truth(truth_offsets, truth_ids, self.n)
        self.codes = np.unique(truth_ids)  # the true ids, sorted: only these can hit
        self.truth_keys = np.sort(truth_rows * len(self.codes) + np.searchsorted(self.codes, truth_ids))
        self.truth_count = np.bincount(truth_rows, minlength=self.n)
        self.counted = self.truth_count > 0

    def __call__(self, predicted: np.ndarray) -> dict[str, float]:
        """The metrics of `predicted` ([n, w] ids, best first), as ranking_scores gives them."""
        k = self.k
        predicted = _checked_predicted(predicted, self.n, k)
        names = [f"map@{k}", f"recall@{k}", f"ndcg@{k}", "mrr", f"precision@{k}"]
        if not self.counted.any():
            return {**dict.fromkeys(names, float("nan")), "rows": 0}
        hits = self.hits(predicted)[self.counted]
        truth_count = self.truth_count[self.counted]
        values = [_average_precision(hits, truth_count), hits.sum(1) / truth_count, _ndcg(hits, truth_count),
                  _reciprocal_rank(hits), hits.sum(1) / k]
        return {**{name: float(np.mean(value)) for name, value in zip(names, values, strict=True)},
                "rows": int(self.counted.sum())}

    def hits(self, predicted: np.ndarray) -> np.ndarray:
        """[n, k] bool: slot (i, j) holds an id in row i's truth, seen for the first time in the row."""
        n, k = predicted.shape
        if not len(self.codes):
            return np.zeros((n, k), dtype=bool)
        code = np.minimum(np.searchsorted(self.codes, predicted), len(self.codes) - 1)
        known = (self.codes[code] == predicted) & (predicted != NO_ITEM)
        keys = np.arange(n, dtype=np.int64)[:, None] * len(self.codes) + code
        found = np.minimum(np.searchsorted(self.truth_keys, keys), len(self.truth_keys) - 1)
        return known & (self.truth_keys[found] == keys) & _first_in_row(predicted)


def _check_k(k: int) -> None:
    if isinstance(k, bool) or not isinstance(k, int | np.integer) or k <= 0:
        raise RelsqlError(f"ranking_scores: k must be a positive whole number, got {k!r}; use k >= 1 (for example k=10)")
    if k > MAX_K:  # predictions are padded to [rows, k]
        raise RelsqlError(f"ranking_scores: k={int(k):,} is more than {MAX_K:,} ranks per row; use k <= {MAX_K:,} "
                          "(for example k=10)")


def _checked_truth(truth_offsets: np.ndarray, truth_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The truth's arrays as int64, checked for the agreed CSR form."""
    truth_offsets, truth_ids = np.asarray(truth_offsets), np.asarray(truth_ids)
    if truth_offsets.ndim != 1 or len(truth_offsets) < 1 or not np.issubdtype(truth_offsets.dtype, np.integer):
        raise RelsqlError(f"ranking_scores: truth_offsets must be a 1-D integer array (one more than the predicted rows), "
                          f"got {truth_offsets.dtype} {truth_offsets.shape}")
    if truth_offsets[0] != 0 or truth_offsets[-1] != len(truth_ids) or (np.diff(truth_offsets) < 0).any():
        raise RelsqlError("ranking_scores: truth_offsets must start at 0, never decrease, and end at len(truth_ids)")
    if truth_ids.ndim != 1 or not np.issubdtype(truth_ids.dtype, np.integer):
        raise RelsqlError(f"ranking_scores: truth_ids must be a 1-D integer array, got {truth_ids.dtype} {truth_ids.shape}")
    return truth_offsets.astype(np.int64), truth_ids.astype(np.int64)


def _checked_predicted(predicted: np.ndarray, n: int, k: int) -> np.ndarray:
    """`predicted` as [n, k] int64, cut or padded (with NO_ITEM) to exactly k columns."""
    predicted = np.asarray(predicted)
    if predicted.ndim != 2 or not np.issubdtype(predicted.dtype, np.integer):
        raise RelsqlError(f"ranking_scores: predicted must be a 2-D integer array [rows, k] of candidate ids, "
                          f"got {predicted.dtype} {predicted.shape}")
    if predicted.shape[0] != n:
        raise RelsqlError(f"ranking_scores: truth_offsets must be {predicted.shape[0] + 1} integers "
                          f"(one more than the predicted rows), got {n + 1}")
    if predicted.shape[1] < k:
        predicted = np.pad(predicted, ((0, 0), (0, k - predicted.shape[1])), constant_values=NO_ITEM)
    return predicted[:, :k].astype(np.int64)


def _distinct_truth(truth_offsets: np.ndarray, truth_ids: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(row, id) of each distinct true pair: a duplicated true id counts once."""
    rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(truth_offsets))
    order = np.lexsort((truth_ids, rows))
    rows, ids = rows[order], truth_ids[order]
    first = np.ones(len(rows), dtype=bool)
    first[1:] = (rows[1:] != rows[:-1]) | (ids[1:] != ids[:-1])
    return rows[first], ids[first]


def _first_in_row(predicted: np.ndarray) -> np.ndarray:
    """[n, k] bool: the slot is the first (best) of its id in its row."""
    order = np.argsort(predicted, axis=1, kind="stable")  # equal ids keep their rank order
    ranked = np.take_along_axis(predicted, order, 1)
    first_sorted = np.ones(predicted.shape, dtype=bool)
    first_sorted[:, 1:] = ranked[:, 1:] != ranked[:, :-1]
    first = np.empty_like(first_sorted)
    np.put_along_axis(first, order, first_sorted, 1)
    return first


def _average_precision(hits: np.ndarray, truth_count: np.ndarray) -> np.ndarray:
    """Sum of precision@i over the ranks i that hit, over min(k, |truth|)."""
    k = hits.shape[1]
    precision = np.cumsum(hits, axis=1) / np.arange(1, k + 1)
    return (precision * hits).sum(1) / np.minimum(truth_count, k)


def _ndcg(hits: np.ndarray, truth_count: np.ndarray) -> np.ndarray:
    """Binary-relevance DCG over the ideal DCG of min(k, |truth|) hits at the top."""
    k = hits.shape[1]
    discount = 1.0 / np.log2(np.arange(2, k + 2))
    ideal = np.cumsum(discount)[np.minimum(truth_count, k) - 1]
    return (hits * discount).sum(1) / ideal


def _reciprocal_rank(hits: np.ndarray) -> np.ndarray:
    """1 / rank of the first hit within k; 0 when there is none."""
    first = np.argmax(hits, axis=1)
    return np.where(hits.any(1), 1.0 / (first + 1), 0.0)
