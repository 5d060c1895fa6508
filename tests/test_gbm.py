"""relsql/train/gbm/gbm.py: trees read out of LightGBM and evaluated by relsql's own numpy code give
LightGBM's raw scores (1e-9) on binary, multiclass and regression tasks, NULLs (NaN) and zeros
included; they survive the plain-data round trip, and a damaged table of trees is refused."""

from __future__ import annotations

from dataclasses import replace

import lightgbm
import numpy as np
import pytest
import torch

from relsql.errors import RelsqlError
from relsql.train.gbm import gbm


def data(seed: int, rows: int = 600):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, 5))
    x[:, 3] = rng.integers(0, 4, rows)  # many exact zeros: the Zero missing type's case
    x[rng.random((rows, 5)) < 0.1] = np.nan
    signal = np.nan_to_num(x[:, 0]) * 2 + np.where(np.isnan(x[:, 1]), 1.5, np.sin(np.nan_to_num(x[:, 1]) * 3)) + (x[:, 3] == 2)
    return x, signal


def booster_of(trees_kind: str, x: np.ndarray, y: np.ndarray, units: int, **extra):
    settings = gbm.params(trees_kind, units, 0, len(x), **extra)
    return lightgbm.train(settings, lightgbm.Dataset(x, y), num_boost_round=40)


@pytest.mark.parametrize("kind", ["binary", "multiclass", "regression"])
@pytest.mark.parametrize("zero_as_missing", [False, True])
def test_own_evaluator_equals_lightgbm_raw_scores(kind, zero_as_missing):
    x, signal = data(1)
    y = {"binary": (signal > 0.5).astype(float), "multiclass": np.digitize(signal, [-1, 0.5, 2]).astype(float),
         "regression": signal}[kind]
    units = 4 if kind == "multiclass" else 1
    booster = booster_of(kind, x, y, units, zero_as_missing=zero_as_missing)
    trees = gbm.Trees.of(booster, x.shape[1])
    probe, _ = data(2, 300)
    probe[:5] = 0.0  # zeros everywhere, and rows of all NaN
    probe[5:10] = np.nan
    expected = booster.predict(probe, raw_score=True).reshape(len(probe), units)
    assert trees.leaves is not None  # the booster's own walk, while it lives
    assert np.abs(trees.raw(probe) - expected).max() < 1e-9
    assert np.abs(replace(trees, leaves=None).raw(probe) - expected).max() < 1e-9  # the numpy walk
    if zero_as_missing:
        assert (trees.missing == 1).any()  # the Zero rule was exercised
    else:
        assert (trees.missing == 2).any()  # the NaN rule was exercised



def walk(trees: gbm.Trees, row: np.ndarray, node: int) -> float:
    """One row down one tree by LightGBM's rule, a node at a time: the leaf's value."""
    return trees.value[_leaf(trees, row, node)]


def _leaf(trees: gbm.Trees, row: np.ndarray, node: int) -> int:
    """One row down one tree by LightGBM's rule, a node at a time: the leaf's node."""
    while trees.feature[node] >= 0:
        value = row[trees.feature[node]]
        missing = trees.missing[node]
        if np.isnan(value) and missing != 2:
            value = 0.0
        as_missing = (missing == 1 and abs(value) <= 1e-35) or (missing == 2 and np.isnan(value))
        left = trees.default_left[node] if as_missing else value <= trees.threshold[node]
        node = trees.left[node] if left else trees.right[node]
    return node


@pytest.mark.parametrize("kind", ["binary", "multiclass"])
def test_own_evaluator_reaches_the_leaves_a_row_by_row_walk_reaches(kind, monkeypatch):
    """raw() moves only the (row, tree) pairs still at a split, level by level, a block of rows at
    a time: every row must end at the leaf a plain walk reaches, so its sums are the same bits,
    whatever the block."""
    x, signal = data(3)
    y = (signal > 0.5).astype(float) if kind == "binary" else np.digitize(signal, [-1, 0.5, 2]).astype(float)
    units = 4 if kind == "multiclass" else 1
    trees = gbm.Trees.of(booster_of(kind, x, y, units, zero_as_missing=True, num_leaves=63, min_data_in_leaf=2), 5)
    trees = replace(trees, leaves=None)  # the numpy walk and its blocks
    probe, _ = data(4, 200)
    probe[:5] = 0.0
    probe[5:10] = np.nan
    leaves = np.array([[walk(trees, row, root) for root in trees.roots] for row in probe])
    expected = np.stack([leaves[:, trees.classes == unit].sum(axis=1) for unit in range(units)], axis=1)
    assert trees.depth > 6 and np.array_equal(trees.raw(probe), expected)
    for pairs in (1, 3 * len(trees.roots) + 1):  # blocks of 2 rows; of 3 rows and a shorter last block
        monkeypatch.setattr(gbm, "PAIRS", pairs)
        assert np.array_equal(trees.raw(probe), expected)
        assert np.array_equal(trees.raw(probe[:-1]), expected[:-1])  # an odd count: no block of one row

