"""Demand-driven mini-batches: what a batch grounds, equality with full-batch training, fan-out
sampling, gradients as relations, database-stored embeddings, interruption and resume."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch

import relsql
from relsql.ground.demand import BatchGrounder

ROOT = Path(__file__).resolve().parent.parent

SHOP = """
CREATE TABLE user_h AS SELECT u.user_id, tanh(linear(features(u.age), 4, 'wu')) AS h FROM users u;
CREATE TABLE pred AS
SELECT i.id, linear(tanh({embed} + linear(features(i.x), 4, 'wx') + linear(uh.h, 4, 'wuh')), 1, 'out') AS h
FROM item i JOIN user_h uh ON uh.user_id = i.user_id;
"""


def shop_db() -> relsql.Database:
    """2,000 items of 300 users; the label depends on the user (an embedding can learn it)."""
    db = relsql.connect()
    db.execute("CREATE TABLE users AS SELECT i AS user_id, (i % 50) * 1.0 AS age FROM range(300) t(i)")
    db.execute("CREATE TABLE item AS SELECT i AS id, (i * 7919) % 300 AS user_id, (i % 13) * 0.1 AS x, "
               "((i * 7919) % 300) % 3 = 0 AS y FROM range(2000) t(i)")
    return db


def shop_template(storage: str = "database") -> relsql.Template:
    return relsql.Template.from_sql(SHOP.format(embed=f"embed(i.user_id, 4, 'user', storage='{storage}')"))


def quiet(fn, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args, **kwargs)


def test_one_batch_of_every_row_equals_full_batch_training(molecules):
    kwargs = dict(target="molecule.mutagenic", seed=0, dtype=torch.float64, progress=False)
    full = quiet(relsql.Model, molecules, relsql.sql_templates.path("mutagenesis"), **kwargs)
    batched = quiet(relsql.Model, molecules, relsql.sql_templates.path("mutagenesis"), batch_size=100_000, **kwargs)
    assert full.batched is None and batched.mini_batches
    quiet(full.fit, epochs=4)
    quiet(batched.fit, epochs=4)
    for a, b in zip(full.history, batched.history):
        for key in a:
            assert a[key] == pytest.approx(b[key], rel=1e-10, abs=1e-12), key
    ours, theirs = full.net.named_weights(), batched.net.named_weights()
    assert set(ours) == set(theirs)
    assert all(torch.allclose(ours[n], theirs[n], rtol=1e-10, atol=1e-12) for n in ours)
    p, q = full.predict(), batched.predict()
    assert p["molecule_id"].to_list() == q["molecule_id"].to_list()
    assert np.allclose(p["probability"].to_numpy(), q["probability"].to_numpy(), rtol=1e-10)


def test_a_batch_grounds_only_what_its_rows_need(molecules):
    tpl = relsql.Template.from_file(relsql.sql_templates.path("mutagenesis"))
    grounder = quiet(BatchGrounder, tpl, molecules, "predict", progress=False)
    keys = grounder.keys("predict")
    picked = np.array([0, 5, 17])
    ids = [keys["molecule_id"][int(i)].as_py() for i in picked]
    batch = grounder.ground(picked)
    atoms = molecules.con.execute("SELECT count(*) FROM atom WHERE molecule_id IN (?, ?, ?)", ids).fetchone()[0]
    assert batch.rows["predict"].tolist() == picked.tolist()
    assert all(r.size for r in batch.relations.values())
    for name, relation in batch.relations.items():  # atom-level relations: exactly those molecules' atoms
        if name not in ("predict", "mol_h", "bond_h") and "atom" in str(tpl.relations[name].keys):
            assert relation.size == atoms, name
    everything = grounder.ground(np.arange(grounder.sizes["predict"]))
    assert (sum(r.rules[0].size for r in batch.relations.values())
            < sum(r.rules[0].size for r in everything.relations.values()) / 20)


def test_fanout_keeps_at_most_n_groundings_per_head_with_a_seed(molecules):
    tpl = relsql.Template.from_file(relsql.sql_templates.path("mutagenesis"))
    exact = quiet(BatchGrounder, tpl, molecules, "predict", progress=False)
    capped = quiet(BatchGrounder, tpl, molecules, "predict", fanout=2, seed=3, progress=False)
    rows = np.arange(20)
    first, again, other = capped.ground(rows, sample=0), capped.ground(rows, sample=0), capped.ground(rows, sample=1)
    full = exact.ground(rows)
    grouped = [(n, i) for n, r in full.relations.items() for i, g in enumerate(r.rules) if g.rule.grouped]
    assert grouped
    wider = False
    for name, i in grouped:
        counts = first.relations[name].rules[i].offsets.diff()
        assert int(counts.max()) <= 2, name
        assert torch.equal(first.relations[name].rules[i].refs[0], again.relations[name].rules[i].refs[0])
        wider |= int(full.relations[name].rules[i].offsets.diff().max()) > 2
    assert wider  # the cap did cut something
    assert any(not torch.equal(first.relations[n].rules[i].refs[0], other.relations[n].rules[i].refs[0]) for n, i in grouped)


def test_mini_batches_train_and_report_time_waiting_on_the_database():
    db = shop_db()
    model = quiet(relsql.Model, db, shop_template("memory"), target="item.y", seed=0, progress=False, batch_size=256)
    quiet(model.fit, epochs=15, lr=0.05)
    assert model.evaluate()["accuracy"] >= 0.9
    assert 0 <= model.timings["waiting_on_database"] <= model.timings["training"]
    assert "waiting on the database" in model.report()


def test_gradients_as_relations_are_the_loss_gradient(molecules):
    model = quiet(relsql.Model, molecules, relsql.sql_templates.path("mutagenesis"), target="molecule.mutagenic", seed=1,
                  dtype=torch.float64, progress=False)
    index, y = model.learner.goal.split_index("train")
    loss = model.task.loss(model.learner.outputs().index_select(0, index), y)
    expected = torch.autograd.grad(loss, list(model.net.named_weights().values()))
    tables = model.gradients_as_relations("g_")
    for (name, _), grad in zip(model.net.named_weights().items(), expected):
        rows = molecules.con.execute(f'SELECT "row", gradient FROM "{tables[name]}" ORDER BY "row"').fetchall()
        got = torch.tensor([r[1] for r in rows], dtype=torch.float64).reshape(grad.shape)
        assert torch.allclose(got, grad, rtol=1e-9, atol=1e-13), name
    with pytest.raises(relsql.RelsqlError, match="already exists"):
        model.gradients_as_relations("g_")


def _memory_start_like_database(memory: relsql.Model, database: relsql.Model) -> None:
    """Give the in-memory embedding the database table's initial rows (same start, same trajectory)."""
    values = memory.batched.grounder.dictionary_tables["user"]["value"]
    rows = database.batched.store("user", values.type).fetch(values.combine_chunks())
    with torch.no_grad():
        memory.net.named_weights()["user"].copy_(rows)


