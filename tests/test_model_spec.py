"""`relsql.ModelSpec` (relsql/train/model/spec.py): every argument of `Model(db, ...)` is in the spec and
reaches it, `model.spec` rebuilds the same model with `Model.from_spec`, `replace` changes what it
names and refuses what is not an argument, and search's trials keep a ranking target's
`candidates=` and `pairs=` (they were dropped when search listed Model's arguments itself)."""

from __future__ import annotations

import dataclasses
import inspect

import numpy as np
import pytest
import torch

import relsql
from relsql.errors import RelsqlError
from relsql.train.model import build as building
from relsql.train.model import search as searching
from relsql.train.model.spec import ModelSpec
from tests.test_ranking_pairs import BASE, PAIR, habit_shop


def _init_parameters() -> dict[str, inspect.Parameter]:
    parameters = dict(inspect.signature(relsql.Model.__init__).parameters)
    assert list(parameters)[:2] == ["self", "db"]
    return {name: p for name, p in parameters.items() if name not in ("self", "db")}


def test_the_spec_has_every_argument_of_model_in_order_with_its_default():
    parameters = _init_parameters()
    fields = {f.name: f for f in dataclasses.fields(ModelSpec)}
    assert list(fields) == list(parameters)
    for name, parameter in parameters.items():
        default = fields[name].default
        expected = inspect.Parameter.empty if default is dataclasses.MISSING else default
        assert parameter.default == expected, name
    assert relsql.ModelSpec is ModelSpec and "ModelSpec" in relsql.__all__


def test_the_learner_is_built_from_the_spec_whole(monkeypatch):
    """Model._build hands build.learner the spec itself (no second list of Model's arguments), and
    Model.load's settings become a spec too (build.saved_spec)."""
    assert list(inspect.signature(building.learner).parameters) == ["db", "spec", "loading"]
    seen = []
    monkeypatch.setattr(building, "learner", lambda db, spec, loading=None: seen.append((db, spec)))
    db, spec = relsql.connect(":memory:"), ModelSpec("t.sql", "t.y", seed=7, threads=2)
    model = relsql.Model.from_spec(db, spec)
    assert seen == [(db, spec)] and model.threads == 2


def test_every_argument_of_model_reaches_its_spec(monkeypatch):
    """Each argument given a value of its own (no checks run: _build is replaced) arrives in the spec."""
    seen = []
    monkeypatch.setattr(relsql.Model, "_build", lambda self, db, spec: seen.append((db, spec)))
    given = {name: object() for name in _init_parameters()}
    db = object()
    relsql.Model(db, **given)
    (got_db, spec), = seen
    assert got_db is db
    assert all(getattr(spec, name) is value for name, value in given.items())
    assert spec.arguments().keys() == given.keys()


@pytest.fixture(scope="module")
def items():
    db = relsql.connect(":memory:")
    db.con.execute("CREATE TABLE item (id INTEGER PRIMARY KEY, x DOUBLE, y DOUBLE)")
    db.con.execute("INSERT INTO item SELECT i, i / 10, (i % 7) / 7 FROM range(80) t(i)")
    return db


def test_model_spec_is_what_was_built_and_builds_it_again(items):
    template = relsql.Template.auto(items, "item.y")
    model = relsql.Model(items, template, "item.y", split=(0.6, 0.2, 0.2), seed=3, progress=False, threads=1,
                         fanout=5, embedding_lr=0.2)
    spec = model.spec
    assert spec.template is template and spec.target == "item.y"
    assert spec.output == model.output and spec.output in template.relations  # decided by the build, now named
    assert spec.task == "regression" and spec.split == (0.6, 0.2, 0.2) and spec.seed == 3
    assert spec.dtype == torch.float32 and spec.device == torch.device("cpu") and spec.threads == 1
    assert spec.fanout == 5 and spec.embedding_lr == 0.2 and spec.progress is False
    assert spec.candidates is None and spec.pairs is None and spec.allow_target_inputs is False
    with pytest.raises(AttributeError):
        model.spec = spec
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.seed = 4

    again = relsql.Model.from_spec(items, spec)
    assert again.spec == spec
    assert all(np.array_equal(again.rows[s], model.rows[s]) for s in ("train", "val", "test"))
    first, second = model.named_weights(), again.named_weights()
    assert first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)

    other = relsql.Model.from_spec(items, spec.replace(seed=4))
    assert other.spec.seed == 4 and spec.seed == 3
    assert not np.array_equal(np.sort(other.rows["train"]), np.sort(model.rows["train"]))
    assert relsql.Model.from_spec(items, spec.replace(split=(0.5, 0.5, 0.0))).spec.split == (0.5, 0.5, 0.0)


