"""Saved models and checkpoints: loading a file never runs code, and a crash between any two
writes of a checkpoint resumes to the uninterrupted result (database-stored embeddings included)."""

from __future__ import annotations

import os
import pickle

import numpy as np
import pytest
import torch

import relsql
from relsql.train.embeddings.embeddings import DatabaseEmbedding
from tests.test_batches import quiet, shop_db, shop_template
from tests.test_model import SIMPLE, build


class Crash(BaseException):
    """Stands for the process dying: not an Exception, so nothing in relsql handles it."""


class _Payload:
    """Unpickling this calls os.system: what a crafted .pt file does to a weights_only=False load."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    db = build(tmp_path_factory.mktemp("m") / "shop.duckdb")
    model = relsql.Model(db, relsql.Template.from_sql(SIMPLE), target="customer.churned", seed=0, progress=False)
    model.fit(epochs=3)
    return db, model


@pytest.mark.parametrize("how", ["pickle", "torch.save"])
def test_a_crafted_model_file_runs_nothing(trained, tmp_path, how):
    db, _ = trained
    marker = tmp_path / "owned"
    path = tmp_path / "evil.pt"
    state = {"format": "relsql-model-3", "template": _Payload(marker)}
    if how == "pickle":
        path.write_bytes(pickle.dumps(state))
    else:
        torch.save(state, path)
    with pytest.raises(relsql.RelsqlError, match="not a relsql model file"):
        relsql.Model.load(path, db)
    assert not marker.exists()
    checkpoint = tmp_path / "evil.ckpt"
    torch.save({"format": "relsql-checkpoint-2", "weights": _Payload(marker)}, checkpoint)
    model = relsql.Model(db, relsql.Template.from_sql(SIMPLE), target="customer.churned", seed=0, progress=False)
    with pytest.raises(relsql.RelsqlError, match="not a relsql training checkpoint"):
        model.fit(epochs=1, checkpoint=checkpoint, resume=True)
    assert not marker.exists()


def test_a_saved_model_is_plain_data_and_round_trips(trained, tmp_path):
    db, model = trained
    path = model.save(tmp_path / "m.pt")
    torch.load(path, weights_only=True)  # what relsql itself does: plain tensors and values only
    again = relsql.Model.load(path, db)
    assert again.predict().equals(model.predict())


def test_files_that_are_not_models_are_refused_clearly(trained, tmp_path):
    db, model = trained
    text = tmp_path / "notes.pt"
    text.write_text("hello")
    for path, message in [(text, "not a relsql model file"), (tmp_path, "is a folder"),
                          (tmp_path / "missing.pt", "does not exist")]:
        with pytest.raises(relsql.RelsqlError, match=message):
            relsql.Model.load(path, db)
    checkpoint = tmp_path / "c.ckpt"
    torch.save({"format": "relsql-checkpoint-2"}, checkpoint)
    with pytest.raises(relsql.RelsqlError, match="is a relsql file of format 'relsql-checkpoint-2', not a model file"):
        relsql.Model.load(checkpoint, db)
    with pytest.raises(relsql.RelsqlError, match="is a folder"):
        model.save(tmp_path)


def test_a_damaged_model_file_is_a_relsql_error(trained, tmp_path):
    db, model = trained
    path = model.save(tmp_path / "m.pt")
    state = torch.load(path, weights_only=True)
    for field, value in [("fanout", "1; DROP TABLE customer; --"), ("seed", "0"), ("dtype", "int64"), ("rows", {}),
                         ("feature_stats", {"x": {"mean": "0); DROP TABLE customer; --", "std": 1.0}}),
                         ("weights", {"nope": torch.zeros(3)}), ("output", "missing")]:
        bad = dict(state, **{field: value})
        torch.save(bad, tmp_path / "bad.pt")
        with pytest.raises(relsql.RelsqlError):
            relsql.Model.load(tmp_path / "bad.pt", db)
    assert db.arrow('SELECT count(*) AS n FROM "customer"').column(0)[0].as_py() == 300


POINTS = [("snapshot", "after"), ("keep_best", "after"), ("save", "after"), ("drop_checkpoints", "after")]


@pytest.mark.parametrize("point", [p for p, _ in POINTS])
def test_a_crash_between_any_two_checkpoint_writes_resumes_exactly(tmp_path, monkeypatch, point):
    """Checkpoint writes: copy of the table, copy of the best epoch's table, the file, dropping
    older copies. The run dies after one of them (the 3rd checkpoint, mid-epoch); a new model on
    the same database resumes and must end where an uninterrupted run ends: same step count,
    same embeddings, same weights."""
    kwargs = dict(target="item.y", seed=0, dtype=torch.float64, progress=False, batch_size=300)
    straight = quiet(relsql.Model, shop_db(), shop_template("database"), **kwargs)
    quiet(straight.fit, epochs=2, patience=100)
    db = shop_db()
    first = quiet(relsql.Model, db, shop_template("database"), **kwargs)
    path = tmp_path / "run.ckpt"
    calls = []
    if point == "save":
        from relsql.train.persist import checkpoint as checkpoints

        original = checkpoints.save

        def crashing(*args, **kw):
            result = original(*args, **kw)
            calls.append(1)
            if len(calls) == 3:
                raise Crash
            return result

        monkeypatch.setattr(checkpoints, "save", crashing)
    else:
        original = getattr(DatabaseEmbedding, point)

        def crashing(self, *args, **kw):
            result = original(self, *args, **kw)
            if not args or point != "snapshot":  # snapshots to the best copy are not checkpoint writes
                calls.append(1)
                if len(calls) == 3:
                    raise Crash
            return result

        monkeypatch.setattr(DatabaseEmbedding, point, crashing)
    with pytest.raises(Crash):
        quiet(first.fit, epochs=2, patience=100, checkpoint=path, checkpoint_every=1)
    monkeypatch.undo()
    again = quiet(relsql.Model, db, shop_template("database"), **kwargs)
    quiet(again.fit, epochs=2, patience=100, checkpoint=path, resume=True)
    store, reference = again.batched.stores["user"], straight.batched.stores["user"]
    assert store.step() == reference.step()
    assert [h["train_loss"] for h in again.history] == pytest.approx([h["train_loss"] for h in straight.history], rel=1e-9)
    ours, theirs = again.net.named_weights(), straight.net.named_weights()
    assert all(torch.allclose(ours[n], theirs[n], rtol=1e-9, atol=1e-12) for n in theirs)
    a, b = store.values(), reference.values()
    assert a.keys() == b.keys() and all(np.allclose(a[k], b[k], rtol=1e-9, atol=1e-12) for k in a)
    copies = [t for t in db.tables() if t.startswith("relsql_embedding_user_")]
    assert len([t for t in copies if "_checkpoint_" in t]) == 1  # only the copy the file names is kept


def test_training_without_a_checkpoint_leaves_no_copies(tmp_path):
    db = shop_db()
    model = quiet(relsql.Model, db, shop_template("database"), target="item.y", seed=0, dtype=torch.float64,
                  progress=False, batch_size=300)
    calls = []

    def stop(info):
        calls.append(info)
        if len(calls) == 8:  # in the second epoch: the first epoch's best copy exists
            raise Crash

    with pytest.raises(Crash):
        quiet(model.fit, epochs=3, patience=100, callback=stop)
    assert sorted(t for t in db.tables() if t.startswith("relsql_")) == ["relsql_embedding_steps", "relsql_embedding_user"]


@pytest.mark.parametrize("change", [
    lambda o: o["state"][0].__setitem__("exp_avg", torch.zeros(7)),
    lambda o: o["state"][0].__setitem__("step", torch.tensor([-1.0])),
    lambda o: o["state"][0].__setitem__("exp_avg_sq", torch.tensor(float("nan"))),
    lambda o: o["param_groups"][0].__setitem__("betas", {"x": 1}),
    lambda o: o["param_groups"][0].__setitem__("differentiable", True),
    lambda o: o["param_groups"][0].__setitem__("amsgrad", True),  # its buffer is missing: torch's KeyError before
    lambda o: o["param_groups"][0].__setitem__("maximize", None),  # the fused kernel's TypeError before
    lambda o: o["param_groups"][0].__setitem__("weight_decay", True),
])
def test_a_checkpoint_with_a_damaged_optimizer_state_is_refused(trained, tmp_path, change):
    again, path = resumable_after(trained[0], tmp_path / "run.ckpt", lambda state: change(state["optimizers"][0]))
    with pytest.raises(relsql.RelsqlError, match="optimizer state"):
        again.fit(epochs=3, checkpoint=path, resume=True)


def resumable_after(db, path, change) -> tuple[relsql.Model, object]:
    """A fresh model beside the checkpoint of a 2-epoch fit, changed by `change(state)`."""
    model = relsql.Model(db, relsql.Template.from_sql(SIMPLE), target="customer.churned", seed=0, progress=False)
    model.fit(epochs=2, checkpoint=path)
    state = torch.load(path, weights_only=True)
    change(state)
    torch.save(state, path)
    return relsql.Model(db, relsql.Template.from_sql(SIMPLE), target="customer.churned", seed=0, progress=False), path


@pytest.mark.parametrize("change", [
    lambda s: s["history"][0].__setitem__("lr", "other"),  # a TypeError in the refit's plateau replay before
    lambda s: s.__setitem__("batch", torch.full((8, 2), float("nan"))),  # a RuntimeError mid-epoch before
    lambda s: s.__setitem__("epoch", -3),
    lambda s: s.__setitem__("best_epoch", "1"),
    lambda s: s.__setitem__("overfit_worse", -1),
])
def test_a_checkpoint_with_damaged_loop_records_is_refused(trained, tmp_path, change):
    """Found by tests/test_fuzz.py's damaged checkpoints: each now a RelsqlError naming the file."""
    again, path = resumable_after(trained[0], tmp_path / "run.ckpt", change)
    with pytest.raises(relsql.RelsqlError, match="damaged"):
        again.fit(epochs=3, checkpoint=path, resume=True)
