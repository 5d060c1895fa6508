"""relsql.Model's interface is declared: every public attribute a user reads is on the class (with a
docstring), so help(), dir() and IDEs show it; nothing is read through from the learner by name."""

from __future__ import annotations

import inspect

import pytest

import relsql
from relsql.train.learner.learner import Learner


def test_model_has_no_read_through():
    assert "__getattr__" not in vars(relsql.Model)
    assert all("__getattr__" not in vars(base) for base in relsql.Model.__mro__ if base is not object)


def test_every_declared_attribute_is_documented_and_read_only():
    declared = {name: value for base in relsql.Model.__mro__ for name, value in vars(base).items()
                if isinstance(value, property) and not name.startswith("_")}
    for must in ("target", "task", "rows", "y", "net", "history", "best_epoch", "stopped", "timings", "trials", "hybrid", "spec"):
        assert must in declared and must in dir(relsql.Model), must
    for name, prop in declared.items():
        assert prop.__doc__ and prop.fset is None, name


def test_declared_attributes_are_the_learners():
    db = relsql.connect(":memory:")
    db.con.execute("CREATE TABLE item (id INTEGER PRIMARY KEY, x DOUBLE, y DOUBLE)")
    db.con.execute("INSERT INTO item SELECT i, i / 10, (i % 7) / 7 FROM range(60) t(i)")
    model = relsql.Model(db, relsql.Template.auto(db, "item.y"), "item.y", progress=False)
    learner = model.learner
    assert isinstance(learner, Learner)
    for name in ("target", "table", "column", "task", "rows", "fractions", "seed", "dtype"):
        assert getattr(model, name) is getattr(learner, name) or getattr(model, name) == getattr(learner, name), name
    for name in ("history", "timings", "best_epoch", "stopped", "monitor", "epoch_cap", "time_budget"):
        assert getattr(model, name) is getattr(learner.record, name), name  # the record of training, its one place
    assert model.target == "item.y" and model.column == "y"
    with pytest.raises(AttributeError):
        model.goal  # noqa: B018 - the learner's own members stay the learner's
    with pytest.raises(AttributeError):
        model.history = []
    assert inspect.signature(relsql.Model.parameters).parameters.keys() == {"self"}


def test_the_trainer_asks_its_strategy_only_what_strategy_declares():
    import re
    from pathlib import Path

    from relsql.train.loop import distributed, trainer
    from relsql.train.loop.strategy import Strategy

    asked = set(re.findall(r"strategy\.(\w+)", Path(trainer.__file__).read_text()))
    assert asked and asked <= set(dir(Strategy)), asked - set(dir(Strategy))
    for kind in (trainer.OneProcess, distributed.Ranks):
        assert issubclass(kind, Strategy) and not kind.__abstractmethods__, kind
