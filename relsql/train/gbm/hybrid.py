"""The network blended with a GBM on SQL features two hops deep, where the validation rows say it helps.

After the network is trained, a GBM (relsql/train/gbm/gbm.py) is fitted on the depth-2 features
(relsql/train/gbm/flat.py `plan(depth=2)`: the one-hop features, the parents' parents, each parent's
other children under the time cut, the mean of each child's own parents) of the training rows,
stopping early on the validation rows: what Deep Feature Synthesis at depth 2 reads, computed by
the database in one query (on the outside corpus the one-hop GBM left a player's earlier salaries
to DFS). A second GBM reads only their one-hop part, a third only the target table's own columns
(column subsets of the same matrix); each gets its own weight, and the blend that scores better on
validation is kept, the wider one on a tie (on the outside corpus the extra columns were noise to
the GBM on a third of the targets, and the own columns alone the strongest anchor on the hostile
databases' small targets).
The blend `a * network + (1 - a) * GBM` is taken in the task's output space (log-odds, class
scores, or the standardized units the network's regression output and labels share: task.py
scales y by the training rows' mean and std), with `a` in {0, 0.1, ..., 1} picked on the
validation rows by the metric that chose the network's epoch (fit's monitor: MAE for a
regression, ROC-AUC, accuracy, or the loss on a validation part too small for them), so one
metric chooses both (ties go to the larger `a`: the network). a = 1 is the network alone. The
network's validation outputs weighed are cross-fitted where fit could (relsql/train/loop/crossfit.py):
each row's from the epoch the other half of the rows chose, so the weight does not reward the
network for the rows that picked its epoch (docs/quality.md: on the outside corpus this raised the
default's counts). When fit refits the network on every labelled row (relsql/train/loop/refit.py),
the GBM is fitted again on those rows for the rounds its early stopping chose, and the weight stays
the one validation picked. The two-hop and own-column GBMs learn at twice the one-hop GBM's rate
with half its patience (`QUICK`, `settings`): the one-hop GBM stays the one a user would fit with
relsql/train/gbm/gbm.py's defaults.

A Hybrid is plain data (the features' description, the trees, the weight): saved with the model,
its GBM features recomputed by the database's SQL for any row, prediction-only rows and rows of
another database after `Model.load` included.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from relsql.errors import RelsqlError
from relsql.train.gbm import baselines, flat, gbm
from relsql.train.task import metrics

WEIGHTS = tuple(round(0.1 * i, 1) for i in range(11))
# the two-hop and own-column GBMs learn at twice gbm.py's rate and stop after half its patience:
# 0.57x the boosting rounds on 964 (target, seed, candidate) fits of the outside corpus at a
# test-score change of -0.07 % (95 % interval -0.24 % .. +0.13 %; docs/performance.md)
QUICK = {"learning_rate": 0.1, "patience": 25}
LOWER_IS_BETTER = ("rmse", "mae", "loss")


@dataclass
class Hybrid:
    """`weight` (the network's share), the GBM's `trees` over `features`, and the validation
    metric each candidate weight scored (`scores`, for the report)."""

    features: flat.Flat
    trees: gbm.Trees
    weight: float
    metric: str
    scores: dict[float, float] = field(default_factory=dict)
    crossfit: bool = False  # whether the network's outputs were cross-fitted (relsql/train/loop/crossfit.py)
    _cache: dict = field(default_factory=dict, repr=False, compare=False)

    def gbm_outputs(self, learner, rids: np.ndarray) -> np.ndarray:
        """The GBM's raw outputs for output rows `rids` (features of every output row computed
        once per database and output, by SQL)."""
        key = _key(learner)
        if key not in self._cache:
            self.keep_features(learner, self.features.of_output(learner.db, learner.output, int(learner.output_rows)))
        return self.trees.raw(self._cache[key][np.asarray(rids, dtype=np.int64)])

    def keep_features(self, learner, every: np.ndarray) -> None:
        """Keep `every` (the features of every output row of `learner`) for `gbm_outputs`: the
        matrix fit() already computed serves predict() with no second query."""
        self._cache.clear()
        self._cache[_key(learner)] = every

    def blend(self, learner, rids: np.ndarray, net_out: torch.Tensor) -> torch.Tensor:
        """`weight * net_out + (1 - weight) * GBM` for output rows `rids` (net_out in the same order)."""
        if self.weight == 1.0:
            return net_out
        theirs = torch.as_tensor(self.gbm_outputs(learner, rids), dtype=net_out.dtype, device=net_out.device)
        return self.weight * net_out + (1.0 - self.weight) * theirs

    def refit(self, learner, rows: np.ndarray) -> int:
        """Fit the GBM again on labelled positions `rows` (every labelled row, after a refit) for as
        many rounds as its early stopping kept, the blend weight unchanged; returns the rounds."""
        rounds = max(1, len(self.trees.roots) // max(1, self.trees.units))
        key = _key(learner)
        if key not in self._cache:
            self.keep_features(learner, self.features.of_output(learner.db, learner.output, int(learner.output_rows)))
        x = self._cache[key][learner.labelled][rows]
        labels = learner.y.detach().cpu().double().numpy()[rows]
        self.trees = gbm.fit(x, labels, learner.task.kind, learner.task.units, learner.seed, rounds=rounds,
                             **settings(self.features))  # at the rate its rounds were chosen at (no patience: no validation)
        return rounds

    def describe(self) -> str:
        gbm = f"GBM on {reach(self.features)} features"
        share = "the network alone" if self.weight == 1.0 else f"the {gbm} alone" if self.weight == 0.0 else \
            f"{self.weight:.1f} x network + {1 - self.weight:.1f} x {gbm}"
        outputs = " (the network's outputs cross-fitted: each half at the epoch the other half chose)" if self.crossfit else ""
        return (f"blend picked on validation {self.metric}{outputs}: {share} (network weight {self.weight:.1f}; "
                f"{self.metric} {self.scores.get(self.weight, float('nan')):.4f} vs network alone "
                f"{self.scores.get(1.0, float('nan')):.4f}, GBM alone {self.scores.get(0.0, float('nan')):.4f})")

    def to_plain(self) -> dict:
        return {"features": self.features.to_plain(), "trees": self.trees.to_plain(), "weight": float(self.weight),
                "metric": self.metric, "scores": [[float(a), float(s)] for a, s in self.scores.items()],
                "crossfit": bool(self.crossfit)}

    @classmethod
    def from_plain(cls, data: dict, where: str = "hybrid") -> Hybrid:
        """A Hybrid from `to_plain`'s dict, checked (a damaged file fails here)."""
        if not isinstance(data, dict) or not {"features", "trees", "weight", "metric", "scores"} <= set(data):
            raise RelsqlError(f"{where} is damaged: not a blend of a network and a GBM")
        weight, metric, scores = data["weight"], data["metric"], data["scores"]
        if type(weight) is not float or weight not in WEIGHTS or not isinstance(metric, str) or not isinstance(scores, list):
            raise RelsqlError(f"{where} is damaged: its blend weight")
        features = flat.Flat.from_plain(data["features"], where)
        trees = gbm.Trees.from_plain(data["trees"], where)
        if trees.features != len(features.names):
            raise RelsqlError(f"{where} is damaged: its trees read {trees.features} features, its description has "
                              f"{len(features.names)}")
        crossfit = data.get("crossfit", False)  # a file written before cross-fitting: False
        if type(crossfit) is not bool:
            raise RelsqlError(f"{where} is damaged: its blend's crossfit flag")
        return cls(features, trees, weight, metric, {float(a): float(s) for a, s in scores}, crossfit)


