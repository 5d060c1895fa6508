"""Data-parallel training (relsql/train/loop/distributed.py): real gloo ranks in their own processes,
checked against single-process training (the oracle), with the same global batches."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import relsql
from tests.test_batches import shop_db, shop_template

pytestmark = pytest.mark.slow  # ranks are processes that each start torch: 10-40 s a test

ROOT = Path(__file__).resolve().parent.parent


def trained(workers: int, db=None, template=None, epochs: int = 3, **fit) -> relsql.Model:
    model = relsql.Model(db or shop_db(), template or shop_template("memory"), "item.y", batch_size=256,
                         dtype=torch.float64, progress=False)
    fit.setdefault("refit", False)  # ranks do not refit: one process is compared without its refit
    return model.fit(epochs=epochs, lr=0.05, workers=workers, **fit)


def assert_same_training(one: relsql.Model, other: relsql.Model, tolerance: float = 1e-10) -> None:
    a, b = one.named_weights(), other.named_weights()
    assert a.keys() == b.keys()
    for name in a:
        assert torch.allclose(a[name].detach(), b[name].detach(), atol=tolerance, rtol=0), name
    assert len(one.history) == len(other.history)
    for x, y in zip(one.history, other.history):
        assert abs(x["train_loss"] - y["train_loss"]) < tolerance and abs(x["val_loss"] - y["val_loss"]) < tolerance
    assert one.best_epoch == other.best_epoch


def test_two_ranks_take_the_steps_of_one_process():
    one, two = trained(1), trained(2)
    assert_same_training(one, two)
    assert one.history[-1]["train_loss"] < one.history[0]["train_loss"]  # it trained: the weights moved
    assert {"waiting_on_store", "compute", "all_reduce"} <= set(two.timings)
    assert two.evaluate()["loss"] == pytest.approx(one.evaluate()["loss"], abs=1e-10)


def test_full_batch_model_on_two_ranks_equals_full_batch_training():
    """A model without batch_size: each epoch is one global batch of every training row."""
    def run(workers: int) -> relsql.Model:
        model = relsql.Model(shop_db(), shop_template("memory"), "item.y", dtype=torch.float64, progress=False)
        return model.fit(epochs=3, lr=0.05, workers=workers, refit=False)  # ranks never refit: the selection run compared

    one, two = run(1), run(2)
    assert_same_training(one, two)
    assert two.evaluate()["roc_auc"] == pytest.approx(one.evaluate()["roc_auc"], abs=1e-12)


def test_uneven_shares_fanout_and_lazily_created_weights():
    """Batches of 37 over 3 ranks (shares of 12 and 13 rows), a fan-out sample, and a second
    statement whose weight only some batches create: still one process's steps."""
    template = relsql.Template.from_sql("""
    CREATE TABLE user_h AS SELECT u.user_id, tanh(linear(features(u.age), 4, 'wu')) AS h FROM users u;
    CREATE TABLE item_h AS SELECT i.id, linear(avg(uh.h), 4, 'wuh') AS h
    FROM item i JOIN item j ON j.user_id = i.user_id JOIN user_h uh ON uh.user_id = j.user_id GROUP BY i.id;
    CREATE TABLE pred AS
    SELECT i.id, linear(tanh(linear(features(i.x), 4, 'wx') + ih.h), 1, 'out') AS h FROM item i JOIN item_h ih ON ih.id = i.id;
    CREATE TABLE pred AS SELECT i.id, linear(features(i.x), 1, 'rare') AS h FROM item i WHERE i.id % 97 = 5;
    """)

    def run(workers: int) -> relsql.Model:
        model = relsql.Model(shop_db(), template, "item.y", batch_size=37, fanout=3, dtype=torch.float64, progress=False)
        return model.fit(epochs=2, lr=0.05, workers=workers, refit=False)  # ranks never refit

    assert_same_training(run(1), run(3))


def test_checkpoint_written_by_rank_zero_resumes(tmp_path):
    path = tmp_path / "ranks.ckpt"
    trained(2, epochs=2, checkpoint=path)
    assert path.exists()
    resumed = relsql.Model(shop_db(), shop_template("memory"), "item.y", batch_size=256, dtype=torch.float64,
                           progress=False).fit(epochs=4, lr=0.05, workers=2, checkpoint=path, resume=True)
    assert_same_training(trained(1, epochs=4), resumed)


def _rank_processes() -> list[int]:
    """The rank processes this test process started (children running relsql.train.loop.distributed)."""
    found = []
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        try:  # a thread may end between listing and reading
            children = (task / "children").read_text().split()
        except OSError:
            continue
        for pid in children:
            try:
                if b"relsql.train.loop.distributed" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    found.append(int(pid))
            except OSError:
                pass
    return sorted(found)


