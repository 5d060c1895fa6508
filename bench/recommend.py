"""Ranking side by side: relsql vs popularity, past items and a PyG two-tower GNN (issue #30, item 6).

    python -m bench.recommend [--quick] [--seeds 0 1 2] [--datasets shop tpcds links] [--k 10]
                              [--fit '{"epochs": 50}'] [--peer '{"epochs": 60}'] [--topk] [--json out.json]
                              [--out out/bench/recommend]

Datasets (bench/recommend_data.py, one new DuckDB file each, data seed 0): a latent-taste shop
(customers, items in categories, a year of purchases; task_rec.item_id = the distinct items each
customer buys in the 30 days after a snapshot, every 30 days), TPC-DS store_sales (the same task
over its five years) and a latent-space link graph (task_link.node_id = each node's held-out
neighbours, not temporal). For every dataset and seed, on THE SAME task rows (the bench's split:
whole snapshots, the latest ~15% of rows test and the ~15% before validation; for the links
relsql's own 70/15/15 random split seeded by the model seed), every method gives the k=10 best candidates of each test row:
- popularity: the candidates with the most events (purchases; degree in the link graph) before the
  row's snapshot;
- past_items: the customer's own most frequent items before the snapshot, popularity to fill (the
  links: common neighbours, degree to fill);
- peer: bench/recommend_peer.py (RDL-style HeteroGraphSAGE two towers, events before the snapshot,
  sampled softmax with uniform negatives, best validation MAP@10);
- relsql: `Template.auto(db, target=..., time_column=...)`, `Model(..., split=the bench's fractions)`,
  `.fit(**fit)`, `.recommend(k, keys=the test rows)`; its own `.evaluate()` is printed beside it,
  and the model's test rows are checked against the bench's. "not available" when the API raises.
All are scored by relsql.train.ranking.metrics.ranking_scores: MAP@10, recall@10, NDCG@10.
Seconds: training only (peer: graph + training; relsql: template + model build + fit), wall and CPU
(this process's, the peer's including its test ranking), with the load average after each. torch uses 1
thread. With --topk, relsql's chunked top_k ranks 100k random query rows x 100k candidates (dimension
32, k 10; timed with bench/topk.py's helpers, which also compares it with a full sort).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import time
from pathlib import Path

import numpy as np

from bench import recommend_data, recommend_peer
from bench.recommend_data import Dataset

METHODS = ["popularity", "past_items", "peer", "relsql"]
METRICS = ("map", "recall", "ndcg")
QUICK = {"shop": {"customers": 400, "items": 200, "purchases": 6000}, "tpcds": {"sf": 0.01, "first": 1460},
         "links": {"nodes": 500}}
QUICK_PEER = {"epochs": 15, "patience": 5, "width": 32}
QUICK_FIT = {"epochs": 15}


# --------------------------------------------------------------------------- metrics
def scores(ds: Dataset, predicted: np.ndarray, rows: np.ndarray, k: int) -> dict[str, float]:
    """relsql's ranking metrics of `predicted` ([len(rows), k] candidate keys) against the rows' lists."""
    from relsql.train.ranking.metrics import ranking_scores

    starts, ends = ds.truth_offsets[rows], ds.truth_offsets[rows + 1]
    offsets = np.concatenate([[0], np.cumsum(ends - starts)]).astype(np.int64)
    ids = np.concatenate([ds.truth_ids[s:e] for s, e in zip(starts, ends)]) if len(rows) else np.zeros(0, np.int64)
    return {name: float(value) for name, value in ranking_scores(predicted, offsets, ids, k).items()}


# --------------------------------------------------------------------------- baselines
def _event_counts(ds: Dataset, before: int | None) -> np.ndarray:
    """Events per candidate (Dataset.candidates order), those dated before `before` (all: None)."""
    kept = slice(None) if before is None or ds.event_day is None else ds.event_day < before
    return np.bincount(np.searchsorted(ds.candidates, ds.event_item[kept]), minlength=len(ds.candidates))


def _ranked(counts: np.ndarray) -> np.ndarray:
    """Candidate positions by count, most first; ties to the lower position (a stable sort)."""
    return np.argsort(-counts, kind="stable")


def _day(ds: Dataset, row: int) -> int | None:
    return None if ds.task_day is None else int(ds.task_day[row])


def popularity(ds: Dataset, rows: np.ndarray, k: int) -> np.ndarray:
    """[rows, k] keys: the candidates with the most events before each row's snapshot."""
    cache: dict[int | None, np.ndarray] = {}
    out = np.zeros((len(rows), k), dtype=np.int64)
    for i, row in enumerate(rows):
        day = _day(ds, row)
        if day not in cache:
            cache[day] = ds.candidates[_ranked(_event_counts(ds, day))[:k]]
        out[i] = cache[day]
    return out


