"""`relsql.Model`: a template, a database and a target column, trained end to end.

A façade over the product layer in relsql/train/: the target (target.py: labels, task, split),
the learner (learner.py: net, head, batches), the batch source (source.py), the trainer
(trainer.py: one loop; distributed.py: its strategy on ranks), the saved state (saved.py) and
the results (results.py, report.py, gradients.py). Its arguments are checked here.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from pathlib import Path

import duckdb
import polars as pl
import torch

from relsql import arguments
from relsql.db import Database, first_line, lost_connection
from relsql.errors import RelsqlError, SourceError
from relsql.ground.demand import database_embeddings
from relsql.template.ir import Template
from relsql.train import build, distributed, gradients, results, saved
from relsql.train import checkpoint as checkpoints
from relsql.train import refit as refits
from relsql.train.options import EPOCHS, LR, PATIENCE, RANKING_BATCH, RANKING_LR, RANKING_PATIENCE, TIME_BUDGET, fit_options
from relsql.train.ranking import results as ranked
from relsql.train.report import LOSSES, plot_history, text_report
from relsql.train.threads import torch_threads
from relsql.train.trainer import OneProcess, Trainer

log = logging.getLogger("relsql")
# the names older code and tests used for the learner's members
_FORMER = {"_outputs": "outputs", "_weights_copy": "weights_copy", "_restore_weights": "restore_weights"}


def _with_threads(method):
    """Run a Model method with torch's threads set for this model (put back afterwards), and a
    database server that went away reported as such."""
    @functools.wraps(method)
    def run(self, *args, **kwargs):
        with torch_threads(self.threads), _server_reachable(self.db):
            return method(self, *args, **kwargs)

    return run


@contextlib.contextmanager
def _server_reachable(db: Database | None):
    """A database that cannot be reached any more (a PostgreSQL server stopped mid-training) is a
    SourceError naming it, whether DuckDB raised it raw or relsql already wrapped it for a statement."""
    try:
        yield
    except (duckdb.Error, RelsqlError) as err:
        lost = None if isinstance(err, SourceError) or db is None else lost_connection(db.description, err)
        if lost is None:
            raise
        raise lost from None


class Model:
    """Trains a template's output relation to predict `target` ("table.column")."""

    def __init__(self, db: Database, template: Template | str | Path, target: str, *, output: str | None = None,
                 task: str | None = None, time_column: str | None = None,
                 split: tuple[float, float, float] = (0.7, 0.15, 0.15), seed: int = 0,
                 dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu", progress: bool | None = None,
                 batch_size: int | None = None, fanout: dict[str, int] | int | None = None,
                 embedding_optimizer: str | None = None, embedding_lr: float = 0.1, allow_target_inputs: bool = False,
                 threads: int | None = None, store: str | Path | bool | None = None,
                 max_groundings: int | None = None, candidates: str | None = None, pairs: str | None = None):
        """`batch_size` (target rows per batch) trains on mini-batches read from a grounding store
        on disk (`store`: a folder to keep and reuse it; default a temporary one; False grounds every
        batch in the database). `fanout` caps the groundings per head (a seeded sample; off by
        default). Embeddings with storage='database' live in database tables, trained in SQL by
        `embedding_optimizer` ("adagrad" or "sgd") at `embedding_lr`; setting it also trains
        in-memory embeddings that way. A template that reads the target is refused unless
        `allow_target_inputs=True`. `threads`: torch's threads while this model trains and predicts
        (default half the cores). A rule estimated at more than `max_groundings` groundings
        (default 10^8) is refused before it runs. A target that references a table (a foreign key,
        or a list of keys) ranks that table's rows: `candidates` names the template's tower for
        them, `pairs` a relation keyed by both keys whose 1-wide value adds to a pair's score (see
        recommend(), docs/recommendation.md). See docs/training.md."""
        if not isinstance(db, Database):
            raise RelsqlError(f"db must be a relsql.Database (from relsql.connect(...)), got {type(db).__name__}")
        self.db = db
        with _server_reachable(db):
            self.threads = None if threads is None else arguments.integer("threads", threads, maximum=1024)
            self.learner = build.learner(db, template, target, output=output, task=task, time_column=time_column,
                                         split=split, seed=seed, dtype=dtype, device=device, progress=progress,
                                         batch_size=batch_size, fanout=fanout, embedding_optimizer=embedding_optimizer,
                                         embedding_lr=embedding_lr, allow_target_inputs=allow_target_inputs, store=store,
                                         max_groundings=max_groundings, candidates=candidates, pairs=pairs)

    @classmethod
    def _around(cls, db: Database, learner) -> Model:
        """A Model over a learner built elsewhere (Model.load's, from a saved state): the only
        other way one is made; it sets what __init__ sets."""
        model = cls.__new__(cls)
        model.db, model.threads, model.learner = db, None, learner
        return model

    def __getattr__(self, name: str):
        """The learner's members (net, task, rows, y, history, target, parameters, ...) and settings read through."""
        if name == "learner":
            raise AttributeError(name)
        learner = self.learner
        if name in _FORMER:
            return getattr(learner, _FORMER[name])
        if name == "_split_tensors":
            return learner.goal.split_index
        for part in (learner, learner.settings):
            if hasattr(part, name):
                return getattr(part, name)
        raise AttributeError(f"'Model' object has no attribute {name!r}")

    @_with_threads
    def fit(self, epochs: int = EPOCHS, batch_size: int | None = None, lr: float | None = None, patience: int | None = None,
            weight_decay: float = 0.0, *, schedule: str | None = "plateau", warmup: float = 0.05, clip: float | None = 1.0,
            monitor: str = "auto", time_budget: float | None = TIME_BUDGET, loss: str | None = None,
            class_weight: str | None = None, negatives: str | None = None, hard_negatives: str | None = None,
            refit: bool = False, hybrid: bool | None = None,
            checkpoint: str | Path | None = None,
            resume: bool = False, checkpoint_every: int | None = None, callback=None, workers: int = 1) -> Model:
        """AdamW on the training rows; keeps the weights of the epoch with the best validation score.
        `lr` defaults to 0.01, `patience` to 100 (a ranking target: 0.03, 40, and steps of
        `batch_size` 4096 target rows, each running both towers whole).

        Training stops at whichever comes first: `epochs`, `time_budget` seconds (None: no limit;
        checked after each epoch), or `patience` epochs without a better validation score
        (`model.stopped` says which). `schedule`: "plateau" (default: the rate halves after
        patience/4 epochs without a better validation score), "cosine" (linear warm-up over
        `warmup` of the steps, then cosine decay to 0 over the epoch budget) or None (constant
        `lr`). Plateau is the default because it does not depend on the epoch budget: a run the
        time budget stops has already decayed where it stalled, and a run resumed with more
        epochs continues as one uninterrupted run would; it also measured best (see EPOCHS). `clip`: the largest norm
        of the dense weights' gradient (None: unclipped). `monitor`: the validation score model
        selection and early stopping compare: "auto" is ROC-AUC (binary), accuracy (multi-class)
        or MAE (regression), as RelBench selects; "loss", or another of the task's metrics; the
        loss breaks ties and stands in where the metric is undefined. `loss` (regression):
        "huber" (default; delta 1 on the standardized target), "mse" or "mae". `class_weight`
        (classification): "balanced" weighs each row's loss by n / (classes x its class's count
        among the training rows). A ranking target: `loss` "softmax" (default; sampled softmax),
        "bce" or "bpr", `negatives` "uniform" (default), "popularity" or "in-batch",
        `hard_negatives` a SQL SELECT of (target keys, candidate key) pairs pushed down, monitor
        "auto" = MAP@k (docs/recommendation.md). `refit=True`: after selection, train again from the same
        initial weights on training + validation rows for the selected number of epochs
        (`model.refit` says so; validation scores are then no longer held out). `hybrid=True`:
        after training, a GBM on one-hop features the database computes is blended with the
        network by a weight picked on the validation rows (1: the network alone; the report
        says which; relsql/train/hybrid.py); False keeps the network alone; None (default):
        True for a template Template.auto generated (its header line), False for one written
        by hand, which means what it meant.

        `batch_size` (default: the model's) trains on mini-batches, the next one prepared in the
        background (time waiting in `timings["waiting_on_database"]`); without it every step is
        full-batch. `checkpoint`: a file written atomically after every epoch (and every
        `checkpoint_every` batches); `resume=True` continues from it, schedule included.
        `callback(info)` is called after every step with epoch, batch, batches and loss; an
        exception from it (or Ctrl-C) stops training with the database consistent. `workers=N`
        trains data-parallel on N processes (the steps of one process; relsql/train/distributed.py).
        Under torchrun (RANK and WORLD_SIZE set), fit() trains as this process's rank instead."""
        epochs = arguments.integer("epochs", epochs)
        ranking = self.task.kind == "ranking"
        lr = arguments.number("lr", (RANKING_LR if ranking else LR) if lr is None else lr, positive=True)
        patience = arguments.integer("patience", (RANKING_PATIENCE if ranking else PATIENCE) if patience is None else patience,
                                     minimum=0)
        weight_decay = arguments.number("weight_decay", weight_decay, minimum=0.0)
        options = fit_options(self.learner, schedule, warmup, clip, monitor, time_budget, loss, class_weight, negatives,
                              hard_negatives)
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
        if ranking and (workers > 1 or distributed.launched_by_torchrun()):
            raise RelsqlError(f"{self.target} is a ranking target, which trains in one process (both towers whole): "
                              "drop workers= (and run it without torchrun)")
        if not isinstance(refit, bool):
            raise RelsqlError(f"refit must be True or False, got {refit!r}")
        if hybrid is not None and not isinstance(hybrid, bool):
            raise RelsqlError(f"hybrid must be True, False or None (automatic templates only), got {hybrid!r}")
        if hybrid is None:
            from relsql.template.auto import is_automatic

            hybrid = is_automatic(self.template.source) and self.task.kind != "ranking"
        elif hybrid and self.task.kind == "ranking":
            raise RelsqlError("hybrid=True blends a GBM with a label's prediction; a ranking target has none: drop hybrid=")
        self.learner.hybrid = None
        learner, common = self.learner, (epochs, batch_size, lr, patience, weight_decay, checkpoint, checkpoint_every, resume)
        if refit:
            refits.check(learner, workers)
        learner.refit = None
        if distributed.launched_by_torchrun():  # this process is one rank of a torchrun group
            world = int(os.environ["WORLD_SIZE"])
            if workers not in (1, world) or callback is not None or refit:
                raise RelsqlError(f"under torchrun, fit() trains as one of its {world} ranks: pass no callback nor refit, and "
                                  f"workers=1 or workers={world} (torchrun's --nproc_per_node x --nnodes)")
            distributed.fit_as_rank(learner, *common, options=options)
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
            distributed.fit(learner, workers, *common, threads=self.threads, options=options)
            return self._blend(hybrid)
        batch_size = batch_size if batch_size is not None else RANKING_BATCH if ranking else learner.settings.batch_size
        state = checkpoints.load(checkpoint) if resume and checkpoint is not None and Path(checkpoint).exists() else None
        initial, before = (learner.weights_copy() if refit else None), len(learner.history)
        with learner.own_random_stream():
            diverged = self._train(epochs, batch_size, lr, patience, weight_decay, options, checkpoint=checkpoint,
                                   checkpoint_every=checkpoint_every, callback=callback, resume=state)
            if not diverged and refit:
                replay = [h["lr"] / lr for h in learner.history[before:]]  # the plateaus the selection met, epoch by epoch
                diverged = refits.retrain(learner, initial, lambda n: self._train(
                    n, batch_size, lr, patience, weight_decay, {**options, "time_budget": None}, callback=callback,
                    keep="last", horizon=epochs, replay=replay))
        if diverged:
            raise RelsqlError(diverged) from None
        return self._blend(hybrid)

    def _blend(self, hybrid: bool) -> Model:
        """The trained network blended with a GBM where the validation rows pick one (hybrid.py)."""
        if hybrid and self.learner.refit is None:  # after a refit the validation rows are no judge
            from relsql.train import hybrid as hybrids

            self.learner.hybrid = hybrids.fit(self.learner)
        return self

    def search(self, budget: float | str = "10m", trials: int | None = None, **options) -> Model:
        """Tune within `budget` ("90s", "10m", "1h" or seconds), every trial on this model's split;
        the best trial becomes this model, the trials are in `model.trials` and the report
        (relsql/train/search.py)."""
        from relsql.train import search as searching

        return searching.search(self, budget, trials, **options)

    def _train(self, epochs: int, batch_size: int | None, lr: float, patience: int, weight_decay: float, options: dict,
               **more) -> str | None:
        """One Trainer's fit in this process: the message of a diverged loss, else None."""
        learner, resume = self.learner, more.pop("resume", None)
        settings = {k: v for k, v in options.items() if k not in ("regression_loss", "class_weights")}
        trainer = Trainer(learner, OneProcess(), epochs=epochs, batch_size=batch_size, lr=lr, patience=patience,
                          weight_decay=weight_decay, **settings, **more)
        return trainer.fit(learner.mini_batches or (batch_size is not None and not learner.whole_net_batches), resume)

    @_with_threads
    def evaluate(self, split: str = "test") -> dict[str, float]:
        """Metrics on a split: accuracy, ROC-AUC, F1 (classification) or MAE, RMSE (regression)."""
        if split == "test" and split in self.rows and not len(self.rows["test"]) and self.fractions[2] == 0:
            raise RelsqlError(f"this model has no test split (split={tuple(self.fractions)} gives the test part 0): "
                              "evaluate('val') scores the validation rows, or build the Model with a test part in split=")
        if self.task.kind == "ranking":
            return ranked.evaluate(self.learner, split)
        return results.evaluate(self.learner, split)

    @_with_threads
    def predict(self, keys=None, *, where: str | None = None) -> pl.DataFrame:
        """Every output row: its key columns, `prediction` and, for a binary task, `probability` (of
        the positive class, `task.classes[1]`), for a multi-class task `probabilities` (a list in
        the order of `task.classes`; a native list column in the database). A key column that
        already has one of those names keeps it; the prediction's column then gets the first free
        name `prediction_1`, `prediction_2`, ... (compared as the database does, ignoring case).
        The last column, `split`, says which part each row was in: "train", "val", "test", or
        null for prediction-only rows (NULL target).

        `keys`: only these rows, in this order: a polars or pandas frame (or a dict of lists) of
        the target table's key columns; a key the model has no row for is a RelsqlError naming it.
        `where`: only the target table's rows satisfying this SQL condition on its columns, e.g.
        "signup >= DATE '2024-01-01' AND tier = 'gold'": parsed by sqlglot, one boolean
        expression over that table's columns only (no statements, subqueries or other tables),
        columns quoted, evaluated by the database. Both: the rows of `keys` that satisfy
        `where`. After Model.load on another database this scores that database's rows."""
        self._not_ranking("predict")
        return results.predict(self.learner, splits=True, keys=keys, where=where)

    def write_predictions(self, name: str, *, replace: bool = False) -> int:
        """Write `predict()` (without its `split` column) as a new table, atomically; an existing
        table needs replace=True."""
        self._not_ranking("write_predictions")
        frame = results.predict(self.learner)
        self.db.write_table(name, frame.to_arrow(), replace=replace, kind="predictions")
        return frame.height

    def _not_ranking(self, method: str) -> None:
        if self.task.kind == "ranking":
            raise RelsqlError(f"{self.target} is a ranking target: {method}() gives one value per row; recommend(k=...) "
                              "and write_recommendations(name) give each row's k best candidates")

    @_with_threads
    def recommend(self, k: int = 10, keys=None, *, where: str | None = None) -> pl.DataFrame:
        """For a ranking target, each row's `k` best candidates, best first: the target table's key
        columns, the candidate's key under the target column's name, `rank` (1..k) and `score`.
        Rows: those with a NULL target (to predict), or those `keys`/`where` choose (as predict())."""
        if self.task.kind != "ranking":
            raise RelsqlError(f"recommend() ranks the rows a foreign-key target references; {self.target} is "
                              f"{self.task.kind}: use predict()")
        return ranked.recommend(self.learner, k, keys, where)

    def write_recommendations(self, name: str, k: int = 10, *, replace: bool = False) -> int:
        """Write `recommend(k)` as a new table, atomically; an existing table needs replace=True."""
        frame = self.recommend(k)
        self.db.write_table(name, frame.to_arrow(), replace=replace, kind="recommendations")
        return frame.height

    @_with_threads
    def gradients_as_relations(self, prefix: str = "grad_", *, split: str = "train", replace: bool = False) -> dict[str, str]:
        """The gradient of the `split` loss at the current weights, one new table `<prefix><name>`
        per weight (columns `parameter`, `row`, `gradient`; a database-stored embedding's `key` and
        `gradient`, summed in the database). Every name is checked before anything is written;
        returns {weight name: table name}."""
        return gradients.write(self.learner, prefix, split, replace)

    def report(self) -> str:
        return text_report(self)

    def baseline(self, split: str = "test") -> dict[str, float]:
        """The metrics of the obvious predictor on a split, fit on the training rows: the majority
        class (classification) or the mean (regression). A model worth having beats it."""
        return results.baseline(self.learner, split)

    def named_weights(self) -> dict[str, torch.Tensor]:
        """The template's weights by name (a typed linear's per type, `name[<value>]`, see
        CompiledNet.named_weights) and the head's as `_head.<name>`."""
        return {**self.net.named_weights(), **self.learner.head_weights()}

    def save(self, path: str | Path) -> Path:
        """Weights, encodings, task and split in one file (written atomically), plot beside it.
        The file holds plain tensors, numbers, strings and Arrow IPC bytes only, so loading it
        cannot run code (see relsql/train/checkpoint.py)."""
        path = saved.write(saved.ModelState.of(self.learner), path)
        if self.history and self.task.kind != "ranking":
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
        grounded on demand, whatever the model was trained with. Every value read from the file
        is checked like a user's argument before use."""
        if batch_size is not None:
            batch_size = arguments.integer("batch_size", batch_size)
        if not isinstance(db, Database):
            raise RelsqlError(f"db must be a relsql.Database (from relsql.connect(...)), got {type(db).__name__}")
        state = saved.read(path)
        with _server_reachable(db):
            learner = build.saved_learner(db, state, device=device, batch_size=batch_size or state.batch_size)
        missing = [n for n in learner.net.weights_by_name() if n not in state.weights]
        if missing:
            raise RelsqlError(f"model file {path} does not fit its own template: weights {missing} are missing")
        try:
            learner.net.set_named_weights(state.weights, learner.fixed())
            learner.head.load_state_dict(state.head)
        except (RuntimeError, KeyError, TypeError, ValueError) as err:
            raise RelsqlError(f"model file {path} does not fit its own template: {first_line(err)}") from None
        learner.net.to(learner.device)
        learner.head.to(learner.device)
        return cls._around(db, learner)
