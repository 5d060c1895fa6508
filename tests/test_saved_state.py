"""The saved state (relsql/train/persist/saved.py): a model file round-trips field by field, a file of the
current format written by hand (not by `saved.write`) loads to the same predictions, and damaged,
crafted or foreign files are refused with a RelsqlError before anything in them runs."""

from __future__ import annotations

import pickle

import numpy as np
import pyarrow as pa
import pytest
import torch

import relsql
from relsql.train.persist import checkpoint as files
from relsql.train.persist import saved
from relsql.train.persist.saved import ModelState
from tests.test_trainer import TEMPLATE, customers

FIELDS = [f for f in ModelState.__dataclass_fields__ if f not in ("labelled", "y", "device")]  # what a file holds


def with_spend(db: relsql.Database) -> relsql.Database:
    db.execute("ALTER TABLE customer ADD COLUMN spend DOUBLE")
    db.execute("UPDATE customer SET spend = (SELECT sum(amount) FROM orders o WHERE o.customer_id = customer.customer_id) "
               "* 3 + 1")
    return db


def trained(kind: str) -> relsql.Model:
    """binary: full batch; regression: mini-batches with a fan-out, a time split, an SGD embedding setting."""
    if kind == "binary":
        m = relsql.Model(customers(), relsql.Template.from_sql(TEMPLATE), "customer.churned", seed=5, dtype=torch.float64,
                         progress=False, split=(0.6, 0.2, 0.2))
    else:
        m = relsql.Model(with_spend(customers()), relsql.Template.from_sql(TEMPLATE), "customer.spend", seed=7,
                         progress=False, batch_size=64, fanout={"predict": 3}, time_column="signup",
                         embedding_optimizer="sgd", embedding_lr=0.2)
    m.fit(epochs=2, lr=0.05)
    return m


def assert_same(field: str, a: object, b: object) -> None:
    if field == "template":
        assert (a.source, a.language) == (b.source, b.language)
    elif field == "task":
        assert (a.kind, a.classes, a.mean, a.std) == (b.kind, b.classes, b.mean, b.std)
    elif field == "split":
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    elif field == "presets":
        assert a.dictionaries.keys() == b.dictionaries.keys()
        assert all(a.dictionaries[k].equals(b.dictionaries[k]) for k in a.dictionaries)
        assert a.feature_stats == b.feature_stats
    elif field in ("weights", "head"):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), field
    else:
        assert a == b, field


@pytest.mark.parametrize("kind", ["binary", "regression"])
def test_a_saved_state_reads_back_field_by_field(kind, tmp_path):
    m = trained(kind)
    state = ModelState.of(m.learner)
    assert state.history and state.weights and (kind == "regression") == (state.task.kind == "regression")
    read = saved.read(saved.write(state, tmp_path / "m.pt"))
    for name in FIELDS:
        assert_same(name, getattr(read, name), getattr(state, name))
    assert read.labelled is None and read.y is None  # the labels stay in the database


def test_model_load_predicts_what_the_saved_model_predicted(tmp_path):
    m = trained("binary")
    path = m.save(tmp_path / "m.pt")
    loaded = relsql.Model.load(path, m.db)
    assert loaded.predict().equals(m.predict())
    assert loaded.best_epoch == m.best_epoch and loaded.history == m.history
    assert loaded.evaluate("test") == m.evaluate("test")
    for name, weight in m.named_weights().items():
        assert torch.equal(weight.detach(), loaded.named_weights()[name].detach()), name


def by_hand(m: relsql.Model) -> dict:
    """Format 3 written out field by field from the model's public members, not through saved.write."""
    learner, task = m.learner, m.task
    encodings = learner.encodings()
    return {
        "template": m.template.source, "language": "sql", "target": "customer.churned", "output": "predict",
        "time_column": None, "fractions": (0.6, 0.2, 0.2), "seed": 5, "dtype": "float64",
        "task": {"kind": "binary", "classes": files.table_bytes(pa.table({"value": pa.array(task.classes)})),
                 "mean": 0.0, "std": 1.0},
        "rows": {k: torch.as_tensor(v, dtype=torch.int64) for k, v in m.rows.items()},
        "dictionaries": {w: files.table_bytes(t) for w, t in encodings.dictionaries.items()},
        "feature_stats": {k: {kk: (float(vv) if isinstance(vv, float | np.floating) else vv) for kk, vv in v.items()}
                          for k, v in encodings.feature_stats.items()},
        "weights": {n: w.detach().clone() for n, w in m.net.weights_by_name().items()},
        "head": {k: v.detach().clone() for k, v in learner.head.state_dict().items()},
        "history": [{k: float(v) if k != "epoch" else int(v) for k, v in h.items()} for h in m.history],
        "best_epoch": m.best_epoch, "batch_size": None, "fanout": None, "embedding_optimizer": None, "embedding_lr": 0.1,
    }


