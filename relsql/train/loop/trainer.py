"""The one training loop (Lightning's Trainer): epochs of batches from the batch source, the
optimizers, callbacks run in order around the epochs (model selection and early stopping, the
rate's epoch step, the time budget, checkpoint files, the user's: relsql/train/loop/callbacks.py), the
record of training it fills and returns (relsql/train/learner/record.py), and a strategy for what differs
between one process and training ranks (relsql/train/loop/distributed.py): how a batch is shared out,
gradients reduced, new weights agreed on, validation computed, embeddings stored and checkpoints
written.
"""

from __future__ import annotations

import logging
import sys
import time

import numpy as np
import torch
from torch import nn

from relsql.compile import compact
from relsql.data.engine import first_line
from relsql.errors import RelsqlError
from relsql.train.eager import eager
from relsql.train.feed import guards
from relsql.train.feed.batched import Batch
from relsql.train.feed.batches import batches
from relsql.train.feed.source import BatchSource, Whole
from relsql.train.learner.learner import Learner
from relsql.train.learner.record import FitRecord
from relsql.train.loop.blendstop import BlendStopping
from relsql.train.loop.callbacks import Callback, Checkpoint, EarlyStopping, Schedule, TimeBudget, Users
from relsql.train.loop.crossfit import CrossFitted
from relsql.train.loop.options import FitConfig
from relsql.train.loop.reuse import KeptForward
from relsql.train.loop.schedule import LearningRate
from relsql.train.loop.strategy import Strategy
from relsql.train.persist import checkpoint as checkpoints
from relsql.train.persist.saved import plain

log = logging.getLogger("relsql")


class Optimizers:
    """Adam (`dense="adam"`) or AdamW (`"adamw"`: weight decay decoupled from the gradient) for the
    weights; with `embedding_optimizer`, in-memory embeddings get that one (the update
    database-stored ones get in SQL). The one place an optimizer's kind is chosen."""

    def __init__(self, learner: Learner, lr: float, weight_decay: float, build: bool = True, dense: str = "adam"):
        self.learner, self.lr, self.weight_decay, self.dense = learner, lr, weight_decay, dense
        self.all: list[torch.optim.Optimizer] = []
        if build:
            dense, sparse = self._parts([p for p in learner.parameters()])
            self.all.append(self.dense_optimizer(dense, lr=lr, weight_decay=weight_decay))
            if sparse:
                self.all.append(self.kind(1)(sparse, lr=learner.settings.embedding_lr))

    def kind(self, index: int) -> type[torch.optim.Optimizer]:
        """The first optimizer is Adam or AdamW; the others train embeddings with the embedding optimizer."""
        if index == 0:
            return eager(torch.optim.AdamW if self.dense == "adamw" else torch.optim.Adam)
        return eager(torch.optim.Adagrad if self.learner.settings.embedding_optimizer == "adagrad" else torch.optim.SGD)

    def dense_optimizer(self, parameters: list[nn.Parameter], **settings) -> torch.optim.Optimizer:
        """Adam(W) with torch's fused kernel (one call per step for every weight: 80 us against the
        multi-tensor kernels' 236 for 14 small weights on one CPU thread), where all weights are
        floating point on one CPU or CUDA device; the multi-tensor one otherwise."""
        devices = {p.device.type for p in parameters}
        fused = len(devices) == 1 and devices <= {"cpu", "cuda"} and all(p.is_floating_point() for p in parameters)
        return self.kind(0)(parameters, **settings, **({"fused": True} if fused else {"foreach": True}))

    def _parts(self, parameters: list[nn.Parameter]) -> tuple[list, list]:
        names = {id(p): n for n, p in self.learner.net.weights_by_name().items()}
        sparse = [p for p in parameters if self.learner.is_embedding(names.get(id(p), ""))]
        chosen = {id(p) for p in sparse}
        return [p for p in parameters if id(p) not in chosen], sparse

    def add(self, created: list[nn.Parameter]) -> None:
        """Weights a batch met first: dense ones join Adam, embeddings get an optimizer of their own."""
        if not created:  # every full-batch step: nothing new (the names' table below costs ~0.2 ms)
            return
        dense, sparse = self._parts([p for p in created if p.requires_grad])
        if dense:
            self.all[0].add_param_group({"params": dense, "lr": self.lr, "weight_decay": self.weight_decay})
        if sparse:
            self.all.append(self.kind(1)(sparse, lr=self.learner.settings.embedding_lr))

    def zero_grad(self) -> None:
        for optimizer in self.all:
            optimizer.zero_grad()

    def step(self) -> None:
        for optimizer in self.all:
            optimizer.step()

    def dense_parameters(self) -> list[nn.Parameter]:
        """The weights the first optimizer trains (gradient clipping bounds their norm)."""
        return [p for group in self.all[0].param_groups for p in group["params"]] if self.all else []

    def state_dict(self) -> dict:
        names = {id(p): name for name, p in self.learner.weights_by_name().items()}
        return {"optimizers": [o.state_dict() for o in self.all],
                "parameter_names": [[names[id(p)] for g in o.param_groups for p in g["params"]] for o in self.all]}

    def load_state_dict(self, state: dict, where: str) -> None:
        weights = self.learner.weights_by_name()
        self.all = []
        for names, optimizer_state in zip(state["parameter_names"], state["optimizers"]):
            chosen = [weights[n] for n in names]
            optimizer = self.dense_optimizer(chosen) if not self.all else self.kind(len(self.all))(chosen)
            optimizer.load_state_dict(optimizer_state)
            checkpoints.check_optimizer(optimizer, where)
            self.all.append(optimizer)