def _fill(own: np.ndarray, order: np.ndarray, k: int) -> np.ndarray:
    """`own` candidate positions first, then `order`'s others, k in all."""
    if len(own) >= k:
        return own[:k]
    head = order[: k + len(own)]
    return np.concatenate([own, head[~np.isin(head, own)][: k - len(own)]])


def past_items(ds: Dataset, rows: np.ndarray, k: int) -> np.ndarray:
    """[rows, k] keys: the query row's own most frequent candidates before the snapshot (ties: the
    more popular first), then popularity; for a non-temporal graph, common neighbours then degree."""
    if ds.task_day is None:
        return common_neighbours(ds, rows, k)
    by_query = np.argsort(ds.event_query, kind="stable")
    sorted_query = ds.event_query[by_query]
    out = np.zeros((len(rows), k), dtype=np.int64)
    cache: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for i, row in enumerate(rows):
        day = int(ds.task_day[row])
        if day not in cache:
            order = _ranked(_event_counts(ds, day))
            rank = np.empty(len(order), dtype=np.int64)
            rank[order] = np.arange(len(order))
            cache[day] = order, rank
        order, rank = cache[day]
        lo, hi = (np.searchsorted(sorted_query, ds.task_query[row], "left"),
                  np.searchsorted(sorted_query, ds.task_query[row], "right"))
        mine = by_query[lo:hi]
        mine = mine[ds.event_day[mine] < day]
        items, counts = np.unique(np.searchsorted(ds.candidates, ds.event_item[mine]), return_counts=True)
        own = items[np.lexsort((rank[items], -counts))]
        out[i] = ds.candidates[_fill(own, order, k)]
    return out


def common_neighbours(ds: Dataset, rows: np.ndarray, k: int) -> np.ndarray:
    """[rows, k] keys: the nodes sharing the most neighbours with the row's node (itself excluded),
    ties and the rest by degree."""
    from scipy import sparse

    n = len(ds.candidates)
    src = np.searchsorted(ds.candidates, ds.event_query)
    dst = np.searchsorted(ds.candidates, ds.event_item)
    adjacency = sparse.csr_matrix((np.ones(len(src)), (src, dst)), shape=(n, n))
    adjacency.data[:] = 1.0  # repeated edges count once
    degree = np.asarray(adjacency.sum(1)).ravel()
    order = _ranked(degree)
    rank = np.empty(n, dtype=np.int64)
    rank[order] = np.arange(n)
    me = np.searchsorted(ds.candidates, ds.task_query[rows])
    shared = (adjacency[me] @ adjacency).toarray()
    out = np.zeros((len(rows), k), dtype=np.int64)
    for i, node in enumerate(me):
        shared[i, node] = -1
        candidates = np.flatnonzero(shared[i] > 0)
        own = candidates[np.lexsort((rank[candidates], -shared[i, candidates]))]
        out[i] = ds.candidates[_fill(own, order[order != node], k)]
    return out


# --------------------------------------------------------------------------- relsql
def _model_split_keys(model, key: str) -> dict[str, np.ndarray] | None:
    """The task keys of the model's train/val/test rows (None when the model does not expose them)."""
    try:
        from relsql.train.learner.results import chosen_rows

        learner = model.learner
        known = chosen_rows(learner)
        by_rid = dict(zip(known["_rid"].to_list(), known[key].to_list()))
        return {name: np.sort([by_rid[r] for r in learner.labelled[learner.rows[name]].tolist()]) for name in learner.rows}
    except Exception:  # noqa: BLE001 - a diagnostic only
        return None


def fitted_model(con, ds: Dataset, seed: int, fit: dict):
    """Template.auto and Model on the bench's split, fitted: (model, wall seconds, CPU seconds)."""
    import relsql

    started, cpu = time.perf_counter(), time.process_time()
    extra = {"time_column": ds.time_column} if ds.time_column else {}
    template = relsql.Template.auto(con, target=ds.target, **extra)
    model = relsql.Model(con, template, target=ds.target, split=ds.fractions, seed=seed, progress=False, threads=1, **extra)
    model.fit(**fit)
    return model, time.perf_counter() - started, time.process_time() - cpu


