"""The same seed gives the same model, bit for bit, on an idle machine and beside a CPU hog: no
wall-clock budget by default, and no choice made by timing changes the numbers."""

from __future__ import annotations

import multiprocessing
import subprocess
import sys
import time

import numpy as np
import pytest

import relsql

pytestmark = pytest.mark.slow

SCRIPT = """
import sys, numpy as np, relsql, torch
torch.set_num_threads(2)
db = relsql.connect(sys.argv[1], read_only=True)
tpl = relsql.Template.auto(db, target="customer.churned")
model = relsql.Model(db, tpl, target="customer.churned", seed=3, progress=False)
model.fit(epochs=int(sys.argv[3]){batch})
np.save(sys.argv[2], model.predict()["probability"].to_numpy())
print(model.stopped)
"""


CUSTOMERS = 3000  # about 12k orders: reductions large enough for the kernel choice (MIN_ROWS = 10k)


def _shop(path) -> None:
    db = relsql.connect(path)
    rng = np.random.default_rng(0)
    db.execute("CREATE TABLE customer(customer_id INTEGER PRIMARY KEY, age DOUBLE, tier VARCHAR, churned BOOLEAN)")
    db.execute("CREATE TABLE orders(order_id INTEGER PRIMARY KEY, customer_id INTEGER REFERENCES customer(customer_id), "
               "amount DOUBLE, ordered DATE)")
    ages = rng.uniform(18, 80, CUSTOMERS)
    counts = rng.poisson(4, CUSTOMERS)
    db.con.executemany("INSERT INTO customer VALUES (?, ?, ?, ?)",
                       [(i, float(ages[i]), str(rng.choice(["a", "b", "c"])), bool(counts[i] > 4 or ages[i] > 70))
                        for i in range(CUSTOMERS)])
    orders = [(k, i, float(rng.gamma(2, 20))) for k, i in enumerate(np.repeat(np.arange(CUSTOMERS), counts))]
    db.con.executemany("INSERT INTO orders VALUES (?, ?, ?, DATE '2024-01-01' + ?::INTEGER)",
                       [(k, int(i), a, k % 300) for k, i, a in orders])
    db.con.close()


def _run(db_path, out, epochs: int, batch: str) -> str:
    script = SCRIPT.replace("{batch}", batch)
    done = subprocess.run([sys.executable, "-c", script, str(db_path), str(out), str(epochs)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip()


def _spin(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


@pytest.mark.parametrize("batch", ["", ", batch_size=64"])
def test_the_same_seed_gives_bitwise_equal_predictions_idle_and_under_load(tmp_path, batch):
    _shop(tmp_path / "shop.duckdb")
    idle = _run(tmp_path / "shop.duckdb", tmp_path / "idle.npy", 15, batch)
    hogs = [multiprocessing.get_context("spawn").Process(target=_spin, args=(600,), daemon=True) for _ in range(4)]
    for hog in hogs:
        hog.start()
    try:
        loaded = _run(tmp_path / "shop.duckdb", tmp_path / "loaded.npy", 15, batch)
    finally:
        for hog in hogs:
            hog.kill()
    assert idle == loaded  # the same stopping reason
    first, second = np.load(tmp_path / "idle.npy"), np.load(tmp_path / "loaded.npy")
    assert first.shape == (CUSTOMERS,) and np.isfinite(first).all()
    assert np.array_equal(first, second)
