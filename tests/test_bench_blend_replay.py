"""bench/blend_replay.py: a recorded run replays to what relsql computed (slow: one default fit)."""

from __future__ import annotations

import json

import pytest

import relsql
from bench import blend_replay, outside_hostile
from relsql.train.gbm import baselines

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