def test_a_rank_that_dies_stops_training_with_a_clear_error():
    killed = []

    def kill_one() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            ranks = _rank_processes()
            if len(ranks) == 2:
                time.sleep(8)  # into training
                os.kill(ranks[1], signal.SIGKILL)
                killed.append(ranks[1])
                return
            time.sleep(0.1)

    thread = threading.Thread(target=kill_one)
    thread.start()
    started = time.monotonic()
    with pytest.raises(relsql.RelsqlError, match=r"training rank \d of 2 failed"):
        trained(2, epochs=500, patience=500)
    thread.join()
    assert killed and time.monotonic() - started < 120  # stopped, not hung until the collective's timeout
    assert not _rank_processes()  # no rank left behind


def embedding_rows(model: relsql.Model) -> tuple[dict, int]:
    """The `user` embedding's table, read from the database: {key: row}, and its step counter."""
    table = model.batched.store("user", None)
    return table.values(), table.step()


def test_database_embeddings_sharded_over_ranks_train_like_one_process():
    """`user` rows live in the database; on 2 ranks each owns half of them in memory, and the
    table ends as one process leaves it (rows, step counter). A second fit starts from the table."""
    def run(workers: int) -> relsql.Model:
        model = relsql.Model(shop_db(), shop_template("database"), "item.y", batch_size=256, dtype=torch.float64,
                             progress=False)
        model.fit(epochs=2, lr=0.05, workers=workers)
        first = embedding_rows(model)
        model.fit(epochs=2, lr=0.05, workers=workers)
        return model, first

    (one, one_first), (two, two_first) = run(1), run(2)
    assert_same_training(one, two)
    for (a, a_step), (b, b_step) in ((one_first, two_first), (embedding_rows(one), embedding_rows(two))):
        assert a_step == b_step and a_step > 0
        assert a.keys() == b.keys() and len(a) == 300
        assert all(np.allclose(a[k], b[k], atol=1e-10, rtol=0) for k in a)
    assert any(not np.allclose(one_first[0][k], embedding_rows(one)[0][k]) for k in one_first[0])  # the second fit moved them
    assert two.evaluate()["loss"] == pytest.approx(one.evaluate()["loss"], abs=1e-10)


def test_sharded_embeddings_checkpoint_and_resume(tmp_path):
    """Every rank keeps its shard beside rank 0's checkpoint; a run resumed from it (after the
    first run's table was rolled back to a fresh database) equals one uninterrupted process."""
    path = tmp_path / "ranks.ckpt"

    def model() -> relsql.Model:
        return relsql.Model(shop_db(), shop_template("database"), "item.y", batch_size=256, dtype=torch.float64,
                            progress=False)

    model().fit(epochs=1, lr=0.05, workers=2, checkpoint=path, checkpoint_every=3)
    shards = sorted(p.name for p in (tmp_path / "ranks.ckpt.shards").iterdir())
    assert shards and {n.split(".")[1] for n in shards} == {"rank0", "rank1"}
    resumed = model().fit(epochs=2, lr=0.05, workers=2, checkpoint=path, resume=True)
    one = model().fit(epochs=2, lr=0.05)
    assert_same_training(one, resumed)
    a, b = embedding_rows(one)[0], embedding_rows(resumed)[0]
    assert a.keys() == b.keys() and all(np.allclose(a[k], b[k], atol=1e-10, rtol=0) for k in a)
    with pytest.raises(relsql.RelsqlError, match="as many workers"):  # refused before any rank starts
        model().fit(epochs=5, lr=0.05, workers=3, checkpoint=path, resume=True)
    with pytest.raises(relsql.RelsqlError, match="workers=2"):
        model().fit(epochs=5, lr=0.05, checkpoint=path, resume=True)


KILLED_SCRIPT = """
import logging, sys, torch, relsql
from tests.test_batches import shop_template
logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
model = relsql.Model(relsql.connect(sys.argv[1]), shop_template("database"), "item.y", batch_size=256,
                     dtype=torch.float64, progress=False)
model.fit(epochs=500, lr=0.05, patience=1000, workers=2, checkpoint=sys.argv[2])
"""