@pytest.mark.parametrize("optimizer", ["sgd", "adagrad"])
def test_database_embedding_follows_the_in_memory_trajectory(optimizer):
    kwargs = dict(target="item.y", seed=0, dtype=torch.float64, progress=False, batch_size=300,
                  embedding_optimizer=optimizer, embedding_lr=0.3)
    memory = quiet(relsql.Model, shop_db(), shop_template("memory"), **kwargs)
    database = quiet(relsql.Model, shop_db(), shop_template("database"), **kwargs)
    _memory_start_like_database(memory, database)
    assert "user" in memory.net.named_weights() and "user" not in database.net.named_weights()
    quiet(memory.fit, epochs=3, lr=0.02, refit=False)  # the database-stored one cannot be refit: compare the runs
    quiet(database.fit, epochs=3, lr=0.02)
    assert database.refit is None and "database-stored embeddings" in database.no_refit
    for a, b in zip(memory.history, database.history):
        assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-9)
    stored = database.batched.stores["user"].values()
    codes = {v: i for i, v in enumerate(memory.batched.grounder.dictionary_tables["user"]["value"].to_pylist())}
    table = memory.net.named_weights()["user"].detach()
    assert len(stored) == 300
    assert all(np.allclose(stored[k], table[codes[k]].numpy(), rtol=1e-9, atol=1e-12) for k in stored)
    assert database.batched.stores["user"].step() > 0


