"""Out-of-core embedding rows in memory-mapped arrays (relsql/train/embeddings/rowcache.py) and the table
they are written back to (relsql/train/embeddings/embeddings.py): lookups against a dict oracle, steps
against a numpy replay of the optimizer read back by plain SQL, and a process killed with
SIGKILL that resumes to the uninterrupted result."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch

import relsql
from relsql.train.embeddings.embeddings import DatabaseEmbedding, initial_values
from relsql.train.embeddings.rowcache import KeyIndex, RowCache
from tests.test_batches import shop_db, shop_template

ROOT = Path(__file__).resolve().parent.parent


def quiet(fn, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args, **kwargs)


@pytest.mark.parametrize("kind", ["int64", "uint64", "float64", "string"])
def test_rows_by_key_match_a_dict_through_growth(kind):
    """Batches of random keys (repeats inside a batch, extremes of the type, -0.0 and 0.0): every
    read gives the key's last written row, or its initial one; `changed` lists exactly the
    written keys with their rows."""
    rng = np.random.default_rng(3)
    pool = {"int64": np.r_[rng.integers(-2**62, 2**62, 3000), [-2**63, 2**63 - 1, 0, -1]],
            "uint64": np.r_[rng.integers(0, 2**63, 3000, dtype=np.uint64), np.array([2**64 - 1, 0], np.uint64)],
            "float64": np.r_[rng.normal(size=3000), [0.0, np.inf, -np.inf, 1e300]],
            "string": np.array([f"k{i}" for i in rng.integers(0, 10**9, 3000)] + ["", "é"], object)}[kind]
    arrow_type = {"int64": pa.int64(), "uint64": pa.uint64(), "float64": pa.float64(), "string": pa.string()}[kind]
    cache = RowCache(2, arrow_type, tempfile.gettempdir())
    oracle: dict = {}

    def initial(keys: pa.Array) -> np.ndarray:
        return np.full((len(keys), 2), 7.0)

    for _ in range(40):
        picked = pool[rng.integers(0, len(pool), int(rng.integers(1, 600)))]
        keys = pa.array(list(picked) if kind == "string" else picked, arrow_type)
        slots, rows = cache.read(keys, initial)
        for key, row in zip(keys.to_pylist(), rows):
            assert np.array_equal(row, oracle.get(key, [7.0, 7.0, 0.0, 0.0])), key
        distinct = np.unique(slots, return_index=True)[1]  # write each key once
        new = rng.normal(size=(len(distinct), 4))
        cache.write(slots[distinct], new)
        oracle.update(zip([keys[int(i)].as_py() for i in distinct], new))
    if kind == "float64":
        assert cache.read(pa.array([-0.0]), initial)[0][0] == cache.read(pa.array([0.0]), initial)[0][0]
    slots, table = cache.changed()
    got = {k: np.array(r) for k, *r in zip(*[table.column(i).to_pylist() for i in range(5)])}
    assert got.keys() == oracle.keys()
    assert all(np.array_equal(got[k], oracle[k]) for k in oracle)
    cache.clean(slots)
    assert not len(cache.changed()[0])


def test_absent_codes_are_not_inserted_when_looking_up_only():
    index = KeyIndex(tempfile.gettempdir())
    assert index.slots(np.array([5, 9]), insert=False).tolist() == [-1, -1]
    assert index.slots(np.array([5, 9]), insert=True).tolist() == [0, 1]
    assert index.slots(np.array([9, 4, 5]), insert=False).tolist() == [1, -1, 0]
    assert index.count == 2


def test_reading_keys_without_a_step_keeps_no_row_for_them():
    """Evaluation on keys never trained: their initial rows, and nothing kept for them."""
    db = relsql.connect()
    table = DatabaseEmbedding(db, "w", 2, pa.int64(), seed=1)
    keys = pa.array(np.arange(5000, dtype=np.int64))
    assert np.array_equal(table.fetch(keys).numpy(), initial_values(keys, 2, 1))
    assert table._live.rows.index.count == 0 and table.values() == {} and table.step() == 0
    table.update(keys[:3], torch.ones(3, 2, dtype=torch.float64))
    assert table._live.rows.index.count == 3 and len(table.values()) == 3


def _table_rows(db: relsql.Database, width: int) -> dict:
    """The embedding table as plain SQL reads it: {key: (e.., a..)}."""
    rows = db.con.execute("SELECT * FROM relsql_embedding_w").fetchall()
    assert len({r[0] for r in rows}) == len(rows)  # one row per key
    return {r[0]: np.array(r[1:]) for r in rows}


@pytest.mark.parametrize("optimizer", ["sgd", "adagrad"])
def test_steps_reach_the_table_at_a_flush_exactly_as_a_numpy_replay(optimizer):
    """Random batches of steps: the table (read by plain SQL) is untouched between flushes and,
    after one, holds exactly the replayed rows and the step counter; a new object on the table
    (another model) sees every step; rows trained past a snapshot are undone by its restore."""
    db = relsql.connect()
    table = DatabaseEmbedding(db, "w", 3, pa.int64(), seed=5, optimizer=optimizer, lr=0.3)
    rng = np.random.default_rng(1)
    e: dict[int, np.ndarray] = {}
    a: dict[int, np.ndarray] = {}

    def train(steps: int) -> None:
        for _ in range(steps):
            keys = np.unique(rng.integers(0, 500, int(rng.integers(1, 80))))
            grad = rng.normal(size=(len(keys), 3))
            fetched = table.fetch(pa.array(keys)).numpy()
            start = initial_values(pa.array(keys), 3, 5)
            for i, k in enumerate(keys.tolist()):
                e.setdefault(k, start[i].copy())
                a.setdefault(k, np.zeros(3))
                assert np.allclose(fetched[i], e[k], rtol=1e-12, atol=0)
                if optimizer == "sgd":
                    e[k] = e[k] - 0.3 * grad[i]
                else:
                    a[k] = a[k] + grad[i] ** 2
                    e[k] = e[k] - 0.3 * grad[i] / (np.sqrt(a[k]) + 1e-10)
            table.update(pa.array(keys), torch.from_numpy(grad))

    def check(step: int, values: dict | None = None, state: dict | None = None) -> None:
        values, state = (e, a) if values is None else (values, state)
        stored = _table_rows(db, 3)
        assert stored.keys() == values.keys()
        assert all(np.allclose(stored[k], np.r_[values[k], state[k]], rtol=1e-9, atol=1e-12) for k in values)
        assert db.con.execute("SELECT step FROM relsql_embedding_steps WHERE weight = 'w'").fetchone()[0] == step

    train(30)
    assert _table_rows(db, 3) == {}  # nothing reached the table yet
    assert table.snapshot() == 30  # a checkpoint's copy flushes first
    check(30)
    saved = ({k: v.copy() for k, v in e.items()}, {k: v.copy() for k, v in a.items()})
    train(12)
    check(30, *saved)  # the steps past the flush are not in the table yet...
    other = DatabaseEmbedding(db, "w", 3, None, seed=5, optimizer=optimizer, lr=0.3)
    assert other.step() == 42  # ...until another object opens it
    check(42)
    train(5)  # this one takes the table back (its rows reloaded: the other's object held none)
    assert table.step() == 47
    check(47)
    assert table.restore(30) == 30 and table.step() == 30
    e, a = saved
    check(30)
    train(4)
    assert table.rows() == len(e)
    check(34)


@pytest.mark.slow
def test_a_killed_process_leaves_the_table_at_a_step_and_resumes_to_the_uninterrupted_run(tmp_path):
    """SIGKILL mid-epoch (no handler runs): the table is exactly its step counter's updates in,
    and a new process resuming from the checkpoint ends where a run never killed ends."""
    path, checkpoint = tmp_path / "shop.duckdb", tmp_path / "run.ckpt"
    kwargs = dict(target="item.y", seed=0, dtype=torch.float64, progress=False, batch_size=50, embedding_optimizer="sgd")
    script = textwrap.dedent(f"""
        import sys, time, warnings, torch, relsql
        warnings.simplefilter("ignore")
        sys.path.insert(0, {str(ROOT)!r})
        from tests.test_batches import shop_template
        db = relsql.connect({str(path)!r})
        model = relsql.Model(db, shop_template("database"), **{kwargs!r})
        steps = []

        def hold(info):  # after 55 steps (a checkpoint every 15 and at the epoch's end): stop here until killed
            steps.append(info)
            if len(steps) == 55:
                print("holding", flush=True)
                time.sleep(600)

        model.fit(epochs=3, patience=100, lr=0.02, checkpoint={str(checkpoint)!r}, checkpoint_every=15, callback=hold)
    """)
    with relsql.connect(path) as db:
        db.execute("CREATE TABLE users AS SELECT i AS user_id, (i % 50) * 1.0 AS age FROM range(300) t(i)")
        db.execute("CREATE TABLE item AS SELECT i AS id, (i * 7919) % 300 AS user_id, (i % 13) * 0.1 AS x, "
                   "((i * 7919) % 300) % 3 = 0 AS y FROM range(2000) t(i)")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert proc.stdout.readline().strip() == "holding", proc.stderr.read()
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    with relsql.connect(path) as db:
        step = db.con.execute("SELECT step FROM relsql_embedding_steps WHERE weight = 'user'").fetchone()[0]
        stored = {r[0]: np.array(r[1:])
                  for r in db.con.execute("SELECT * EXCLUDE (a0, a1, a2, a3) FROM relsql_embedding_user").fetchall()}
    assert 0 < step <= 55

    class Stop(Exception):
        pass

    taken = []

    def stop_at(info):
        taken.append(info)
        if len(taken) == step:
            raise Stop

    memory = quiet(relsql.Model, shop_db(), shop_template("memory"), **kwargs)
    reference = quiet(relsql.Model, shop_db(), shop_template("database"), **kwargs)
    values = memory.batched.grounder.dictionary_tables["user"]["value"]
    with torch.no_grad():
        memory.net.named_weights()["user"].copy_(reference.batched.store("user", values.type).fetch(values.combine_chunks()))
    with pytest.raises(relsql.RelsqlError, match="raised Stop"):
        quiet(memory.fit, epochs=3, patience=100, lr=0.02, callback=stop_at)
    codes = {v: i for i, v in enumerate(values.to_pylist())}
    in_memory = memory.net.named_weights()["user"].detach()
    assert stored and all(np.allclose(v, in_memory[codes[k]].numpy(), rtol=1e-9, atol=1e-12) for k, v in stored.items())

    quiet(reference.fit, epochs=3, patience=100, lr=0.02)
    with relsql.connect(path) as db:
        again = quiet(relsql.Model, db, shop_template("database"), **kwargs)
        quiet(again.fit, epochs=3, patience=100, lr=0.02, checkpoint=checkpoint, resume=True)
        assert [h["train_loss"] for h in again.history] == pytest.approx([h["train_loss"] for h in reference.history], rel=1e-9)
        ours, theirs = again.batched.stores["user"], reference.batched.stores["user"]
        assert ours.step() == theirs.step() > 55
        a, b = ours.values(), theirs.values()
        assert a.keys() == b.keys() and all(np.allclose(a[k], b[k], rtol=1e-9, atol=1e-12) for k in a)


def test_the_best_epochs_copy_is_made_only_when_the_table_changes_and_restores_exactly():
    """The best epoch's (temp) copy is noted, not written, while the table stays as it was; any
    write-back first makes it; either way restoring it gives back exactly the rows and step,
    and a checkpoint's kept best copy holds them too."""
    db = relsql.connect()
    table = DatabaseEmbedding(db, "w", 2, pa.int64(), seed=2, optimizer="adagrad", lr=0.5)
    keys = pa.array(np.arange(40, dtype=np.int64))

    def train(steps: int) -> None:
        for i in range(steps):
            picked = keys[i % 4 * 10:(i % 4 + 1) * 10]
            table.fetch(picked)
            table.update(picked, torch.full((10, 2), 0.1 * (i + 1), dtype=torch.float64))

    def same(a: dict, b: dict) -> bool:
        return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)

    def kept(step: int) -> dict:
        return {r[0]: np.array(r[1:-1]) for r in db.con.execute(f'SELECT * FROM "relsql_embedding_w_best_{step}"').fetchall()}

    def temp_tables() -> list[str]:
        return [r[0] for r in db.con.execute("SELECT table_name FROM duckdb_tables() WHERE temporary").fetchall()]

    train(6)
    best = table.best_table()
    assert table.snapshot(best) == 6 and best.name not in temp_tables()  # noted only
    at_best = _table_rows(db, 2)
    train(3)
    assert table.restore(best) == 6 and same(_table_rows(db, 2), at_best) and table.step() == 6
    train(2)  # from the best rows again
    assert table.snapshot(best) == 8
    at_best = _table_rows(db, 2)
    train(3)
    assert table.snapshot() == 11  # a checkpoint's write-back: the best copy is made first
    assert best.name in temp_tables()
    assert table.keep_best() == 8 and same(kept(8), at_best)
    assert table.restore(best) == 8 and same(_table_rows(db, 2), at_best) and table.step() == 8
    train(1)
    assert table.snapshot(best) == 9 and best.name not in temp_tables()
    assert table.keep_best() == 9 and same(kept(9), _table_rows(db, 2))  # made from the table, which is that copy
    table.drop(best)
    assert best.name not in temp_tables() and table.step() == 9


