"""The learner of a ranking target: two towers from one compiled net, scored by dot product.

The query tower is the output relation (one vector per target row), the candidate tower the
relation keyed by the referenced table's key (one vector per candidate). A step scores every
training positive against negatives shared by the step (sampled uniformly, by popularity, or
from the step's own positives) with the task's loss; validation ranks all candidates exactly
(chunked top-k) and measures MAP@k. Full batch: the net computes both towers whole.

A timed relation (timed.py: one number per time and candidate) is carried as more columns of each
tower (the one-hot of the row's time, the values per time), so the losses, the exact top-k and the
pair relation's ranking see it without a case of their own. (A learnt bias per candidate, carried
the same way, was measured and left out: bench.recommend's shop, seed 0, test MAP@10 0.1197 without,
0.1195 with; on TPC-DS it learnt the training years' items, which the later years replace.)
"""

from __future__ import annotations

import time

import numpy as np
import polars as pl
import torch
from torch import nn

from relsql import arguments
from relsql.compile import make_plan
from relsql.compile.module import CompiledNet
from relsql.compile.passes import RULES, shared_aggregation
from relsql.errors import GroundingError, RelsqlError, SchemaError
from relsql.ground.execute import Presets, ground
from relsql.train.learner.defaults import RANKING_LR, RANKING_PATIENCE, RANKING_STEP_POSITIVES, ranking_batch
from relsql.train.learner.learner import Learner
from relsql.train.ranking import hard, losses, negatives, results
from relsql.train.ranking.baselines import popularity, popularity_lines
from relsql.train.ranking.metrics import Judge
from relsql.train.ranking.pairs import PairIndex, rank_with_pairs
from relsql.train.ranking.timed import TimedIndex, blends
from relsql.train.ranking.topk import top_k
from relsql.train.task.ranking import LOSSES, NEGATIVES, RankingTask, empty_scores

VALIDATION_SEED = 7919  # the validation loss's negatives: the same every epoch, so epochs compare
# the plan's passes but shared_aggregation: its greedy and timing took 3.1 s CPU (5.2 s wall) of the
# shop's 5.3 s planning in bench.recommend and rewrote no product (Template.auto's towers; the plan is
# the same for every model seed); a step took as long without it (0.093-0.096 s vs 0.095-0.104 s)
PASSES = tuple(rule for rule in RULES if rule is not shared_aggregation)
BLEND_ALPHAS = (1.0, 0.5, 0.25, 0.0)  # the dot product's share beside a timed relation, the whole first (wins ties)