def run_relsql(ds: Dataset, seed: int, k: int, fit: dict) -> dict:
    """relsql through its public API on the bench's split; {"available": False, "why"} when it raises."""
    import polars as pl

    import relsql

    con = relsql.connect(str(ds.path), read_only=True)
    try:
        model, seconds, cpu = fitted_model(con, ds, seed, fit)
        split = _model_split_keys(model, "task_id")
        same = None if split is None else all(
            np.array_equal(split[s], ds.task_id[ds.split[s]]) for s in ("train", "val", "test"))
        test = np.sort(ds.split["test"])
        frame = model.recommend(k=k, keys=pl.DataFrame({"task_id": ds.task_id[test]}))
        predicted = _frame_to_keys(frame, ds, test, k)
        own = model.evaluate()
        history = {"epochs": len(getattr(model.learner, "history", []) or []),
                   "best_epoch": getattr(model.learner, "best_epoch", None)}
    except Exception as err:  # noqa: BLE001 - the API may not have landed: report, do not fail the bench
        return {"available": False, "why": f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"[:200]}
    finally:
        con.close()
    return {"available": True, "predicted": predicted, "seconds": seconds, "cpu_seconds": cpu, "same_split": same,
            "own_evaluate": {name: float(v) for name, v in own.items()}, **history}


def _frame_to_keys(frame, ds: Dataset, rows: np.ndarray, k: int) -> np.ndarray:
    """recommend()'s frame (task_id, <target column>, rank, score) as [rows, k] keys; -1 pads."""
    column = ds.target.split(".")[1]
    out = np.full((len(rows), k), -1, dtype=np.int64)
    position = {key: i for i, key in enumerate(ds.task_id[rows].tolist())}
    for task, item, rank in zip(frame["task_id"].to_list(), frame[column].to_list(), frame["rank"].to_list()):
        if rank <= k:
            out[position[task], rank - 1] = item
    return out


# --------------------------------------------------------------------------- one dataset, one seed
def run_one(ds: Dataset, seed: int, k: int, fit: dict, peer: dict, with_relsql: bool = True) -> list[dict]:
    """Every method's test scores on `ds` for model seed `seed`."""
    import torch

    torch.set_num_threads(1)
    if ds.time_column is None:  # relsql seeds its random split with the model's seed: so does the bench, per seed
        ds = dataclasses.replace(ds, split=recommend_data.random_split(len(ds.task_id), seed))
    test = np.sort(ds.split["test"])
    out = []
    for name, method in (("popularity", popularity), ("past_items", past_items)):
        started = time.perf_counter()
        predicted = method(ds, test, k)
        out.append({"method": name, "scores": scores(ds, predicted, test, k), "seconds": time.perf_counter() - started})
    cpu = time.process_time()
    result = recommend_peer.run(ds, seed, lambda p, r: scores(ds, p, r, k), k=k, **peer)
    out.append({"method": "peer", "scores": scores(ds, result["predicted"], test, k), "seconds": result["seconds"],
                "cpu_seconds": time.process_time() - cpu, "load_average": os.getloadavg()[0],
                "epochs": result["epochs"], "best_epoch": result["best_epoch"]})
    if with_relsql:
        fitted = run_relsql(ds, seed, k, fit)
        row = {"method": "relsql", "available": fitted["available"]}
        if fitted["available"]:
            row.update(scores=scores(ds, fitted["predicted"], test, k), seconds=fitted["seconds"],
                       cpu_seconds=fitted["cpu_seconds"], load_average=os.getloadavg()[0],
                       same_split=fitted["same_split"], own_evaluate=fitted["own_evaluate"],
                       epochs=fitted["epochs"], best_epoch=fitted["best_epoch"])
        else:
            row["why"] = fitted["why"]
        out.append(row)
    for row in out:
        row.update(dataset=ds.name, seed=seed)
    return out


# --------------------------------------------------------------------------- top-k timing
def time_topk(rows: int = 100_000, candidates: int = 100_000, dim: int = 32, k: int = 10, threads: int = 2) -> dict | None:
    """Exact top-k of `rows` x `candidates` random float32 vectors by relsql's chunked top_k, timed
    with bench/topk.py's helpers (None when that bench is absent)."""
    try:
        from bench import topk as topk_bench
    except ImportError:
        return None
    import torch

    from relsql.train.ranking.topk import top_k

    generator = torch.Generator().manual_seed(0)
    query = torch.randn(rows, dim, generator=generator)
    items = torch.randn(candidates, dim, generator=generator)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)  # the target is stated for 2 cores; the methods above train on 1
    try:
        before = topk_bench.peak_rss_mb()
        seconds, _ = topk_bench.timed(lambda: top_k(query, items, k))
    finally:
        torch.set_num_threads(previous)
    return {"rows": rows, "candidates": candidates, "dim": dim, "k": k, "seconds": seconds, "threads": threads,
            "peak_rss_growth_mb": topk_bench.peak_rss_mb() - before, "load_average": os.getloadavg()[0]}