@dataclass
class Candidate:
    """One GBM the blend may take: its `features` (the `columns` of the matrix `every` of every
    output row that all candidates share, None for all of them: no copy is held while the network
    trains), the `trees` fitted on the training rows and their raw outputs `theirs` on the
    validation rows."""

    features: flat.Flat
    every: np.ndarray
    columns: np.ndarray | None
    trees: gbm.Trees
    theirs: np.ndarray

    def x(self) -> np.ndarray:
        """This candidate's features of every output row."""
        return self.every if self.columns is None else self.every[:, self.columns]


def candidates(learner) -> list[Candidate] | None:
    """The blend's GBMs (`_feature_sets`), fitted on the training rows with early stopping on the
    validation rows: they do not depend on the network, so fit() fits them before it and its
    training can watch the blend (relsql/train/loop/blendstop.py). None without validation rows
    or features."""
    if not len(learner.rows["val"]) or not len(learner.rows["train"]):
        return None
    spec = flat.plan(learner.db, learner.table, learner.column, learner.time_column, depth=2)
    if not spec.names:
        return None
    every = spec.of_output(learner.db, learner.output, int(learner.output_rows))  # baselines.features, every row kept
    found = []
    for features, columns in _feature_sets(spec):
        x = every[:, columns] if columns is not None else every
        labelled = x[learner.labelled]
        trees = baselines.fit_trees(learner, labelled, **settings(features))
        found.append(Candidate(features, every, columns, trees, trees.raw(labelled[learner.rows["val"]])))
    return found


