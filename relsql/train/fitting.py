"""What `Model.fit` does with its arguments: check them, pick the defaults of the target's kind,
and hand the learner to one way of training (this process's Trainer, ranks, or this process as a
torchrun rank), then blend a GBM where asked. Model stays a façade; this is the one place where
fit's arguments meet the strategies."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from relsql import arguments, ownfiles
from relsql.compile.module import check_training_bytes
from relsql.db import Database
from relsql.errors import RelsqlError
from relsql.ground.demand import database_embeddings
from relsql.train import checkpoint as checkpoints
from relsql.train import distributed
from relsql.train import refit as refits
from relsql.train.learner import Learner
from relsql.train.options import LR, PATIENCE, RANKING_LR, RANKING_PATIENCE, fit_options, ranking_batch
from relsql.train.trainer import OneProcess, Trainer

log = logging.getLogger("relsql")


def fit(db: Database, learner: Learner, threads: int | None, *, epochs, batch_size, lr, patience, weight_decay,
        schedule, warmup, clip, monitor, time_budget, loss, class_weight, negatives, hard_negatives, refit, hybrid,
        checkpoint, resume, checkpoint_every, callback, workers) -> None:
    """Train `learner` as Model.fit's arguments say (documented there)."""
    epochs = arguments.integer("epochs", epochs)
    ranking = learner.task.kind == "ranking"
    lr = arguments.number("lr", (RANKING_LR if ranking else LR) if lr is None else lr, positive=True)
    patience = arguments.integer("patience", (RANKING_PATIENCE if ranking else PATIENCE) if patience is None else patience,
                                 minimum=0)
    weight_decay = arguments.number("weight_decay", weight_decay, minimum=0.0)
    options = fit_options(learner, schedule, warmup, clip, monitor, time_budget, loss, class_weight, negatives,
                          hard_negatives)
    if batch_size is not None:
        batch_size = arguments.integer("batch_size", batch_size)
    if checkpoint_every is not None:
        checkpoint_every = arguments.integer("checkpoint_every", checkpoint_every)
    if checkpoint is not None:
        checkpoint = checkpoints.writable(checkpoint, "checkpoint")
        ownfiles.check(checkpoint, "checkpoint", "pass a new file name for the checkpoint, or one relsql wrote")
    if callback is not None and not callable(callback):
        raise RelsqlError(f"callback must be callable (a function of one dict), got {type(callback).__name__}")
    if len(learner.rows["train"]) == 0:
        raise RelsqlError(f"no labelled target rows to train on in {learner.target}")
    check_training_bytes(learner.parameters(), learner.device)
    workers = arguments.integer("workers", workers, maximum=1024)
    if ranking and (workers > 1 or distributed.launched_by_torchrun()):
        raise RelsqlError(f"{learner.target} is a ranking target, which trains in one process (both towers whole): "
                          "drop workers= (and run it without torchrun)")
    hybrid = _hybrid(learner, refit, hybrid)
    learner.hybrid = None
    common = (epochs, batch_size, lr, patience, weight_decay, checkpoint, checkpoint_every, resume)
    if refit:
        refits.check(learner, workers)
    learner.refit = None
    if distributed.launched_by_torchrun():  # this process is one rank of a torchrun group
        world = int(os.environ["WORLD_SIZE"])
        if workers not in (1, world) or callback is not None or refit:
            raise RelsqlError(f"under torchrun, fit() trains as one of its {world} ranks: pass no callback nor refit, and "
                              f"workers=1 or workers={world} (torchrun's --nproc_per_node x --nnodes)")
        distributed.fit_as_rank(learner, *common, options=options)
        return
    swapped = sorted(database_embeddings(learner.template)) if not db.transactional else []
    if workers > 1 or swapped:  # an engine without transactions trains its stored embeddings on ranks only
        if callback is not None:
            raise RelsqlError("fit(workers=N) takes no callback (the steps run in other processes): train with one worker to use one"
                              if workers > 1 else f"{db.description} has no transactions to update embeddings {swapped} "
                              "step by step, so fit() trains them on a rank process, which takes no callback: drop callback=")
        if workers == 1:
            log.info("%s has no transactions: training embeddings %s on one rank, which writes them back whole",
                     db.description, swapped)
        distributed.fit(learner, workers, *common, threads=threads, options=options)
    else:
        _in_this_process(learner, epochs, batch_size, lr, patience, weight_decay, options, refit=refit,
                         checkpoint=checkpoint, checkpoint_every=checkpoint_every, callback=callback, resume=resume)
    if hybrid and learner.refit is None:  # after a refit the validation rows are no judge
        from relsql.train import hybrid as hybrids

        learner.hybrid = hybrids.fit(learner)


def _hybrid(learner: Learner, refit, hybrid) -> bool:
    """Whether to blend a GBM after training: hybrid=, or by default for Template.auto's templates."""
    if not isinstance(refit, bool):
        raise RelsqlError(f"refit must be True or False, got {refit!r}")
    if hybrid is not None and not isinstance(hybrid, bool):
        raise RelsqlError(f"hybrid must be True, False or None (automatic templates only), got {hybrid!r}")
    if hybrid is None:
        from relsql.template.auto import is_automatic

        return is_automatic(learner.template.source) and learner.task.kind != "ranking"
    if hybrid and learner.task.kind == "ranking":
        raise RelsqlError("hybrid=True blends a GBM with a label's prediction; a ranking target has none: drop hybrid=")
    return hybrid


def _in_this_process(learner: Learner, epochs: int, batch_size: int | None, lr: float, patience: int,
                     weight_decay: float, options: dict, *, refit: bool, checkpoint: Path | None,
                     checkpoint_every: int | None, callback, resume: bool) -> None:
    """This process's Trainer, then the refit where asked; a diverged loss is a RelsqlError."""
    ranking = learner.task.kind == "ranking"
    batch_size = (batch_size if batch_size is not None else ranking_batch(len(learner.rows["train"])) if ranking
                  else learner.settings.batch_size)
    state = checkpoints.load(checkpoint) if resume and checkpoint is not None and Path(checkpoint).exists() else None
    initial, before = (learner.weights_copy() if refit else None), len(learner.history)
    with learner.own_random_stream():
        diverged = train(learner, epochs, batch_size, lr, patience, weight_decay, options, checkpoint=checkpoint,
                         checkpoint_every=checkpoint_every, callback=callback, resume=state)
        if not diverged and refit:
            replay = [h["lr"] / lr for h in learner.history[before:]]  # the plateaus the selection met, epoch by epoch
            diverged = refits.retrain(learner, initial, lambda n: train(
                learner, n, batch_size, lr, patience, weight_decay, {**options, "time_budget": None}, callback=callback,
                keep="last", horizon=epochs, replay=replay))
    if diverged:
        raise RelsqlError(diverged) from None


def train(learner: Learner, epochs: int, batch_size: int | None, lr: float, patience: int, weight_decay: float,
          options: dict, **more) -> str | None:
    """One Trainer's fit in this process: the message of a diverged loss, else None."""
    resume = more.pop("resume", None)
    settings = {k: v for k, v in options.items() if k not in ("regression_loss", "class_weights")}
    trainer = Trainer(learner, OneProcess(), epochs=epochs, batch_size=batch_size, lr=lr, patience=patience,
                      weight_decay=weight_decay, **settings, **more)
    return trainer.fit(learner.mini_batches or (batch_size is not None and not learner.whole_net_batches), resume)
