"""The trainable model (what Lightning calls the LightningModule): the compiled net and its head
over a target, with the batches it reads. Built from a database (grounding and planning it), or
from a saved state without one (a training rank's, from the grounding store).
"""

from __future__ import annotations

import contextlib
import copy
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn

from relsql import arguments, cores
from relsql.compile import make_plan, shapes
from relsql.compile.module import CompiledNet
from relsql.data.duckdb import engine_threads
from relsql.data.engine import Database
from relsql.errors import GroundingError, RelsqlError
from relsql.ground import reach
from relsql.ground.demand import BatchGrounder, database_embeddings
from relsql.ground.execute import Presets, ground
from relsql.ground.store import GroundingStore, fingerprint
from relsql.template.ir import Template
from relsql.train.feed import guards
from relsql.train.feed.batched import Batch, Batched
from relsql.train.feed.batches import batches
from relsql.train.feed.source import BatchSource, Whole
from relsql.train.gbm import baselines
from relsql.train.learner import members
from relsql.train.learner.defaults import LR, PATIENCE
from relsql.train.learner.record import FitRecord
from relsql.train.learner.threads import torch_threads
from relsql.train.persist.saved import ModelState
from relsql.train.task.target import Target
from relsql.train.task.task import SCORES, Task

if TYPE_CHECKING:
    import polars as pl

log = logging.getLogger("relsql")
# plan over the rows the output reads only where at least this share of the groundings goes: a
# smaller cut costs its copy and saves a few rows of work (relsql/ground/reach.py)
LIVE_SHARE = 0.02


@dataclass
class Settings:
    """How a model grounds, runs and stores its batches (checked by the caller)."""

    dtype: torch.dtype = torch.float32
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    progress: bool | None = None
    batch_size: int | None = None
    fanout: dict | int | None = None
    store: str | bool | None = True
    embedding_optimizer: str | None = None
    embedding_lr: float = 0.1
    max_groundings: int | None = None


