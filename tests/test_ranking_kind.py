"""Ranking as its own learner kind (#43): what fit does by default with a ranking target, and what
it refuses, is declared by the ranking learner (lr, patience, rows per step, no GBM blend, one
process), not by tests of `task.kind` around the code. The figures are fit's documented defaults
(relsql/train/options.py: lr 0.01 and patience 100 for a label, 0.03 and 16 for a ranking; a ranking
step of 4096 target rows, or a quarter of fewer training rows but at least 256)."""

from __future__ import annotations

import math
from collections import Counter

import pytest

import relsql
from relsql.errors import RelsqlError
from relsql.train import fitting
from tests.test_auto_ranking import _shop as ranking_shop
from tests.test_trainer import customers


@pytest.fixture
def configs(monkeypatch):
    """The FitConfig each of fit's Trainers got, in order."""
    seen = []
    original = fitting.train

    def spy(learner, config, *args, **kwargs):
        seen.append(config)
        return original(learner, config, *args, **kwargs)

    monkeypatch.setattr(fitting, "train", spy)
    return seen


@pytest.fixture(scope="module")
def ranking():
    db = relsql.connect()
    ranking_shop(db)
    template = relsql.Template.auto(db, "task_rec.item_id", time_column="snapshot", width=8, hops=1)
    yield relsql.Model(db, template, target="task_rec.item_id", time_column="snapshot", seed=0, progress=False)
    db.close()


def test_a_ranking_fits_with_its_own_defaults(ranking, configs):
    ranking.fit(epochs=1)
    config = configs[-1]
    train_rows = len(ranking.rows["train"])
    assert train_rows < 4096
    assert (config.lr, config.patience, config.hybrid) == (0.03, 16, False)
    assert config.batch_size == max(256, -(-train_rows // 4))


def test_a_label_target_fits_with_the_label_defaults(configs):
    db = customers()
    template = relsql.Template.auto(db, "customer.churned", hops=1, width=4)
    model = relsql.Model(db, template, target="customer.churned", seed=0, progress=False)
    model.fit(epochs=1)
    config = configs[-1]
    assert (config.lr, config.patience, config.batch_size, config.hybrid) == (0.01, 100, None, True)


def test_a_ranking_refuses_a_blend_and_workers(ranking):
    with pytest.raises(RelsqlError, match="a ranking target has none: drop hybrid="):
        ranking.fit(epochs=1, hybrid=True)
    with pytest.raises(RelsqlError, match="is a ranking target, which trains in one process.*drop workers="):
        ranking.fit(epochs=1, workers=2)


def test_a_rankings_baseline_is_the_most_popular_candidates(ranking):
    """Model.baseline of a ranking target (it raised AttributeError: 'RankingTask' object has no
    attribute 'scores'): the training rows' 10 most bought items, recommended to every validation
    row, scored in plain Python from the task table (ties in popularity by the candidate relation's
    row order)."""
    from relsql.train.search import labelled_keys
    from tests.test_ranking import naive_metrics

    keys = [key[0] for key in labelled_keys(ranking.learner)]
    lists = dict(ranking.db.con.execute("SELECT task_id, item_id FROM task_rec WHERE len(item_id) > 0").fetchall())
    counts = Counter(item for p in ranking.rows["train"] for item in set(lists[keys[p]]))
    order = ranking.learner.goal.candidate_keys.sort_by("_rid").column("item_id").to_pylist()
    top = sorted(order, key=lambda item: (-counts[item], order.index(item)))[:10]
    truth = {keys[p]: set(lists[keys[p]]) for p in ranking.rows["val"]}
    expected = naive_metrics({row: top for row in truth}, truth, 10)
    found = ranking.baseline("val")
    assert found.keys() >= expected.keys()
    for name, value in expected.items():
        assert math.isclose(found[name], value, rel_tol=1e-9), name
    with pytest.raises(RelsqlError, match="split 'nope' has no rows"):
        ranking.baseline("nope")
