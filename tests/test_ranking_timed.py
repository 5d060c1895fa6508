"""Timed relations (#30): a relation keyed by the target's time and the referenced key adds its
value to the score of every target row of that time; Template.auto writes one from the events
strictly before each snapshot. Also: a step's loss over a capped subset of its positives, and
recommend()'s default rows (NULL targets, not empty lists)."""

from __future__ import annotations

import datetime as dt

import numpy as np
import polars as pl
import pytest
import torch

import relsql
from relsql.train.ranking import losses
from tests.test_auto_ranking import SNAPSHOTS, _same, _shop
from tests.test_ranking import shop

TOWERS = """
CREATE TABLE item_h AS SELECT i.item_id, embed(i.item_id, 8, 'item') AS h FROM item i;
CREATE TABLE task_h AS SELECT t.task_id, embed(t.customer_id, 8, 'who') AS h FROM task_rec t;
"""
TIMED = """
CREATE TABLE sold AS
SELECT s.snapshot, p.item_id, linear(log(1 + count(*)), 1, 'sold') AS h
FROM (SELECT DISTINCT snapshot FROM task_rec) s JOIN purchase p ON p.day < s.snapshot
GROUP BY s.snapshot, p.item_id;
""" + TOWERS  # the output relation is the last statement's


@pytest.fixture(scope="module")
def timed_model(tmp_path_factory):
    db = shop(tmp_path_factory.mktemp("timed") / "shop.duckdb")
    model = relsql.Model(db, relsql.Template.from_sql(TIMED), target="task_rec.item_id", time_column="snapshot", seed=0)
    model.fit(epochs=3, time_budget=None)
    return db, model


def test_the_timed_relation_adds_its_value_to_each_rows_score(timed_model):
    """recommend()'s scores equal dot(query, candidate) + the timed value of (the row's snapshot,
    the candidate), 0 where that pair has none; computed here from the relations' values."""
    db, model = timed_model
    assert model.learner.goal.timed_relation == "sold"
    query = {r["task_id"]: np.array(r["value"]) for r in model.net.values("task_h").to_dicts()}
    item = {r["item_id"]: np.array(r["value"]) for r in model.net.values("item_h").to_dicts()}
    sold = {(r["snapshot"], r["item_id"]): float(np.ravel(r["value"])[0]) for r in model.net.values("sold").to_dicts()}
    snapshot = {r["task_id"]: r["snapshot"] for r in db.arrow("SELECT task_id, snapshot FROM task_rec").to_pylist()}
    chosen = pl.DataFrame({"task_id": list(range(0, 200, 7))})
    frame = model.recommend(k=40, keys=chosen)  # every candidate: the ones without a timed value too
    assert frame.height == 40 * chosen.height
    missing = 0
    for row in frame.to_dicts():
        key = (snapshot[row["task_id"]], row["item_id"])
        missing += key not in sold
        expected = float(query[row["task_id"]] @ item[row["item_id"]]) + sold.get(key, 0.0)
        assert row["score"] == pytest.approx(expected, rel=1e-5, abs=1e-5)
    assert missing > 0  # some (snapshot, item) pairs had no sale before: they add 0
    assert len({v for v in sold.values()}) > 1


def test_a_timed_relation_is_saved_with_the_model(timed_model, tmp_path):
    db, model = timed_model
    path = model.save(tmp_path / "timed.relsql")
    loaded = relsql.Model.load(path, db)
    assert loaded.learner.goal.timed_relation == "sold"
    assert loaded.recommend(k=5).equals(model.recommend(k=5))


def test_a_timed_relation_must_be_one_wide(tmp_path):
    db = shop(tmp_path / "shop.duckdb")
    wide = TIMED.replace("linear(log(1 + count(*)), 1, 'sold')", "linear(log(1 + count(*)), 2, 'sold')")
    with pytest.raises(relsql.RelsqlError, match="timed relation `sold`.*1 wide"):
        relsql.Model(db, relsql.Template.from_sql(wide), target="task_rec.item_id", time_column="snapshot")


def test_without_a_time_column_there_is_no_timed_relation(tmp_path):
    db = shop(tmp_path / "shop.duckdb")
    model = relsql.Model(db, relsql.Template.from_sql(TIMED), target="task_rec.item_id", seed=0)
    assert model.learner.goal.timed_relation is None


@pytest.fixture
def auto_shop():
    db = relsql.connect()
    _shop(db)
    yield db
    db.close()


