"""A Learner from a ModelSpec (`Model(...)`'s arguments), each checked like a user's
(relsql/arguments.py), in the order the API documents them; or from a saved state
(`saved_learner`: Model.load, whose settings become a spec too)."""

from __future__ import annotations

from pathlib import Path

import sqlglot.expressions as exp
import torch

from relsql import arguments, cores
from relsql import sql as q
from relsql.data.duckdb import engine_threads
from relsql.data.engine import Database
from relsql.data.references import referenced
from relsql.errors import RelsqlError, SchemaError
from relsql.ground.demand import database_embeddings
from relsql.ground.execute import Presets, groundings_limit
from relsql.template import Template, ir
from relsql.train.learner import loaded
from relsql.train.learner.learner import Learner, Settings
from relsql.train.learner.record import FitRecord
from relsql.train.model.spec import ModelSpec
from relsql.train.persist import saved
from relsql.train.persist.saved import ModelState
from relsql.train.ranking.learner import RankingLearner
from relsql.train.ranking.target import ranking_target
from relsql.train.task import checks
from relsql.train.task.target import Target


def learner(db: Database, spec: ModelSpec, loading: ModelState | None = None) -> Learner:
    """The spec's arguments checked (all but `threads`, which the Model keeps), the leakage check,
    then the build (grounding, planning, labels); `loading`: Model.load's saved state. The user's
    tables and columns are read once for all of it (`frozen_schema`): building writes no user table
    (only relsql's temp tables), and the target's checks, key discovery, the leakage check and
    grounding each read the catalog (about 15 statements of a small database's 170); and all of it on
    DuckDB's threads as grounding (`engine_threads`), so the thread count changes once, not per stage."""
    with db.frozen_schema(), engine_threads(db, cores.half()):
        return _learner(db, spec, loading)


def _learner(db: Database, spec: ModelSpec, loading: ModelState | None) -> Learner:
    template, target, task, candidates = spec.template, spec.target, spec.task, spec.candidates
    if not isinstance(template, ir.Template | str | Path):
        raise RelsqlError(f"template must be a relsql.Template or the path of a template file, got {type(template).__name__}")
    template = template if isinstance(template, ir.Template) else Template.from_file(template)
    table, column = arguments.target(target)
    output = arguments.text("output", spec.output, optional=True) or checks.default_output(template, table)
    if output not in template.relations:
        raise RelsqlError(f"output relation `{output}` is not in the template; it declares {list(template.relations)}")
    time_column = arguments.text("time_column", spec.time_column, optional=True)
    fractions, seed = arguments.split(spec.split), arguments.integer("seed", spec.seed, minimum=0, maximum=2**31 - 1)
    settings = Settings(dtype=arguments.dtype(spec.dtype), device=arguments.device(spec.device), progress=spec.progress)
    settings.batch_size = None if spec.batch_size is None else arguments.integer("batch_size", spec.batch_size)
    settings.fanout = arguments.fanout(spec.fanout, template.relations)
    settings.store = arguments.store(spec.store)
    settings.embedding_optimizer = arguments.choice("embedding_optimizer", spec.embedding_optimizer,
                                                    (None, "adagrad", "sgd"))
    settings.embedding_lr = arguments.number("embedding_lr", spec.embedding_lr, positive=True)
    settings.max_groundings = groundings_limit(spec.max_groundings)
    arguments.choice("task", task, (None, "binary", "multiclass", "regression", "ranking"))
    pairs = arguments.text("pairs", spec.pairs, optional=True)
    reference = None
    if task in (None, "ranking") and (loading is None or loading.task.kind == "ranking"):
        reference = referenced(db, table, column, infer=task == "ranking")
    if reference is not None:
        goal = ranking_target(template, table, column, output, reference, candidates, time_column, fractions, seed, loading,
                              pairs=pairs)
    elif task == "ranking" or candidates is not None or pairs is not None:
        raise SchemaError(f"target {table}.{column} references no table, so it cannot be ranked: a ranking target is a "
                          "foreign key (declared, or given to relsql.connect(keys=...)) or a list named after a table's "
                          "one-column primary key; drop task='ranking', candidates= and pairs= for a label column")
    else:
        goal = Target(table, column, output, template.relations[output].keys, time_column, fractions, seed)
    if not spec.allow_target_inputs:
        goal.refuse_leaks(template, db)
    made = (RankingLearner if reference is not None else Learner)(db, template, goal, settings)
    if loading is not None:  # Model.load: the saved encodings, task and split
        made.record = FitRecord(history=loading.history, best_epoch=loading.best_epoch)
        made.refit = loading.refit  # its held-out scores: what evaluate() reports of the val and test rows
        if loading.hybrid is not None:
            from relsql.train.gbm.hybrid import Hybrid

            made.hybrid = Hybrid.from_plain(loading.hybrid)
    if loading is None:
        made.build(Presets(), task)
    elif not deferred(made):
        made.build(loading.presets, loading.task, split=loading.split)
    return made


def deferred(made: Learner) -> bool:
    """Whether a loaded model waits for its first use to ground and plan (relsql/train/learner/loaded.py):
    a plain one; a ranking model or one with database-stored embeddings is built at once."""
    return type(made) is Learner and not database_embeddings(made.template)


def saved_spec(state: ModelState, *, device: str | torch.device, batch_size: int | None) -> ModelSpec:
    """The spec of a saved model as Model.load builds it: what the file keeps (the task, encodings
    and split come with the state), on `device` with `batch_size`; the rest Model's defaults. The
    saved template may read the target: it was allowed once."""
    return ModelSpec(state.template, state.target).replace(
        output=state.output, time_column=state.time_column, split=state.fractions, seed=state.seed, dtype=state.dtype,
        device=device, batch_size=batch_size, fanout=state.fanout, embedding_optimizer=state.embedding_optimizer,
        embedding_lr=state.embedding_lr, allow_target_inputs=True)


def saved_learner(db: Database, state: ModelState, *, device: str | torch.device, batch_size: int | None) -> Learner:
    """Model.load's learner: the saved settings checked like arguments, then built on `db` with the
    saved encodings, task and split."""
    return learner(db, saved_spec(state, device=device, batch_size=batch_size), loading=state)


def loaded_learner(db: Database, path: str | Path, *, device: str | torch.device, batch_size: int | None) -> Learner:
    """Model.load's learner from the file at `path`. A plain model is checked against the
    database cheaply and built on first use (relsql/train/learner/loaded.py); others are built now, their
    saved weights set. A file whose weights do not fit its own template is a RelsqlError."""
    state = saved.read(path)
    made = saved_learner(db, state, device=device, batch_size=batch_size or state.batch_size)
    if deferred(made):
        loaded.check_head(state, path)
        made.goal.task, made.goal.rows = state.task, dict(state.split)
        made.goal.check_columns(db)
        saved.check_split(made, path, labelled_count(db, made.goal), stacklevel=4)
        saved.check_blend(made, path)
        made.pending = loaded.Pending(state, path)
        return made
    loaded.set_built_weights(made, state, path)
    saved.check_loaded(made, path)  # what only the database can confirm: rows, the blend's columns
    return made


def labelled_count(db: Database, goal: Target) -> int:
    """The target rows with a label: at least as many as the output relation reaches."""
    column = exp.Count(this=q.col(goal.column))
    return int(db.scalar(exp.select(column).from_(exp.Table(this=q.ident(goal.table))))[0])