def test_replace_and_from_spec_refuse_what_is_not_a_model_argument(items):
    spec = ModelSpec(relsql.Template.auto(items, "item.y"), "item.y")
    with pytest.raises(RelsqlError, match="epochs is not an argument of relsql.Model"):
        spec.replace(epochs=3)
    with pytest.raises(RelsqlError, match="spec must be a relsql.ModelSpec"):
        relsql.Model.from_spec(items, {"target": "item.y"})
    with pytest.raises(RelsqlError, match="seed"):  # checked when built, as Model's own arguments
        relsql.Model.from_spec(items, spec.replace(seed=-1))


# two candidate towers and two pair relations: the ones a user names are not the ones found by default
# (the last of each)
FIRST = (PAIR.replace("pair_h", "pair_first").replace("linear(count(*), 1)", "linear(count(*), 1, 'first')")
         + "CREATE TABLE item_first AS SELECT i.item_id, embed(i.item_id, 16, 'item_first') AS h FROM item i;\n")


@pytest.fixture(scope="module")
def ranked(tmp_path_factory):
    return habit_shop(tmp_path_factory.mktemp("spec") / "shop.duckdb", customers=20, months=4)


def test_search_trials_keep_candidates_and_pairs(ranked):
    template = relsql.Template.from_sql(FIRST + PAIR + BASE)
    found = relsql.Model(ranked, template, target="task_rec.item_id", time_column="snapshot", progress=False)
    assert (found.task.candidates, found.task.pairs) == ("item_h", "pair_h")  # the defaults differ from the named ones
    model = relsql.Model(ranked, template, target="task_rec.item_id", time_column="snapshot", progress=False,
                         candidates="item_first", pairs="pair_first")
    assert (model.spec.candidates, model.spec.pairs) == ("item_first", "pair_first")
    state = searching.Search(model, 60.0, 1, 1, None, {}, set())
    trial = searching.build(state, searching.Config(0, {"lr": 0.01, "weight_decay": 0.0})).model
    assert (trial.task.candidates, trial.task.pairs) == ("item_first", "pair_first")
    assert trial.spec == model.spec.replace(progress=False, allow_target_inputs=True)
    assert all(np.array_equal(trial.rows[s], model.rows[s]) for s in model.rows)


def test_a_loaded_model_has_the_spec_it_was_saved_with(items, tmp_path):
    model = relsql.Model(items, relsql.Template.auto(items, "item.y"), "item.y", split=(0.6, 0.2, 0.2), seed=3,
                         progress=False, threads=1, fanout=5, embedding_lr=0.2)
    model.fit(epochs=2, time_budget=None)
    loaded = relsql.Model.load(model.save(tmp_path / "m.relsql"), items)
    spec = loaded.spec
    assert spec.template.source == model.template.source
    # what the file keeps comes back; how this process runs it is Model.load's (threads, progress, the store)
    assert spec == model.spec.replace(template=spec.template, threads=None, progress=None, allow_target_inputs=True)
    again = relsql.Model.from_spec(items, spec)
    assert all(np.array_equal(again.rows[s], model.rows[s]) for s in ("train", "val", "test"))
