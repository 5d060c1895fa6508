"""How far MAP@10 can go on a ranking dataset of bench/recommend.py: is 2x popularity reachable? (issue #30)

    python -m bench.recommend_ceiling [--datasets tpcds shop] [--k 10] [--quick] [--out out/bench/recommend_ceiling]

On the bench's own split and test rows (bench/recommend_data.py), scored by relsql's ranking metrics:
- repeat: the share of test positives (row, item) whose customer bought the item before the row's
  snapshot, beside the same share with the customers shuffled among the test rows of each snapshot
  (5 seeded shuffles, averaged): equal shares mean that what a customer bought says nothing about what they buy next;
- popularity and past_items: bench/recommend.py's baselines (events before the snapshot; the
  customer's own items first, then popularity);
- oracle_window: every row of a snapshot gets the items with the most events IN ITS OWN LABEL
  WINDOW [snapshot, snapshot + 30 days) — future popularity, which no model may see;
- oracle_rows: the items in the most test rows' lists of that snapshot (the best ranking shared by
  all rows of a snapshot for precision@k; the row's own list counts too, so it is generous);
- oracle_past: the customer's earlier items first, then oracle_rows' order;
- popularity_not_past, oracle_not_past: popularity's and oracle_rows' orders with the customer's
  earlier items moved last (where buying an item makes buying it again LESS likely, as on TPC-DS).
When items are drawn independently of the customer, no ranking that ignores the customer beats
oracle_rows by much, and the customer adds nothing: oracle_rows bounds what a model can reach.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import numpy as np

from bench import recommend, recommend_data
from bench.recommend_data import WINDOW, Dataset

SHUFFLES = 5  # seeded shuffles of the customers, averaged
QUICK = {"tpcds": {"sf": 0.01, "first": 1460}, "shop": {"customers": 400, "items": 200, "purchases": 6000}}


def _bought_before(ds: Dataset, row: int) -> set[int]:
    """The items the row's customer has events with before its snapshot."""
    mine = (ds.event_query == ds.task_query[row]) & (ds.event_day < ds.task_day[row])
    return set(ds.event_item[mine].tolist())


def _truth(ds: Dataset, row: int) -> np.ndarray:
    return ds.truth_ids[ds.truth_offsets[row]:ds.truth_offsets[row + 1]]


def repeat_share(ds: Dataset, rows: np.ndarray, customers: np.ndarray | None = None) -> float:
    """Share of the rows' positives that the customer (`customers[i]` in place of row i's own) bought before."""
    hits = total = 0
    for i, row in enumerate(rows):
        query = ds.task_query[row] if customers is None else customers[i]
        mine = (ds.event_query == query) & (ds.event_day < ds.task_day[row])
        earlier = np.unique(ds.event_item[mine])
        truth = _truth(ds, row)
        hits += int(np.isin(truth, earlier).sum())
        total += len(truth)
    return hits / total if total else float("nan")


def shuffled_customers(ds: Dataset, rows: np.ndarray, seed: int = 0) -> np.ndarray:
    """The rows' customers permuted among the rows of the same snapshot."""
    rng = np.random.default_rng(seed)
    out = ds.task_query[rows].copy()
    for day in np.unique(ds.task_day[rows]):
        same = np.flatnonzero(ds.task_day[rows] == day)
        out[same] = out[same][rng.permutation(len(same))]
    return out


def _top(counts: np.ndarray, ds: Dataset, k: int) -> np.ndarray:
    return ds.candidates[np.argsort(-counts, kind="stable")[:k]]


def oracle_window(ds: Dataset, rows: np.ndarray, k: int) -> np.ndarray:
    """[rows, k]: per snapshot, the items with the most events in the label window itself."""
    out = np.zeros((len(rows), k), dtype=np.int64)
    for day in np.unique(ds.task_day[rows]):
        inside = (ds.event_day >= day) & (ds.event_day < day + WINDOW)
        counts = np.bincount(np.searchsorted(ds.candidates, ds.event_item[inside]), minlength=len(ds.candidates))
        out[ds.task_day[rows] == day] = _top(counts, ds, k)
    return out


def _row_frequency(ds: Dataset, rows: np.ndarray) -> np.ndarray:
    """Per candidate: in how many of `rows`' lists it is."""
    ids = np.concatenate([np.unique(_truth(ds, r)) for r in rows]) if len(rows) else np.zeros(0, np.int64)
    return np.bincount(np.searchsorted(ds.candidates, ids), minlength=len(ds.candidates))