def test_fit_stops_early_on_validation_rows_and_is_deterministic():
    x, signal = data(3, 800)
    y = (signal > 0.5).astype(float)
    a = gbm.fit(x[:500], y[:500], "binary", 1, seed=7, x_val=x[500:], y_val=y[500:])
    b = gbm.fit(x[:500], y[:500], "binary", 1, seed=7, x_val=x[500:], y_val=y[500:])
    assert len(a.roots) < gbm.ROUNDS  # stopped early
    assert np.array_equal(a.raw(x), b.raw(x))
    accuracy = ((a.raw(x[500:])[:, 0] > 0) == y[500:]).mean()
    assert accuracy > 0.85


def test_plain_round_trip_and_damage():
    x, signal = data(4)
    trees = gbm.fit(x, np.digitize(signal, [0, 1]).astype(float), "multiclass", 3, seed=0)
    plain = trees.to_plain()
    assert all(isinstance(v, torch.Tensor | int) for v in plain.values())
    back = gbm.Trees.from_plain(plain)
    assert np.array_equal(back.raw(x), trees.raw(x))
    looped = dict(plain, left=plain["left"].clone())
    inner = int(torch.nonzero(plain["feature"] >= 0)[1])
    looped["left"][inner] = 0  # a child before its parent: could loop
    with pytest.raises(RelsqlError, match="damaged"):
        gbm.Trees.from_plain(looped)
    with pytest.raises(RelsqlError, match="damaged"):
        gbm.Trees.from_plain(dict(plain, feature=plain["feature"] + 100))
    with pytest.raises(RelsqlError, match="lacks"):
        gbm.Trees.from_plain({k: v for k, v in plain.items() if k != "value"})
    with pytest.raises(RelsqlError, match="expected 5 features"):
        trees.raw(x[:, :4])


def dumped(booster, features: int) -> dict[str, np.ndarray]:
    """The node table by a naive reference: LightGBM's own JSON dump, walked recursively in preorder."""
    dump = booster.dump_model()
    nodes = {k: [] for k in ("feature", "threshold", "missing", "default_left", "left", "right", "value")}
    roots, depths = [], []

    def add(tree: dict, level: int) -> int:
        index = len(nodes["feature"])
        leaf = "leaf_value" in tree
        for key, value in (("feature", -1 if leaf else tree["split_feature"]), ("threshold", 0.0 if leaf else tree["threshold"]),
                           ("missing", 0 if leaf else {"None": 0, "Zero": 1, "NaN": 2}[tree["missing_type"]]),
                           ("default_left", False if leaf else tree["default_left"]),
                           ("value", tree["leaf_value"] if leaf else 0.0), ("left", -1), ("right", -1)):
            nodes[key].append(value)
        if leaf:
            return level
        nodes["left"][index] = len(nodes["feature"])
        deepest = add(tree["left_child"], level + 1)
        nodes["right"][index] = len(nodes["feature"])
        return max(deepest, add(tree["right_child"], level + 1))

    for info in dump["tree_info"]:
        roots.append(len(nodes["feature"]))
        depths.append(add(info["tree_structure"], 0))
    arrays = {k: np.asarray(v) for k, v in nodes.items()}
    # JSON has no infinity: the dump writes a threshold of +-inf as +-1e300 (the booster splits on inf)
    arrays["threshold"] = np.where(np.abs(arrays["threshold"]) == 1e300, np.copysign(np.inf, arrays["threshold"]),
                                   arrays["threshold"])
    return {**arrays, "roots": np.asarray(roots), "depth": max(depths)}