def test_checkpoints_write_the_embeddings_back_and_a_killed_run_resumes(tmp_path):
    """The parent writes each epoch's checkpoint rows into the table while the ranks train: killed
    mid-run, the table holds one process's state after that many epochs (its step counter says
    how many); resumed, the run counts its steps from the step the table had at its start."""
    path, checkpoint = tmp_path / "shop.duckdb", tmp_path / "ranks.ckpt"
    with relsql.connect(path) as db:
        shop = shop_db()
        for table in ("users", "item"):
            db.write_table(table, shop.arrow(f"SELECT * FROM {table}"))
    run = subprocess.Popen([sys.executable, "-c", KILLED_SCRIPT, str(path), str(checkpoint)], cwd=ROOT, text=True,
                           stderr=subprocess.PIPE, start_new_session=True)
    timer = threading.Timer(300, os.killpg, (run.pid, signal.SIGKILL))  # never hang the suite
    timer.start()
    try:
        lines = []
        for line in run.stderr:
            lines.append(line)
            if "written back at the checkpoint" in line:
                break
        os.killpg(run.pid, signal.SIGKILL)
        run.wait()
    finally:
        timer.cancel()
    assert run.returncode == -signal.SIGKILL, "".join(lines[-20:])  # killed while training, not finished

    def table(db) -> tuple[dict, int]:
        from relsql.train.embeddings.embeddings import DatabaseEmbedding

        stored = DatabaseEmbedding(db, "user", 4, None)
        return stored.values(), stored.step()

    with relsql.connect(path) as db:
        rows, step = table(db)
    steps_per_epoch = 6  # ceil(1,400 training rows / 256)
    assert step > 0 and step % steps_per_epoch == 0
    epochs = step // steps_per_epoch
    one = trained(1, template=shop_template("database"), epochs=epochs, patience=1000)
    assert one.best_epoch == epochs - 1  # its table holds the last epoch's rows, as the checkpoint's does
    expected, expected_step = embedding_rows(one)
    assert step == expected_step and rows.keys() == expected.keys()
    assert all(np.allclose(rows[k], expected[k], atol=1e-10, rtol=0) for k in rows)

    with relsql.connect(path) as db:  # resumed from the newest checkpoint, whatever the table holds
        resumed = trained(2, db=db, template=shop_template("database"), epochs=epochs + 3, patience=1000,
                          checkpoint=checkpoint, resume=True)
        rows, step = table(db)
    one = trained(1, template=shop_template("database"), epochs=epochs + 3, patience=1000)
    assert_same_training(one, resumed)
    expected, expected_step = embedding_rows(one)
    assert step == expected_step == (epochs + 3) * steps_per_epoch
    assert all(np.allclose(rows[k], expected[k], atol=1e-10, rtol=0) for k in rows)


def test_what_ranks_cannot_do_yet_is_refused_before_anything_runs():
    model = relsql.Model(shop_db(), shop_template("memory"), "item.y", batch_size=256, progress=False, store=False)
    with pytest.raises(relsql.RelsqlError, match="store=False"):
        model.fit(epochs=1, workers=2)
    with pytest.raises(relsql.RelsqlError, match="callback"):
        model.fit(epochs=1, workers=2, callback=print)
    with pytest.raises(relsql.RelsqlError, match="workers must be"):
        model.fit(epochs=1, workers=0)


TORCHRUN_SCRIPT = """
import os, sys, torch, relsql
from tests.test_batches import shop_db, shop_template
folder = sys.argv[1]
model = relsql.Model(shop_db(), shop_template("memory"), "item.y", batch_size=256, dtype=torch.float64,
                     progress=False, store=os.path.join(folder, "store"))
model.fit(epochs=3, lr=0.05)
tasks = f"/proc/{os.getpid()}/task"
threads = [open(os.path.join(tasks, t, "comm")).read().strip() for t in os.listdir(tasks)] if os.path.isdir(tasks) else []
torch.save({"weights": {n: p.detach() for n, p in model.named_weights().items()},
            "losses": [h["val_loss"] for h in model.history], "threads": threads},
           os.path.join(folder, f"rank{os.environ['RANK']}.pt"))
"""


def test_ranks_started_by_torchrun_train_like_one_process(tmp_path):
    """torchrun's own processes (env:// rendezvous), one kept store that rank 0 writes and rank 1
    waits for: every rank ends with one process's weights."""
    script = tmp_path / "train.py"
    script.write_text(TORCHRUN_SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           str(script), str(tmp_path)], capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    one = trained(1)
    for rank in (0, 1):
        found = torch.load(tmp_path / f"rank{rank}.pt", weights_only=True)
        for name, weight in one.named_weights().items():
            assert torch.allclose(weight.detach(), found["weights"][name], atol=1e-10, rtol=0), (rank, name)
        assert found["losses"] == pytest.approx([h["val_loss"] for h in one.history], abs=1e-10)
        # the process group is gone once fit() returns: no gloo thread is left to be torn down at
        # interpreter exit, where it could abort the rank (a reference leak kept them alive)
        assert not [t for t in found["threads"] if "gloo" in t], (rank, found["threads"])
    assert (tmp_path / "store" / "manifest.json").exists()


def test_cli_trains_on_two_workers(tmp_path):
    database = tmp_path / "shop.duckdb"
    db = shop_db()
    db.execute(f"ATTACH '{database}' AS f")
    db.execute("CREATE TABLE f.users AS SELECT * FROM users")
    db.execute("CREATE TABLE f.item AS SELECT * FROM item")
    db.close()
    template = tmp_path / "shop.sql"
    template.write_text(shop_template("memory").source)
    done = subprocess.run([sys.executable, "-m", "relsql.cli", "train", str(database), "--template", str(template),
                           "--target", "item.y", "--batch-size", "256", "--epochs", "2", "--workers", "2",
                           "--model", str(tmp_path / "m.pt"), "--predictions", "scores"],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "wrote 2000 predictions" in done.stdout
    with relsql.connect(database) as db:
        model = relsql.Model.load(tmp_path / "m.pt", db)
        assert len(model.history) == 2
