"""`relsql.Model`: a template, a database and a target column, trained end to end.

The output relation (the template's last, or `output=`) is joined with the target table on
its key columns, so each labelled target row gets the value of its head. Rows with a NULL
target are prediction-only. Temporal splits order rows by `time_column`; keeping future rows
out of a target's groundings is the template's job (see README, "Time").
"""

from __future__ import annotations

import contextlib
import copy
import functools
import logging
import os
import time
from pathlib import Path

import duckdb
import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import sqlglot.expressions as exp
import torch
from torch import nn

from relsql import arguments
from relsql.compile import make_plan, shapes
from relsql.compile.module import CompiledNet
from relsql.db import Database, first_line, free_name, lost_connection
from relsql.errors import RelsqlError, SchemaError, SourceError
from relsql.ground import query as q
from relsql.ground.demand import BatchGrounder, database_embeddings
from relsql.ground.execute import Presets, ground, groundings_limit
from relsql.ground.store import GroundingStore, fingerprint
from relsql.template.ir import Template
from relsql.train import baselines, checks, gradients, guards, saved
from relsql.train import checkpoint as checkpoints
from relsql.train.batched import Batch, Batched
from relsql.train.batches import Worker, batches
from relsql.train.leakage import target_reads
from relsql.train.report import LOSSES, plot_history, text_report
from relsql.train.split import split_rows
from relsql.train.task import Task, detect
from relsql.train.threads import torch_threads

log = logging.getLogger("relsql")  # progress as log lines, for runs without a terminal (the CLI shows them)


def _with_threads(method):
    """Run a Model method with torch's threads set for this model (and put back afterwards), and
    a database server that went away reported as such."""
    @functools.wraps(method)
    def run(self, *args, **kwargs):
        with torch_threads(getattr(self, "threads", None)), _server_reachable(self):
            return method(self, *args, **kwargs)

    return run


# How a lost or refused connection reads in the errors of DuckDB's scanners (PostgreSQL's libpq texts)
def _reports_server(method):
    """A Model method (the constructor) whose lost database connection is a SourceError naming it."""
    @functools.wraps(method)
    def run(self, *args, **kwargs):
        with _server_reachable(self):
            return method(self, *args, **kwargs)

    return run


@contextlib.contextmanager
def _server_reachable(model: Model):
    """A database that cannot be reached any more (a PostgreSQL server stopped mid-training) is a
    SourceError naming it, whether DuckDB raised it raw or relsql already wrapped it for a statement."""
    try:
        yield
    except (duckdb.Error, RelsqlError) as err:
        db = getattr(model, "db", None)
        lost = None if isinstance(err, SourceError) or db is None else lost_connection(db.description, err)
        if lost is None:
            raise
        raise lost from None