class Stop(Exception):
    pass


def _stop_after(steps: int):
    seen = []

    def callback(info):
        seen.append(info)
        if len(seen) == steps:
            raise Stop

    return callback


def test_an_interrupted_epoch_leaves_the_embedding_table_at_a_step():
    kwargs = dict(target="item.y", seed=0, dtype=torch.float64, progress=False, batch_size=300, embedding_optimizer="adagrad")
    memory = quiet(relsql.Model, shop_db(), shop_template("memory"), **kwargs)
    db = shop_db()
    database = quiet(relsql.Model, db, shop_template("database"), **kwargs)
    _memory_start_like_database(memory, database)
    for model in (memory, database):
        with pytest.raises(relsql.RelsqlError, match="raised Stop"):
            quiet(model.fit, epochs=3, callback=_stop_after(4))
    store = database.batched.stores["user"]
    assert store.step() == 4  # the 4th update was submitted before the callback raised, and completed
    codes = {v: i for i, v in enumerate(memory.batched.grounder.dictionary_tables["user"]["value"].to_pylist())}
    table = memory.net.named_weights()["user"].detach()
    assert all(np.allclose(v, table[codes[k]].numpy(), rtol=1e-9, atol=1e-12) for k, v in store.values().items())


def test_checkpoints_resume_to_the_uninterrupted_result(tmp_path):
    kwargs = dict(target="item.y", seed=0, dtype=torch.float64, progress=False, batch_size=300)
    straight = quiet(relsql.Model, shop_db(), shop_template("database"), **kwargs)
    quiet(straight.fit, epochs=3, patience=100)
    db = shop_db()
    first = quiet(relsql.Model, db, shop_template("database"), **kwargs)
    path = tmp_path / "run.ckpt"
    with pytest.raises(relsql.RelsqlError, match="raised Stop"):
        quiet(first.fit, epochs=3, patience=100, checkpoint=path, checkpoint_every=2, callback=_stop_after(10))
    assert path.exists()
    again = quiet(relsql.Model, db, shop_template("database"), **kwargs)  # a new process would do the same
    quiet(again.fit, epochs=3, patience=100, checkpoint=path, resume=True)
    assert [h["train_loss"] for h in again.history] == pytest.approx([h["train_loss"] for h in straight.history], rel=1e-9)
    ours, theirs = again.net.named_weights(), straight.net.named_weights()
    assert all(torch.allclose(ours[n], theirs[n], rtol=1e-9, atol=1e-12) for n in theirs)
    a, b = again.batched.stores["user"].values(), straight.batched.stores["user"].values()
    assert a.keys() == b.keys() and all(np.allclose(a[k], b[k], rtol=1e-9, atol=1e-12) for k in a)


