"""Gradient-boosted trees (LightGBM) as plain data with their own evaluator.

LightGBM fits; relsql keeps only the fitted trees as numpy arrays read from the booster's text
model (`booster.model_to_string()`) and evaluates them itself (`Trees.raw`), so a saved model holds
numbers, never a pickled booster, and a loaded model predicts without LightGBM objects (while the
fitted booster lives, its C++ walk finds the leaves: `Leaves`, the same bits). The evaluator follows
LightGBM's numerical decision rule: a NaN is read as 0 unless the split's missing type is NaN;
a value routed as missing (NaN under missing type NaN, or |x| <= 1e-35 under missing type Zero)
goes to the side `default_left` names; any other value goes left when it is <= the threshold.

Defaults for small relational data (500-5,000 rows), and why:
- learning rate 0.05 with up to 2,000 rounds and early stopping after 50 rounds without a better
  validation loss: slow enough that early stopping on a small validation part picks a good
  round, enough rounds that it rarely hits the cap;
- 31 leaves, at least min(20, rows / 20) rows per leaf: LightGBM's own leaf count, with leaves
  small data can still fill;
- 0.9 of the features per tree and L2 1.0 on leaf values: a little variance reduction that
  costs nothing measurable on the targets of issue #29;
- one thread and `deterministic=True`: this 2-core machine is shared, and a seed must give the
  same trees every time. Without validation rows, 200 rounds.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from relsql.errors import RelsqlError

KINDS = ("binary", "multiclass", "regression")
_ZERO = 1e-35  # LightGBM's kZeroThreshold
ROUNDS, PATIENCE, ROUNDS_WITHOUT_VALIDATION = 2000, 50, 200
PAIRS = 1 << 20  # (row, tree) pairs Trees.raw walks at once: 8 MiB per array of them


def params(kind: str, units: int, seed: int, rows: int, threads: int = 1, **overrides) -> dict:
    """LightGBM parameters for a task (see the module docstring for the choices)."""
    objective = {"binary": "binary", "multiclass": "multiclass", "regression": "regression"}[kind]
    chosen = {"objective": objective, "learning_rate": 0.05, "num_leaves": 31,
              "min_data_in_leaf": max(1, min(20, rows // 20)), "feature_fraction": 0.9, "lambda_l2": 1.0,
              "seed": int(seed), "deterministic": True, "force_row_wise": True, "num_threads": int(threads),
              "verbosity": -1}
    if kind == "multiclass":
        chosen["num_class"] = int(units)
    return {**chosen, **overrides}


def fit(x: np.ndarray, y: np.ndarray, kind: str, units: int, seed: int = 0, *, x_val: np.ndarray | None = None,
        y_val: np.ndarray | None = None, threads: int = 1, rounds: int | None = None, patience: int = PATIENCE,
        **overrides) -> Trees:
    """Trees fitted to features `x` (float64, NaN for NULL) and encoded labels `y` (0/1, class
    index, or a standardized number); early stopping on (`x_val`, `y_val`) after `patience` rounds
    without a better validation loss when given, else `rounds` rounds (a refit's: the rounds an
    early-stopped fit kept; default 200). `overrides`: LightGBM parameters over `params`'s."""
    import lightgbm

    if kind not in KINDS:
        raise RelsqlError(f"GBM task must be one of {', '.join(KINDS)}, got {kind!r}")
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if x.ndim != 2 or len(x) != len(y) or not len(x):
        raise RelsqlError(f"GBM: features of shape {x.shape} do not fit {len(y)} labels")
    settings = params(kind, units, seed, len(x), threads, **overrides)
    train = lightgbm.Dataset(x, y, params={"verbosity": -1}, free_raw_data=True)
    if x_val is not None and len(x_val):
        valid = lightgbm.Dataset(np.asarray(x_val, dtype=np.float64), np.asarray(y_val, dtype=np.float64), reference=train)
        booster = lightgbm.train(settings, train, num_boost_round=ROUNDS, valid_sets=[valid], keep_training_booster=True,
                                 callbacks=[lightgbm.early_stopping(int(patience), verbose=False)])
    else:
        booster = lightgbm.train(settings, train, num_boost_round=ROUNDS_WITHOUT_VALIDATION if rounds is None else int(rounds),
                                 keep_training_booster=True)
    # keep_training_booster: else train() writes the booster to text and reads it back (a tenth of a
    # small fit's time); the text model Trees.of reads holds the best iteration's trees either way
    return Trees.of(booster, x.shape[1])