def fit(learner, found: list[Candidate] | None = None) -> Hybrid | None:
    """A GBM on the depth-2 features of the training rows, one on their one-hop part and one on
    the target table's own columns (`candidates`, or those `found` before training), each with the
    blend weight the validation rows pick by the metric that chose the network's epoch (see the
    module docstring); the blend that scores better there (the wider one on a tie).
    None without validation rows or features."""
    found = candidates(learner) if found is None else found
    if not found:
        return None
    with torch.no_grad():
        net, y = learner.split_outputs("val")
    honest = learner.record.crossfit  # the same run's outputs at epochs other rows chose (relsql/train/loop/crossfit.py)
    net = (net if honest is None else honest).detach().cpu().double().numpy()
    truth = y.detach().cpu().double().numpy()
    metric = chosen_on(learner)
    index, weight, scores = choose(learner.task, net, [c.theirs for c in found], truth, metric)
    kept = found[index]
    blend = Hybrid(kept.features, kept.trees, weight, metric, scores, honest is not None)
    blend.keep_features(learner, kept.x())  # predict() reads these rows' features again otherwise
    return blend


def choose(task, net: np.ndarray, theirs: list[np.ndarray], truth: np.ndarray,
           metric: str) -> tuple[int, float, dict[float, float]]:
    """`fit`'s pick from validation outputs alone (bench/blend_replay.py replays it): each GBM
    candidate's outputs (`theirs`) blended with the network's (`net`) at its best weight, the blend
    that scores best (the first, wider, on a tie): (its index, its weight, its score per weight)."""
    best = None
    for index, outputs in enumerate(theirs):
        scores = weighed(task, net, outputs, truth, metric)
        weight = best_weight(scores, metric)
        if best is None or _ranked(scores[weight], metric) > _ranked(best[2][best[1]], metric) + 1e-12:
            best = (index, weight, scores)
    return best


def weighed(task, net: np.ndarray, theirs: np.ndarray, truth: np.ndarray, metric: str) -> dict[float, float]:
    """`metric` of `a * net + (1 - a) * theirs` against `truth` for every weight a in WEIGHTS (the
    loss of all of them in one call)."""
    if metric == "loss":
        blends = np.stack([a * net + (1 - a) * theirs for a in WEIGHTS])
        return dict(zip(WEIGHTS, task.losses(torch.as_tensor(blends), torch.as_tensor(truth)).tolist()))
    if metric == "roc_auc":  # a binary task's score of its one output column (Task.score), all blends sorted at once
        blends = np.stack([(a * net + (1 - a) * theirs)[:, 0] for a in WEIGHTS])
        return dict(zip(WEIGHTS, metrics.roc_aucs(truth, blends).tolist()))
    return {a: score(task, a * net + (1 - a) * theirs, truth, metric) for a in WEIGHTS}


