"""bench/variants.py: the comparison's arithmetic by hand, and a run that records what the public API
scores in this process, once per (database, seed, variant)."""

from __future__ import annotations

import json

import pytest

from bench import outside_hostile, variants


def _row(database, seed, variant, metric, score, cpu=1.0, gbm=None):
    return {"database": database, "seed": seed, "variant": variant, "metric": metric, "score": score, "cpu": cpu,
            "gbm": gbm}


def test_compare_by_hand():
    runs = [_row("hostile_1", 0, "base", "roc_auc", 0.90, 2.0, gbm=0.92), _row("hostile_1", 0, "wide", "roc_auc", 0.93, 4.0),
            _row("plurel_2", 0, "base", "rmse", 2.0, 1.0, gbm=1.5), _row("plurel_2", 0, "wide", "rmse", 2.5, 3.0),
            _row("plurel_2", 1, "base", "rmse", 1.0, 1.0, gbm=1.2), _row("plurel_2", 1, "wide", "rmse", 1.0, 1.0),
            _row("plurel_3", 0, "wide", "rmse", 1.0)]  # no base run on this pair: left out
    table = variants.compare(runs[1:] + runs[:1])  # the base is the variant that recorded the anchors, not the first row's
    assert list(table) == ["base", "wide"]
    wide = table["wide"]
    assert wide["runs"] == 3 and (wide["better"], wide["worse"]) == (1, 1)
    assert wide["mean"] == pytest.approx((0.03 - 0.25 + 0.0) / 3)  # ROC-AUC +0.03; RMSE 2.0 -> 2.5 is -25 %
    assert wide["median"] == pytest.approx(0.0)
    assert wide["at_least_gbm"] == 2  # 0.93 >= 0.92; 2.5 > 1.5 is not; 1.0 <= 1.2
    assert wide["cpu_ratio"] == pytest.approx(2.0)  # ratios 2, 3, 1
    assert wide["sources"] == {"hostile": (pytest.approx(0.03), 1, 0), "plurel": (pytest.approx(-0.125), 0, 1)}
    low, high = wide["interval"]
    assert low <= wide["mean"] <= high
    assert table["base"]["at_least_gbm"] == 1 and table["base"]["mean"] == 0
    assert variants.compare(runs, base="wide")["base"]["mean"] == pytest.approx((-0.03 + 0.2 + 0.0) / 3)


def test_picked_by_validation_by_hand():
    def row(database, variant, metric, score, val_loss, val, cpu, gbm=None):
        return {**_row(database, 0, variant, metric, score, cpu, gbm), "val_loss": val_loss, "val": val}

    runs = [row("hostile_1", "base", "roc_auc", 0.90, 0.30, 0.91, 2.0, gbm=0.92),
            row("hostile_1", "own", "roc_auc", 0.95, 0.25, 0.89, 1.0),
            row("plurel_2", "base", "rmse", 2.0, 0.40, 1.9, 1.0, gbm=1.5), row("plurel_2", "own", "rmse", 2.5, 0.40, 2.4, 0.5),
            row("plurel_3", "base", "rmse", 1.0, 0.2, 1.1, 1.0, gbm=1.2),
            {**_row("plurel_3", 0, "own", "rmse", 0.5), "val_loss": None}]  # recorded before validation scores were
    on_loss = variants.picked(runs, ["base", "own"])
    assert [(r["database"], r["chose"]) for r in on_loss] == [("hostile_1", "own"), ("plurel_2", "base")]  # a tie: the first
    assert [r["score"] for r in on_loss] == [0.95, 2.0] and [r["cpu"] for r in on_loss] == [3.0, 1.5]
    assert all(r["variant"] == "picked(base,own)" and r["gbm"] is None for r in on_loss)
    on_metric = variants.picked(runs, ["base", "own"], on="val")  # ROC-AUC: higher is better; RMSE: lower
    assert [r["chose"] for r in on_metric] == ["base", "base"]
    table = variants.compare(runs + on_loss)
    assert table["picked(base,own)"]["runs"] == 2 and table["picked(base,own)"]["at_least_gbm"] == 1  # 0.95 >= 0.92
    assert table["picked(base,own)"]["mean"] == pytest.approx((0.05 + 0.0) / 2)


@pytest.mark.slow
def test_a_run_records_each_variant_once_as_the_api_scores_it(tmp_path):
    manifest = outside_hostile.generate(1, tmp_path / "corpus", small=True)
    path = str(tmp_path / "corpus" / "hostile_1.json")
    chosen = {"base": {"fit": {"epochs": 3}}, "narrow": {"auto": {"width": 8}, "fit": {"epochs": 3}}}
    out = tmp_path / "runs.jsonl"
    variants.run([path], [0], chosen, out, jobs=2, timeout=600)
    variants.run([path], [0], chosen, out, jobs=2, timeout=600)  # already there: nothing run again
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(r["variant"] for r in rows) == ["base", "narrow"], rows
    base = next(r for r in rows if r["variant"] == "base")
    assert base["database"] == manifest["name"] and base["gbm"] is not None and base["epochs"] == 3
    here = variants.one(path, 0, "narrow", chosen["narrow"], anchors=False)
    narrow = next(r for r in rows if r["variant"] == "narrow")
    assert narrow["score"] == here["score"]  # the child process scored what this one does: seeded, no clock
    assert narrow["val_loss"] == here["val_loss"] is not None and narrow["val"] is not None
    assert narrow["kept"] == here["kept"] and narrow["kept"] in ("whole template", "own columns")