class Learner:
    """Net, head and target; outputs, weights, and the record of training (history, best epoch)."""

    # a batch_size cuts the training rows into steps that each run the whole net (ranking: both
    # towers whole, the loss on some rows' positives), rather than mini-batches from the store
    whole_net_batches = False
    # what fit does by default, and may do, with this kind of target (a ranking learner says its own)
    fit_lr, fit_patience = LR, PATIENCE  # lr= and patience= when not given
    fit_overfit = True  # overfit= when not given: training and validation losses are one function of the rows
    blends = True  # fit(hybrid=True) may blend a GBM with its predictions (a label's)
    one_process: str | None = None  # why fit must train it in one process (no workers=, no torchrun), if it must
    # the verb (Model's method, the CLI's command) giving what the model answers per target row: one value
    # (predict); a ranking learner's answers are the row's k best candidates (recommend)
    answers = "predict"
    # its training loss reads outputs(): a full-batch validation forward may serve the next step (relsql/train/loop/reuse.py)
    reuses_forward = True

    def __init__(self, db: Database | None, template: Template, target: Target, settings: Settings):
        self.db, self.template, self.goal, self.settings = db, template, target, settings
        self.pending = None  # a loaded model's state, applied on first use (relsql/train/learner/loaded.py)
        self.net: CompiledNet | None = None
        self.grounding_whole = True  # False: the net's grounding lacks rows no output reads (relsql/ground/reach.py)
        self.head: nn.Module = nn.Identity()
        self.batched: Batched | None = None
        self.mini_batches = settings.batch_size is not None or bool(database_embeddings(template))
        self.output_rows = 0
        self.fingerprint: str | None = None
        self.record = FitRecord()  # the record of training (history, best epoch, ...), put here by the fit entry points
        # after a refit on every labelled row (relsql/train/loop/refit.py): {"epochs", "rows", "train_loss",
        # "held_out": the selected model's validation and test scores, "gbm_rounds" where a blend was refit}
        self.refit: dict | None = None
        self.no_refit: str | None = None  # after a fit without a refit: why ("refit=False", or what prevented it)
        self.random_state: torch.Tensor | None = None  # the model's own torch generator state (Model.fit's draws)
        self.trials = None  # after Model.search: one row per trial (relsql/train/model/search.py)
        self.hybrid = None  # a GBM blended with the network (relsql/train/gbm/hybrid.py), where one is picked

    @property
    def automatic(self) -> bool:
        """Whether its template is Template.auto's text (edited or not): fit's defaults differ for one
        (a GBM blend; the network alone in steps of shares of the rows: relsql/train/loop/options.py)."""
        from relsql.template.auto import is_automatic  # the generator's package, only where asked

        return is_automatic(self.template.source or "")

    # -- the target's names, read through -------------------------------------------------------
    target = property(lambda self: self.goal.name)
    table = property(lambda self: self.goal.table)
    column = property(lambda self: self.goal.column)
    output = property(lambda self: self.goal.output)
    time_column = property(lambda self: self.goal.time_column)
    fractions = property(lambda self: self.goal.fractions)
    seed = property(lambda self: self.goal.seed)
    task = property(lambda self: self.goal.task)
    rows = property(lambda self: self.goal.rows)
    labelled = property(lambda self: self.ready().goal.labelled)
    positions = property(lambda self: self.ready().goal.positions)
    y = property(lambda self: self.ready().goal.y)
    dtype = property(lambda self: self.settings.dtype)
    device = property(lambda self: self.settings.device)

    @contextlib.contextmanager
    def own_random_stream(self):
        """fit's random draws (dropout masks, negatives) come from the model's own torch generator
        state, seeded by its seed and carried from one fit to the next: the caller's generator is
        left as it was, and the model's draws do not depend on what the caller drew before."""
        if self.random_state is None:
            self.random_state = torch.Generator().manual_seed(self.seed).get_state()
        with torch.random.fork_rng(devices=[]):
            torch.set_rng_state(self.random_state)
            try:
                yield
            finally:
                self.random_state = torch.get_rng_state()

    # -- a loaded model, built on first use ------------------------------------------------------
    # Model.load defers grounding and planning (relsql/train/learner/loaded.py): the net, the head, the
    # batches and the labels are made when first read, as Model(...) would have made them.
    net = property(lambda self: self.ready()._net, lambda self, value: setattr(self, "_net", value))
    head = property(lambda self: self.ready()._head, lambda self, value: setattr(self, "_head", value))
    batched = property(lambda self: self.ready()._batched, lambda self, value: setattr(self, "_batched", value))

    def ready(self) -> Learner:
        """This learner, built: a loaded model's deferred grounding and planning done now."""
        pending = self.__dict__.get("pending")
        if pending is not None:
            self.pending = None
            try:
                pending.complete(self)
            except BaseException:
                self.pending = pending
                raise
        return self

    def asked(self, keys: object, where: object):
        """What predict(keys=, where=) reads: this learner, or for a loaded model not built yet a
        view that grounds and runs only the rows asked for (relsql/train/learner/loaded.py)."""
        if self.__dict__.get("pending") is None or (keys is None and where is None):
            return self
        return self.pending.asked(self)

    # -- construction -----------------------------------------------------------------------------
    def build(self, presets: Presets, task: str | Task | None, split: dict | None = None) -> None:
        """Ground (all of it, or the key tables for mini-batches), plan, read the labels, make the head.
        What draws random numbers here (the head's initial weights) draws from the model's seed in a
        stream of its own: the caller's torch generator is left as it was. Planning runs on the
        threads training uses by default (half the cores), so that the kernels it times are timed
        as they will run; on a busy 2-core machine torch's every-core default made Lahman's planning
        34 s instead of 10 s (its threads spinning against each other and the other jobs). Grounding
        runs on as many DuckDB threads, where that is relsql's choice (`engine_threads`: not a count
        the user set, put back afterwards): DuckDB's two threads on that machine cost Lahman's
        grounding a third more than one."""
        with torch.random.fork_rng(devices=[]), torch_threads(None), engine_threads(self.db, cores.half()):
            torch.manual_seed(self.seed)
            self._build(presets, task, split)

    def _build(self, presets: Presets, task: str | Task | None, split: dict | None) -> None:
        self.goal.check_columns(self.db)
        started = time.perf_counter()
        if self.mini_batches:  # keys only, up front; each batch grounds its own rows
            self.batched = self.make_batched(presets)
            self.record.timings["grounding"] = time.perf_counter() - started
            log.info("grounded the key tables of %d relations in %.2fs", len(self.batched.grounder.order),
                     self.record.timings["grounding"])
            labels = self.goal.read(self.db)
            started = time.perf_counter()
            probe = self.batched.prepare(labels.column("_rid").to_numpy()[: min(labels.num_rows, self.settings.batch_size or 64)])
            self.net = CompiledNet(probe.plan, probe.grounding, dtype=self.dtype, seed=self.seed)
            self.record.timings["planning"] = time.perf_counter() - started
            self.output_rows = self.batched.grounder.sizes[self.output]
            plan = probe.plan
        else:
            grounding = ground(self.template, self.db, presets=presets, progress=self.settings.progress,
                               max_groundings=self.settings.max_groundings, outputs=(self.output,))
            self.record.timings["grounding"] = time.perf_counter() - started
            log.info("grounded %d relations in %.2fs; planning", len(grounding.relations), self.record.timings["grounding"])
            started = time.perf_counter()
            whole = grounding
            grounding = reach.live(grounding, self.output, LIVE_SHARE)  # rows no output row reads are never computed
            self.grounding_whole = grounding is whole  # else to_heterodata grounds the database again
            plan = make_plan(self.template, grounding, self.dtype, outputs=[self.output], device=self.device)
            self.net = CompiledNet(plan, grounding, dtype=self.dtype, seed=self.seed)
            self.record.timings["planning"] = time.perf_counter() - started
            log.info("planned %d ops in %.2fs", len(plan.ops), self.record.timings["planning"])
            self.output_rows = grounding.relations[self.output].size
            labels = self.goal.read(self.db)
        if not self.output_rows:
            raise GroundingError(f"the output relation {self.output} has no rows: none of its statements has groundings "
                                 "(their FROM/JOIN/WHERE return no rows); check the join conditions and that the tables "
                                 "hold data")
        self.goal.label(self.db, labels, task, split, self.dtype, self.device)
        width = int(np.prod(plan.meta[plan.outputs[self.output]].shape[1:]))
        self.check_head(width)
        self.head = members.head(self.template, self.output, width, self.task.units, self.dtype)
        self.net.to(self.device)
        self.head.to(self.device)

    def baseline(self, split: str) -> dict[str, float]:
        """The metrics of the obvious predictor on a split, fit on the training rows (Model.baseline)."""
        if split not in self.rows or not len(self.rows[split]):
            raise RelsqlError(f"split {split!r} has no rows; use 'train', 'val' or 'test'")
        return self.baseline_scores(split)

    def baseline_scores(self, split: str) -> dict[str, float]:
        """The majority class (classification) or the mean (regression) of the training rows, on `split`."""
        return baselines.majority(self, split)

    def fit_batch_size(self) -> int | None:
        """fit's rows per step where batch_size= is not given: the model's own (None: full batch)."""
        return self.settings.batch_size

    def fit_settings(self, monitor: str, loss: str | None, class_weight: str | None, negatives: str | None,
                     hard_negatives: str | None) -> dict:
        """fit's checked monitor, loss and class weights for a label (classification or regression):
        negatives are a ranking's, refused here. Sets the task's loss and class weights."""
        task = self.task
        if negatives is not None or hard_negatives is not None:
            raise RelsqlError(f"negatives= and hard_negatives= are for a ranking target; {self.target} is {task.kind}: "
                              "drop them")
        metrics = ("loss", *task.scores(np.zeros((2, task.units)), np.zeros(2)))
        arguments.choice("monitor", monitor, ("auto", *metrics))
        if task.kind == "regression":
            loss = arguments.choice("loss", "huber" if loss is None else loss, ("huber", "mse", "mae"))
            if class_weight is not None:
                raise RelsqlError(f"class_weight weighs classes, but {self.target} is a regression target: drop class_weight=")
        elif loss is not None:
            raise RelsqlError(f"loss= chooses a regression loss; {self.target} is {task.kind} (cross-entropy): drop loss=")
        arguments.choice("class_weight", class_weight, ("balanced", None))
        task.regression_loss = loss or task.regression_loss
        task.class_weights = None
        if class_weight == "balanced":
            task.balance(self.y[self.rows["train"]].cpu().numpy())
        return {"monitor": task.selects_on(self.y[self.rows["val"]].cpu().numpy()) if monitor == "auto" else monitor,
                "regression_loss": task.regression_loss, "class_weights": task.class_weights}

    def evaluate(self, split: str) -> dict[str, float]:
        """Model.evaluate on a split with rows (relsql/train/learner/results.py checks it): the loss and the
        task's metrics of the outputs (blended with fit's GBM, where it picked one) against the labels."""
        with torch.no_grad():
            out, y = self.split_outputs(split)
            hybrid = getattr(self, "hybrid", None)
            if hybrid is not None:
                out = hybrid.blend(self, self.labelled[self.rows[split]], out)
            return self.scores(out, y)

    def recommend(self, k: int, keys: object = None, where: object = None) -> pl.DataFrame:
        """Model.recommend: a ranking learner's; this one gives one value per row."""
        raise RelsqlError(f"recommend() ranks the rows a foreign-key target references; {self.target} is "
                          f"{self.task.kind}: use predict()")

    def baseline_lines(self, split: str, ours: float) -> list[str] | None:
        """The report's lines on the baselines of `split` where this learner writes its own (`ours`:
        the model's score on the task's metric); None: the report compares a label's baselines (the
        majority or mean, a linear model and GBMs of the table's columns, relsql/train/model/report.py)."""
        return None

    def resplit(self, split: dict[str, np.ndarray]) -> None:
        """Read the labels again with `split` (labelled positions per part), as search gives each trial
        the base model's split: a regression target is then standardized with the same training rows."""
        self.goal.label(self.db, self.goal.read(self.db), self.task.kind, split, self.dtype, self.device)

    def check_head(self, width: int) -> None:
        """The head's weight and its outputs (one row per output row, full batch; per batch row in
        mini-batches) fit in memory before torch allocates them: a target with 10^5 classes does not."""
        units, size = self.task.units, self.settings.batch_size
        rows = min(self.output_rows, size) if self.mini_batches and size else self.output_rows
        fix = (f"{units} classes are too many to predict one by one: is {self.target} a key or free text? Predict a "
               "coarser column, or task='regression' for a number" if self.task.kind == "multiclass" else
               "use a smaller output width")
        for shape in ((units, width), (rows, units)):
            shapes.check_size(shape, self.dtype, f"target {self.target} ({self.task.kind}, output relation {self.output})", fix)

    def make_batched(self, presets: Presets) -> Batched:
        """The mini-batch grounder (and its store) on the database; checked against the build."""
        settings = self.settings
        grounder = BatchGrounder(self.template, self.db, self.output, presets, fanout=settings.fanout, seed=self.seed,
                                 progress=settings.progress, max_groundings=settings.max_groundings)
        store = None
        if settings.store is not False:
            started = time.perf_counter()
            store = GroundingStore.open(grounder, None if settings.store is True else settings.store, settings.progress,
                                        dtype=self.dtype)
            self.record.timings["bulk_grounding"] = time.perf_counter() - started
        if self.net is not None:  # the model was built on an earlier reading of the tables
            built = self.net.grounding
            guards.check_same({n: r.size for n, r in built.relations.items()}, grounder.sizes, "rows per relation")
            guards.check_same(built.vocab_sizes, {w: t.num_rows for w, t in grounder.dictionary_tables.items()},
                              "categories per embedding")
        self.fingerprint = fingerprint(grounder) if store is None else None  # batches read the tables live
        return self.attach(grounder, store)

    def attach(self, grounder: BatchGrounder, store: GroundingStore | None) -> Batched:
        return Batched(grounder, self.template, self.output, self.dtype, self.seed,
                       self.settings.embedding_optimizer or "adagrad", self.settings.embedding_lr, store, device=self.device)

    def ensure_batched(self) -> Batched:
        """The mini-batch grounder, made (with the full grounding's encodings) on first use."""
        if self.batched is None:
            self.batched = self.make_batched(self.presets())
        return self.batched

    def check_unchanged(self, source: BatchSource | None = None) -> None:
        """Mini-batches grounded in the database (store=False) read the tables again: they must
        still hold the rows the model was built on (a hash of every row, one scan per table)."""
        built = self.fingerprint
        if built is None or self.batched is None or self.batched.grounding_store is not None:
            return
        now = fingerprint(self.batched.grounder) if source is None else source.run(fingerprint, self.batched.grounder)
        guards.check_fingerprint(built, now, self.output)

    def encodings(self) -> Presets:
        """The dictionaries and feature statistics in use (database-stored embeddings have none)."""
        if self.mini_batches:
            grounder = self.batched.grounder
            return Presets(dict(grounder.dictionary_tables), dict(grounder.feature_stats))
        return self.presets()

    def presets(self) -> Presets:
        """The encodings of the full grounding, so mini-batches encode features and categories alike."""
        grounding = self.net.grounding
        return Presets(dict(grounding.dictionaries), dict(grounding.feature_stats))

    # -- outputs ----------------------------------------------------------------------------------
    def outputs(self) -> torch.Tensor:
        """Every output row's outputs after the head, full batch."""
        value = self.net()[self.output]
        return self.head(value.reshape(value.shape[0], -1))

    def batch_outputs(self, batch: Batch | Whole, external: dict[str, torch.Tensor],
                      whole: torch.Tensor | None = None) -> torch.Tensor:
        """A batch's outputs, in batch order; `whole`: outputs() already computed (a full batch's)."""
        if isinstance(batch, Whole):
            whole = self.outputs() if whole is None else whole
            return members.rows(whole, torch.as_tensor(batch.rids, device=self.device))
        return Batched.outputs(self.net, self.head, batch, external, self.output)

    def outputs_of(self, rids: np.ndarray, source: BatchSource | None = None, batch_size: int | None = None) -> torch.Tensor:
        """Outputs for output rows `rids` in mini-batches, without gradients."""
        own = source is None
        if own:  # predict() or evaluate(): read the tables again only if they are the model's
            self.check_unchanged()
            source = BatchSource(self.batched)
        try:
            outs = [torch.zeros((0, self.task.units), dtype=self.dtype, device=self.device)]
            for _, batch, external in source.epoch(batches(np.asarray(rids), batch_size or self.settings.batch_size, None)):
                if batch is not None:
                    with torch.no_grad():
                        outs.append(self.batch_outputs(batch, external))
            return torch.cat(outs)
        finally:
            if own:
                source.close()

    def split_outputs(self, split: str, source: BatchSource | None = None, batch_size: int | None = None,
                      whole: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(outputs, encoded labels) of a split's rows; `whole`: outputs() already computed (full batch)."""
        index, y = self.goal.split_index(split)
        if whole is None and self.batched is not None and (self.mini_batches or (source is not None and not source.full)):
            return self.outputs_of(self.labelled[self.rows[split]], source, batch_size), y
        with torch.no_grad():
            return (self.outputs() if whole is None else whole.detach()).index_select(0, index), y

    def batch_loss(self, batch: Batch | Whole, external: dict[str, torch.Tensor], share: np.ndarray,
                   whole: torch.Tensor | None = None) -> torch.Tensor:
        """The training loss of a batch whose labelled rows are `share` (positions into `labelled`);
        `whole`: outputs() already computed (a full batch's, with its graph)."""
        return members.loss(self.task, self.batch_outputs(batch, external, whole),
                            self.y[torch.as_tensor(share, device=self.device)])

    def split_scores(self, split: str, source: BatchSource | None = None, batch_size: int | None = None,
                     prefix: str = "", whole: torch.Tensor | None = None) -> dict[str, float]:
        """The loss and the task's metrics on a split's rows; `whole`: outputs() already computed."""
        out, y = self.split_outputs(split, source, batch_size, whole)
        return self.scores(out, y, prefix)

    def scores(self, out: torch.Tensor, y: torch.Tensor, prefix: str = "") -> dict[str, float]:
        """The loss and the task's metrics of outputs `out` against labels `y`."""
        record = {f"{prefix}loss": float(self.task.loss(out, y))}
        for name, value in self.task.scores(out.cpu().double().numpy(), y.cpu().double().numpy()).items():
            record[f"{prefix}{name}"] = value
        return record

    def metric_and_loss(self, out: torch.Tensor, y: torch.Tensor, metric: str) -> tuple[float, float]:
        """`scores`' `metric` (NaN where it has none of that name) and loss, computing only those two:
        the cross-fitted halves score both halves every epoch."""
        if self.task.kind not in SCORES:  # a task whose metrics only `scores` knows
            scores = self.scores(out, y)
            return scores.get(metric, float("nan")), scores["loss"]
        loss = float(self.task.loss(out, y))
        if metric == "loss" or metric not in SCORES[self.task.kind]:
            return (loss if metric == "loss" else float("nan")), loss
        return self.task.score(out.cpu().double().numpy(), y.cpu().double().numpy(), metric), loss

    # -- weights ----------------------------------------------------------------------------------
    def parameters(self) -> list[nn.Parameter]:
        return [p for p in [*self.net.parameters(), *self.head.parameters()] if p.requires_grad]

    def head_weights(self) -> dict[str, nn.Parameter]:
        return {f"_head.{name}": p for name, p in self.head.named_parameters()}

    def weights_by_name(self) -> dict[str, nn.Parameter]:
        """Every parameter whole under its name (gradients are taken of these)."""
        return {**self.net.weights_by_name(), **self.head_weights()}

    def fixed(self) -> set[str]:
        return {name for name, spec in self.template.weights.items() if spec.fixed}

    def weights_copy(self) -> tuple[dict, dict]:
        return ({n: p.detach().clone() for n, p in self.net.weights_by_name().items()},
                copy.deepcopy(self.head.state_dict()))

    def restore_weights(self, state: tuple[dict, dict]) -> None:
        self.net.set_named_weights(state[0], self.fixed())
        self.head.load_state_dict(state[1])

    def is_embedding(self, name: str) -> bool:
        """Whether weight `name` is an in-memory embedding trained by the embedding optimizer."""
        spec = self.template.weights.get(name)
        return bool(self.settings.embedding_optimizer) and spec is not None and spec.kind == "embed"

    def embedding_tables(self) -> dict:
        """The database-stored embeddings' tables met so far."""
        return self.batched.stores if self.batched is not None else {}

    def move(self, device: torch.device) -> None:
        """Net, head and labels onto `device` (a rank's own GPU)."""
        self.settings.device = device
        self.net.to(device)
        self.head.to(device)
        self.goal.y = self.goal.y.to(device)



def from_state(state: ModelState, store: GroundingStore) -> Learner:
    """A training rank's learner: the parent's state and its labels, batches from the grounding
    store (no database). Its net is planned on a first batch, then given the parent's weights."""
    table, column = state.target.rsplit(".", 1)
    target = Target(table, column, state.output, state.template.relations[state.output].keys, state.time_column,
                    state.fractions, state.seed)
    device = torch.device(state.device)
    target.restore(state.task, state.labelled, state.split, state.y.to(device))
    settings = Settings(dtype=state.dtype, device=device, progress=False, batch_size=state.batch_size, fanout=state.fanout,
                        store=True, embedding_optimizer=state.embedding_optimizer, embedding_lr=state.embedding_lr)
    learner = Learner(None, state.template, target, settings)
    learner.record = FitRecord(history=list(state.history), best_epoch=state.best_epoch)
    learner.batched = learner.attach(store.grounder, store)
    probe = learner.batched.prepare(state.labelled[: min(len(state.labelled), state.batch_size or 64)])
    learner.net = CompiledNet(probe.plan, probe.grounding, dtype=state.dtype, seed=state.seed)
    learner.net.set_named_weights(state.weights, learner.fixed())
    if state.head:
        learner.head = loaded_head(state.head, state.dtype)
    else:  # the members' mean where the output relation holds members (it has no weights to give), else none
        plan = learner.net.plan
        width = int(np.prod(plan.meta[plan.outputs[learner.output]].shape[1:]))
        if (k := members.count(learner.template, learner.output, width, learner.task.units)) > 1:
            learner.head = members.MemberMean(k, learner.task.units)
    learner.net.to(device)
    learner.head.to(device)
    return learner


def loaded_head(head: dict[str, torch.Tensor], dtype: torch.dtype) -> nn.Linear:
    """A Linear holding a saved head's weights (copies in `dtype`). It is made on the meta device and
    given the saved tensors, so nothing is drawn or initialised: torch's skip_init, which did this
    before, imports sympy on first use, 0.7 s of CPU in a model's load."""
    weight = head["weight"]
    linear = nn.Linear(weight.shape[1], weight.shape[0], device="meta", dtype=dtype)
    linear.load_state_dict({name: value.to(dtype=dtype, copy=True) for name, value in head.items()}, assign=True)
    return linear
