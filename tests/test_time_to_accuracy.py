"""bench.time_to_accuracy: its bench database's label, its template's semantics (checked against a
numpy forward of the network the template's comment describes), and its per-seed medians."""

from __future__ import annotations

import math

import duckdb
import numpy as np
import pytest
import torch

import relsql
from bench import time_to_accuracy as tta

BRANDS = [f"Brand#{i}{j}" for i in range(1, 4) for j in range(1, 4)]  # 9 brands


@pytest.fixture(scope="module")
def tiny_tpch(tmp_path_factory):
    """A small TPC-H-shaped DuckDB file with the columns the benchmark reads."""
    folder = tmp_path_factory.mktemp("tta")
    path = folder / "tiny_tpch.duckdb"
    rng = np.random.default_rng(7)
    n_part, n_customer, n_order = 60, 12, 150
    con = duckdb.connect(str(path))
    try:
        con.execute("CREATE TABLE part (p_partkey BIGINT, p_brand VARCHAR, p_size INTEGER, p_retailprice DECIMAL(15, 2))")
        con.executemany("INSERT INTO part VALUES (?, ?, ?, ?)",
                        [[k + 1, BRANDS[k % len(BRANDS)], int(rng.integers(1, 51)), round(float(rng.uniform(900, 2100)), 2)]
                         for k in range(n_part)])
        con.execute("CREATE TABLE customer (c_custkey BIGINT, c_acctbal DECIMAL(15, 2))")
        con.executemany("INSERT INTO customer VALUES (?, ?)",
                        [[k + 1, round(float(rng.uniform(-999, 9999)), 2)] for k in range(n_customer)])
        con.execute("CREATE TABLE orders (o_orderkey BIGINT, o_custkey BIGINT, o_totalprice DECIMAL(15, 2))")
        con.executemany("INSERT INTO orders VALUES (?, ?, ?)",
                        [[k + 1, int(rng.integers(1, n_customer + 1)), round(float(rng.uniform(1e3, 4e5)), 2)]
                         for k in range(n_order)])
        con.execute("CREATE TABLE lineitem (l_orderkey BIGINT, l_partkey BIGINT, l_linenumber INTEGER, "
                    "l_quantity DECIMAL(15, 2), l_extendedprice DECIMAL(15, 2), l_discount DECIMAL(15, 2))")
        rows = [[o + 1, int(rng.integers(1, n_part + 1)), n + 1, float(rng.integers(1, 51)),
                 round(float(rng.uniform(900, 1e5)), 2), round(float(rng.integers(0, 11)) / 100, 2)]
                for o in range(n_order) for n in range(int(rng.integers(1, 8)))]
        con.executemany("INSERT INTO lineitem VALUES (?, ?, ?, ?, ?, ?)", rows)
    finally:
        con.close()
    return path


@pytest.fixture(scope="module")
def bench_db(tiny_tpch, tmp_path_factory):
    path, rate = tta.bench_database(tiny_tpch, 0.001, "signed-size", "", 0.1, tmp_path_factory.mktemp("bench"))
    return path, rate


def _fetch(path, sql: str) -> dict:
    con = duckdb.connect(str(path), read_only=True)
    try:
        return con.execute(sql).fetchnumpy()
    finally:
        con.close()


def test_signed_size_label_is_the_documented_rule(tiny_tpch, bench_db):
    """Half the brands +1, half -1; an order's label is its line items' mean of sign x cos(2 pi size / 20)
    above the median over orders, flipped for about --noise of the orders (recomputed in numpy)."""
    path, rate = bench_db
    parts = _fetch(tiny_tpch, "SELECT p_partkey, p_brand, p_size FROM part ORDER BY p_partkey")
    items = _fetch(tiny_tpch, "SELECT l_orderkey, l_partkey FROM lineitem")
    orders = _fetch(path, "SELECT o_orderkey, label_y, split_rank FROM orders ORDER BY o_orderkey")
    # the sign per brand: the bench's seeded hash order of the brands, every other one +1
    order = _fetch(tiny_tpch, f"SELECT p_brand, row_number() OVER (ORDER BY hash(p_brand, {tta.SEED}), p_brand) AS r "
                              "FROM (SELECT DISTINCT p_brand FROM part)")
    sign = {b: 1.0 if r % 2 == 0 else -1.0 for b, r in zip(order["p_brand"], order["r"])}
    assert abs(sum(sign.values())) <= 1  # half and half
    part_score = {k: sign[b] * math.cos(2 * math.pi * s / 20)
                  for k, b, s in zip(parts["p_partkey"], parts["p_brand"], parts["p_size"])}
    per_order: dict[int, list[float]] = {}
    for o, p in zip(items["l_orderkey"], items["l_partkey"]):
        per_order.setdefault(int(o), []).append(part_score[int(p)])
    score = {o: float(np.mean(v)) for o, v in per_order.items()}
    median = float(np.median(list(score.values())))
    raw = np.array([score[int(o)] > median for o in orders["o_orderkey"]])
    flipped = raw != orders["label_y"].astype(bool)
    assert 0 < flipped.mean() < 0.25  # about 10 % flipped (150 orders)
    assert rate == pytest.approx(float(orders["label_y"].mean()))
    assert sorted(orders["split_rank"].tolist()) == list(range(len(orders["o_orderkey"])))