def test_auto_timed_counts_read_only_events_before_each_snapshot(auto_shop):
    """Template.auto's timed relation: changing a purchase ON a snapshot date (its future) leaves
    that snapshot's values alone and changes the later snapshots'; every value is a count's log."""
    tpl = relsql.Template.auto(auto_shop, "task_rec.item_id", time_column="snapshot")
    assert "CREATE TABLE recent_item" in tpl.source
    assert [name for name, rel in tpl.relations.items() if sorted(rel.keys) == ["item_id", "snapshot"]] == ["recent_item"]
    before = _timed(auto_shop, tpl)
    # its pairs: the items bought strictly before each snapshot (the windowed rule's are among them)
    rows = auto_shop.arrow("SELECT item_id, bought FROM purchase").to_pylist()
    for snap in SNAPSHOTS:
        counted = {r["item_id"] for r in rows if r["bought"] < snap}
        assert {i for s, i in before if s == snap} == counted
    old_item, = auto_shop.scalar("SELECT item_id FROM purchase WHERE purchase_id = 0")  # bought on SNAPSHOTS[1]
    auto_shop.execute("UPDATE purchase SET item_id = (item_id + 1) % 16 WHERE purchase_id = 0")
    after = _timed(auto_shop, tpl)
    for key, value in before.items():
        if key[0] <= SNAPSHOTS[1]:
            assert _same(value, after[key]), key
    later = [k for k in before if k[0] == SNAPSHOTS[2] and k[1] in (old_item, (old_item + 1) % 16)]
    assert later and any(not _same(before[k], after.get(k, np.zeros(1))) for k in later)


def _timed(db, tpl) -> dict:
    frame = relsql.compile(tpl, db, dtype=torch.float64, seed=0).values("recent_item")
    return {(s, i): np.array(v) for s, i, v in zip(frame["snapshot"].to_list(), frame["item_id"].to_list(),
                                                    frame["value"].to_list())}


def test_auto_trains_with_its_timed_relation(auto_shop):
    tpl = relsql.Template.auto(auto_shop, "task_rec.item_id", time_column="snapshot")
    model = relsql.Model(auto_shop, tpl, target="task_rec.item_id", time_column="snapshot", seed=0)
    assert model.learner.goal.timed_relation == "recent_item"
    model.fit(epochs=2, time_budget=None)
    assert np.isfinite(model.evaluate()["map@10"])


def test_a_capped_step_is_the_loss_over_a_seeded_subset_of_its_positives(timed_model):
    """pair_loss(cap=c): the sampled softmax over the c positives a seeded permutation keeps, against
    the step's negatives, computed here from the towers (the pair relation and timed columns included)."""
    _, model = timed_model
    learner = model.learner
    positions = learner.rows["train"]
    rows, items = learner.goal.pairs(positions)
    cap = len(rows) // 3
    with torch.no_grad():
        got = float(learner.pair_loss(positions, torch.Generator().manual_seed(11), cap=cap))
        generator = torch.Generator().manual_seed(11)
        keep = np.sort(torch.randperm(len(rows), generator=generator)[:cap].numpy())
        query, candidate, _ = learner.computed()
        drawn, _ = learner.draw(torch.as_tensor(items[keep]), generator)
        q = query[torch.as_tensor(rows[keep])]
        positive = (q * candidate[torch.as_tensor(items[keep])]).sum(1)
        negative = q @ candidate[drawn].T
        negative[drawn[None, :] == torch.as_tensor(items[keep])[:, None]] = -1e4
        expected = float(losses.ranking_loss("softmax", positive, negative, log_q=None))
        whole = float(learner.pair_loss(positions, torch.Generator().manual_seed(11), cap=len(rows)))
        uncapped = float(learner.pair_loss(positions, torch.Generator().manual_seed(11)))
    assert got == pytest.approx(expected, rel=1e-5)
    assert whole == pytest.approx(uncapped, rel=1e-6)  # a cap at or above the count keeps every positive


def test_recommend_ranks_null_targets_not_empty_lists(tmp_path):
    """An empty list is a label with no positives: recommend() without keys or where ranks only the
    rows whose target is NULL, as its contract says."""
    db = shop(tmp_path / "shop.duckdb")
    top, = db.scalar("SELECT max(task_id) FROM task_rec")
    db.execute(f"INSERT INTO task_rec VALUES ({top + 1}, 7, DATE '{dt.date(2025, 6, 30)}', [])")
    nulls = sorted(r["task_id"] for r in db.arrow("SELECT task_id FROM task_rec WHERE item_id IS NULL").to_pylist())
    model = relsql.Model(db, relsql.Template.from_sql(TOWERS), target="task_rec.item_id", time_column="snapshot", seed=0)
    model.fit(epochs=1, time_budget=None)
    frame = model.recommend(k=3)
    assert sorted(frame["task_id"].unique().to_list()) == nulls
    assert top + 1 not in frame["task_id"].to_list()
    assert model.recommend(k=3, keys=pl.DataFrame({"task_id": [top + 1]})).height == 3  # asked for: ranked


def _naive_map(ranked: list[list[int]], truth: list[set[int]], k: int) -> float:
    """MAP@k as RelBench defines it, written out: precision at each hit over min(k, |truth|)."""
    total = 0.0
    for items, true in zip(ranked, truth):
        hits, score = 0, 0.0
        for i, item in enumerate(items[:k]):
            if item in true:
                hits += 1
                score += hits / (i + 1)
        total += score / min(k, len(true))
    return total / len(ranked)