# --------------------------------------------------------------------------- summary and printing
def summarize(rows: list[dict], k: int) -> list[dict]:
    """Per dataset and method: mean (and std over seeds) of each metric and seconds."""
    table = []
    for dataset in dict.fromkeys(r["dataset"] for r in rows):
        for method in METHODS:
            mine = [r for r in rows if r["dataset"] == dataset and r["method"] == method]
            if not mine:
                continue
            done = [r for r in mine if "scores" in r]
            line = {"dataset": dataset, "method": method, "seeds": len(done)}
            if not done:
                line["why"] = mine[0].get("why", "not run")
                table.append(line)
                continue
            for metric in METRICS:
                values = [r["scores"][f"{metric}@{k}"] for r in done]
                line[f"{metric}@{k}"] = statistics.fmean(values)
                line[f"{metric}@{k}_std"] = statistics.pstdev(values) if len(values) > 1 else 0.0
            line["seconds"] = statistics.fmean(r["seconds"] for r in done)
            if all("cpu_seconds" in r for r in done):
                line["cpu_seconds"] = statistics.fmean(r["cpu_seconds"] for r in done)
                line["load_average"] = statistics.fmean(r["load_average"] for r in done)
            if method == "relsql":
                line["same_split"] = [r.get("same_split") for r in done]
                line["own_map"] = statistics.fmean(r["own_evaluate"].get(f"map@{k}", float("nan")) for r in done)
            table.append(line)
    return table


def ratios(table: list[dict], k: int) -> dict[str, dict[str, float]]:
    """Per dataset: relsql's MAP@k over popularity's and over the peer's; its seconds over the peer's."""
    out = {}
    for dataset in dict.fromkeys(r["dataset"] for r in table):
        by = {r["method"]: r for r in table if r["dataset"] == dataset}
        relsql = by.get("relsql", {})
        if f"map@{k}" not in relsql:
            continue
        key = f"map@{k}"
        out[dataset] = {"map_vs_popularity": relsql[key] / by["popularity"][key] if by["popularity"][key] else float("inf"),
                        "map_vs_peer": relsql[key] / by["peer"][key] if by["peer"][key] else float("inf"),
                        "seconds_vs_peer": relsql["seconds"] / by["peer"]["seconds"],
                        "cpu_seconds_vs_peer": relsql.get("cpu_seconds", float("nan"))
                                               / by["peer"].get("cpu_seconds", float("nan"))}
    return out


def per_seed(rows: list[dict], k: int) -> str:
    """One line per dataset and seed: the peer's and relsql's MAP@k, wall and CPU seconds, load average."""
    lines = []
    for (dataset, seed) in dict.fromkeys((r["dataset"], r["seed"]) for r in rows):
        cells = []
        for r in (r for r in rows if r["dataset"] == dataset and r["seed"] == seed and r["method"] in ("peer", "relsql")):
            if "scores" not in r:
                continue
            cells.append(f"{r['method']} {r['scores'][f'map@{k}']:.4f} ({r['seconds']:.1f} s wall, {r['cpu_seconds']:.1f} s CPU, "
                         f"epochs {r.get('epochs')}, best {r.get('best_epoch')}, load {r['load_average']:.1f})")
        if cells:
            lines.append(f"  {dataset} seed {seed}: " + "; ".join(cells))
    return "\n".join(lines)


