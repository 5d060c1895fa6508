"""`relsql.Model`: a template, a database and a target column, trained end to end.

A façade over the product layer in relsql/train/: the target (target.py: labels, task, split),
the learner (learner.py: net, head, batches), the batch source (source.py), the trainer
(trainer.py: one loop; distributed.py: its strategy on ranks), the saved state (saved.py) and
the results (results.py, report.py, gradients.py). Its arguments are checked here.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl
import torch

from relsql import arguments, relbench
from relsql.data.engine import Database
from relsql.errors import RelsqlError
from relsql.progress import lines as progress_lines
from relsql.template.ir import Template
from relsql.train.learner import results
from relsql.train.learner.defaults import EPOCHS, TIME_BUDGET
from relsql.train.loop.callbacks import Callback
from relsql.train.loop.options import FitConfig
from relsql.train.model import build, gradients, own_columns
from relsql.train.model.calls import checked_database, server_reachable, with_threads
from relsql.train.model.report import LOSSES, plot_history, text_report
from relsql.train.model.spec import ModelSpec
from relsql.train.model.views import LearnerViews
from relsql.train.persist import saved


class Model(LearnerViews):
    """Trains a template's output relation to predict `target` ("table.column"); its read-only
    attributes (target, task, rows, net, history, best_epoch, ...) are declared in LearnerViews."""

    def __init__(self, db: Database, template: Template | str | Path, target: str, *, output: str | None = None,
                 task: str | None = None, time_column: str | None = None,
                 split: tuple[float, float, float] = (0.7, 0.15, 0.15), seed: int = 0,
                 dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu", progress: bool | None = None,
                 batch_size: int | None = None, fanout: dict[str, int] | int | None = None,
                 embedding_optimizer: str | None = None, embedding_lr: float = 0.1, allow_target_inputs: bool = False,
                 threads: int | None = None, store: str | Path | bool | None = None,
                 max_groundings: int | None = None, candidates: str | None = None, pairs: str | None = None):
        """`batch_size` trains on mini-batches of target rows read from a grounding store on disk
        (`store`: a folder to keep; False grounds every batch in the database); `fanout` caps the
        groundings per head (seeded). Embeddings with storage='database' live in tables, trained in
        SQL by `embedding_optimizer` ("adagrad" | "sgd") at `embedding_lr`. A template reading the
        target is refused unless `allow_target_inputs=True`. `threads`: torch's threads (default
        half the cores). A rule estimated above `max_groundings` (10^8) is refused before it runs.
        A target referencing a table (a foreign key or a list of keys) ranks its rows: `candidates`
        names their tower, `pairs` a relation keyed by both keys adding to a pair's score
        (docs/recommendation.md). See docs/training.md."""
        self._build(db, ModelSpec(template, target, output=output, task=task, time_column=time_column, split=split,
                                  seed=seed, dtype=dtype, device=device, progress=progress, batch_size=batch_size,
                                  fanout=fanout, embedding_optimizer=embedding_optimizer, embedding_lr=embedding_lr,
                                  allow_target_inputs=allow_target_inputs, threads=threads, store=store,
                                  max_groundings=max_groundings, candidates=candidates, pairs=pairs))

    @classmethod
    def from_spec(cls, db: Database, spec: ModelSpec) -> Model:
        """A model made of `spec` (another model's `model.spec`, changed with `spec.replace(...)`) on `db`."""
        if not isinstance(spec, ModelSpec):
            raise RelsqlError(f"spec must be a relsql.ModelSpec (a model's `model.spec`), got {type(spec).__name__}")
        model = cls.__new__(cls)
        model._build(db, spec)
        return model

    def _build(self, db: Database, spec: ModelSpec) -> None:
        """Check `spec` and build the learner (`model.spec` then reads what was built: ModelSpec.of)."""
        self.db = checked_database(db)
        with server_reachable(db), progress_lines(spec.progress):
            self.threads = None if spec.threads is None else arguments.integer("threads", spec.threads, maximum=1024)
            self.learner = build.learner(db, spec)
        self._allow_target_inputs = spec.allow_target_inputs

    @property
    def spec(self) -> ModelSpec:
        """what the model is made of (Model's arguments but db, as built), for Model.from_spec(db, spec.replace(...))"""
        return ModelSpec.of(self.learner, threads=self.threads, allow_target_inputs=self._allow_target_inputs)

    @classmethod
    def _around(cls, db: Database, learner) -> Model:
        """A Model over a learner built elsewhere (Model.load's, from a saved state); it sets what
        _build sets."""
        model = cls.__new__(cls)
        model.db, model.threads, model.learner = db, None, learner
        model._allow_target_inputs = True  # a saved template may read the target: it was allowed once (build.saved_spec)
        return model

    @with_threads
    def fit(self, epochs: int = EPOCHS, batch_size: int | None = None, lr: float | None = None, patience: int | None = None,
            weight_decay: float = 0.0, *, overfit: bool | None = None, schedule: str | None = "plateau",
            warmup: float | None = None, clip: float | None = 1.0, monitor: str = "auto",
            time_budget: float | None = TIME_BUDGET, loss: str | None = None, class_weight: str | None = None,
            negatives: str | None = None, hard_negatives: str | None = None, refit: bool | None = None,
            hybrid: bool | None = None, checkpoint: str | Path | None = None, resume: bool = False,
            checkpoint_every: int | None = None, callback=None, callbacks: list[Callback] | None = None,
            workers: int = 1, steps_per_epoch: int | None = None) -> Model:
        """AdamW on the training rows, keeping the weights of the epoch with the best validation score
        (docs/training.md has every option and why its default was chosen).

        Stops at `epochs`, `patience` epochs without a better score or a `time_budget` in seconds if given (none by default: same
        seed, same model under any load; `model.stopped` says which). `lr`/`patience` default to 0.01/100; for a ranking target to
        0.03/16, steps of 4096 target rows (fewer rows: 4 steps). `overfit` (default: on for a label target, off for a ranking
        one) also stops 20 epochs after the best where the net overfits or has learnt its training rows by heart. `schedule`
        "plateau" | "cosine" | None (`warmup`: cosine's share); `clip` the dense gradient's largest norm; `monitor` "auto"
        (ROC-AUC, accuracy, MAE, or MAP@k for a ranking target), "loss" or another metric. `loss`: "huber" | "mse" | "mae"
        (regression), "softmax" | "bce" | "bpr" (ranking); `class_weight="balanced"`; `negatives` "uniform" | "popularity" |
        "in-batch" and `hard_negatives` (a SQL SELECT of pairs) for ranking. `refit`: once the held-out scores are measured, the
        selected model trains on every labelled row for half the epochs validation chose (the blend's GBM too); predict() uses it,
        evaluate() the held-out scores. None: wherever it can (model.no_refit says why not); True: refuse where not; False: never.
        `hybrid`: blend a GBM on two-hop SQL features, weighted on validation by the epoch's metric. `steps_per_epoch`: whole-net
        steps, each on a seeded share of the training rows (default 4 for an automatic template's network alone, else 1);
        `batch_size` trains on mini-batches. `checkpoint` is written atomically every epoch (and `checkpoint_every` batches),
        `resume=True` continues from it; `callback(info)` after every step (raising stops training, database consistent), or a
        relsql.Callback; `callbacks=[...]`: relsql.Callback objects, run after fit's own in order (on_fit_start, on_batch_end,
        on_epoch_end: a reason to stop or None, on_fit_end); `workers=N` trains data-parallel on N processes, and under torchrun
        as this rank."""
        config = FitConfig.checked(self.learner, epochs=epochs, batch_size=batch_size, lr=lr, patience=patience,
                                   overfit=overfit, weight_decay=weight_decay, schedule=schedule, warmup=warmup, clip=clip,
                                   monitor=monitor, time_budget=time_budget, loss=loss, class_weight=class_weight,
                                   negatives=negatives, hard_negatives=hard_negatives, refit=refit, hybrid=hybrid,
                                   checkpoint=checkpoint, resume=resume, checkpoint_every=checkpoint_every,
                                   callback=callback, callbacks=callbacks, workers=workers, steps_per_epoch=steps_per_epoch)
        self.learner = own_columns.fit(self.db, self.learner, self.threads, config, self.spec)
        return self

    def search(self, budget: float | str = "10m", trials: int | None = None, **options) -> Model:
        """Tune within `budget` ("90s", "10m", "1h" or seconds), every trial on this model's split;
        the best trial becomes this model, the trials are in `model.trials` and the report
        (relsql/train/model/search.py)."""
        from relsql.train.model import search as searching

        return searching.search(self, budget, trials, **options)

    @with_threads
    def evaluate(self, split: str = "test") -> dict[str, float]:
        """Metrics on a split: accuracy, ROC-AUC, F1 (classification) or MAE, RMSE (regression). After
        a refit on every labelled row, "val" and "test" give the scores measured before it, on rows
        the selected model had not seen (model.refit["held_out"]), never the refit model's."""
        if split == "test" and split in self.rows and not len(self.rows["test"]) and self.fractions[2] == 0:
            raise RelsqlError(f"this model has no test split (split={tuple(self.fractions)} gives the test part 0): "
                              "evaluate('val') scores the validation rows, or build the Model with a test part in split=")
        return results.evaluate(self.learner, split)

    @with_threads
    def predict(self, keys=None, *, where: str | None = None, with_split: bool = True) -> pl.DataFrame:
        """Every output row: its key columns, `prediction`, for a binary task `probability` (of
        `task.classes[1]`), for a multi-class one `probabilities` (in `task.classes`' order), and
        `split` ("train", "val", "test", or null for prediction-only rows). A key column that has
        one of those names keeps it; the prediction's column gets the first free `prediction_1`, ...
        `with_split=False` leaves the `split` column out: scores to hand on or store (what
        write_predictions and `relsql predict --table` write), not the training's bookkeeping.

        `keys`: only these rows, in this order (a polars or pandas frame, or a dict of lists, of
        the target table's key columns; an unknown key is a RelsqlError naming it). `where`: only
        the rows satisfying one SQL boolean expression over the target table's own columns
        (parsed by sqlglot, no subqueries), evaluated by the database. After Model.load on
        another database this scores that database's rows (docs/training.md), and `keys`/`where`
        ground only the rows asked for."""
        self._one_value_per_row("predict")
        relbench.refuse_pairs_as_keys(self.db, self.learner.table, keys)
        return results.predict(self.learner.asked(keys, where), splits=with_split, keys=keys, where=where)

    @with_threads
    def explain(self, keys=None, *, where: str | None = None, steps: int | None = None, per: str = "column",
                unit: int | None = None) -> pl.DataFrame:
        """Why each row (as predict() picks) got its output (class `unit`'s score): input rows' attributions (docs/explain.md)."""
        from relsql.explain import explain

        return explain(self.learner, keys, where, steps=steps, per=per, unit=unit)

    def write_predictions(self, name: str, *, keys=None, where: str | None = None, replace: bool = False) -> int:
        """Write `predict(keys, where=where, with_split=False)` (every row by default) as a new table,
        atomically; an existing table needs replace=True. Returns the number of rows written."""
        self._one_value_per_row("write_predictions")
        frame = self.predict(keys, where=where, with_split=False)
        self.db.write_table(name, frame.to_arrow(), replace=replace, kind="predictions")
        return frame.height

    def _one_value_per_row(self, method: str) -> None:
        """Refuse predict() where the learner's answers are not one value per row (a ranking's are candidates)."""
        if self.learner.answers != "predict":
            raise RelsqlError(f"{self.target} is a {self.task.kind} target: {method}() gives one value per row; "
                              "recommend(k=...) and write_recommendations(name) give each row's k best candidates")

    @with_threads
    def recommend(self, k: int = 10, keys=None, *, where: str | None = None) -> pl.DataFrame:
        """For a ranking target, each row's `k` best candidates, best first: the target table's key
        columns, the candidate's key under the target column's name, `rank` (1..k) and `score`.
        Rows: those with a NULL target (to predict), or those `keys`/`where` choose (as predict())."""
        relbench.refuse_pairs_as_keys(self.db, self.learner.table, keys)
        return self.learner.recommend(k, keys, where)  # a learner of one value per row refuses: use predict()

    def write_recommendations(self, name: str, k: int = 10, *, keys=None, where: str | None = None,
                              replace: bool = False) -> int:
        """Write `recommend(k, keys, where=where)` (by default the rows with a NULL target) as a new
        table, atomically; an existing table needs replace=True. Returns the number of rows written."""
        frame = self.recommend(k, keys, where=where)
        self.db.write_table(name, frame.to_arrow(), replace=replace, kind="recommendations")
        return frame.height

    @with_threads
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
        class (classification), the mean (regression), the most popular candidates (ranking). A model
        worth having beats it."""
        return self.learner.baseline(split)

    def named_weights(self) -> dict[str, torch.Tensor]:
        """The template's weights by name (a typed linear's per type, `name[<value>]`, see
        CompiledNet.named_weights) and the head's as `_head.<name>`."""
        return {**self.net.named_weights(), **self.learner.head_weights()}

    def save(self, path: str | Path) -> Path:
        """Weights, encodings, task and split in one file (written atomically), plot beside it. The file
        holds plain tensors, numbers, strings and Arrow IPC bytes only: loading it cannot run code."""
        path = saved.write(saved.ModelState.of(self.learner), path)
        if self.history and self.task.plots_history:
            split = "val" if len(self.rows["val"]) else "train"
            plot_history(self.history, path.with_suffix(".png"), self.task.metric, title=f"{self.target}: {self.output}",
                         loss=LOSSES[self.task.kind], best_epoch=self.best_epoch,
                         baseline=self.baseline(split).get(self.task.metric))
        return path

    @classmethod
    def load(cls, path: str | Path, db: Database, *, device: str | torch.device = "cpu",
             batch_size: int | None = None) -> Model:
        """A saved model on `db`, built on first use with the saved encodings: same predictions;
        predict(keys=/where=) first grounds only those rows. `batch_size` predicts (and evaluates)
        in mini-batches of that many target rows, grounded on demand. Every value read from the
        file is checked like a user's argument before use (relsql/train/learner/loaded.py)."""
        if batch_size is not None:
            batch_size = arguments.integer("batch_size", batch_size)
        with server_reachable(checked_database(db)), progress_lines(None):
            learner = build.loaded_learner(db, path, device=device, batch_size=batch_size)
        return cls._around(db, learner)