@pytest.fixture(scope="module")
def blended_model(tmp_path_factory):
    db = shop(tmp_path_factory.mktemp("blend") / "shop.duckdb")
    tpl = relsql.Template.from_sql("-- relsql: blend\n" + TIMED)
    model = relsql.Model(db, tpl, target="task_rec.item_id", time_column="snapshot", seed=0)
    model.fit(epochs=3, time_budget=None)
    return db, model


def test_a_blend_line_picks_the_dot_products_share_with_the_best_validation_map(blended_model):
    """`-- relsql: blend`: the kept share of the dot product is the one of BLEND_ALPHAS whose ranking
    of the validation rows has the best MAP@10, each computed here from the towers by a full sort."""
    from relsql.train.ranking.learner import BLEND_ALPHAS, TowerBlend

    _, model = blended_model
    learner = model.learner
    assert isinstance(learner.head, TowerBlend)
    picked = float(learner.head.alpha)
    assert picked in BLEND_ALPHAS
    with torch.no_grad():
        query, candidate, _ = learner.computed()
    own = query.shape[1] - learner.timed.times
    rows = learner.labelled[learner.rows["val"]]
    offsets, ids = learner.goal.truth("val")
    truth = [set(ids[offsets[i]:offsets[i + 1]].tolist()) for i in range(len(rows))]
    found = {}
    for alpha in BLEND_ALPHAS:
        q = query[rows].double()
        scores = alpha * q[:, :own] @ candidate[:, :own].double().T + q[:, own:] @ candidate[:, own:].double().T
        ranked = [list(np.argsort(-row, kind="stable")[:10]) for row in scores.numpy()]
        found[alpha] = _naive_map(ranked, truth, 10)
    assert found[picked] == pytest.approx(max(found.values()), abs=1e-6)
    kept = next(r for r in model.history if r["epoch"] == model.best_epoch)
    assert kept["val_map@10"] == pytest.approx(found[picked], abs=1e-6)


def test_a_blended_models_scores_and_saved_share(blended_model, tmp_path):
    """recommend()'s scores are alpha * dot(query, candidate) + the timed value; the share is saved."""
    db, model = blended_model
    alpha = float(model.learner.head.alpha)
    query = {r["task_id"]: np.array(r["value"]) for r in model.net.values("task_h").to_dicts()}
    item = {r["item_id"]: np.array(r["value"]) for r in model.net.values("item_h").to_dicts()}
    sold = {(r["snapshot"], r["item_id"]): float(np.ravel(r["value"])[0]) for r in model.net.values("sold").to_dicts()}
    snapshot = {r["task_id"]: r["snapshot"] for r in db.arrow("SELECT task_id, snapshot FROM task_rec").to_pylist()}
    frame = model.recommend(k=10, keys=pl.DataFrame({"task_id": list(range(0, 200, 9))}))
    for row in frame.to_dicts():
        expected = (alpha * float(query[row["task_id"]] @ item[row["item_id"]])
                    + sold.get((snapshot[row["task_id"]], row["item_id"]), 0.0))
        assert row["score"] == pytest.approx(expected, rel=1e-5, abs=1e-5)
    loaded = relsql.Model.load(model.save(tmp_path / "blend.relsql"), db)
    assert float(loaded.learner.head.alpha) == alpha
    assert loaded.recommend(k=5).equals(model.recommend(k=5))


def test_auto_writes_the_blend_line(auto_shop):
    from relsql.train.ranking.learner import TowerBlend

    tpl = relsql.Template.auto(auto_shop, "task_rec.item_id", time_column="snapshot")
    assert "-- relsql: blend" in tpl.source
    model = relsql.Model(auto_shop, tpl, target="task_rec.item_id", time_column="snapshot", seed=0)
    assert isinstance(model.learner.head, TowerBlend)
    plain = relsql.Template.from_sql(tpl.source.replace("-- relsql: blend", "-- blend"))
    model = relsql.Model(auto_shop, plain, target="task_rec.item_id", time_column="snapshot", seed=0)
    assert not isinstance(model.learner.head, TowerBlend)


def test_a_head_saved_before_the_blend_loads_with_the_towers_whole():
    """A state without `alpha` (saved before the blend existed) loads strictly, with alpha 1."""
    from relsql.train.ranking.learner import TowerBlend
    head = TowerBlend(torch.float64)
    head.alpha.fill_(0.25)
    result = head.load_state_dict({})
    assert float(head.alpha) == 1.0 and not result.missing_keys and not result.unexpected_keys
    head.load_state_dict({"alpha": torch.tensor(0.5, dtype=torch.float64)})
    assert float(head.alpha) == 0.5