class OneProcess(Strategy):
    """The strategy of one process: the whole batch here, database-stored embeddings updated in the
    database per step, checkpoints written here."""

    main, bars, world = True, True, 1
    keeps_forward = compacts = True

    def source(self, learner: Learner, batched: bool) -> BatchSource:
        return BatchSource(learner.ensure_batched() if batched else None, fork=True)

    def shares(self, order: list[np.ndarray]) -> list[np.ndarray]:
        return order

    def create_weights(self, trainer: Trainer, batch: Batch | Whole | None) -> list[nn.Parameter]:
        return [] if not isinstance(batch, Batch) else trainer.learner.net.add_weights(batch.plan)

    def reduce(self, trainer: Trainer, loss: torch.Tensor, external: dict) -> tuple[float, None]:
        return float(loss), None

    def after_step(self, trainer: Trainer, batch, external: dict, reduced) -> None:
        if isinstance(batch, Batch):
            trainer.source.submit(trainer.learner.batched.update, batch, external)

    def validate(self, trainer: Trainer, train_loss: float) -> dict[str, float]:
        learner, record = trainer.learner, {"train_loss": train_loss}
        if not len(learner.rows["val"]):
            return {**record, "val_loss": float("nan")}
        whole = None
        if trainer.keeping:  # with its graph: the next epoch's step reuses this forward (relsql/train/loop/reuse.py)
            whole = learner.outputs()
            if whole.requires_grad:
                trainer.kept.keep(learner, whole, trainer.watched)
        with torch.no_grad():
            if trainer.crossfit is None:
                kept = {} if whole is None else {"whole": whole}  # a ranking learner's scores take no `whole`
                return {**record, **learner.split_scores("val", trainer.source, trainer.batch_size, "val_", **kept)}
            out, y = learner.split_outputs("val", trainer.source, trainer.batch_size, whole)
            trainer.val_outputs = out  # the halves score it (relsql/train/loop/crossfit.py)
            return {**record, **learner.scores(out, y, "val_")}

    def best(self, trainer: Trainer) -> None:
        for table in trainer.learner.embedding_tables().values():
            trainer.source.run(table.snapshot, table.best_table())

    def keep_best(self, trainer: Trainer, last: int | None) -> None:
        for table in trainer.learner.embedding_tables().values():
            if last != trainer.record.best_epoch:  # else the table already holds the best epoch's rows
                trainer.source.run(table.restore, table.best_table())
            trainer.source.run(table.drop, table.best_table())

    def checkpoint(self, trainer: Trainer, epoch: int, batch: int) -> None:
        trainer.write_checkpoint(epoch, batch)

    def resume(self, trainer: Trainer, state: dict, where: str) -> None:
        if state.get("shards"):
            raise RelsqlError(f"checkpoint {where} was written by {state['shards']['world']} training ranks, which kept the "
                              "database-stored embeddings in shards beside it: resume with fit(workers="
                              f"{state['shards']['world']})")

    def timings(self, trainer: Trainer) -> dict[str, float]:
        return {"waiting_on_database": trainer.source.waited}

    def agree(self, stop: bool) -> bool:
        """Whether every process stops (one process: its own choice; ranks: any rank's, e.g. a time budget)."""
        return stop