def _reference_logits(model: relsql.Model, path, keys: np.ndarray) -> np.ndarray:
    """The network TEMPLATE's comment describes, in numpy, with the model's weights and encodings."""
    learner = model.learner
    encodings = learner.encodings()
    stats = encodings.feature_stats
    w = {k: v.detach().double().numpy() for k, v in model.named_weights().items()}
    table = encodings.dictionaries["part_h.embed0"].to_pydict()
    code = dict(zip(table["value"], table["code"]))

    def std(x, key):
        return (np.asarray(x, dtype=np.float64) - stats[key]["mean"]) / stats[key]["std"]

    parts = _fetch(path, "SELECT p_partkey, p_brand, p_size::DOUBLE AS s, p_retailprice::DOUBLE AS r "
                         "FROM part ORDER BY p_partkey")
    part_h = np.tanh(w["part_h.embed0"][[code[b] for b in parts["p_brand"]]]
                     + np.stack([std(parts["s"], "part_h#0:1"), std(parts["r"], "part_h#0:2")], 1) @ w["w_part"].T + w["b_part"])
    customers = _fetch(path, "SELECT c_custkey, c_acctbal::DOUBLE AS a FROM customer ORDER BY c_custkey")
    orders = _fetch(path, "SELECT o_orderkey, o_custkey, o_totalprice::DOUBLE AS t FROM orders ORDER BY o_orderkey")
    items = _fetch(path, "SELECT l_orderkey, l_partkey, l_quantity::DOUBLE AS q, l_extendedprice::DOUBLE AS p, "
                         "l_discount::DOUBLE AS d FROM lineitem")
    per_item = np.maximum(part_h[np.searchsorted(parts["p_partkey"], items["l_partkey"])] @ w["w_item_part"].T
                          + np.stack([std(items["q"], "items_h#0:0"), std(items["p"], "items_h#0:1"),
                                      std(items["d"], "items_h#0:2")], 1) @ w["w_item"].T + w["b_item"], 0)  # ReLU per line item
    at = np.searchsorted(orders["o_orderkey"], items["l_orderkey"])
    items_h = np.zeros((len(orders["o_orderkey"]), per_item.shape[1]))
    np.add.at(items_h, at, per_item)
    items_h /= np.bincount(at, minlength=len(orders["o_orderkey"]))[:, None]  # then the mean per order
    customer_h = np.tanh(std(customers["a"], "customer_h#0:0")[:, None] @ w["w_customer"].T + w["b_customer"])
    hidden = np.maximum(items_h @ w["w_o_items"].T + customer_h[np.searchsorted(customers["c_custkey"], orders["o_custkey"])]
                        @ w["w_o_customer"].T + std(orders["t"], "predict#0:0")[:, None] @ w["w_o"].T + w["b_o"], 0)
    logits = (hidden @ w["w_out"].T + w["b_out"])[:, 0]
    return logits[np.searchsorted(orders["o_orderkey"], keys)]


def test_template_is_the_described_network(bench_db):
    """relsql's mini-batch outputs of TEMPLATE equal a numpy forward of the GraphSAGE-style net its
    comment describes (ReLU per line item inside the average, biases), with non-zero biases."""
    path, _ = bench_db
    db = relsql.connect(str(path), read_only=True)
    try:
        model = relsql.Model(db, relsql.Template.from_sql(tta.TEMPLATE.format(w=8)), target="orders.label_y",
                             time_column="split_rank", split=tta.SPLIT, seed=3, batch_size=32, fanout={"items_h": 16},
                             progress=False, threads=1)
        generator = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for name, weight in model.named_weights().items():
                if name.startswith("b_"):  # biases start at 0: give them values the check can see
                    weight.copy_(torch.randn(weight.shape, generator=generator, dtype=weight.dtype))
        keys = _fetch(path, "SELECT o_orderkey FROM orders ORDER BY o_orderkey DESC LIMIT 40")["o_orderkey"]
        predicted = model.predict(keys={"o_orderkey": keys.tolist()})
        assert predicted["o_orderkey"].to_list() == keys.tolist()
        probability = np.clip(predicted["probability"].to_numpy().astype(np.float64), 1e-7, 1 - 1e-7)
        expected = _reference_logits(model, path, keys)
        assert np.std(expected) > 0.05
        np.testing.assert_allclose(np.log(probability / (1 - probability)), expected, atol=2e-4)
    finally:
        db.close()