class Model:
    """Trains a template's output relation to predict `target` ("table.column")."""

    @_reports_server
    def __init__(self, db: Database, template: Template | str | Path, target: str, *, output: str | None = None,
                 task: str | None = None, time_column: str | None = None,
                 split: tuple[float, float, float] = (0.7, 0.15, 0.15), seed: int = 0,
                 dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu", progress: bool | None = None,
                 batch_size: int | None = None, fanout: dict[str, int] | int | None = None,
                 embedding_optimizer: str | None = None, embedding_lr: float = 0.1, allow_target_inputs: bool = False,
                 threads: int | None = None, store: str | Path | bool | None = None,
                 max_groundings: int | None = None):
        """`batch_size` (target rows per batch) trains on mini-batches: the database grounds every
        relation once, in bulk, into a grounding store on disk (`store`: a folder to keep it in
        and reuse while the data is unchanged; default a temporary one; False grounds every batch
        in the database instead), and each batch reads only its own rows' groundings from it, so
        per-batch time and memory follow the batch, not the database. `fanout` caps the groundings
        per head (per relation, or one number for all), a seeded sample; off by default (exact). Embeddings declared
        with storage='database' live in database tables, trained in SQL by `embedding_optimizer`
        ("adagrad", the default for them, or "sgd") at `embedding_lr`; they imply mini-batches.
        Setting `embedding_optimizer` also trains in-memory embeddings that way instead of Adam.
        A template that reads the target column (or a copy of it) is refused unless
        `allow_target_inputs=True`: a model that sees its label learns nothing. `threads`: torch's
        threads while this model trains and predicts (default: half the cores, see
        relsql/train/threads.py); torch's own setting is restored afterwards. A rule the database
        estimates at more than `max_groundings` groundings (default 10^8) is refused before it runs."""
        if not isinstance(db, Database):
            raise RelsqlError(f"db must be a relsql.Database (from relsql.connect(...)), got {type(db).__name__}")
        self.db = db
        if not isinstance(template, Template | str | Path):
            raise RelsqlError(f"template must be a relsql.Template or the path of a template file, got {type(template).__name__}")
        self.template = template if isinstance(template, Template) else Template.from_file(template)
        self.table, self.column = arguments.target(target)
        self.target = target
        self.output = arguments.text("output", output, optional=True) or checks.default_output(self.template, self.table)
        if self.output not in self.template.relations:
            raise RelsqlError(f"output relation `{self.output}` is not in the template; it declares {list(self.template.relations)}")
        self.time_column = arguments.text("time_column", time_column, optional=True)
        self.fractions, self.seed = arguments.split(split), arguments.integer("seed", seed, minimum=0, maximum=2**31 - 1)
        self.dtype, self.device = arguments.dtype(dtype), arguments.device(device)
        self.progress = progress
        self.history: list[dict] = []
        self.best_epoch: int | None = None
        self.timings: dict[str, float] = {}
        self.batch_size = None if batch_size is None else arguments.integer("batch_size", batch_size)
        self.fanout = arguments.fanout(fanout, self.template.relations)
        self.store = arguments.store(store)
        self.embedding_optimizer = arguments.choice("embedding_optimizer", embedding_optimizer, (None, "adagrad", "sgd"))
        self.embedding_lr = arguments.number("embedding_lr", embedding_lr, positive=True)
        self.threads = None if threads is None else arguments.integer("threads", threads, maximum=1024)
        self.max_groundings = groundings_limit(max_groundings)
        arguments.choice("task", task, (None, "binary", "multiclass", "regression"))
        self.batched: Batched | None = None
        if not allow_target_inputs:
            reads = target_reads(self.template, db, self.table, self.column)
            if reads:
                raise SchemaError(f"the template reads the target {self.target} it is to predict: {'; '.join(reads[:3])}"
                                  f"{' ...' if len(reads) > 3 else ''}. A model that sees its label learns nothing: remove "
                                  "these inputs, or pass allow_target_inputs=True if their values are known before "
                                  "prediction time")
        self._build(Presets(), task)

    # -- construction ------------------------------------------------------------------------
    def _build(self, presets: Presets, task: str | Task | None, split: dict | None = None) -> None:
        columns = dict(self.db.columns(self.table))
        if self.column not in columns:
            raise SchemaError(f"target {self.target}: table `{self.table}` has no column `{self.column}`; columns: {', '.join(columns)}")
        if self.time_column is not None and self.time_column not in columns:
            raise SchemaError(f"time_column `{self.time_column}` is not a column of `{self.table}`")
        relation = self.template.relations[self.output]
        missing = [k for k in relation.keys if k not in columns]
        if missing or not relation.keys:
            raise SchemaError(
                f"output relation `{self.output}` is keyed by {relation.keys}, but the target table `{self.table}` "
                f"has no column(s) {missing or '(none)'}; select the target table's key as the output's head key "
                f"(e.g. `SELECT t.id, ... FROM {self.table} t ... GROUP BY t.id`)")
        torch.manual_seed(self.seed)
        started = time.perf_counter()
        self.mini_batches = self.batch_size is not None or bool(database_embeddings(self.template))
        if self.mini_batches:  # keys only, up front; each batch grounds its own rows
            self.batched = self._batched(presets)
            self.timings["grounding"] = time.perf_counter() - started
            log.info("grounded the key tables of %d relations in %.2fs", len(self.batched.grounder.order), self.timings["grounding"])
            labels = self._labels(relation.keys)
            started = time.perf_counter()
            probe = self.batched.prepare(labels.column("_rid").to_numpy()[: min(labels.num_rows, self.batch_size or 64)])
            self.net = CompiledNet(probe.plan, probe.grounding, dtype=self.dtype, seed=self.seed)
            self.timings["planning"] = time.perf_counter() - started
            self.output_rows = self.batched.grounder.sizes[self.output]
            plan = probe.plan
        else:
            grounding = ground(self.template, self.db, presets=presets, progress=self.progress,
                               max_groundings=self.max_groundings)
            self.timings["grounding"] = time.perf_counter() - started
            log.info("grounded %d relations in %.2fs; planning", len(grounding.relations), self.timings["grounding"])
            started = time.perf_counter()
            plan = make_plan(self.template, grounding, self.dtype, outputs=[self.output], device=self.device)
            self.net = CompiledNet(plan, grounding, dtype=self.dtype, seed=self.seed)
            self.timings["planning"] = time.perf_counter() - started
            log.info("planned %d ops in %.2fs", len(plan.ops), self.timings["planning"])
            self.output_rows = grounding.relations[self.output].size
            labels = self._labels(relation.keys)
        where = f"{self.target}"
        self.task = task if isinstance(task, Task) else detect(labels.column("y"), where, task)
        self.positions = labels.column("_rid").to_numpy()
        column = labels.column("y").combine_chunks()
        labelled = pc.is_valid(column).to_numpy(zero_copy_only=False)  # per row, without Python objects
        self.labelled = self.positions[labelled]
        raw = column.filter(pc.is_valid(column))
        if split is None:
            times = labels.column("t").filter(pa.array(labelled)) if self.time_column else None
            split = split_rows(len(raw), self.fractions, self.seed, times)
            checks.splits(self, split, len(raw))
        self.rows = {k: np.asarray(v, dtype=np.int64) for k, v in split.items()}
        if self.task.kind == "regression" and not isinstance(task, Task):  # standardized by the training rows
            train_values = pc.cast(raw, pa.float64()).to_numpy(zero_copy_only=False)[self.rows["train"]]
            self.task.mean = float(train_values.mean()) if len(train_values) else 0.0
            self.task.std = float(train_values.std()) or 1.0
        encoded = self.task.encode(raw)
        if self.task.kind in ("binary", "multiclass") and (encoded < 0).any():
            unknown = sorted(set(raw.filter(pa.array(encoded < 0)).unique().to_pylist()), key=str)
            raise SchemaError(f"target {where} has values {unknown[:5]} the model was not trained on")
        self.y = torch.as_tensor(encoded, dtype=self.dtype, device=self.device)
        width = int(np.prod(plan.meta[plan.outputs[self.output]].shape[1:]))
        self._check_head(width)
        self.head = nn.Identity() if width == self.task.units else nn.Linear(width, self.task.units, dtype=self.dtype)
        self.net.to(self.device)
        self.head.to(self.device)

    def _check_head(self, width: int) -> None:
        """The head's weight and its outputs (one row per output row, full batch; per batch row in
        mini-batches) fit in memory before torch allocates them: a target with 10^5 classes does not."""
        units = self.task.units
        rows = min(self.output_rows, self.batch_size) if self.mini_batches and self.batch_size else self.output_rows
        fix = (f"{units} classes are too many to predict one by one: is {self.target} a key or free text? Predict a "
               "coarser column, or task='regression' for a number" if self.task.kind == "multiclass" else
               "use a smaller output width")
        for shape in ((units, width), (rows, units)):
            shapes.check_size(shape, self.dtype, f"target {self.target} ({self.task.kind}, output relation {self.output})", fix)

    def _encodings(self) -> Presets:
        """The dictionaries and feature statistics in use (database-stored embeddings have none)."""
        if self.mini_batches:
            grounder = self.batched.grounder
            return Presets(dict(grounder.dictionary_tables), dict(grounder.feature_stats))
        return Presets(dict(self.net.grounding.dictionaries), dict(self.net.grounding.feature_stats))

    def _presets(self) -> Presets:
        """The encodings of the full grounding, so mini-batches encode features and categories alike."""
        grounding = self.net.grounding
        return Presets(dict(grounding.dictionaries), dict(grounding.feature_stats))

    def _batched(self, presets: Presets) -> Batched:
        grounder = BatchGrounder(self.template, self.db, self.output, presets, fanout=self.fanout, seed=self.seed,
                                 progress=self.progress, max_groundings=self.max_groundings)
        store = None
        if self.store is not False:
            started = time.perf_counter()
            store = GroundingStore.open(grounder, None if self.store is True else self.store, self.progress)
            self.timings["bulk_grounding"] = time.perf_counter() - started
        if hasattr(self, "net"):  # the model was built on an earlier reading of the tables
            self._check_sizes(grounder)
        self._fingerprint = fingerprint(grounder) if store is None else None  # batches read the tables live
        return Batched(grounder, self.template, self.output, self.dtype, self.seed,
                       self.embedding_optimizer or "adagrad", self.embedding_lr, store, device=self.device)

    def _check_sizes(self, grounder: BatchGrounder) -> None:
        """A grounder made after the build (fit(batch_size=...) on a full-batch model) found the
        rows and categories the model's ids and codes were made for."""
        built = self.net.grounding
        guards.check_same({n: r.size for n, r in built.relations.items()}, grounder.sizes, "rows per relation")
        guards.check_same(built.vocab_sizes, {w: t.num_rows for w, t in grounder.dictionary_tables.items()},
                          "categories per embedding")

    def _check_unchanged(self, worker: Worker | None = None) -> None:
        """Mini-batches grounded in the database (store=False) read the tables again: they must
        still hold the rows the model was built on (a hash of every row, one scan per table)."""
        built = getattr(self, "_fingerprint", None)
        if built is None or self.batched is None or self.batched.grounding_store is not None:
            return
        now = worker.run(fingerprint, self.batched.grounder) if worker is not None else fingerprint(self.batched.grounder)
        guards.check_fingerprint(built, now, self.output)

    def _labels(self, keys: list[str]) -> pa.Table:
        """(_rid of the output row, target value[, time]) for every target row that has a head."""
        checks.key_types(self, keys)
        k, t = "k", "t"
        select = [q.col("_rid", k), exp.alias_(q.col(self.column, t), q.ident("y"))]
        if self.time_column:
            select.append(exp.alias_(q.col(self.time_column, t), q.ident("t")))
        on = exp.and_(*[exp.NullSafeEQ(this=q.col(key, k), expression=q.col(key, t)) for key in keys])
        query = (exp.select(*select)
                 .from_(exp.alias_(self.db.temp_table("k", self.output), q.ident(k), table=True))
                 .join(exp.alias_(exp.Table(this=q.ident(self.table)), q.ident(t), table=True), on=on)
                 .order_by(q.col("_rid", k)))
        labels = self.db.arrow(query)
        if len(set(labels.column("_rid").to_pylist())) != labels.num_rows:
            raise SchemaError(f"target table `{self.table}` has several rows per output key {keys}; the key must be unique")
        return labels

    # -- training ---------------------------------------------------------------------------
    def _outputs(self) -> torch.Tensor:
        value = self.net()[self.output]
        return self.head(value.reshape(value.shape[0], -1))

    def _split_tensors(self, split: str) -> tuple[torch.Tensor, torch.Tensor]:
        rows = self.rows[split]
        index = torch.as_tensor(self.labelled[rows], device=self.device)
        return index, self.y[torch.as_tensor(rows, device=self.device)]

    def parameters(self) -> list[nn.Parameter]:
        return [p for p in [*self.net.parameters(), *self.head.parameters()] if p.requires_grad]

    def _optimizers(self, lr: float, weight_decay: float) -> list[torch.optim.Optimizer]:
        """Adam for the weights; with `embedding_optimizer`, in-memory embeddings get that one instead
        (the same update the database-stored ones get in SQL)."""
        embeddings = {id(p) for name, p in self.net.weights_by_name().items()
                      if self.embedding_optimizer and self.template.weights.get(name) is not None
                      and self.template.weights[name].kind == "embed"}
        dense = [p for p in self.parameters() if id(p) not in embeddings]
        found = [torch.optim.Adam(dense, lr=lr, weight_decay=weight_decay, foreach=True)]  # one kernel per step, not per weight
        sparse = [p for p in self.parameters() if id(p) in embeddings]
        if sparse:
            kind = torch.optim.Adagrad if self.embedding_optimizer == "adagrad" else torch.optim.SGD
            found.append(kind(sparse, lr=self.embedding_lr))
        return found

    @_with_threads
    def fit(self, epochs: int = 100, batch_size: int | None = None, lr: float = 0.01, patience: int = 20,
            weight_decay: float = 0.0, *, checkpoint: str | Path | None = None, resume: bool = False,
            checkpoint_every: int | None = None, callback=None, workers: int = 1) -> Model:
        """Adam on the training rows; keeps the weights of the best validation loss.

        `batch_size` (default: the model's) trains on demand-grounded mini-batches of that many
        target rows: each batch's groundings are computed by the database when it is needed, the
        next batch is grounded in the background, and the time spent waiting for the database is
        in `timings["waiting_on_database"]`. Without it, every step is full-batch.
        `checkpoint`: a file written atomically after every epoch (and every `checkpoint_every`
        batches), with database-stored embeddings copied aside in the database; `resume=True`
        continues from it. `callback(info)` is called after every step with epoch, batch, batches
        and loss; an exception from it (or Ctrl-C) stops training with the database consistent.
        `workers=N` trains data-parallel on N processes reading the grounding store (each a share
        of every batch, gradients summed: the steps of one process; relsql/train/distributed.py).
        Under torchrun (RANK and WORLD_SIZE set), fit() trains as this process's rank instead.
        """
        from tqdm.auto import tqdm

        epochs = arguments.integer("epochs", epochs)
        lr = arguments.number("lr", lr, positive=True)
        patience = arguments.integer("patience", patience, minimum=0)
        weight_decay = arguments.number("weight_decay", weight_decay, minimum=0.0)
        if batch_size is not None:
            batch_size = arguments.integer("batch_size", batch_size)
        if checkpoint_every is not None:
            checkpoint_every = arguments.integer("checkpoint_every", checkpoint_every)
        if checkpoint is not None:
            checkpoint = checkpoints.writable(checkpoint, "checkpoint")
        if callback is not None and not callable(callback):
            raise RelsqlError(f"callback must be callable (a function of one dict), got {type(callback).__name__}")
        if len(self.rows["train"]) == 0:
            raise RelsqlError(f"no labelled target rows to train on in {self.target}")
        workers = arguments.integer("workers", workers, maximum=1024)
        from relsql.train import distributed

        if distributed.launched_by_torchrun():  # this process is one rank of a torchrun group
            world = int(os.environ["WORLD_SIZE"])
            if workers not in (1, world) or callback is not None:
                raise RelsqlError(f"under torchrun, fit() trains as one of its {world} ranks: pass no callback, and "
                                  f"workers=1 or workers={world} (torchrun's --nproc_per_node x --nnodes)")
            distributed.fit_as_rank(self, epochs, batch_size, lr, patience, weight_decay, checkpoint, checkpoint_every, resume)
            return self
        swapped = sorted(database_embeddings(self.template)) if not self.db.transactional else []
        if workers > 1 or swapped:  # an engine without transactions trains its stored embeddings on ranks only
            if callback is not None:
                raise RelsqlError("fit(workers=N) takes no callback (the steps run in other processes): train with one worker to use one"
                                  if workers > 1 else f"{self.db.description} has no transactions to update embeddings {swapped} "
                                  "step by step, so fit() trains them on a rank process, which takes no callback: drop callback=")
            if workers == 1:
                log.info("%s has no transactions: training embeddings %s on one rank, which writes them back whole",
                         self.db.description, swapped)
            distributed.fit(self, workers, epochs, batch_size, lr, patience, weight_decay, checkpoint, checkpoint_every, resume)
            return self
        batch_size = batch_size if batch_size is not None else self.batch_size
        batched = self.mini_batches or batch_size is not None
        if batched and self.batched is None:
            self.batched = self._batched(self._presets())
        optimizers = self._optimizers(lr, weight_decay)
        monitor = "val" if len(self.rows["val"]) else "train"
        best = {"loss": float("inf"), "state": None}
        start_epoch, start_batch = 0, 0
        self._running = (0.0, 0)  # (loss x rows, rows) of the epoch so far, kept in mid-epoch checkpoints
        worker = Worker() if batched else None
        if resume and checkpoint is not None and Path(checkpoint).exists():
            start_epoch, start_batch = self._resume(checkpoint, optimizers, best, worker)
        started = time.perf_counter()
        last = None  # the last epoch trained in this call
        self.epoch_cap = epochs
        self._first_epoch = start_epoch
        bar = tqdm(range(start_epoch, epochs), desc="training", unit="epoch", disable=None if self.progress is None else not self.progress)
        try:
            for epoch in bar:
                train_loss, last = None, epoch
                if batched:
                    self._check_unchanged(worker)
                    order = batches(self.rows["train"], batch_size, np.random.default_rng([self.seed, epoch]))
                    first = start_batch if epoch == start_epoch else 0
                    train_loss = self._train_batches(worker, order, epoch, first, optimizers, checkpoint, checkpoint_every,
                                                     callback, best, lr, weight_decay)
                else:
                    train_loss = self._full_step(optimizers, epoch)
                    if callback is not None:
                        callback({"epoch": epoch, "batch": 0, "batches": 1, "loss": train_loss})
                record = {"epoch": epoch, **self._losses(worker, batch_size, train_loss)}
                guards.check_loss(record[f"{monitor}_loss"], epoch, split="validation" if monitor == "val" else "training")
                self.history.append(record)
                if guards.logs_epoch(epoch, start_epoch, epochs):  # a few lines per fit, not one per epoch
                    log.info("epoch %d of %d: train loss %.4f, validation loss %.4f (%.1fs so far)", epoch + 1, epochs,
                             record["train_loss"], record["val_loss"], time.perf_counter() - started)
                current = record[f"{monitor}_loss"]
                bar.set_postfix(loss=f"{record['train_loss']:.4f}", val=f"{record['val_loss']:.4f}")
                stop = False
                if current < best["loss"] - 1e-7:
                    best["loss"], self.best_epoch = current, epoch
                    best["state"] = self._weights_copy()
                    for store in self._stores().values():
                        worker.run(store.snapshot, store.best_table())
                elif epoch - self.best_epoch >= patience:
                    stop = True
                if checkpoint is not None:
                    self._checkpoint(checkpoint, epoch + 1, 0, optimizers, best, worker)
                self.stopped = "early (no validation improvement for patience epochs)" if stop else "epochs"
                if stop:
                    break
            self._keep_best(best, last, worker)
            self._log_end(started)
        except guards.Diverged as err:
            self.stopped = f"diverged ({err.split} loss {err.value} at epoch {err.epoch + 1})"
            self._keep_best(best, last, worker)
            raise RelsqlError(guards.diverged_message(err, lr, self.best_epoch if best["state"] is not None else None, best["loss"])) from None
        finally:
            if worker is not None:
                worker.close()  # an update already running completes: the database stays at a step boundary
                self.timings["waiting_on_database"] = self.timings.get("waiting_on_database", 0.0) + worker.waited
            self.timings["training"] = self.timings.get("training", 0.0) + time.perf_counter() - started
        return self

    def _keep_best(self, best: dict, last: int | None, worker: Worker | None) -> None:
        """Put back the weights (and database-stored embeddings) of the best epoch, if one finished."""
        if best["state"] is None:
            return
        self._restore_weights(best["state"])
        for store in self._stores().values():
            if last != self.best_epoch:  # else the table already holds the best epoch's rows
                worker.run(store.restore, store.best_table())
            worker.run(store.drop, store.best_table())

    def _log_end(self, started: float) -> None:
        """The line a log reader looks for: how training ended and which epoch's weights the model has."""
        kept = next((r for r in self.history if r["epoch"] == self.best_epoch), None)
        if kept is not None:
            why = "stopped early" if getattr(self, "stopped", "epochs").startswith("early") else "the epoch limit"
            log.info("trained to epoch %d of %d (%s) in %.1fs; kept epoch %d: validation loss %.4f",
                     self.history[-1]["epoch"] + 1, self.epoch_cap, why, time.perf_counter() - started,
                     self.best_epoch + 1, kept["val_loss"])

    def _full_step(self, optimizers, epoch: int = 0) -> float:
        train_index, train_y = self._split_tensors("train")
        for optimizer in optimizers:
            optimizer.zero_grad()
        loss = self.task.loss(self._outputs().index_select(0, train_index), train_y)
        guards.check_loss(float(loss.detach()), epoch)  # before a NaN reaches the weights
        loss.backward()
        for optimizer in optimizers:
            optimizer.step()
        return float(loss.detach())

    def _train_batches(self, worker: Worker, order: list[np.ndarray], epoch: int, first: int, optimizers, checkpoint,
                       checkpoint_every, callback, best, lr: float, weight_decay: float) -> float:
        """One epoch of mini-batches: batch t + 1 is grounded in the database while batch t trains;
        its stored embeddings are read after batch t's update was applied (one queue, in order).
        Returns the epoch's training loss: the mean over its rows of the loss each batch had."""
        from tqdm.auto import tqdm

        batched = self.batched
        total, count = self._running if first else (0.0, 0)
        bar = tqdm(total=len(order), initial=first, desc=f"epoch {epoch}", unit="batch", leave=False,
                   disable=None if self.progress is None else not self.progress)
        rids = [self.labelled[positions] for positions in order]
        epoch_started = time.perf_counter()
        pending = worker.prefetch(batched.prepare, rids[first], epoch) if first < len(order) else None
        for b in range(first, len(order)):
            batch: Batch = worker.wait(pending)
            external = worker.run(batched.fetch, batch)
            pending = worker.prefetch(batched.prepare, rids[b + 1], epoch) if b + 1 < len(order) else None
            created = self.net.add_weights(batch.plan)
            if created:
                optimizers[0].add_param_group({"params": [p for p in created if p.requires_grad and not self._is_embedding(p)],
                                               "lr": lr, "weight_decay": weight_decay})
                new_embeddings = [p for p in created if p.requires_grad and self._is_embedding(p)]
                if new_embeddings:
                    optimizers.append(self._optimizers_for(new_embeddings))
            for optimizer in optimizers:
                optimizer.zero_grad()
            out = Batched.outputs(self.net, self.head, batch, external, self.output)
            y = self.y[torch.as_tensor(order[b], device=self.device)]
            loss = self.task.loss(out, y)
            guards.check_loss(float(loss.detach()), epoch, b, len(order))  # before a NaN reaches the weights
            loss.backward()
            for optimizer in optimizers:
                optimizer.step()
            worker.submit(batched.update, batch, external)
            total, count = total + float(loss.detach()) * len(order[b]), count + len(order[b])
            self._running = (total, count)
            if checkpoint is not None and checkpoint_every and (b + 1) % checkpoint_every == 0 and b + 1 < len(order):
                self._checkpoint(checkpoint, epoch, b + 1, optimizers, best, worker)
            bar.update(1)
            bar.set_postfix(loss=f"{total / count:.4f}")
            if b + 1 - first == min(3, len(order) - first) and len(order) > 3 and epoch == self._first_epoch:  # once per fit
                each = (time.perf_counter() - epoch_started) / (b + 1 - first)
                log.info("epoch %d: %d batches, about %.0fs for the epoch (%.2fs per batch so far)", epoch + 1, len(order),
                         each * (len(order) - first), each)
            if callback is not None:
                callback({"epoch": epoch, "batch": b, "batches": len(order), "loss": float(loss.detach())})
        bar.close()
        return total / count if count else float("nan")

    def _is_embedding(self, parameter: nn.Parameter) -> bool:
        if not self.embedding_optimizer:
            return False
        names = {id(p): n for n, p in self.net.weights_by_name().items()}
        spec = self.template.weights.get(names.get(id(parameter), ""))
        return spec is not None and spec.kind == "embed"

    def _optimizers_for(self, parameters: list[nn.Parameter]) -> torch.optim.Optimizer:
        kind = torch.optim.Adagrad if self.embedding_optimizer == "adagrad" else torch.optim.SGD
        return kind(parameters, lr=self.embedding_lr)

    def _batched_outputs(self, rids: np.ndarray, worker: Worker | None, batch_size: int | None) -> torch.Tensor:
        """Outputs (after the head) for global output rows `rids`, in mini-batches, without gradients."""
        own = worker is None
        if own:  # predict() or evaluate(): read the tables again only if they are the model's
            self._check_unchanged()
        worker = worker or Worker()
        try:
            chunks = batches(np.asarray(rids), batch_size or self.batch_size, None)
            outs = []
            pending = worker.prefetch(self.batched.prepare, chunks[0])
            for i in range(len(chunks)):
                batch = worker.wait(pending)
                external = worker.run(self.batched.fetch, batch)
                pending = worker.prefetch(self.batched.prepare, chunks[i + 1]) if i + 1 < len(chunks) else None
                with torch.no_grad():
                    outs.append(Batched.outputs(self.net, self.head, batch, external, self.output))
            return torch.cat(outs) if outs else torch.zeros((0, self.task.units), dtype=self.dtype)
        finally:
            if own:
                worker.close()

    def _split_outputs(self, split: str, worker: Worker | None = None, batch_size: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(outputs, encoded labels) of a split's rows."""
        index, y = self._split_tensors(split)
        if self.batched is not None and (self.mini_batches or worker is not None):
            return self._batched_outputs(self.labelled[self.rows[split]], worker, batch_size), y
        with torch.no_grad():
            return self._outputs().index_select(0, index), y

    def _losses(self, worker: Worker | None = None, batch_size: int | None = None,
                train_loss: float | None = None) -> dict[str, float]:
        """Training and validation loss (and validation metrics). An epoch passes the training loss
        its steps had (before each update, averaged over rows), so the training rows are not
        computed a second time."""
        record = {} if train_loss is None else {"train_loss": train_loss}
        for split in ("train", "val"):
            if f"{split}_loss" in record:
                continue
            if not len(self.rows[split]):
                record[f"{split}_loss"] = float("nan")
                continue
            with torch.no_grad():
                out, y = self._split_outputs(split, worker, batch_size)
                record[f"{split}_loss"] = float(self.task.loss(out, y))
            if split == "val":
                for name, value in self.task.scores(out.cpu().double().numpy(), y.cpu().double().numpy()).items():
                    record[f"val_{name}"] = value
        return record

    # -- weights, snapshots, checkpoints ------------------------------------------------------
    def _weights_copy(self) -> tuple[dict, dict]:
        return ({n: p.detach().clone() for n, p in self.net.weights_by_name().items()},
                copy.deepcopy(self.head.state_dict()))

    def _restore_weights(self, state: tuple[dict, dict]) -> None:
        self.net.set_named_weights(state[0], self._fixed())
        self.head.load_state_dict(state[1])

    def _fixed(self) -> set[str]:
        return {name for name, spec in self.template.weights.items() if spec.fixed}

    def _stores(self) -> dict:
        return self.batched.stores if self.batched is not None else {}

    def _checkpoint(self, path, epoch: int, batch: int, optimizers, best, worker, extra: dict | None = None) -> None:
        """The database copies first, then the file that names them, then older copies dropped:
        a crash between any two leaves a file whose copies exist and match it. `extra`: more
        entries for the file (training ranks name their embedding shards there)."""
        steps = {w: worker.run(store.snapshot) for w, store in self._stores().items()}
        best_steps = {w: worker.run(store.keep_best) for w, store in self._stores().items()}
        names = {id(p): name for name, p in self._weights_by_name().items()}
        checkpoints.save(path, {
            "target": self.target, "template": self.template.source, "epoch": epoch, "batch": batch,
            "weights": self._weights_copy(), "optimizers": [o.state_dict() for o in optimizers],
            "parameter_names": [[names[id(p)] for g in o.param_groups for p in g["params"]] for o in optimizers],
            "history": saved.plain(self.history), "best_epoch": self.best_epoch, "best_loss": float(best["loss"]),
            "best_state": best["state"], "stores": steps, "best_stores": best_steps,
            "running": tuple(float(v) for v in self._running) if batch else (0.0, 0.0), **(extra or {}),
        })
        for w, store in self._stores().items():
            worker.run(store.drop_checkpoints, steps[w], best_steps[w])


    def _resume(self, path, optimizers, best, worker) -> tuple[int, int]:
        state = checkpoints.load(path)
        if state.get("shards"):
            raise RelsqlError(f"checkpoint {path} was written by {state['shards']['world']} training ranks, which kept the "
                              "database-stored embeddings in shards beside it: resume with fit(workers="
                              f"{state['shards']['world']})")
        try:
            return self._resume_from(state, path, optimizers, best, worker)
        except (KeyError, TypeError, ValueError, IndexError, RuntimeError, AttributeError) as err:
            raise RelsqlError(f"checkpoint {path} is damaged or does not fit this model ({type(err).__name__}: "
                              f"{first_line(err)}); start without resume=True") from None

    def _resume_from(self, state: dict, path, optimizers, best, worker) -> tuple[int, int]:
        if state.get("target") != self.target or state.get("template") != self.template.source:
            raise RelsqlError(f"checkpoint {path} was written for another template or target ({state['target']}); "
                              "resume with the same model, or start without resume=True")
        self._restore_weights(state["weights"])
        weights = self._weights_by_name()
        optimizers.clear()
        for names, optimizer_state in zip(state["parameter_names"], state["optimizers"]):
            params = [weights[n] for n in names]
            kind = torch.optim.Adam if not optimizers else (torch.optim.Adagrad if self.embedding_optimizer == "adagrad" else torch.optim.SGD)
            optimizer = kind(params)
            optimizer.load_state_dict(optimizer_state)
            checkpoints.check_optimizer(optimizer, f"checkpoint {path}")
            optimizers.append(optimizer)
        self.history, self.best_epoch = list(state["history"]), state["best_epoch"]
        best["loss"], best["state"] = state["best_loss"], state["best_state"]
        best_steps = state.get("best_stores", {})
        for weight, step in state["stores"].items():
            store = self.batched.stores.get(weight) or self.batched.store(weight, None)  # the table exists already
            worker.run(store.restore, int(step))
            if best_steps.get(weight) is not None:
                worker.run(store.load_best, int(best_steps[weight]))
        self._running = tuple(state["running"])
        return state["epoch"], state["batch"]

    # -- results ----------------------------------------------------------------------------
    @_with_threads
    def evaluate(self, split: str = "test") -> dict[str, float]:
        """Metrics on a split: accuracy, ROC-AUC, F1 (classification) or MAE, RMSE (regression)."""
        if split not in self.rows:
            raise RelsqlError(f"unknown split {split!r}; use 'train', 'val' or 'test'")
        if len(self.rows[split]) == 0:
            raise RelsqlError(f"the {split} split has no rows")
        with torch.no_grad():
            out, y = self._split_outputs(split)
            scores = {"loss": float(self.task.loss(out, y))}
        scores.update(self.task.scores(out.cpu().double().numpy(), y.cpu().double().numpy()))
        return scores

    @_with_threads
    def predict(self) -> pl.DataFrame:
        """Every output row: its key columns, `prediction` and, for a binary task, `probability` (of
        the positive class, `task.classes[1]`), for a multi-class task `probabilities` (a list in
        the order of `task.classes`; a native list column in the database).

        A key column that already has one of those names keeps it; the prediction's column then
        gets the first free name `prediction_1`, `prediction_2`, ... (compared as the database
        does, ignoring case)."""
        if self.mini_batches:
            keys = pl.from_arrow(self.batched.grounder.keys(self.output)).sort("_rid")
            out = self._batched_outputs(keys["_rid"].to_numpy(), None, None).cpu().double().numpy()
            keys = keys.drop("_rid")
        else:
            with torch.no_grad():
                out = self._outputs().cpu().double().numpy()
            keys = pl.from_arrow(self.net.grounding.relations[self.output].keys).sort("_rid").drop("_rid")
        predictions, probabilities = self.task.decode(out)
        taken = {k.casefold() for k in keys.columns}
        frame = keys.with_columns(pl.Series(free_name("prediction", taken), predictions))
        if probabilities is None:
            return frame
        if self.task.kind == "binary":  # one number: the probability of the positive class, classes[1]
            return frame.with_columns(pl.Series(free_name("probability", taken), probabilities[:, 1], dtype=pl.Float64))
        name = free_name("probabilities", taken)
        return frame.with_columns(pl.Series(name, probabilities.tolist(), dtype=pl.List(pl.Float64)))

    def write_predictions(self, name: str, *, replace: bool = False) -> int:
        """Write `predict()` as a new table, atomically; an existing table needs replace=True."""
        frame = self.predict()
        self.db.write_table(name, frame.to_arrow(), replace=replace, kind="predictions")
        return frame.height

    @_with_threads
    def gradients_as_relations(self, prefix: str = "grad_", *, split: str = "train", replace: bool = False) -> dict[str, str]:
        """The gradient of the `split` loss at the current weights, one new table per weight.

        A weight's table `<prefix><name>` has columns `parameter`, `row` (first index) and
        `gradient` (the rest, as a list); a database-stored embedding's has `key` and `gradient`,
        one row per key the split uses, summed over batches inside the database. Every name is
        checked before anything is written; returns {weight name: table name}.
        """
        return gradients.write(self, prefix, split, replace)

    def report(self) -> str:
        return text_report(self)

    def baseline(self, split: str = "test") -> dict[str, float]:
        """The metrics of the obvious predictor on a split, fit on the training rows: the majority
        class (classification) or the mean (regression). A model worth having beats it."""
        if split not in self.rows or not len(self.rows[split]):
            raise RelsqlError(f"split {split!r} has no rows; use 'train', 'val' or 'test'")
        return baselines.majority(self, split)

    def named_weights(self) -> dict[str, torch.Tensor]:
        """The template's weights by name (a typed linear's per type, `name[<value>]`, see
        CompiledNet.named_weights) and the head's as `_head.<name>`."""
        return {**self.net.named_weights(), **self._head_weights()}

    def _weights_by_name(self) -> dict[str, nn.Parameter]:
        """Every parameter whole under its name (gradients are taken of these)."""
        return {**self.net.weights_by_name(), **self._head_weights()}

    def _head_weights(self) -> dict[str, nn.Parameter]:
        return {f"_head.{name}": p for name, p in self.head.named_parameters()}

    # -- persistence ------------------------------------------------------------------------
    def save(self, path: str | Path) -> Path:
        """Weights, encodings, task and split in one file (written atomically), plot beside it.

        The file holds plain tensors, numbers, strings and Arrow IPC bytes only, so loading it
        cannot run code (see relsql/train/checkpoint.py)."""
        path = saved.write(self, path)
        if self.history:
            split = "val" if len(self.rows["val"]) else "train"
            plot_history(self.history, path.with_suffix(".png"), self.task.metric, title=f"{self.target}: {self.output}",
                         loss=LOSSES[self.task.kind], best_epoch=self.best_epoch,
                         baseline=self.baseline(split).get(self.task.metric))
        return path

    @classmethod
    def load(cls, path: str | Path, db: Database, *, device: str | torch.device = "cpu",
             batch_size: int | None = None) -> Model:
        """A saved model on `db`: grounded again with the saved encodings, same predictions.

        `batch_size` predicts (and evaluates) in mini-batches of that many target rows, each
        grounded on demand, whatever the model was trained with: nothing is grounded or planned
        for the whole database up front, so a large database loads in the time of its key tables.
        Every value read from the file is checked like a user's argument before use."""
        if batch_size is not None:
            batch_size = arguments.integer("batch_size", batch_size)
        if not isinstance(db, Database):
            raise RelsqlError(f"db must be a relsql.Database (from relsql.connect(...)), got {type(db).__name__}")
        state = saved.read(path)
        model = cls.__new__(cls)
        model.db, model.template, model.target = db, state.template, state.target
        model.table, model.column = arguments.target(state.target)
        model.output, model.time_column, model.fractions, model.seed = state.output, state.time_column, state.fractions, state.seed
        model.dtype, model.device, model.progress = state.dtype, arguments.device(device), None
        model.history, model.best_epoch, model.timings = state.history, state.best_epoch, {}
        model.batch_size, model.fanout, model.threads = batch_size or state.batch_size, state.fanout, None
        model.store, model.max_groundings = True, groundings_limit(None)
        model.embedding_optimizer, model.embedding_lr = state.embedding_optimizer, state.embedding_lr
        model.batched = None
        model._build(state.presets, state.task, split=state.split)
        missing = [n for n in model.net.weights_by_name() if n not in state.weights]
        if missing:
            raise RelsqlError(f"model file {path} does not fit its own template: weights {missing} are missing")
        try:
            model.net.set_named_weights(state.weights, model._fixed())
            model.head.load_state_dict(state.head)
        except (RuntimeError, KeyError, TypeError, ValueError) as err:
            raise RelsqlError(f"model file {path} does not fit its own template: {first_line(err)}") from None
        model.net.to(model.device)
        model.head.to(model.device)
        return model
