"""bench/blend_replay.py: a recorded run replays to what relsql computed (slow: one default fit)."""

from __future__ import annotations

import json

import pytest

import relsql
from bench import blend_replay, outside_hostile
from relsql.train.gbm import baselines, hybrid

pytestmark = pytest.mark.slow


def test_a_recorded_run_replays_to_the_blend_and_the_baseline_relsql_computed(tmp_path):
    outside_hostile.generate(0, tmp_path / "corpus", small=True)
    manifest = tmp_path / "corpus" / "hostile_0.json"
    info = blend_replay.record(manifest, 2, tmp_path / "runs", {}, {"epochs": 30})
    runs = blend_replay.load([tmp_path / "runs"])
    assert len(runs) == 1
    run, arrays = runs[0]
    assert run["metric"] == "roc_auc" and info["weight"] is not None
    # the replay picks the weight relsql's blend picked, and scores the blend as evaluate() did
    assert blend_replay.picked(run, arrays) == run["weight"]
    assert blend_replay.check(runs) == []
    # the one-hop GBM replayed scores as relsql's own baseline report on the same split
    entry = json.loads(manifest.read_text())
    db = relsql.connect(entry["path"], read_only=True, **({"keys": entry["keys"]} if entry.get("keys") else {}))
    try:
        options = {"time_column": entry["targets"][0]["time_column"]}
        model = relsql.Model(db, relsql.Template.auto(db, target="item.label", **options), target="item.label", seed=2,
                             progress=False, **options)
        expected = baselines.compare(model.learner)["gbm_one_hop"]["roc_auc"]
    finally:
        db.close()
    replayed = blend_replay.score(run, arrays["gbm1_test"], arrays["y_test"])
    assert replayed == pytest.approx(expected, abs=1e-12)
    table = blend_replay.replay(runs)
    assert table["GBM alone"]["all"]["runs"] == 1
    assert table["picked"]["all"]["at_least_one_hop"] == int(info["scores"]["roc_auc"] >= expected - 1e-12)


def test_a_candidates_out_of_fold_output_for_a_row_never_reads_that_rows_label(tmp_path):
    """out_of_fold: a row's output comes from a GBM fitted without it, so changing that row's label
    changes every fold's model but its own (other rows' outputs move, its own does not), and every
    candidate is recorded with its out-of-fold outputs on the training and validation rows."""
    outside_hostile.generate(1, tmp_path / "corpus", small=True)
    entry = json.loads((tmp_path / "corpus" / "hostile_1.json").read_text())
    db = relsql.connect(entry["path"], read_only=True, **({"keys": entry["keys"]} if entry.get("keys") else {}))
    try:
        target = entry["targets"][0]
        options = {"time_column": target["time_column"]} if target.get("time_column") else {}
        model = relsql.Model(db, relsql.Template.auto(db, target=target["target"], **options), target=target["target"],
                             seed=0, progress=False, **options)
        learner = model.learner
        candidate = hybrid.candidates(learner)[0]
        before = blend_replay.out_of_fold(learner, candidate)
        rows = list(learner.rows["train"]) + list(learner.rows["val"])
        assert before.shape == (len(rows), learner.task.units)
        changed = 3
        learner.y[rows[changed]] = 1 - learner.y[rows[changed]]  # a binary label flipped
        after = blend_replay.out_of_fold(learner, candidate)
        assert after[changed] == pytest.approx(before[changed], abs=0)
        assert not (after == before).all()
    finally:
        db.close()
