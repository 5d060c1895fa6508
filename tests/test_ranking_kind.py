"""Ranking as its own learner kind (#43): what fit does by default with a ranking target, and what
it refuses, is declared by the ranking learner (lr, patience, rows per step, no GBM blend, one
process), not by tests of `task.kind` around the code; so are what the model answers with
(predict or recommend), its evaluation, fit's loss options, the report's baselines (the learner),
the history plot and the file's fields (the task). The figures are fit's documented defaults
(relsql/train/loop/options.py: lr 0.01 and patience 100 for a label, 0.03 and 16 for a ranking; a ranking
step of 4096 target rows, or a quarter of fewer training rows but at least 256)."""

from __future__ import annotations

import math
from collections import Counter

import pytest

import relsql
from relsql.errors import RelsqlError
from relsql.train.loop import fitting
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


def test_a_ranking_takes_the_steps_asked_for(ranking, configs):
    train_rows = len(ranking.rows["train"])
    for steps, size in ((1, train_rows), (3, -(-train_rows // 3))):
        ranking.fit(epochs=1, steps_per_epoch=steps)
        assert (configs[-1].batch_size, configs[-1].whole_net) == (size, True)


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
    from relsql.train.model.search import labelled_keys
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


# -------------------------------------------------------------- what the task and the learner declare, not a kind test
KIND_FACTORIES = {"relsql/train/model/build.py", "relsql/train/persist/saved.py"}  # task="ranking", a file's task kind: the class


def _ranking_kind_tests() -> dict[str, list[int]]:
    """Per module of relsql/ outside relsql/train/ranking/, the lines comparing something with the
    string "ranking" (==, !=, in, not in; also inside a tuple or list) or calling isinstance with a
    Ranking* class: read with `ast`, so comments and messages do not count."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    found: dict[str, list[int]] = {}

    def names_ranking(node: ast.AST) -> bool:
        if isinstance(node, ast.Constant):
            return node.value == "ranking"
        return isinstance(node, ast.Tuple | ast.List | ast.Set) and any(names_ranking(e) for e in node.elts)

    for path in sorted((root / "relsql").rglob("*.py")):
        name = path.relative_to(root).as_posix()
        if name.startswith("relsql/train/ranking/"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            hit = isinstance(node, ast.Compare) and any(names_ranking(n) for n in (node.left, *node.comparators))
            hit = hit or (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "isinstance"
                          and len(node.args) == 2 and "Ranking" in ast.unparse(node.args[1]))
            if hit:
                found.setdefault(name, []).append(node.lineno)
    return found


def test_generic_modules_ask_the_learner_not_the_ranking_kind():
    """Outside relsql/train/ranking/ the ranking kind is named only where a kind is chosen: build.py
    (Model's task= and the target's reference pick RankingLearner) and saved.py (a model file's task
    kind picks RankingTask). Everything else asks what the learner or the task declares (answers,
    evaluate, recommend, fit_settings, baseline_lines, plots_history, saved_fields)."""
    found = _ranking_kind_tests()
    assert "relsql/train/model/build.py" in found  # the scan does find the factories' tests
    assert set(found) <= KIND_FACTORIES, {name: lines for name, lines in found.items() if name not in KIND_FACTORIES}


def test_a_task_that_plots_no_history_saves_no_plot_and_leaves_its_place_alone(ranking, tmp_path):
    """Model.save plots the history beside the file where the task declares it (Task.plots_history; a
    ranking task's is False). With the default a file of the user's where the plot goes is refused;
    a label task that declares no plot saves without one, and that file is left as it was."""
    db = customers()
    template = relsql.Template.auto(db, "customer.churned", hops=1, width=4)
    model = relsql.Model(db, template, target="customer.churned", seed=0, progress=False).fit(epochs=2)
    assert model.save(tmp_path / "plotted.pt").with_suffix(".png").stat().st_size > 1000
    mine = tmp_path / "mine.png"
    mine.write_bytes(b"the user's picture")
    with pytest.raises(RelsqlError, match="mine.png"):
        model.save(tmp_path / "mine.pt")
    model.task.plots_history = False
    assert model.save(tmp_path / "mine.pt").exists() and mine.read_bytes() == b"the user's picture"
    assert model.save(tmp_path / "bare.pt").exists() and not (tmp_path / "bare.png").exists()
    if not ranking.history:
        ranking.fit(epochs=1)
    assert ranking.save(tmp_path / "rec.pt").exists() and not (tmp_path / "rec.png").exists()


def test_the_report_writes_the_baselines_the_learner_declares(ranking, monkeypatch):
    """text_report asks the learner for its baseline lines (Learner.baseline_lines, given the model's
    score on the task's metric); None, a label learner's, means the label baselines."""
    db = customers()
    template = relsql.Template.auto(db, "customer.churned", hops=1, width=4)
    model = relsql.Model(db, template, target="customer.churned", seed=0, progress=False).fit(epochs=2)
    assert "majority class of the training rows" in model.report()
    monkeypatch.setattr(model.learner, "baseline_lines", lambda split, ours: [f"  baseline (declared) on {split}: {ours:.6f}"])
    lines = model.report().splitlines()
    assert [line for line in lines if "baseline" in line] == [
        f"  baseline (declared) on test: {model.evaluate('test')[model.task.metric]:.6f}"]
    if not ranking.history:
        ranking.fit(epochs=1)
    popular = ranking.baseline("test")
    assert f"  baseline (the 10 most popular candidates of the training rows) on test: map@10 {popular['map@10']:.4f}" \
        in ranking.report()
