"""bench/recommend.py and its data (issue #30, item 6): the generated task lists, the split, the
baselines and the peer's time cut checked against naive recomputations; the bench end to end."""

from __future__ import annotations

import json
from collections import Counter

import duckdb
import numpy as np
import pytest

from bench import recommend, recommend_data, recommend_peer

K = 10


def naive_scores(predicted: np.ndarray, offsets: np.ndarray, ids: np.ndarray, k: int) -> dict[str, float]:
    """MAP@k (AP over min(|truth|, k)), recall@k, NDCG@k (binary gains) and MRR, row by row."""
    maps, recalls, ndcgs, mrrs = [], [], [], []
    for i, row in enumerate(predicted):
        truth = set(ids[offsets[i]:offsets[i + 1]].tolist())
        hits, precision_sum, dcg, reciprocal = 0, 0.0, 0.0, 0.0
        for j, item in enumerate(row[:k].tolist()):
            if item in truth:
                hits += 1
                precision_sum += hits / (j + 1)
                dcg += 1.0 / np.log2(j + 2)
                reciprocal = reciprocal or 1.0 / (j + 1)
        best = min(len(truth), k)
        maps.append(precision_sum / best)
        recalls.append(hits / len(truth))
        ndcgs.append(dcg / sum(1.0 / np.log2(j + 2) for j in range(best)))
        mrrs.append(reciprocal)
    return {f"map@{k}": float(np.mean(maps)), f"recall@{k}": float(np.mean(recalls)),
            f"ndcg@{k}": float(np.mean(ndcgs)), "mrr": float(np.mean(mrrs))}


@pytest.fixture(scope="module")
def shop(tmp_path_factory):
    path = tmp_path_factory.mktemp("rec") / "shop.duckdb"
    return recommend_data.write_shop(path, customers=150, items=60, purchases=2500, categories=5, regions=3)


def _purchases(ds):
    con = duckdb.connect(str(ds.path), read_only=True)
    try:
        rows = con.execute("SELECT customer_id, item_id, date - DATE '2024-01-01' FROM purchase").fetchall()
        tasks = con.execute("SELECT task_id, customer_id, snapshot - DATE '2024-01-01', item_id FROM task_rec "
                            "ORDER BY task_id").fetchall()
    finally:
        con.close()
    return rows, tasks


def test_shop_task_lists_equal_a_naive_recomputation(shop):
    purchases, tasks = _purchases(shop)
    expected = set()
    for snapshot in range(30, 365 - 30 + 1, 30):
        bought: dict[int, set] = {}
        for customer, item, day in purchases:
            if snapshot <= day < snapshot + 30:
                bought.setdefault(customer, set()).add(item)
        expected |= {(customer, snapshot, tuple(sorted(items))) for customer, items in bought.items()}
    assert {(c, s, tuple(items)) for _, c, s, items in tasks} == expected
    assert [t for t, *_ in tasks] == shop.task_id.tolist()
    lists = [tuple(shop.truth_ids[a:b]) for a, b in zip(shop.truth_offsets[:-1], shop.truth_offsets[1:])]
    assert lists == [tuple(items) for *_, items in tasks]


def test_the_split_is_whole_snapshots_and_relsql_reproduces_it(shop):
    from relsql.train.task.split import split_rows

    days = shop.task_day
    train, val, test = (days[shop.split[s]] for s in ("train", "val", "test"))
    assert len(train) and len(val) and len(test)
    assert train.max() < val.min() and val.max() < test.min()
    assert sorted(np.concatenate(list(shop.split.values())).tolist()) == list(range(len(days)))
    relsqls = split_rows(len(days), shop.fractions, seed=0, times=days.tolist())
    for name in ("train", "val", "test"):
        assert sorted(relsqls[name].tolist()) == shop.split[name].tolist()


def test_popularity_and_past_items_equal_naive_counts(shop):
    purchases, _ = _purchases(shop)
    rows = np.sort(shop.split["test"])[:40]
    popular = recommend.popularity(shop, rows, K)
    past = recommend.past_items(shop, rows, K)
    for i, row in enumerate(rows):
        snapshot, customer = int(shop.task_day[row]), int(shop.task_query[row])
        counts = Counter(item for _, item, day in purchases if day < snapshot)
        ranked = sorted(range(1, 61), key=lambda item: (-counts[item], item))
        assert popular[i].tolist() == ranked[:K]
        own = Counter(item for c, item, day in purchases if c == customer and day < snapshot)
        mine = sorted(own, key=lambda item: (-own[item], ranked.index(item)))
        assert past[i].tolist() == (mine + [item for item in ranked if item not in own])[:K]