@dataclass
class Trees:
    """All trees of a booster in one preorder node table. Node i: `feature[i]` (-1 for a leaf),
    `threshold`, `missing` (0 none, 1 zero, 2 NaN), `default_left`, `left`/`right` (node indices,
    always greater than i), `value` (a leaf's output). `roots[t]` is tree t's first node and
    `classes[t]` the output column it adds to."""

    feature: np.ndarray
    threshold: np.ndarray
    missing: np.ndarray
    default_left: np.ndarray
    left: np.ndarray
    right: np.ndarray
    value: np.ndarray
    roots: np.ndarray
    classes: np.ndarray
    units: int
    features: int
    depth: int
    leaves: Leaves | None = field(default=None, compare=False, repr=False)  # the fitted booster's, while it lives

    @classmethod
    def of(cls, booster, features: int) -> Trees:
        """The trees a LightGBM booster predicts with (its best iteration after early stopping),
        read from its text model: `dump_model()`'s JSON, parsed and walked in Python, cost a quarter
        of a small fit's time (62 ms against 4 for the text, 100 rounds of 31 leaves). The booster
        stays beside them (`Leaves`) for the fit's own evaluations; a saved model holds the arrays only."""
        leaf_nodes: list[np.ndarray] = []
        trees = cls.of_text(booster.model_to_string(), features, leaf_nodes)
        if leaf_nodes:
            starts = np.cumsum([0, *[len(n) for n in leaf_nodes[:-1]]]).astype(np.int64)
            trees.leaves = Leaves(booster, len(trees.roots) // trees.units, np.concatenate(leaf_nodes), starts)
        return trees

    @classmethod
    def of_text(cls, text: str, features: int, leaf_nodes: list[np.ndarray] | None = None) -> Trees:
        """Trees from LightGBM's text model format: each tree's node arrays (internal nodes 0..n-2,
        a child < 0 is leaf ~child), put in preorder as `_preorder` does. `leaf_nodes`, where given,
        gains per tree the node each of LightGBM's leaves (0, 1, ...) became."""
        per_round, trees = 1, []
        lines = iter(text.splitlines())
        for line in lines:
            if line.startswith("num_tree_per_iteration="):
                per_round = int(line.partition("=")[2])
            elif line.startswith("Tree="):
                tree: dict[str, str] = {}
                for inner in lines:
                    if not inner:
                        break
                    key, _, value = inner.partition("=")
                    tree[key] = value
                trees.append(tree)
            elif line == "end of trees":
                break
        parts: dict[str, list[np.ndarray]] = {k: [] for k in ("feature", "threshold", "missing", "default_left",
                                                              "left", "right", "value")}
        roots, classes, depth, size = [], [], 0, 0
        for index, tree in enumerate(trees):
            if int(tree.get("num_cat", "0")):
                raise RelsqlError("GBM: categorical splits are not supported (features are passed as numbers)")
            roots.append(size)
            classes.append(index % per_round)
            nodes, deepest, leaf_node = _preorder(tree, size)
            if leaf_nodes is not None:
                leaf_nodes.append(leaf_node)
            depth = max(depth, deepest)
            for key, array in nodes.items():
                parts[key].append(array)
            size += len(nodes["feature"])
        kinds = {"feature": np.int64, "missing": np.int64, "left": np.int64, "right": np.int64, "default_left": bool,
                 "threshold": np.float64, "value": np.float64}
        arrays = {k: np.concatenate(v).astype(kinds[k]) if v else np.zeros(0, dtype=kinds[k]) for k, v in parts.items()}
        return cls(**arrays, roots=np.asarray(roots, dtype=np.int64), classes=np.asarray(classes, dtype=np.int64),
                   units=per_round, features=int(features), depth=depth)

    def raw(self, x: np.ndarray) -> np.ndarray:
        """Raw scores (log-odds, class scores, standardized values), (rows, units), float64."""
        x = np.asarray(x, dtype=np.float64)
        if x.ndim != 2 or x.shape[1] != self.features:
            raise RelsqlError(f"GBM: expected {self.features} features per row, got an array of shape {x.shape}")
        out = np.zeros((len(x), self.units))
        if not len(self.roots) or not len(x):
            return out
        # blocks of rows, so that memory is bounded: numpy sums a block's (rows, trees) leaf values in
        # one order for every block of 2 rows or more, but in another for a single row, so no block
        # of one row is cut off a larger input (its last row joins the block before)
        step = max(2, PAIRS // len(self.roots))
        starts = list(range(0, len(x), step))
        if len(starts) > 1 and len(x) - starts[-1] == 1:
            starts.pop()
        for first, end in zip(starts, [*starts[1:], len(x)]):
            leaves = self._leaves(x[first:end])
            for unit in range(self.units):
                out[first:end, unit] = leaves[:, self.classes == unit].sum(axis=1)
        return out

    def _leaves(self, x: np.ndarray) -> np.ndarray:
        """The value of the leaf each row reaches in each tree, (rows, trees): LightGBM's own walk where
        the fitted booster is at hand (`Leaves`), else only the (row, tree) pairs still at a split
        move on, level by level."""
        if self.leaves is not None:
            return self.value[self.leaves.nodes(x)]
        node = np.tile(self.roots, len(x))  # (row, tree) pairs, row-major: each pair's node so far
        going = np.flatnonzero(self.feature[node] >= 0)
        for _ in range(self.depth):
            if not len(going):
                break
            at = node[going]
            value = x[going // len(self.roots), self.feature[at]]  # a pair's row: its position // trees
            missing = self.missing[at]
            nan = np.isnan(value)
            value = np.where(nan & (missing != 2), 0.0, value)
            as_missing = ((missing == 1) & (np.abs(value) <= _ZERO) & ~np.isnan(value)) | ((missing == 2) & nan)
            go_left = np.where(as_missing, self.default_left[at], value <= self.threshold[at])
            node[going] = reached = np.where(go_left, self.left[at], self.right[at])
            going = going[self.feature[reached] >= 0]
        return self.value[node].reshape(len(x), len(self.roots))

    def to_plain(self) -> dict:
        """Tensors and ints only: what a model file holds (relsql/train/persist/checkpoint.py)."""
        arrays = {k: torch.as_tensor(getattr(self, k)) for k in
                  ("feature", "threshold", "missing", "default_left", "left", "right", "value", "roots", "classes")}
        return {**arrays, "units": int(self.units), "features": int(self.features), "depth": int(self.depth)}

    @classmethod
    def from_plain(cls, data: dict, where: str = "GBM trees") -> Trees:
        """Trees from `to_plain`'s dict, checked: a damaged file fails here, not inside `raw` (its
        sizes too: a tensor's elements are bounded by the file, relsql/train/persist/checkpoint.py)."""
        if not isinstance(data, dict):
            raise RelsqlError(f"{where} is damaged: not a table of trees")
        try:
            arrays = {k: np.asarray(data[k].numpy()) for k in
                      ("feature", "threshold", "missing", "default_left", "left", "right", "value", "roots", "classes")}
            units, features, depth = (data[k] for k in ("units", "features", "depth"))
        except (KeyError, AttributeError, TypeError):
            raise RelsqlError(f"{where} is damaged: it lacks part of its trees") from None
        trees = cls(**arrays, units=units, features=features, depth=depth)
        trees.check(where)
        return trees

    def check(self, where: str) -> None:
        """Shapes, types and links that `raw` relies on: children after their parent, in range."""
        n = len(self.feature)
        ints = ("feature", "missing", "left", "right", "roots", "classes")
        ok = all(type(v) is int and v >= 1 for v in (self.units, self.features)) and type(self.depth) is int
        ok = ok and all(getattr(self, k).ndim == 1 for k in (*ints, "threshold", "default_left", "value"))
        ok = ok and all(len(getattr(self, k)) == n for k in ("threshold", "missing", "default_left", "left", "right", "value"))
        ok = ok and all(getattr(self, k).dtype == np.int64 for k in ints) and self.default_left.dtype == bool
        ok = ok and self.threshold.dtype == np.float64 and self.value.dtype == np.float64 and len(self.roots) == len(self.classes)
        if ok:
            inner = self.feature >= 0
            index = np.arange(n)
            ok = bool((self.feature < self.features).all() and (self.feature >= -1).all()
                      and np.isin(self.missing, (0, 1, 2)).all() and np.isfinite(self.value).all()
                      and ((self.left[inner] > index[inner]) & (self.left[inner] < n)).all()
                      and ((self.right[inner] > index[inner]) & (self.right[inner] < n)).all()
                      and ((self.roots >= 0) & (self.roots < max(n, 1))).all()
                      and ((self.classes >= 0) & (self.classes < self.units)).all() and 0 <= self.depth <= n)
        if not ok:
            raise RelsqlError(f"{where} is damaged: its trees do not fit together")
        # `raw` allocates (rows, units) and (rows, trees): both bounded by what fitting can make, one tree per
        # unit per round for at most ROUNDS rounds, checked before any of it is allocated
        if self.units > max(1, len(self.roots)) or len(self.roots) > ROUNDS * self.units:
            raise RelsqlError(f"{where} is damaged: {len(self.roots):,} trees for {self.units:,} scores per row; "
                              f"fitting makes one tree per score per round, for at most {ROUNDS:,} rounds")


@dataclass
class Leaves:
    """The leaves a fitted LightGBM booster routes rows to, as `Trees` node indices: its C++ walk
    (`predict(pred_leaf=True)`) in place of `Trees._leaves`' numpy one, which took a quarter of a fit
    with 2,000 rounds (docs/performance.md). Both follow LightGBM's decision rule (the module
    docstring), so a row reaches the same leaf and `raw` sums the same values: the same bits as a
    loaded model's (tests/test_gbm.py)."""

    booster: object
    rounds: int  # the iterations the text model holds (the best one's)
    leaf_node: np.ndarray  # per tree, from `starts[tree]`: LightGBM's leaf j -> the node index
    starts: np.ndarray

    def nodes(self, x: np.ndarray) -> np.ndarray:
        """(rows, trees) node indices of the leaves `x`'s rows reach."""
        leaf = np.asarray(self.booster.predict(x, pred_leaf=True, num_iteration=self.rounds, num_threads=1), dtype=np.int64)
        return self.leaf_node[self.starts[None, :] + leaf.reshape(len(x), len(self.starts))]


def _numbers(tree: dict[str, str], key: str, kind: type) -> np.ndarray:
    text = tree.get(key, "").strip()
    return np.array(text.split(), dtype=kind) if text else np.zeros(0, dtype=kind)


def _preorder(tree: dict[str, str], offset: int) -> tuple[dict[str, np.ndarray], int, np.ndarray]:
    """One tree's nodes in preorder (a node, its left subtree, its right subtree), child links
    shifted by `offset` (the node table's size so far), its depth (splits on the longest path) and the
    node index each leaf (by its text number) became.
    A text tree numbers its internal nodes 0..n-2 (node 0 the root) and its leaves apart: a child
    link >= 0 is an internal node, one < 0 the leaf ~link."""
    leaves = _numbers(tree, "leaf_value", np.float64)
    split = _numbers(tree, "split_feature", np.int64)
    threshold = _numbers(tree, "threshold", np.float64)
    decision = _numbers(tree, "decision_type", np.int64)
    children = (_numbers(tree, "left_child", np.int64), _numbers(tree, "right_child", np.int64))
    order: list[int] = []  # preorder of nodes: internal i as i, leaf j as ~j
    level: list[int] = []
    stack = [(0 if len(split) else ~0, 0)]  # a tree without splits is its one leaf
    while stack:
        node, at = stack.pop()
        order.append(node)
        level.append(at)
        if node >= 0:
            stack.append((int(children[1][node]), at + 1))
            stack.append((int(children[0][node]), at + 1))
    order_array = np.asarray(order, dtype=np.int64)
    inner = order_array >= 0
    at_inner, at_leaf = order_array[inner], ~order_array[~inner]
    place = np.zeros(len(split), dtype=np.int64)
    place[at_inner] = np.flatnonzero(inner)
    leaf_place = np.zeros(len(leaves), dtype=np.int64)
    leaf_place[at_leaf] = np.flatnonzero(~inner)

    def placed(links: np.ndarray) -> np.ndarray:
        return np.where(links >= 0, place[np.maximum(links, 0)], leaf_place[np.maximum(~links, 0)]) + offset

    n = len(order)
    nodes = {"feature": np.full(n, -1, dtype=np.int64), "threshold": np.zeros(n), "missing": np.zeros(n, dtype=np.int64),
             "default_left": np.zeros(n, dtype=bool), "left": np.full(n, -1, dtype=np.int64),
             "right": np.full(n, -1, dtype=np.int64), "value": np.zeros(n)}
    rows = np.flatnonzero(inner)
    nodes["feature"][rows] = split[at_inner]
    nodes["threshold"][rows] = threshold[at_inner]
    nodes["missing"][rows] = (decision[at_inner] >> 2) & 3
    nodes["default_left"][rows] = (decision[at_inner] & 2) != 0
    nodes["left"][rows] = placed(children[0][at_inner])
    nodes["right"][rows] = placed(children[1][at_inner])
    nodes["value"][~inner] = leaves[at_leaf]
    return nodes, max(level), leaf_place + offset