@pytest.mark.parametrize("kind", ["binary", "multiclass", "regression"])
def test_trees_read_from_the_text_model_equal_the_json_dump(kind):
    """Trees.of reads the booster's text model: the same node table, bit for bit, as LightGBM's
    JSON dump walked in preorder (but for thresholds of infinity, which the dump writes as 1e300: read
    so, values beyond 1e300 went the other way than in LightGBM); an early-stopped booster gives its
    best iteration's trees, and trees of one leaf (labels without a split) are read too."""
    x, signal = data(5, 700)
    y = {"binary": (signal > 0.5).astype(float), "multiclass": np.digitize(signal, [-1, 0.5, 2]).astype(float),
         "regression": signal}[kind]
    units = 4 if kind == "multiclass" else 1
    constant = np.full(len(y), 1.0 if kind != "regression" else 2.5)  # no split anywhere: a tree of one leaf
    for labels, extra in ((y, {"zero_as_missing": True, "num_leaves": 63, "min_data_in_leaf": 2}), (y, {}),
                          (constant, {})):
        booster = booster_of(kind, x, labels, units, **extra)
        trees, expected = gbm.Trees.of(booster, 5), dumped(booster, 5)
        for key in ("feature", "threshold", "missing", "default_left", "left", "right", "value", "roots"):
            assert np.array_equal(getattr(trees, key), expected[key]), key
        assert trees.depth == expected["depth"] and trees.units == units
        probe = np.concatenate([x, np.where(np.isnan(x), x, np.sign(x) * 1e308)])  # beyond 1e300: as LightGBM splits
        assert np.abs(trees.raw(probe) - booster.predict(probe, raw_score=True).reshape(len(probe), units)).max() < 1e-9
    assert trees.depth == 0 and (trees.feature == -1).all()  # the constant labels' trees: leaves only
    stopped = lightgbm.train(gbm.params(kind, units, 0, 500), lightgbm.Dataset(x[:500], y[:500]), num_boost_round=400,
                             valid_sets=[lightgbm.Dataset(x[500:], y[500:])],
                             callbacks=[lightgbm.early_stopping(5, verbose=False)])
    assert 0 < stopped.best_iteration < 400
    trees = gbm.Trees.of(stopped, 5)
    assert len(trees.roots) == stopped.best_iteration * units
    assert np.array_equal(trees.value, dumped(stopped, 5)["value"])
    assert np.abs(trees.raw(x) - stopped.predict(x, raw_score=True).reshape(len(x), units)).max() < 1e-9


def test_a_fit_keeps_the_trees_of_its_best_iteration():
    """gbm.fit keeps LightGBM's training booster (no text round trip inside train()): its trees are
    still those of the best iteration, as a booster returned the default way predicts."""
    x, signal = data(6, 900)
    y = (signal > 0.5).astype(float)
    trees = gbm.fit(x[:600], y[:600], "binary", 1, seed=3, x_val=x[600:], y_val=y[600:])
    settings = gbm.params("binary", 1, 3, 600)
    booster = lightgbm.train(settings, lightgbm.Dataset(x[:600], y[:600], params={"verbosity": -1}),
                             num_boost_round=gbm.ROUNDS,
                             valid_sets=[lightgbm.Dataset(x[600:], y[600:], params={"verbosity": -1})],
                             callbacks=[lightgbm.early_stopping(gbm.PATIENCE, verbose=False)])
    assert len(trees.roots) == booster.best_iteration < gbm.ROUNDS
    assert np.abs(trees.raw(x) - booster.predict(x, raw_score=True)[:, None]).max() < 1e-9
    plain = gbm.fit(x[:600], y[:600], "binary", 1, seed=3, rounds=17)
    assert len(plain.roots) == 17


@pytest.mark.parametrize("kind", ["binary", "multiclass", "regression"])
def test_the_fitted_boosters_leaves_give_the_numpy_walks_bits(kind):
    """A fit's trees evaluate through the booster's own walk (`Leaves`, LightGBM's pred_leaf) while it
    lives; a saved and loaded model has only the arrays and walks them in numpy. Both must give the
    same bits on rows with NaNs and exact zeros (the classifiers stop early, the regression runs 2,000 rounds)."""
    x, signal = data(5, 900)
    y = {"binary": (signal > 0.5).astype(float), "multiclass": np.digitize(signal, [-1, 0.5, 2]).astype(float),
         "regression": signal}[kind]
    units = 4 if kind == "multiclass" else 1
    trees = gbm.fit(x[:600], y[:600], kind, units, x_val=x[600:], y_val=y[600:], zero_as_missing=True)
    assert trees.leaves is not None and 0 < len(trees.roots) <= gbm.ROUNDS * units
    loaded = gbm.Trees.from_plain(trees.to_plain())
    assert loaded.leaves is None
    probe, _ = data(6, 301)
    probe[:5] = 0.0
    probe[5:10] = np.nan
    assert np.array_equal(trees.raw(probe), loaded.raw(probe))
    assert np.array_equal(trees.leaves.nodes(probe), np.stack([[_leaf(loaded, row, root) for root in loaded.roots]
                                                               for row in probe]))