def render(table: list[dict], k: int, sizes: dict[str, dict]) -> str:
    lines = []
    for dataset in dict.fromkeys(r["dataset"] for r in table):
        info = sizes.get(dataset, {})
        lines.append(f"\n{dataset}: {info.get('rows', '?')} task rows (test {info.get('test', '?')}), "
                     f"{info.get('candidates', '?')} candidates")
        lines.append(f"  {'method':<12}{'MAP@' + str(k):>14}{'recall@' + str(k):>14}{'NDCG@' + str(k):>14}{'train s':>10}"
                     f"{'CPU s':>8}{'load':>6}")
        for r in (r for r in table if r["dataset"] == dataset):
            if f"map@{k}" not in r:
                lines.append(f"  {r['method']:<12}not available ({r.get('why', '')})")
                continue
            cells = "".join(f"{r[f'{m}@{k}']:>8.4f}±{r[f'{m}@{k}_std']:<5.3f}" for m in METRICS)
            extra = f"   (own evaluate() MAP {r['own_map']:.4f}, same split {r['same_split']})" if r["method"] == "relsql" else ""
            cpu = f"{r['cpu_seconds']:>8.1f}{r['load_average']:>6.1f}" if "cpu_seconds" in r else ""
            lines.append(f"  {r['method']:<12}{cells}{r['seconds']:>10.1f}{cpu}{extra}")
    return "\n".join(lines)


# --------------------------------------------------------------------------- main
def build(names: list[str], quick: bool, folder: Path) -> list[Dataset]:
    return [recommend_data.WRITERS[name](folder / f"{name}.duckdb", **(QUICK[name] if quick else {})) for name in names]


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m bench.recommend", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small datasets, short training, seed 0 (about a minute)")
    parser.add_argument("--seeds", nargs="*", type=int, default=None, help="model seeds (default 0 1 2; --quick 0)")
    parser.add_argument("--datasets", nargs="*", default=list(recommend_data.WRITERS), choices=list(recommend_data.WRITERS))
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--fit", default="{}", help="Model.fit keyword arguments, JSON")
    parser.add_argument("--peer", default="{}", help="bench/recommend_peer.run keyword arguments, JSON")
    parser.add_argument("--no-relsql", action="store_true", help="baselines and peer only")
    parser.add_argument("--topk", action="store_true", help="also time top-10 for 100k x 100k (bench/topk.py)")
    parser.add_argument("--json", default=None, help="write every number here")
    parser.add_argument("--out", default="out/bench/recommend", help="folder of the generated database files")
    args = parser.parse_args(argv)
    seeds = args.seeds if args.seeds is not None else ([0] if args.quick else [0, 1, 2])
    # no wall-clock budget, as the peer has none: fit's default 60 s stopped the shop's seed 1 at epoch 51 (best 39,
    # still improving) at load average 6.6; epochs and patience stop both sides
    fit = {"time_budget": None, **(QUICK_FIT if args.quick else {}), **json.loads(args.fit)}
    peer = {**(QUICK_PEER if args.quick else {}), **json.loads(args.peer)}
    datasets = build(args.datasets, args.quick, Path(args.out))
    rows = [row for ds in datasets for seed in seeds for row in run_one(ds, seed, args.k, fit, peer, not args.no_relsql)]
    table = summarize(rows, args.k)
    sizes = {ds.name: {"rows": len(ds.task_id), "test": len(ds.split["test"]), "candidates": len(ds.candidates)}
             for ds in datasets}
    print(render(table, args.k, sizes))
    print("\nper seed:\n" + per_seed(rows, args.k))
    ratio = ratios(table, args.k)
    for dataset, r in ratio.items():
        print(f"{dataset}: relsql/popularity MAP {r['map_vs_popularity']:.2f}x, relsql/peer MAP {r['map_vs_peer']:.2f}x, "
              f"relsql/peer seconds {r['seconds_vs_peer']:.2f}x (CPU seconds {r['cpu_seconds_vs_peer']:.2f}x), "
              f"load average {os.getloadavg()}")
    topk = time_topk(k=args.k) if args.topk else None
    if topk is not None:
        print(f"exact top-{topk['k']} of {topk['rows']:,} rows x {topk['candidates']:,} candidates (dim {topk['dim']}, "
              f"{topk['threads']} threads): {topk['seconds']:.1f} s, peak RSS growth {topk['peak_rss_growth_mb']:.0f} MB, "
              f"load average {topk['load_average']:.1f}")
    report = {"rows": [{key: v for key, v in r.items() if key != "predicted"} for r in rows], "table": table,
              "ratios": ratio, "sizes": sizes, "topk": topk, "seeds": seeds, "fit": fit, "peer": peer,
              "machine": platform.platform(), "load_average": os.getloadavg()}
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=1, default=str))
    return report


if __name__ == "__main__":
    main()