class RankingLearner(Learner):
    """A Learner whose outputs are rankings of the candidate relation's rows."""

    candidates = property(lambda self: self.goal.candidates)
    whole_net_batches = True  # fit(batch_size=B): steps of B target rows' positives, both towers whole
    fit_lr, fit_patience = RANKING_LR, RANKING_PATIENCE
    fit_overfit = False  # its training loss (sampled negatives) and validation loss are not on one scale
    blends = False  # a ranking has no label prediction for a GBM to blend with
    one_process = "a ranking target, which trains in one process (both towers whole)"
    answers = "recommend"  # each row's k best candidates, no value per row
    reuses_forward = False  # its loss draws negatives against both towers: no validation forward to reuse

    def fit_batch_size(self) -> int:
        """Steps of RANKING_BATCH target rows' positives (fewer where the training rows are few)."""
        return ranking_batch(len(self.rows["train"]))

    def fit_settings(self, monitor: str, loss: str | None, class_weight: str | None, negatives: str | None,
                     hard_negatives: str | None) -> dict:
        """fit's checked monitor (MAP@k by default), loss and negatives (hard ones: this fit's only)."""
        task = self.task
        arguments.choice("monitor", monitor, ("auto", "loss", *task.metric_names()))
        if class_weight is not None:
            raise RelsqlError(f"class_weight weighs classes; {self.target} is a ranking target: drop class_weight=")
        task.loss = arguments.choice("loss", task.loss if loss is None else loss, LOSSES)
        task.negatives = arguments.choice("negatives", task.negatives if negatives is None else negatives, NEGATIVES)
        self.use_hard_negatives(hard_negatives)
        if monitor == "auto":
            monitor = task.selects_on(len(self.rows["val"]))
        return {"monitor": monitor, "regression_loss": task.regression_loss, "class_weights": None}

    def evaluate(self, split: str) -> dict[str, float]:
        """Model.evaluate on a split with rows: the loss and the ranking metrics (MAP@k, recall@k, NDCG@k,
        MRR, precision@k)."""
        return self.split_scores(split)

    def recommend(self, k: int, keys: object = None, where: object = None) -> pl.DataFrame:
        """Model.recommend: each chosen row's k best candidates (relsql/train/ranking/results.py)."""
        return results.recommend(self, k, keys, where)

    def baseline_lines(self, split: str, ours: float) -> list[str]:
        """The report's baseline: the training rows' most popular candidates, and whether the model beats it."""
        return popularity_lines(self, split, ours)

    def _build(self, presets: Presets, task: RankingTask | None, split: dict | None) -> None:
        goal = self.goal
        goal.check_columns(self.db)
        if self.mini_batches:
            raise SchemaError(f"target {goal.name} is a ranking target, which trains full-batch: drop batch_size= "
                              "(and database-stored embeddings) for it")
        started = time.perf_counter()
        grounding = ground(self.template, self.db, presets=presets, progress=self.settings.progress,
                           max_groundings=self.settings.max_groundings, outputs=(self.output,))
        self.record.timings["grounding"] = time.perf_counter() - started
        if not grounding.relations[goal.candidates].size:  # before widths: an empty relation has none to compare
            raise SchemaError(f"the candidate relation `{goal.candidates}` of ranking target {goal.name} has no rows: "
                              f"table `{goal.reference.table}` is empty or the relation's query selects none of its rows")
        if not grounding.relations[self.output].size:
            raise GroundingError(f"the output relation {self.output} has no rows: none of its statements has groundings "
                                 "(their FROM/JOIN/WHERE return no rows); "
                                 "check the join conditions and that the tables hold data")
        started = time.perf_counter()
        extra = [name for name in (goal.pair_relation, goal.timed_relation) if name]
        outputs = [self.output, goal.candidates] + extra
        plan = make_plan(self.template, grounding, self.dtype, passes=PASSES, outputs=outputs, device=self.device)
        self.net = CompiledNet(plan, grounding, dtype=self.dtype, seed=self.seed)
        self.record.timings["planning"] = time.perf_counter() - started
        widths = {name: int(np.prod(plan.meta[plan.outputs[name]].shape[1:])) for name in (self.output, goal.candidates)}
        if widths[self.output] != widths[goal.candidates]:
            raise SchemaError(f"the towers of ranking target {goal.name} differ in width: output `{self.output}` is "
                              f"{widths[self.output]} wide, candidates `{goal.candidates}` {widths[goal.candidates]}; their dot "
                              "product scores a pair, so give both the same width")
        for name in extra:
            self.check_one_wide(plan, name)
        self.output_rows = grounding.relations[self.output].size
        goal.candidate_keys = grounding.relations[goal.candidates].keys
        if not goal.candidate_keys.num_rows:
            raise SchemaError(f"the candidate relation `{goal.candidates}` of ranking target {goal.name} has no rows: "
                              f"table `{goal.reference.table}` is empty or the relation's query selects none of its rows")
        labels = goal.read(self.db)
        goal.label(self.db, labels, task, split, self.dtype, self.device)
        self.timed = None if goal.timed_relation is None else TimedIndex.of(
            grounding, goal.timed_relation, labels, goal.candidate_keys, goal.reference, goal.time_column, self.output_rows)
        self.net.to(self.device)
        self.pair_index = None if goal.pair_relation is None else \
            PairIndex.of(grounding, goal.pair_relation, self.output, goal.candidates, goal.reference)
        self.hard = None  # hard negatives: fit_options sets them (or None) for each fit
        self.step_positives: int | None = RANKING_STEP_POSITIVES  # a step's loss over at most this many positives
        self.popularity = self.training_popularity()
        self.head = TowerBlend(self.dtype) if self.timed is not None and blends(self.template) else nn.Identity()

    def baseline_scores(self, split: str) -> dict[str, float]:
        """The training rows' k most popular candidates recommended to every row of `split`."""
        return popularity(self, split)

    def training_popularity(self) -> torch.Tensor:
        """How often each candidate is a positive of the training rows (popularity negatives draw by it)."""
        items = self.goal.pairs(self.rows["train"])[1]
        return torch.as_tensor(np.bincount(items, minlength=self.candidate_rows), dtype=torch.float64)

    def resplit(self, split: dict[str, np.ndarray]) -> None:
        """The labels read again with `split`, and the popularity of its training rows."""
        super().resplit(split)
        self.popularity = self.training_popularity()

    def check_one_wide(self, plan, name: str) -> None:
        """A pair or timed relation adds one number to a pair's score: it must be one wide."""
        width = int(np.prod(plan.meta[plan.outputs[name]].shape[1:]))
        if width != 1:
            what = "pair" if name == self.goal.pair_relation else "timed"
            raise SchemaError(f"the {what} relation `{name}` of ranking target {self.goal.name} must be 1 wide (one number "
                              f"added to a pair's score), but it is {width} wide: end it in linear(..., 1)")

    def use_hard_negatives(self, sql: str | None) -> None:
        """Hard negatives from SQL `sql` (hard.py) for the fits that follow (fit(hard_negatives=) sets them
        for its own run); None drops them."""
        self.hard = None if sql is None else hard.hard_negatives(self, sql)

    @property
    def candidate_rows(self) -> int:
        return self.goal.candidate_keys.num_rows

    def check_head(self, width: int) -> None:  # no head: the towers' dot product is the score
        pass

    def towers(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(query vectors per output row, candidate vectors per candidate row)."""
        return self.computed()[:2]

    def computed(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """The towers (with the timed relation's columns, see the module) and the pair relation's
        values ([pairs], None without one), from one pass of the net."""
        values = self.net()
        query, candidate = values[self.output], values[self.candidates]
        pair = values[self.goal.pair_relation].reshape(-1) if self.goal.pair_relation else None
        query, candidate = query.reshape(query.shape[0], -1), candidate.reshape(candidate.shape[0], -1)
        if self.timed is not None:
            hot, grid = self.timed.columns(values[self.goal.timed_relation], query.dtype)
            query, candidate = torch.cat([query, hot], 1), torch.cat([candidate, grid], 1)
        return query, candidate, pair

    def pair_term(self, pair: torch.Tensor | None):
        """A function (output rows, candidate rows) -> each pair's added score (0 without a pair relation)."""
        if pair is None:
            return lambda rows, items: torch.zeros((), dtype=self.dtype, device=rows.device)
        return lambda rows, items: self.pair_index.term(pair, rows, items)

    def outputs(self) -> torch.Tensor:
        """The query tower's vectors (without the timed relation's columns)."""
        value = self.net()[self.output]
        return value.reshape(value.shape[0], -1)

    def pair_loss(self, positions: np.ndarray, generator: torch.Generator | None = None,
                  computed: tuple | None = None, cap: int | None = None) -> torch.Tensor:
        """The task's loss over the positives of labelled rows `positions`, negatives drawn from
        `generator` (default torch's, i.e. the model's own stream during fit); `computed`: the
        towers of computed() when already at hand."""
        task = self.task
        rows, items = self.goal.pairs(positions)
        if cap is not None and len(rows) > cap:  # a seeded subset of the step's positives
            keep = torch.randperm(len(rows), generator=generator if generator is not None else _default_generator())[:cap]
            keep = np.sort(keep.numpy())
            rows, items = rows[keep], items[keep]
        full_query, candidate, pair = computed if computed is not None else self.computed()
        added = self.pair_term(pair)
        device = full_query.device
        rows = torch.as_tensor(rows, device=device)
        query = full_query.index_select(0, rows)
        items = torch.as_tensor(items, device=device)
        positive = (query * candidate.index_select(0, items)).sum(1) + added(rows, items)
        drawn, log_q = self.draw(items, generator)
        scores = query @ candidate.index_select(0, drawn).T
        if pair is not None:
            scores = scores + self.pair_index.matrix(pair, rows, drawn)
        scores = scores.masked_fill_(drawn[None, :] == items[:, None], -1e4)  # a drawn positive is no negative
        loss = losses.ranking_loss(task.loss, positive, scores, log_q=log_q if task.loss == "softmax" else None)
        if self.hard is not None:
            extra = hard.hard_loss(self, np.asarray(positions, dtype=np.int64), full_query, candidate, added,
                                   generator if generator is not None else _default_generator())
            loss = loss if extra is None else loss + extra
        return loss

    def draw(self, items: torch.Tensor, generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
        """The step's shared negatives and their log sampling probabilities."""
        task, m = self.task, self.candidate_rows
        generator = generator if generator is not None else _default_generator()
        count = min(task.count, m)
        if task.negatives == "in-batch":  # the step's positive items: popular items are drawn as often as they are bought
            pick = torch.randint(len(items), (count,), generator=generator).to(items.device)
            drawn = items[pick]
            frequency = torch.bincount(items, minlength=m).to(torch.float64) / len(items)
            return drawn, frequency[drawn].log().to(self.dtype)
        drawn, log_q = negatives.sample_negatives(task.negatives, count, m, generator, popularity=self.popularity)
        return drawn.to(items.device), log_q.to(device=items.device, dtype=self.dtype)

    def batch_loss(self, batch, external: dict, share: np.ndarray) -> torch.Tensor:
        return self.pair_loss(np.asarray(share, dtype=np.int64), cap=self.step_positives)

    def rank(self, rids: np.ndarray, k: int, computed: tuple | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(scores, candidate row ids) of the k best candidates of output rows `rids`, exact; `computed`:
        the towers of computed() when already at hand."""
        with torch.no_grad():
            query, candidate, pair = computed if computed is not None else self.computed()
            query = self.blended(query, float(self.head.alpha) if isinstance(self.head, TowerBlend) else 1.0)
            if pair is not None:
                return rank_with_pairs(query, candidate, pair, self.pair_index, np.asarray(rids, dtype=np.int64), k)
            return top_k(query.index_select(0, torch.as_tensor(rids, device=query.device)), candidate, k)

    def blended(self, query: torch.Tensor, alpha: float) -> torch.Tensor:
        """The query tower's own columns times `alpha` (the timed relation's columns as they are)."""
        if alpha == 1.0 or self.timed is None:
            return query
        own = query.shape[1] - self.timed.times
        return torch.cat([query[:, :own] * alpha, query[:, own:]], 1)

    def pick_blend(self, positions: np.ndarray, computed: tuple, judge: Judge) -> tuple[torch.Tensor, dict[str, float]]:
        """Set the head's alpha to the one of BLEND_ALPHAS whose ranking of `positions` has the best MAP@k
        (the first on ties); that ranking's candidate row ids and its scores by `judge`."""
        best = None
        for alpha in BLEND_ALPHAS:
            self.head.alpha.fill_(alpha)
            _, ranked = self.rank(self.labelled[positions], self.task.k, computed)
            found = judge(ranked.cpu().numpy())
            if best is None or found[f"map@{self.task.k}"] > best[0][f"map@{self.task.k}"]:
                best = found, alpha, ranked
        self.head.alpha.fill_(best[1])
        return best[2], best[0]

    def judge(self, split: str) -> Judge:
        """The metrics of rankings of a split's rows, its truth prepared once (validation judges every
        epoch, and up to len(BLEND_ALPHAS) rankings each time)."""
        positions, k = self.rows[split], self.task.k
        judges = self.__dict__.setdefault("_judges", {})  # split -> (its rows, k, judge)
        kept = judges.get(split)
        if kept is None or kept[0] is not positions or kept[1] != k:
            offsets, ids = self.goal.truth(split)
            kept = judges[split] = positions, k, Judge(offsets, ids, k)
        return kept[2]

    def split_scores(self, split: str, source=None, batch_size: int | None = None, prefix: str = "") -> dict[str, float]:
        """The loss (negatives drawn alike every time) and the ranking metrics on a split."""
        positions = self.rows[split]
        if not len(positions):
            return {f"{prefix}loss": float("nan"), **{f"{prefix}{k}": v for k, v in empty_scores(self.task).items()}}
        judge = self.judge(split)
        with torch.no_grad():
            computed = self.computed()  # one pass of the net for the loss and the ranking
            loss = float(self.pair_loss(positions, torch.Generator().manual_seed(VALIDATION_SEED), computed))
            if split == "val" and isinstance(self.head, TowerBlend):
                _, scores = self.pick_blend(positions, computed, judge)
            else:
                _, index = self.rank(self.labelled[positions], self.task.k, computed)
                scores = judge(index.cpu().numpy())
        return {f"{prefix}loss": loss, **{f"{prefix}{name}": float(scores[name]) for name in self.task.metric_names()}}


class TowerBlend(nn.Module):
    """How much of the towers' dot product a ranking adds to the timed relation's value: `alpha`, picked
    on the validation rows each epoch among BLEND_ALPHAS (training always scores with the whole dot
    product). Where items are bought uniformly (TPC-DS) the towers add noise to what sells as of each
    snapshot, and validation picks little or none of them; on the shop it keeps them whole."""

    def __init__(self, dtype: torch.dtype):
        super().__init__()
        self.register_buffer("alpha", torch.ones((), dtype=dtype))

    def load_state_dict(self, state, strict: bool = True, assign: bool = False):
        """A model saved before the blend existed has no alpha: its towers count whole."""
        if "alpha" not in state:
            state = {**state, "alpha": torch.ones_like(self.alpha)}
        return super().load_state_dict(state, strict, assign)


def _default_generator() -> torch.Generator:
    """A generator continuing torch's default stream (fit runs inside the model's own stream)."""
    return torch.Generator().manual_seed(int(torch.randint(0, 2**62, (1,)).item()))