def test_a_file_of_the_current_format_written_by_hand_loads(tmp_path):
    m = trained("binary")
    path = files.write(tmp_path / "hand.pt", "relsql-model-3", by_hand(m), "model file")
    loaded = relsql.Model.load(path, m.db)
    assert loaded.predict().equals(m.predict())
    assert loaded.task.classes == [False, True] and [len(v) for v in loaded.rows.values()] == [len(v) for v in m.rows.values()]


def tampered(m: relsql.Model) -> dict[str, dict]:
    """One change per case to a valid file's contents, each a damage the reader must name."""
    good = by_hand(m)
    cases = {
        "negative seed": {"seed": -1},
        "integer dtype": {"dtype": "int8"},
        "output not a relation": {"output": "nowhere"},
        "foreign weight": {"weights": {**good["weights"], "w_evil": torch.zeros(2)}},
        "integer weight": {"weights": {k: torch.zeros(v.shape, dtype=torch.int64) for k, v in good["weights"].items()}},
        "split of floats": {"rows": {**good["rows"], "train": good["rows"]["train"].double()}},
        "classes not Arrow": {"task": {**good["task"], "classes": b"not arrow"}},
        "zero std": {"task": {**good["task"], "std": 0.0}},
        "unknown task": {"task": {**good["task"], "kind": "ranking"}},
        "bad language": {"language": "python"},
        "template not text": {"template": 42},
        "missing field": None,
        "fanout for no relation": {"fanout": {"nowhere": 2}},
        "fractions not summing to 1": {"fractions": (0.9, 0.9, 0.9)},
        "target without a column": {"target": "customer"},
        "negative embedding_lr": {"embedding_lr": -1.0},
        "feature std zero": {"feature_stats": {k: {**v, "std": 0.0} for k, v in good["feature_stats"].items()}},
        "head of another shape": {"head": {k: torch.zeros(7, 7, dtype=torch.float64) for k in good["head"]}},
    }
    out = {}
    for name, change in cases.items():
        state = dict(good)
        if change is None:
            del state["rows"]
        else:
            state.update(change)
        out[name] = state
    assert good["feature_stats"], "the template has features, so the feature case changes something"
    return out


def test_tampered_files_are_refused_with_a_relsql_error(tmp_path):
    m = trained("binary")
    for name, state in tampered(m).items():
        path = files.write(tmp_path / "t.pt", "relsql-model-3", state, "model file")
        with pytest.raises(relsql.RelsqlError, match=r"t\.pt") as caught:
            relsql.Model.load(path, m.db)
        assert "Traceback" not in str(caught.value), name


class Ran:
    """Unpickling this would create a file: proof that loading ran code."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_foreign_and_crafted_files_are_refused_before_anything_runs(tmp_path):
    m = trained("binary")
    good = m.save(tmp_path / "good.pt").read_bytes()
    marker = tmp_path / "ran"
    foreign = {
        "truncated": good[: len(good) // 2],
        "random bytes": np.random.default_rng(0).bytes(4096),
        "empty": b"",
        "code": pickle.dumps({"format": "relsql-model-3", "x": Ran(str(marker))}),
    }
    for name, data in foreign.items():
        (tmp_path / f"{name}.pt").write_bytes(data)
    torch.save({"weights": torch.zeros(2)}, tmp_path / "plain torch.pt")
    files.save(tmp_path / "checkpoint.pt", {"epoch": 1})
    files.write(tmp_path / "older.pt", "relsql-model-2", {"template": "x"})
    for path in sorted(tmp_path.glob("*.pt")):
        if path.name == "good.pt":
            continue
        with pytest.raises(relsql.RelsqlError) as caught:
            relsql.Model.load(path, m.db)
        assert path.name in str(caught.value), (path.name, str(caught.value))
    assert not marker.exists()  # nothing in a file ran
    assert "format 'relsql-checkpoint-2'" in _error(tmp_path / "checkpoint.pt", m.db)
    assert "train and save again" in _error(tmp_path / "older.pt", m.db)


def _error(path, db) -> str:
    with pytest.raises(relsql.RelsqlError) as caught:
        relsql.Model.load(path, db)
    return str(caught.value)