def oracle_rows(ds: Dataset, rows: np.ndarray, k: int) -> np.ndarray:
    """[rows, k]: per snapshot, the items in the most of that snapshot's test lists."""
    out = np.zeros((len(rows), k), dtype=np.int64)
    for day in np.unique(ds.task_day[rows]):
        same = ds.task_day[rows] == day
        out[same] = _top(_row_frequency(ds, rows[same]), ds, k)
    return out


def oracle_past(ds: Dataset, rows: np.ndarray, k: int) -> np.ndarray:
    """[rows, k]: the customer's earlier items (most bought first), then oracle_rows' order."""
    return _with_past(ds, rows, k, _oracle_order, first=True)


def oracle_not_past(ds: Dataset, rows: np.ndarray, k: int) -> np.ndarray:
    """[rows, k]: oracle_rows' order, the customer's earlier items moved last."""
    return _with_past(ds, rows, k, _oracle_order, first=False)


def popularity_not_past(ds: Dataset, rows: np.ndarray, k: int) -> np.ndarray:
    """[rows, k]: popularity before the snapshot, the customer's earlier items moved last."""
    return _with_past(ds, rows, k, lambda ds, rows, day: recommend._ranked(recommend._event_counts(ds, day)), first=False)


def _oracle_order(ds: Dataset, rows: np.ndarray, day: int) -> np.ndarray:
    """Candidate positions by how many of the snapshot's test lists hold them."""
    return np.argsort(-_row_frequency(ds, rows[ds.task_day[rows] == day]), kind="stable")


def _with_past(ds: Dataset, rows: np.ndarray, k: int, order_of, first: bool) -> np.ndarray:
    """[rows, k]: per snapshot `order_of(ds, rows, day)` (candidate positions), with each row's customer's
    earlier items (most bought first) put first, or else moved after every other candidate."""
    out = np.zeros((len(rows), k), dtype=np.int64)
    for day in np.unique(ds.task_day[rows]):
        order = order_of(ds, rows, day)
        for i in np.flatnonzero(ds.task_day[rows] == day):
            mine = (ds.event_query == ds.task_query[rows[i]]) & (ds.event_day < day)
            items, counts = np.unique(np.searchsorted(ds.candidates, ds.event_item[mine]), return_counts=True)
            own = items[np.argsort(-counts, kind="stable")]
            ranked = recommend._fill(own, order, k) if first else np.concatenate([order[~np.isin(order, own)], own])[:k]
            out[i] = ds.candidates[ranked]
    return out


def ceiling(ds: Dataset, k: int) -> dict:
    """The figures of the module's docstring for `ds`'s test rows."""
    rows = np.sort(ds.split["test"])
    out = {"dataset": ds.name, "test_rows": len(rows), "positives": int(sum(len(_truth(ds, r)) for r in rows)),
           "repeat_share": repeat_share(ds, rows),
           "repeat_share_shuffled": float(np.mean([repeat_share(ds, rows, shuffled_customers(ds, rows, seed))
                                                   for seed in range(SHUFFLES)]))}
    methods = {"popularity": recommend.popularity, "past_items": recommend.past_items, "oracle_window": oracle_window,
               "oracle_rows": oracle_rows, "oracle_past": oracle_past, "popularity_not_past": popularity_not_past,
               "oracle_not_past": oracle_not_past}
    for name, method in methods.items():
        out[name] = recommend.scores(ds, method(ds, rows, k), rows, k)[f"map@{k}"]
    return out


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(prog="python -m bench.recommend_ceiling", description=__doc__.split("\n\n")[0])
    parser.add_argument("--datasets", nargs="*", default=["tpcds", "shop"], choices=["tpcds", "shop"])
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--quick", action="store_true", help="the small datasets of bench.recommend --quick")
    parser.add_argument("--out", default="out/bench/recommend_ceiling", help="folder of the generated database files")
    args = parser.parse_args(argv)
    found = []
    for name in args.datasets:
        ds = recommend_data.WRITERS[name](Path(args.out) / f"{name}.duckdb", **(QUICK[name] if args.quick else {}))
        result = ceiling(ds, args.k)
        found.append(result)
        print(f"{name}: {result['test_rows']} test rows, {result['positives']} positives; bought before by the same "
              f"customer {result['repeat_share']:.3f} (customers shuffled within a snapshot: "
              f"{result['repeat_share_shuffled']:.3f})")
        print(f"  MAP@{args.k}: " + ", ".join(f"{m} {result[m]:.4f}" for m in
              ("popularity", "past_items", "popularity_not_past", "oracle_window", "oracle_rows", "oracle_past",
               "oracle_not_past"))
              + f"; 2x popularity = {2 * result['popularity']:.4f}; load average {os.getloadavg()}")
    return found


if __name__ == "__main__":
    main()
