"""bench/outside.py in CI: a sample of the outside corpus through the runner (slow).

8 hostile databases (bench/outside_hostile.py, seeded, generated here at their smallest sizes) and
3 small PluRel databases committed as Parquet under tests/data/outside (one per key mode:
declared, keys file, none), each in a fresh process with small fit overrides. The product
requirement: every VALID database ends `ok` (trains, predicts, evaluates, saves, loads with the
same predictions, writes its predictions). The runner must classify honestly: a deliberately
invalid database is a RelsqlError ("refused"), never ok; a process over its timeout is a timeout.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import outside, outside_hostile, outside_plurel

pytestmark = pytest.mark.slow

DATA = Path(__file__).parent / "data" / "outside"
FIT = {"epochs": 5}
HOSTILE_SEEDS = range(8)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    root = tmp_path_factory.mktemp("outside")
    manifests = []
    for seed in HOSTILE_SEEDS:
        outside_hostile.generate(seed, root / "hostile", small=True)
        manifests.append(root / "hostile" / f"hostile_{seed}.json")
    for folder in sorted(DATA.glob("plurel_*")):
        m = outside_plurel.load(folder, root / "plurel")
        manifests.append(root / "plurel" / f"{m['name']}.json")
    outside_hostile.invalid(root / "hostile")
    manifests.append(root / "hostile" / "invalid_nolabels.json")
    # two databases at a time (each in its own process, one torch thread): the same runs, results and
    # checks, on both of CI's cores while the rest of the slow tests run in one process
    rows = outside.run(manifests, FIT, timeout=600, out=root / "run", jobs=2)
    return root, rows


def test_sample_covers_the_hostile_features_and_key_modes():
    features = set().union(*(outside_hostile.features_of(s) for s in HOSTILE_SEEDS))
    assert features == set(outside_hostile.FEATURES) | set(outside_hostile.SCHEMA_FEATURES)
    assert {outside_hostile.key_mode(s) for s in HOSTILE_SEEDS} == set(outside_hostile.KEY_MODES)
    modes = {outside_plurel.KEY_MODES[json.loads((f / "meta.json").read_text())["seed"] % 3] for f in DATA.glob("plurel_*")}
    assert modes == set(outside_plurel.KEY_MODES)
    assert sum(f.stat().st_size for f in DATA.rglob("*") if f.is_file()) < 1_000_000


def test_invalid_database_is_refused_not_ok(sweep):
    _, rows = sweep
    invalid = [r for r in rows if not r["valid"]]
    assert invalid and all(r["outcome"] == "relsql_error" and r["verdict"] == "refused" for r in invalid), invalid


def test_results_and_summary_written(sweep):
    root, rows = sweep
    lines = (root / "run" / "results.jsonl").read_text().splitlines()
    assert len(lines) == len(rows)
    summary = (root / "run" / "summary.md").read_text()
    assert "| hostile |" in summary and "| plurel |" in summary
    for r in rows:
        assert r["outcome"] in ("ok", *outside.FAILURES)
        if r["outcome"] == "ok":  # timings, metric and the peer's on the same split
            assert r["construct_s"] > 0 and r["fit_predict_s"] > 0 and r["save_load_s"] > 0
            assert r["score"] is not None and r["load_max_diff"] <= 1e-6
            assert "gbm_s" in r or "gbm_error" in r
        else:
            assert r.get("message"), r


def test_timeout_is_recorded_not_fatal(tmp_path):
    m = outside_hostile.generate(0, tmp_path / "hostile", small=True)
    rows = outside.run_database(tmp_path / "hostile" / f"{m['name']}.json", FIT, timeout=1.0, out=tmp_path / "run")
    assert rows and all(r["outcome"] == "timeout" for r in rows), rows
    assert rows[0]["message"] == "after 1 s"


def test_every_valid_database_trains_and_predicts(sweep):
    """The product requirement: 0 crashes, 0 raw exceptions on valid databases."""
    _, rows = sweep
    failures = [f"{r['database']} {r['target']}: {r['outcome']} [{r.get('stage')}] {r.get('error_type', '')}: "
                f"{(r.get('message') or '')[:300]}" for r in rows if r["valid"] and r["outcome"] != "ok"]
    assert not failures, "\n".join(failures)


def test_the_accuracy_anchors_are_recorded_on_the_models_split(tmp_path):
    """--alone and --rdl: the network alone is scored on the same test rows as the default (a
    finite metric of the same kind), the RDL peer runs on an untimed target and is skipped, with
    the reason, on a timed one; the own-column GBM's score sits beside the one-hop GBM's."""
    m = outside_plurel.load(DATA / "plurel_15", tmp_path / "plurel")
    manifests = [tmp_path / "plurel" / f"{m['name']}.json"]
    outside_hostile.generate(3, tmp_path / "hostile", small=True)  # its first target has a time column
    manifests.append(tmp_path / "hostile" / "hostile_3.json")
    rows = outside.run(manifests, FIT, timeout=600, out=tmp_path / "run", child_args=("--first-targets", "1", "--alone", "--rdl"))
    assert [r["outcome"] for r in rows] == ["ok", "ok"], rows
    for r in rows:
        assert r["alone_epochs"] >= 1 and "own_gbm_score" in r, r
        if r["time_column"]:
            assert r["metric"] == "roc_auc" and 0 <= r["alone_score"] <= 1, r
            assert r["rdl_skipped"].startswith("timed target") and "rdl_score" not in r
        else:
            assert r["metric"] == "rmse" and 0 < r["alone_score"] < 1e6, r
            assert 0 < r["rdl_score"] < 1e6 and r["rdl_epochs"] >= 1, r
    assert [bool(r["time_column"]) for r in rows] == [False, True]
    summary = (tmp_path / "run" / "summary.md").read_text()
    table = summary[summary.index("## relsql's default against the anchors"):]
    assert "| plurel_15 |" in table and "| hostile_3 |" in table and "network alone" in table
    untimed, timed = rows  # DFS was not asked for; the timed target has no RDL score
    best = int(untimed["score"] <= min(untimed["gbm_score"], untimed["rdl_score"]) + 1e-12)  # RMSE
    best += int(timed["score"] >= timed["gbm_score"] - 1e-12)  # ROC-AUC
    assert f"(those recorded): {best} of 2" in table


def test_repeat_records_every_runs_cpu_and_the_summary_takes_their_medians(tmp_path):
    """--repeat 3: construction, fit+predict and the peer three times each (fresh Models with the
    same seed, which must predict as the first did, else the target is a mismatch); the summary's
    CPU ratios are those of the medians."""
    import statistics

    outside_hostile.generate(2, tmp_path / "hostile", small=True)
    rows = outside.run([tmp_path / "hostile" / "hostile_2.json"], FIT, timeout=600, out=tmp_path / "run",
                       child_args=("--first-targets", "1", "--repeat", "3"))
    assert [r["outcome"] for r in rows] == ["ok"], rows
    r = rows[0]
    for part in ("construct", "fit_predict", "gbm"):
        runs = r[f"{part}_cpu_runs"]
        assert len(runs) == 3 and all(v > 0 for v in runs), (part, runs)
    assert r["construct_cpu_runs"][0] == r["construct_cpu_s"] and r["fit_predict_cpu_runs"][0] == r["fit_predict_cpu_s"]
    assert r["gbm_cpu_s"] in r["gbm_cpu_runs"]
    ratio = statistics.median(r["fit_predict_cpu_runs"]) / statistics.median(r["gbm_cpu_runs"])
    summary = (tmp_path / "run" / "summary.md").read_text()
    assert f"CPU seconds (each the median of 3 runs): fit+predict/GBM median {ratio:.2f}" in summary


def test_a_repeat_that_predicts_differently_is_a_mismatch(tmp_path, monkeypatch):
    """A repeated fit of the same seed must predict what the first did: here the repeat's Model is
    given another seed (another split and initial weights), and the target is a mismatch."""
    import shutil
    import sys

    import relsql

    m = outside_hostile.generate(2, tmp_path / "hostile", small=True)
    manifest = json.loads((tmp_path / "hostile" / f"{m['name']}.json").read_text())
    original = relsql.Model.__init__

    def init(self, *args, **kwargs):
        if sys._getframe(1).f_code.co_name == "ours":  # the repeat's Model (bench/outside.py repeated)
            kwargs["seed"] = kwargs["seed"] + 1
        original(self, *args, **kwargs)

    monkeypatch.setattr(relsql.Model, "__init__", init)
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(manifest["path"], work / Path(manifest["path"]).name)
    rec = outside.run_target(manifest, manifest["targets"][0], FIT, work, 0, repeat=2)
    assert rec["outcome"] == "mismatch", rec
    assert rec["message"].startswith("run 2 of the same seed predicted differently from the first"), rec["message"]
    assert len(rec["fit_predict_cpu_runs"]) == 2