class Trainer:
    """Trains a Learner: epochs of shuffled batches of the training rows, the best epoch kept."""

    def __init__(self, learner: Learner, strategy: Strategy, config: FitConfig, *, keep: str = "best", horizon: int | None = None,
                 replay: list[float] | None = None, callbacks: list[Callback] = (), crossfit: bool = False,
                 blend: list | None = None):
        """`config`: the fit's settings (its defaults are the plain loop: Adam, constant rate, no
        clipping, the best loss kept; Model.fit's FitConfig.checked gives the ones that converge).
        `horizon`: the epochs the schedule spans (default `config.epochs`; a refit stops early on
        the selection run's schedule). `keep="last"`: the last epoch's weights, not the best one's.
        `replay`: the rate's share after each epoch, taken from another run (a refit replays the
        plateaus its selection run met, having no validation of its own). `callbacks`: more
        callbacks, run after fit's own and the user's (`config.users`; relsql/train/loop/callbacks.py).
        `crossfit`: also score each epoch on two halves of the validation rows, for the blend
        (relsql/train/loop/crossfit.py; the record's `crossfit` holds the outputs). `blend`: the
        blend's GBM candidates (hybrid.candidates), with crossfit: also stop where the blend stops
        improving (relsql/train/loop/blendstop.py).
        The record (`self.record`) continues the learner's: the fit entry point puts it on the
        learner before fit(), so that the model's history grows as the epochs finish."""
        self.learner, self.strategy, self.config = learner, strategy, config
        self.epochs, self.batch_size, self.lr = config.epochs, config.batch_size, config.lr
        self.whole_net = learner.whole_net_batches or config.whole_net  # batch_size's steps each run the whole net
        self.clip, self.time_budget = config.clip, config.time_budget
        self.rate = LearningRate(config.lr, config.schedule, warmup=config.warmup, patience=max(1, config.patience // 4))
        self.horizon = horizon or config.epochs
        self.checkpointer = Checkpoint(config.checkpoint, config.checkpoint_every)
        self.stopping = EarlyStopping(learner, config.patience, config.monitor, last=keep == "last", overfit=config.overfit)
        users = [Users(given) for given in (*config.users, *callbacks)]
        self.crossfit = CrossFitted(learner) if crossfit and keep == "best" else None
        self.blend = BlendStopping(learner, blend) if blend and self.crossfit else None
        self.val_outputs: torch.Tensor | None = None  # this epoch's validation outputs, where crossfit asks for them
        self.callbacks: list[Callback] = [self.stopping, *([self.crossfit] if self.crossfit else []),
                                          *([self.blend] if self.blend else []),
                                          Schedule(self.rate, self.stopping, replay), TimeBudget(self.time_budget),
                                          self.checkpointer, *users]
        self.record: FitRecord = learner.record.continued()
        self.optimizers: Optimizers | None = None
        self.source: BatchSource | None = None
        self.running = (0.0, 0)  # (loss x rows, rows) of the epoch so far, kept in mid-epoch checkpoints
        self.clock = {"epochs": 0.0, "waiting_on_store": 0.0, "compute": 0.0, "all_reduce": 0.0, "validation": 0.0}
        self.first_epoch = 0
        self.started = 0.0
        # the validation forward kept for the next full-batch step, where allowed (relsql/train/loop/reuse.py);
        # `watched`: a user's Callback runs between the two, so the weights' values are compared too
        self.kept, self.reusable, self.keeping = KeptForward(), False, False
        self.watched = any(isinstance(c, Users) and isinstance(c.given, Callback) for c in self.callbacks)

    def fit(self, batched: bool, resume: dict | None = None) -> FitRecord:
        """Train; the learner ends with the best epoch's weights. Returns the record of training,
        whose `diverged` is the message of a loss that stopped being a number (the learner then
        holds the best weights so far), else None."""
        learner, record = self.learner, self.record
        self.source = self.strategy.source(learner, batched)
        start_epoch = start_batch = 0
        started, last, compacted = time.perf_counter(), None, None
        self.started = started
        try:
            compacted = self.compact_tables(resume)
            self.optimizers = Optimizers(learner, self.lr, self.config.weight_decay, dense=self.config.optimizer)
            self.rate.plan(self.horizon * self.steps_per_epoch())
            if resume is not None:
                start_epoch, start_batch = self.resume(resume)
            record.epoch_cap, record.time_budget, self.first_epoch = self.epochs, self.time_budget, start_epoch
            record.steps = self.steps_per_epoch()
            self.reusable = self.strategy.keeps_forward and self.source.full and KeptForward.allowed(learner)
            for callback in self.callbacks:
                callback.on_fit_start(self)
            for epoch in self._bar(range(start_epoch, self.epochs), desc="training", unit="epoch"):
                last = epoch
                if self._epoch(epoch, start_batch if epoch == start_epoch else 0):
                    break
            self._end(last)
            self._log_end(started)
            return record
        except guards.Diverged as err:
            record.stopped = f"diverged ({err.split} loss {err.value} at epoch {err.epoch + 1})"
            self._end(last)
            best = record.best_epoch if self.stopping.state is not None else None
            record.diverged = guards.diverged_message(err, self.lr, best, self.stopping.loss)
            return record
        finally:
            self.kept.drop()
            if compacted is not None:
                compacted.expand()
            learner.net.train(False)
            unwritten = self._flush_tables()
            self.source.close()  # an update already running completes: the database stays at a step boundary
            record.add_timings({**self.strategy.timings(self), "training": time.perf_counter() - started})
            _report_unwritten(unwritten, sys.exc_info()[1])

    def compact_tables(self, resume: dict | None) -> compact.Compacted | None:
        """Train the net's hashed text tables on the rows its plan reads (relsql/compile/compact.py),
        where that gives the same numbers and nothing outside this loop sees the weights mid-fit: one
        process on the CPU running the net's own plan (full batch), weight decay 0 (else unread rows
        move too), no checkpoint nor resume (their files hold whole tables) and no user callback
        (it may read the weights by name). The full tables are back when fit returns or raises."""
        config = self.config
        if (not self.strategy.compacts or not self.source.full or resume is not None or config.weight_decay != 0
                or config.checkpoint is not None or any(isinstance(c, Users) for c in self.callbacks)
                or self.learner.device.type != "cpu"):
            return None
        return compact.compact(self.learner.net)

    def _end(self, last: int | None) -> None:
        """The callbacks' end of fit (the best epoch's weights put back), after epoch `last`."""
        self.kept.drop()
        for callback in self.callbacks:
            callback.on_fit_end(self, last)

    def _flush_tables(self) -> Exception | None:
        """Write the rows trained ahead of their tables into them, every table tried; the first
        failure is returned so that fit's own error, if one is on its way, is not replaced by it."""
        failure = None
        for table in self.learner.embedding_tables().values():
            try:
                self.source.run(table.flush)
            except Exception as err:  # noqa: BLE001 - handed to _report_unwritten
                failure = failure or err
        return failure

    def steps_per_epoch(self) -> int:
        """Optimizer steps in one epoch: one full batch, or the global batches of the training rows."""
        if not self.batch_size or (self.source.full and not self.whole_net):
            return 1
        return -(-len(self.learner.rows["train"]) // self.batch_size)

    def _epoch(self, epoch: int, first: int) -> bool:
        """One epoch, its validation, then the callbacks (model selection, early stopping, the
        rate's step, the time budget, the checkpoint, the user's); True to stop."""
        learner, monitor = self.learner, self.stopping.monitor
        if not self.source.full:
            learner.check_unchanged(self.source)
            order = batches(learner.rows["train"], self.batch_size, np.random.default_rng([learner.seed, epoch]))
        elif self.batch_size and self.whole_net:  # several steps, each of the whole net and some rows
            order = batches(learner.rows["train"], self.batch_size, np.random.default_rng([learner.seed, epoch]))
        else:
            order = [learner.rows["train"]]
        clock = time.perf_counter()
        learner.net.train(True)  # dropout on for the steps only
        try:
            train_loss = self.train_batches(order, epoch, first)
        finally:
            learner.net.train(False)
        self.clock["epochs"] += time.perf_counter() - clock
        clock = time.perf_counter()
        # the next epoch's first step may reuse it (its later steps run the net again: the weights have moved)
        self.keeping = self.reusable and epoch + 1 < self.epochs
        record = {"epoch": epoch, **self.strategy.validate(self, train_loss), "lr": self.rate.now()}
        self.clock["validation"] += time.perf_counter() - clock
        guards.check_loss(record[f"{monitor}_loss"], epoch, split="validation" if monitor == "val" else "training")
        self.record.history.append(record)
        self._log_epoch(epoch, record, self.started)
        reasons = [callback.on_epoch_end(self, epoch, record) for callback in self.callbacks]  # every one, every epoch
        self.record.stopped = next((reason for reason in reasons if reason), "epochs")  # what ends (or will end) training
        return self.record.stopped != "epochs"

    def _log_epoch(self, epoch: int, record: dict, started: float) -> None:
        if self.strategy.main and guards.logs_epoch(epoch, self.first_epoch, self.epochs) and self.stopping.last:
            log.info("refit: epoch %d of %d: train loss %.4f (%.1fs so far)", epoch + 1, self.epochs, record["train_loss"],
                     time.perf_counter() - started)
        elif self.strategy.main and guards.logs_epoch(epoch, self.first_epoch, self.epochs):  # a few lines per fit
            extra = ("" if self.stopping.metric == "loss"
                     else f", {self.stopping.key} {record.get(self.stopping.key, float('nan')):.4f}")
            log.info("epoch %d of %d: train loss %.4f, validation loss %.4f%s (%.1fs so far)", epoch + 1, self.epochs,
                     record["train_loss"], record["val_loss"], extra, time.perf_counter() - started)
        if getattr(self, "bar", None) is not None:
            self.bar.set_postfix(loss=f"{record['train_loss']:.4f}", val=f"{record['val_loss']:.4f}")

    def train_batches(self, order: list[np.ndarray], epoch: int, first: int) -> float:
        """One pass over the global batches (from batch `first`): batch t + 1 is prepared while batch
        t trains. Returns the epoch's training loss: the mean over its rows of each batch's loss."""
        learner, strategy = self.learner, self.strategy
        shares = strategy.shares(order)
        total, count = self.running if first else (0.0, 0)
        bar = self._bar(None, total=len(order), initial=first, desc=f"epoch {epoch}", unit="batch", leave=False,
                        quiet=self.source.full)
        epoch_started, loss_value = time.perf_counter(), float("nan")
        for b, batch, external in self.source.epoch([learner.labelled[s] for s in shares], epoch, first):
            positions, share = order[b], shares[b]
            clock = time.perf_counter()
            self.optimizers.add(strategy.create_weights(self, batch))
            self.optimizers.zero_grad()
            loss = torch.zeros((), dtype=learner.dtype, device=learner.device)
            if batch is not None:
                whole = self.kept.take(learner) if isinstance(batch, Whole) else None
                loss = (learner.batch_loss(batch, external, share) if whole is None
                        else learner.batch_loss(batch, external, share, whole))
                if len(share) != len(positions):
                    loss = loss * (len(share) / len(positions))  # this share's part of the batch mean
                loss.backward()
            self.clock["compute"] += time.perf_counter() - clock
            clock = time.perf_counter()
            loss_value, reduced = strategy.reduce(self, loss.detach(), external)
            self.clock["all_reduce"] += time.perf_counter() - clock
            guards.check_loss(loss_value, epoch, None if self.source.full else b, len(order))  # before the step
            self.clip_gradients()
            if self.optimizers.all:
                self.rate.apply(self.optimizers.all[0])
            self.optimizers.step()
            strategy.after_step(self, batch, external, reduced)
            total, count = total + loss_value * len(positions), count + len(positions)
            self.running = (total, count)
            self._progress(bar, b, first, len(order), epoch, epoch_started, total / count)
            step = {"epoch": epoch, "batch": b, "batches": len(order), "loss": loss_value}
            for callback in self.callbacks:  # a checkpoint every so many steps, the user's callback
                callback.on_batch_end(self, step)
        if bar is not None:
            bar.close()
        if self.source.full and len(order) == 1:
            return loss_value
        return total / count if count else float("nan")

    def clip_gradients(self) -> None:
        """Bound the norm of the dense weights' gradient (all of them at once) by `clip`: after the
        ranks' all-reduce, so every rank clips the same sum."""
        if self.clip is None:
            return
        grads = [p for p in self.optimizers.dense_parameters() if p.grad is not None]
        if grads:
            nn.utils.clip_grad_norm_(grads, self.clip, foreach=True)

    def _progress(self, bar, b: int, first: int, count: int, epoch: int, started: float, mean: float) -> None:
        if bar is not None:
            bar.update(1)
            bar.set_postfix(loss=f"{mean:.4f}")
        if (self.strategy.bars and b + 1 - first == min(3, count - first) and count > 3
                and epoch == self.first_epoch):  # once per fit
            each = (time.perf_counter() - started) / (b + 1 - first)
            log.info("epoch %d: %d batches, about %.0fs for the epoch (%.2fs per batch so far)", epoch + 1, count,
                     each * (count - first), each)

    def _bar(self, iterable, quiet: bool = False, **settings):
        """A tqdm bar where the strategy shows them and the learner's progress allows; else None
        (or the plain iterable)."""
        progress = self.learner.settings.progress
        if not self.strategy.bars or quiet:
            return iterable
        from tqdm.auto import tqdm

        bar = tqdm(iterable, disable=None if progress is None else not progress, **settings)
        if iterable is not None:
            self.bar = bar
        return bar

    def _log_end(self, started: float) -> None:
        """The line a log reader looks for: how training ended and which epoch's weights the model has."""
        record = self.record
        kept = record.kept()
        if kept is not None and self.strategy.main and self.stopping.last:  # a refit: no selection, its last epoch
            log.info("refit: trained %d epochs in %.1fs; the model keeps the last", len(record.history),
                     time.perf_counter() - started)
        elif kept is not None and self.strategy.main:
            why = {"early": "stopped early", "time ": "the time budget"}.get((record.stopped or "epochs")[:5], "the epoch limit")
            log.info("trained to epoch %d of %d (%s) in %.1fs; kept epoch %d: validation loss %.4f",
                     record.history[-1]["epoch"] + 1, self.epochs, why, time.perf_counter() - started,
                     record.best_epoch + 1, kept["val_loss"])
            if self.stopping.metric != "loss":
                log.info("model selection: epoch %d had the best %s, %.4f (the loss breaks ties)", record.best_epoch + 1,
                         self.stopping.key, kept.get(self.stopping.key, float("nan")))

    # -- checkpoints ------------------------------------------------------------------------------
    def write_checkpoint(self, epoch: int, batch: int, extra: dict | None = None) -> None:
        """The database copies first, then the file that names them, then older copies dropped:
        a crash between any two leaves a file whose copies exist and match it. `extra`: more
        entries for the file (training ranks name their embedding shards there)."""
        learner, tables = self.learner, self.learner.embedding_tables()
        steps = {w: self.source.run(table.snapshot) for w, table in tables.items()}
        best_steps = {w: self.source.run(table.keep_best) for w, table in tables.items()}
        checkpoints.save(self.checkpointer.path, {
            "target": learner.target, "template": learner.template.source, "epoch": epoch, "batch": batch,
            "weights": learner.weights_copy(), **self.optimizers.state_dict(),
            "history": plain(self.record.history), **self.stopping.state_dict(), "stores": steps, "best_stores": best_steps,
            "running": tuple(float(v) for v in self.running) if batch else (0.0, 0.0), "schedule": self.rate.state_dict(),
            **(self.crossfit.state_dict() if self.crossfit else {}), **(self.blend.state_dict() if self.blend else {}),
            **(extra or {}),
        })
        for w, table in tables.items():
            self.source.run(table.drop_checkpoints, steps[w], best_steps[w])

    def resume(self, state: dict) -> tuple[int, int]:
        """Continue from a checkpoint's state: (epoch, batch) to start at."""
        where = self.checkpointer.path
        self.strategy.resume(self, state, where)
        try:
            return self._resume_from(state, where)
        except (KeyError, TypeError, ValueError, IndexError, RuntimeError, AttributeError) as err:
            raise RelsqlError(f"checkpoint {where} is damaged or does not fit this model ({type(err).__name__}: "
                              f"{first_line(err)}); start without resume=True") from None

    def _resume_from(self, state: dict, where: str) -> tuple[int, int]:
        learner = self.learner
        if state.get("target") != learner.target or state.get("template") != learner.template.source:
            raise RelsqlError(f"checkpoint {where} was written for another template or target ({state['target']}); "
                              "resume with the same model, or start without resume=True")
        learner.restore_weights(state["weights"])
        self.optimizers.load_state_dict(state, f"checkpoint {where}")
        self.record.history = _checked_history(state["history"], where)
        self.stopping.load_state_dict(state)
        self.record.best_epoch = self.stopping.best_epoch
        self.rate.load_state_dict(state.get("schedule"))
        if self.crossfit is not None:
            self.crossfit.load_state_dict(state)
        if self.blend is not None:
            self.blend.load_state_dict(state)
        best_steps = state.get("best_stores", {})
        for weight, step in state["stores"].items():
            table = learner.batched.stores.get(weight) or learner.batched.store(weight, None)  # the table exists already
            self.source.run(table.restore, int(step))
            if best_steps.get(weight) is not None:
                self.source.run(table.load_best, int(best_steps[weight]))
        running, epoch, batch = state["running"], state["epoch"], state["batch"]
        if not (isinstance(running, list | tuple) and len(running) == 2 and all(map(checkpoints.is_number, running))
                and all(type(v) is int and v >= 0 for v in (epoch, batch))):
            raise RelsqlError(f"checkpoint {where} is damaged: the epoch and batch it stopped at; start without resume=True")
        self.running = tuple(running)
        return epoch, batch


def _checked_history(history: object, where: str) -> list[dict]:
    """A checkpoint's epoch records: each a dict of names to numbers (a NaN is a number), as the
    loop wrote them; a damaged one fails here, clearly, rather than in the refit's arithmetic."""
    number = checkpoints.is_number
    if not isinstance(history, list) or not all(
            isinstance(r, dict) and all(isinstance(k, str) and number(v) for k, v in r.items()) and number(r.get("epoch"))
            and number(r.get("lr")) for r in history):
        raise RelsqlError(f"checkpoint {where} is damaged: its history of epochs; start without resume=True")
    return list(history)


def _report_unwritten(failure: Exception | None, pending: BaseException | None) -> None:
    """A write-back that failed while fit was already raising (a callback's error, a lost
    connection) becomes a note on that error, which stays the one the user sees; otherwise it is
    raised: rows that did not reach their table are never dropped silently."""
    if failure is None:
        return
    if pending is None:
        raise failure
    pending.add_note(f"relsql: the embedding rows trained since the last write-back did not reach their table "
                     f"({type(failure).__name__}: {str(failure).splitlines()[0] if str(failure) else ''}); "
                     "the table holds the last step that was written")