@pytest.mark.slow
def test_ctrl_c_during_training_leaves_a_consistent_database(tmp_path):
    """A real SIGINT to a training process: afterwards the table is exactly `step` updates in."""
    path = tmp_path / "shop.duckdb"
    script = textwrap.dedent(f"""
        import sys, warnings, torch, relsql
        warnings.simplefilter("ignore")
        sys.path.insert(0, {str(ROOT / 'tests')!r})
        from test_batches import shop_template
        db = relsql.connect({str(path)!r})
        model = relsql.Model(db, shop_template("database"), target="item.y", seed=0, dtype=torch.float64,
                             progress=False, batch_size=50, embedding_optimizer="sgd")
        steps = []

        def stepped(info):  # tell the test once the table has been updated a few times
            steps.append(info)
            if len(steps) == 3:
                print("stepped", flush=True)

        print("training", flush=True)
        model.fit(epochs=1000, patience=1000, callback=stepped)
    """)
    with relsql.connect(path) as db:
        db.execute("CREATE TABLE users AS SELECT i AS user_id, (i % 50) * 1.0 AS age FROM range(300) t(i)")
        db.execute("CREATE TABLE item AS SELECT i AS id, (i * 7919) % 300 AS user_id, (i % 13) * 0.1 AS x, "
                   "((i * 7919) % 300) % 3 = 0 AS y FROM range(2000) t(i)")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
    assert proc.stdout.readline().strip() == "training"
    assert proc.stdout.readline().strip() == "stepped"  # however loaded the machine, training is under way
    import time

    time.sleep(1.0)  # somewhere in a later step
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert "KeyboardInterrupt" in err
    with relsql.connect(path) as db:
        step = db.con.execute("SELECT step FROM relsql_embedding_steps WHERE weight = 'user'").fetchone()[0]
        stored = {r[0]: np.array(r[1:])
                  for r in db.con.execute("SELECT * EXCLUDE (a0, a1, a2, a3) FROM relsql_embedding_user").fetchall()}
    assert step > 0
    # replay exactly `step` updates in memory from the same start: the interrupted table must match
    memory = quiet(relsql.Model, shop_db(), shop_template("memory"), target="item.y", seed=0, dtype=torch.float64,
                   progress=False, batch_size=50, embedding_optimizer="sgd")
    reference = quiet(relsql.Model, shop_db(), shop_template("database"), target="item.y", seed=0, dtype=torch.float64,
                      progress=False, batch_size=50, embedding_optimizer="sgd")
    _memory_start_like_database(memory, reference)
    with pytest.raises(relsql.RelsqlError, match="raised Stop"):
        quiet(memory.fit, epochs=1000, patience=1000, callback=_stop_after(step))
    codes = {v: i for i, v in enumerate(memory.batched.grounder.dictionary_tables["user"]["value"].to_pylist())}
    table = memory.net.named_weights()["user"].detach()
    assert all(np.allclose(v, table[codes[k]].numpy(), rtol=1e-9, atol=1e-12) for k, v in stored.items())


def test_a_snapshot_put_back_restores_the_rows_and_the_step():
    """What early stopping and resuming rely on: the table swapped back to a copy, in one transaction."""
    model = quiet(relsql.Model, shop_db(), shop_template("database"), target="item.y", seed=0, dtype=torch.float64,
                  progress=False, batch_size=300)
    quiet(model.fit, epochs=1)
    store = model.batched.stores["user"]
    before, step = store.values(), store.step()
    assert store.snapshot() == step  # the checkpoint copy, named by its step
    keys = pa.array(sorted(before)[:50], type=store.key_arrow)
    store.update(keys, torch.ones(50, 4, dtype=torch.float64))
    changed = store.values()
    assert store.step() == step + 1 and not np.allclose(changed[keys[0].as_py()], before[keys[0].as_py()])
    assert store.restore(step) == step and store.step() == step
    after = store.values()
    assert after.keys() == before.keys() and all(np.array_equal(after[k], before[k]) for k in before)
    store.update(keys, torch.ones(50, 4, dtype=torch.float64))  # the swapped-in table is the live one
    assert all(np.array_equal(store.values()[k], changed[k]) for k in changed)


def test_a_failed_database_update_is_raised_not_lost():
    from relsql.train.feed.batches import Worker

    def fail():
        raise RuntimeError("the update failed")

    worker = Worker()
    worker.submit(fail)  # queued like an embedding update: nobody waits on it directly
    with pytest.raises(RuntimeError, match="the update failed"):
        worker.wait(worker.prefetch(lambda: 1))  # the next batch's wait reports it
    assert worker.wait(worker.prefetch(lambda: 2)) == 2  # reported once
    worker.submit(fail)
    with pytest.raises(RuntimeError, match="the update failed"):
        worker.close()  # or closing does
