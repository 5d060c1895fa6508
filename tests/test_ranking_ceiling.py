"""bench/recommend_ceiling.py (issue #30): the repeat share and the oracles on a hand-made dataset
whose answers are worked out by hand, and on a generated shop against naive loops."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from bench import recommend_ceiling as ceiling
from bench import recommend_data
from bench.recommend_data import Dataset


def tiny() -> Dataset:
    """Candidates 10..50; customers 1 and 2; snapshot days 100 (two test rows) and 130 (one)."""
    events = [(1, 10, 50), (1, 20, 60), (2, 30, 70),  # history before day 100
              (1, 40, 100), (2, 40, 101), (2, 50, 105), (1, 30, 110),  # window [100, 130)
              (2, 20, 131), (2, 40, 140)]  # window [130, 160)
    query, item, day = (np.array(column, dtype=np.int64) for column in zip(*events))
    truths = [[30, 40], [40, 50], [20, 40]]  # customer 1 @100, customer 2 @100, customer 2 @130
    offsets = np.concatenate([[0], np.cumsum([len(t) for t in truths])]).astype(np.int64)
    rows = np.arange(3)
    return Dataset("tiny", Path("none"), "task_rec.item_id", "snapshot", "customer", "customer_id", "item", "purchase",
                   np.array([10, 20, 30, 40, 50], dtype=np.int64), query, item, day, rows,
                   np.array([1, 2, 2], dtype=np.int64), np.array([100, 100, 130], dtype=np.int64), offsets,
                   np.array([i for t in truths for i in t], dtype=np.int64),
                   {"train": np.zeros(0, np.int64), "val": np.zeros(0, np.int64), "test": rows})


def test_repeat_share_and_oracles_by_hand():
    ds, rows = tiny(), np.arange(3)
    # positives: 30 (customer 1 bought 10, 20 before: no), 40 (no); 40, 50 (customer 2 had 30: no);
    # 20, 40 at day 130 (customer 2 had 30, 40, 50 before 130: 40 yes) -> 1 of 6
    assert ceiling.repeat_share(ds, rows) == 1 / 6
    # customer 1 in place of row 2: before day 130 it had 10, 20, 40, 30 -> 20 and 40 hit: 2 of 6
    assert ceiling.repeat_share(ds, rows, np.array([1, 2, 1])) == 2 / 6
    # day 100's lists hold 40 twice, 30 and 50 once (ties to the lower key); day 130's: 20, 40
    assert ceiling.oracle_rows(ds, rows, 3).tolist() == [[40, 30, 50], [40, 30, 50], [20, 40, 10]]
    # events in [100, 130): 40 twice, 50 once, 30 once; in [130, 160): 20, 40
    assert ceiling.oracle_window(ds, rows, 2).tolist() == [[40, 30], [40, 30], [20, 40]]
    # the customer's earlier items moved last: customer 2 at 130 had 30, 40, 50
    assert ceiling.oracle_not_past(ds, rows, 5).tolist() == [[40, 30, 50, 10, 20], [40, 50, 10, 20, 30],
                                                              [20, 10, 30, 40, 50]]
    # ... or put first (most bought first, ties to the lower key), then the oracle's order
    assert ceiling.oracle_past(ds, rows, 3).tolist() == [[10, 20, 40], [30, 40, 50], [30, 40, 50]]


def test_ceiling_on_a_small_shop_matches_naive_loops(tmp_path):
    ds = recommend_data.write_shop(tmp_path / "shop.duckdb", customers=150, items=60, purchases=2500)
    rows = np.sort(ds.split["test"])
    hits = total = 0
    for row in rows:  # the same customer's earlier items, by a plain loop over the events
        earlier = {int(i) for q, i, d in zip(ds.event_query, ds.event_item, ds.event_day)
                   if q == ds.task_query[row] and d < ds.task_day[row]}
        truth = ds.truth_ids[ds.truth_offsets[row]:ds.truth_offsets[row + 1]].tolist()
        hits += sum(i in earlier for i in truth)
        total += len(truth)
    assert ceiling.repeat_share(ds, rows) == hits / total
    found = ceiling.ceiling(ds, 10)
    # the shop's customers re-buy what they like: their own history beats a shuffled customer's
    assert found["repeat_share"] > found["repeat_share_shuffled"]
    # the oracle that knows each snapshot's lists is at least as good as popularity before it
    assert found["oracle_rows"] >= found["popularity"]