def test_a_fit_stopped_by_its_callback_leaves_every_step_in_the_table(tmp_path):
    """A callback that raises stops training mid-epoch, before any epoch-end copy or read of the
    table; the trainer still writes the rows trained ahead of it back before fit() raises, so a
    raw SQL read in the same process sees the step counter at the steps the callback counted."""
    path = tmp_path / "shop.duckdb"

    class Stop(Exception):
        pass

    def stop_at_7(info):
        steps.append(info)
        if len(steps) == 7:
            raise Stop

    with relsql.connect(path) as db:
        model = _users_items_model(db)
        steps = []
        with pytest.raises(relsql.RelsqlError, match="raised Stop"):
            quiet(model.fit, epochs=2, lr=0.02, callback=stop_at_7)
        stored = db.con.execute("SELECT step FROM relsql_embedding_steps WHERE weight = 'user'").fetchone()[0]
        assert stored == len(steps) == 7


def test_a_write_back_that_fails_while_fit_raises_leaves_fits_error_with_a_note(tmp_path):
    """The callback closes the connection and raises: the trainer's write-back then fails too. The
    user sees the callback's own error (relsql's, naming it and chaining it; not the connection's),
    with a note that the trained rows did not reach the table."""
    path = tmp_path / "shop.duckdb"

    class Stop(Exception):
        pass

    def close_and_stop(info):
        steps.append(info)
        if len(steps) == 3:
            db.con.close()
            raise Stop

    db = relsql.connect(path)
    model = _users_items_model(db)
    steps = []
    with pytest.raises(relsql.RelsqlError, match="raised Stop") as caught:
        quiet(model.fit, epochs=2, lr=0.02, callback=close_and_stop)
    notes = getattr(caught.value, "__notes__", [])
    assert isinstance(caught.value.__cause__, Stop)
    assert len(notes) == 1 and "did not reach their table" in notes[0]


def _users_items_model(db):
    """300 users, 2,000 items whose label follows their user; a database-stored user embedding, batches of 100."""
    db.execute("CREATE TABLE users AS SELECT i AS user_id, (i % 50) * 1.0 AS age FROM range(300) t(i)")
    db.execute("CREATE TABLE item AS SELECT i AS id, (i * 7919) % 300 AS user_id, (i % 13) * 0.1 AS x, "
               "((i * 7919) % 300) % 3 = 0 AS y FROM range(2000) t(i)")
    return relsql.Model(db, shop_template("database"), target="item.y", seed=0, progress=False, batch_size=100,
                        embedding_optimizer="sgd")