def _side(seconds: float | None, rss: float, seed: int = 0) -> dict:
    return {"time_to_target_s": seconds, "peak_rss_mib": rss, "seed": seed}


def test_seed_summary_medians_count_unreached_runs_as_slowest():
    pairs = [(_side(10.0, 600), _side(3.0, 500), 0.8, 0.3), (_side(20.0, 610), _side(None, 520), 0.82, None),
             (_side(30.0, 620), _side(6.0, 510), 0.81, 0.2)]
    summary = tta.seed_summary(pairs)
    assert summary["pyg_time_s"] == 20.0
    assert summary["relsql_time_s"] == 6.0  # 3, 6, never: the median is the middle one
    assert summary["ratio"] == 0.3  # 0.2, 0.3, never
    assert (summary["pyg_rss_mib"], summary["relsql_rss_mib"], summary["target"]) == (610, 510, 0.81)
    assert (summary["reached"], summary["seeds"]) == (2, 3)
    two_never = [pairs[0], pairs[1], (_side(30.0, 620), _side(None, 510), 0.81, None)]
    assert tta.seed_summary(two_never)["relsql_time_s"] is None
    assert tta.seed_summary(two_never)["ratio"] is None


def test_chance_level_seeds_are_left_out(capsys):
    """A seed whose PyG run stayed at chance (its best within 0.05 of the majority class) is printed
    but not in the medians."""
    pairs = [(_side(10.0, 600, 0) | {"best_test_accuracy": 0.86, "s_per_epoch": 1.0},
              _side(4.0, 500) | {"best_test_accuracy": 0.87, "s_per_epoch": 1.0, "loadavg": "1"}, 0.86, 0.4),
             (_side(9.0, 600, 2) | {"best_test_accuracy": 0.5003, "s_per_epoch": 1.0},
              _side(None, 500) | {"best_test_accuracy": 0.4997, "s_per_epoch": 1.0, "loadavg": "1"}, 0.5003, None)]
    assert tta.learnt(pairs, 0.501) == pairs[:1]
    tta._print_seeds(1.0, pairs, 0.501)
    out = capsys.readouterr().out
    assert "seeds [2]" in out and "reached PyG's best in 1 of 1 seeds" in out


@pytest.mark.parametrize("text", ["32MB", "1GiB", " 512 KB "])
def test_flush_threshold_accepts_sizes(text):
    assert tta._checked_size(text) == text.strip()


@pytest.mark.parametrize("text", ["", "32", "1MB'; DROP TABLE orders; --", "MB"])
def test_flush_threshold_refuses_other_text(text):
    with pytest.raises(SystemExit, match="duckdb-flush-threshold"):
        tta._checked_size(text)


TREE_MEMORY = """
import json, multiprocessing, time
import numpy as np
from bench import TreeMemory

def hold(ready, done):
    block = np.ones(160 * 2**20 // 8)  # 160 MiB written: the child's own pages
    ready.set()
    done.wait(30)

shared = np.ones(200 * 2**20 // 8)  # 200 MiB this process holds; the child maps them too, unwritten
context = multiprocessing.get_context("fork")
ready, done = context.Event(), context.Event()
memory = TreeMemory(interval=0.01)
child = context.Process(target=hold, args=(ready, done))
child.start()
assert ready.wait(30)
time.sleep(0.2)  # several samples while the child holds its block
peak, children = memory.stop(), memory.children
done.set()
child.join(30)
print(json.dumps({"peak": peak, "children": children, "shared": float(shared.sum())}))
"""


def test_tree_memory_counts_a_forked_childs_own_pages_once():
    """bench.TreeMemory: a child's freshly written pages count, the pages it shares with its parent
    not twice. In a fresh process: this one may have other children (a PostgreSQL server, a JVM)."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    done = subprocess.run([sys.executable, "-c", TREE_MEMORY], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parent.parent)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert 150 <= got["children"] <= 200  # the child's 160 MiB, not the 200 MiB it shares
    assert got["peak"] >= 200 + 150  # the parent's 200 MiB (and its interpreter), plus the child's own block