def test_links_hold_each_edge_out_once_and_common_neighbours(tmp_path):
    ds = recommend_data.write_links(tmp_path / "links.duckdb", nodes=120, degree=6, communities=4)
    held = [(int(q), int(x)) for i, q in enumerate(ds.task_query)
            for x in ds.truth_ids[ds.truth_offsets[i]:ds.truth_offsets[i + 1]]]
    kept = set(zip(ds.event_query.tolist(), ds.event_item.tolist()))
    assert held and not any(pair in kept or pair[::-1] in kept for pair in held)
    assert len({frozenset(p) for p in held}) == len(held)  # an edge is in one list only
    neighbours: dict[int, set] = {}
    for a, b in kept:
        neighbours.setdefault(a, set()).add(b)
    rows = np.arange(min(15, len(ds.task_id)))
    got = recommend.common_neighbours(ds, rows, K)
    for i, row in enumerate(rows):
        me = int(ds.task_query[row])
        shared = {v: len(neighbours.get(me, set()) & neighbours.get(v, set())) for v in range(1, 121) if v != me}
        top = sorted(v for v in shared if shared[v] > 0)
        best = sorted(top, key=lambda v: (-shared[v], -len(neighbours.get(v, ())), v))
        assert got[i].tolist()[:len(best[:K])] == best[:K]


def test_the_peer_sees_only_events_before_the_snapshot(shop):
    graph = recommend_peer.build_graph(shop)
    purchases, _ = _purchases(shop)
    for snapshot in (30, 150, 330):
        edges = recommend_peer.edges_before(graph, snapshot)
        assert edges[graph.event_type].shape[1] == sum(day < snapshot for *_, day in purchases)


def test_bench_quick_json_end_to_end(tmp_path, monkeypatch):
    monkeypatch.setitem(recommend.QUICK, "shop", {"customers": 120, "items": 50, "purchases": 1800,
                                                  "categories": 5, "regions": 3})
    out = tmp_path / "r.json"
    report = recommend.main(["--quick", "--datasets", "shop", "--json", str(out), "--out", str(tmp_path),
                             "--peer", '{"epochs": 4, "width": 16}', "--fit", '{"epochs": 3}'])
    assert json.loads(out.read_text())["sizes"] == report["sizes"]
    lines = {r["method"]: r for r in report["table"]}
    assert set(lines) == set(recommend.METHODS)
    for method in ("popularity", "past_items", "peer"):
        for metric in ("map", "recall", "ndcg"):
            assert 0.0 <= lines[method][f"{metric}@{K}"] <= 1.0
    assert lines["past_items"][f"map@{K}"] > 0  # customers re-buy: their past items hit
    relsql_line = lines["relsql"]
    if "map@10" in relsql_line:  # the ranking API has landed
        assert 0.0 <= relsql_line["map@10"] <= 1.0 and relsql_line["same_split"] == [True]
    else:
        assert relsql_line["why"]


def test_relsql_ranking_scores_equal_the_naive_metrics():
    from relsql.train.ranking import metrics

    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 15, 30)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    ids = np.concatenate([rng.choice(40, n, replace=False) for n in lengths]).astype(np.int64)
    predicted = np.stack([rng.choice(40, K, replace=False) for _ in lengths]).astype(np.int64)
    got = metrics.ranking_scores(predicted, offsets, ids, K)
    for name, value in naive_scores(predicted, offsets, ids, K).items():
        assert got[name] == pytest.approx(value, abs=1e-9), name


def test_links_relsql_trains_on_the_benchs_rows_for_another_seed(tmp_path):
    ds = recommend_data.write_links(tmp_path / "links.duckdb", nodes=150, degree=6, communities=4)
    rows = recommend.run_one(ds, 1, K, {"epochs": 2}, {"epochs": 2, "width": 8})
    fitted = next(r for r in rows if r["method"] == "relsql")
    assert fitted["available"], fitted.get("why")
    assert fitted["same_split"] is True  # relsql's split of seed 1, not the data's seed 0
    assert fitted["scores"]["map@10"] == pytest.approx(fitted["own_evaluate"]["map@10"], abs=1e-12)