def best_blend(task, net: np.ndarray, found: list[Candidate], truth: np.ndarray, metric: str) -> float:
    """The best validation score any candidate's blend with `net` reaches, as larger-is-better."""
    best = float("-inf")
    for candidate in found:
        scores = weighed(task, net, candidate.theirs, truth, metric)
        best = max(best, _ranked(scores[best_weight(scores, metric)], metric))
    return best


def _feature_sets(spec: flat.Flat) -> list[tuple[flat.Flat, np.ndarray | None]]:
    """The features a blend's GBM may read, each a column subset of `spec`'s matrix: all of it;
    where it reaches two hops, its one-hop part (on the outside corpus the two-hop GBM lost to the
    one-hop one on a third of the targets, docs/quality.md); and the target table's own columns
    alone, where there are others (on the hostile corpus a GBM on them was the strongest anchor on
    7 of 10 databases: with ~100 training rows every other column was noise to the trees)."""
    near = replace(spec, parents=[p for p in spec.parents if p.of < 0 and p.features],
                   children=[replace(c, lookups=[]) for c in spec.children if not c.through])
    own = replace(spec, parents=[], children=[])
    where = {name: i for i, name in enumerate(spec.names)}
    out: list[tuple[flat.Flat, np.ndarray | None]] = [(spec, None)]
    if len(where) < len(spec.names):  # two features of one name: subsets cannot be told apart
        return out
    for part in (near, own) if spec.depth == 2 else (own,):
        columns = [where.get(name) for name in part.names]
        if part.names and None not in columns and len(columns) < len(out[-1][0].names):  # fewer: not the same set
            out.append((part, np.array(columns, dtype=np.int64)))
    return out


def settings(features: flat.Flat) -> dict:
    """gbm.fit's settings for a blend GBM over `features`: the one-hop features get gbm.py's own, so
    that GBM is the one-hop GBM a user would fit and a blend of weight 0 predicts exactly what it
    does; the two-hop and own-column ones `QUICK`'s, at about half the boosting rounds."""
    return {} if reach(features) == "one-hop" else dict(QUICK)


def reach(features: flat.Flat) -> str:
    """Which of the blend's feature sets `features` is: "two-hop", "one-hop" or "own-column"."""
    if features.depth == 2:
        return "two-hop"
    return "one-hop" if features.parents or features.children else "own-column"


def chosen_on(learner) -> str:
    """The metric fit selected the network's epoch on (its monitor without "val_"), which picks the
    blend too; the task's reported metric where fit recorded none."""
    monitor = learner.record.monitor
    if monitor is None or not monitor.startswith("val_"):
        return learner.task.metric
    return monitor.removeprefix("val_")


def best_weight(scores: dict[float, float], metric: str) -> float:
    """The weight whose blend scored best by `metric` (an undefined score ranks last); ties go to
    the larger weight: the network."""
    return max(scores, key=lambda a: (_ranked(scores[a], metric), a))


def _ranked(value: float, metric: str) -> float:
    """`value` of `metric` as larger-is-better, an undefined (NaN) score below every defined one (an
    infinite one at the largest finite magnitude, as numpy's nan_to_num: NaN ranks below -inf)."""
    value = float(-value if metric in LOWER_IS_BETTER else value)
    if math.isfinite(value):
        return value
    return -math.inf if math.isnan(value) else math.copysign(sys.float_info.max, value)


def score(task, out: np.ndarray, truth: np.ndarray, metric: str) -> float:
    """`metric` ("loss" or one of `task`'s) of raw outputs `out` against encoded labels `truth`."""
    if metric == "loss":
        return float(task.loss(torch.as_tensor(out), torch.as_tensor(truth)))
    return task.score(out, truth, metric)


def _key(learner) -> tuple:
    """What the features of `learner`'s output rows depend on: its database, output and row count."""
    return id(learner.db), learner.output, int(learner.output_rows)
