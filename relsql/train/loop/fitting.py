"""What `Model.fit` does with its arguments: check them, pick the defaults of the target's kind,
and hand the learner to one way of training (this process's Trainer, ranks, or this process as a
torchrun rank), then blend a GBM where asked. Model stays a façade; this is the one place where
fit's arguments meet the strategies."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from relsql.compile.module import check_training_bytes
from relsql.data.engine import Database
from relsql.errors import RelsqlError
from relsql.ground.demand import database_embeddings
from relsql.train.learner.learner import Learner
from relsql.train.learner.record import FitRecord
from relsql.train.loop import distributed
from relsql.train.loop import refit as refits
from relsql.train.loop.options import FitConfig
from relsql.train.loop.trainer import OneProcess, Trainer
from relsql.train.persist import checkpoint as checkpoints

log = logging.getLogger("relsql")


def fit(db: Database, learner: Learner, threads: int | None, config: FitConfig) -> None:
    """Train `learner` as `config` (Model.fit's arguments, checked) says."""
    if len(learner.rows["train"]) == 0:
        raise RelsqlError(f"no labelled target rows to train on in {learner.target}")
    check_training_bytes(learner.parameters(), learner.device)
    workers = config.workers
    if learner.one_process and (workers > 1 or distributed.launched_by_torchrun()):
        raise RelsqlError(f"{learner.target} is {learner.one_process}: drop workers= (and run it without torchrun)")
    learner.hybrid = None
    torchrun = distributed.launched_by_torchrun()
    if config.refit:
        refits.check(learner, workers, torchrun)
    learner.refit = None
    learner.no_refit = "refit=False" if config.refit is False else refits.unavailable(learner, workers, torchrun)
    if torchrun:  # this process is one rank of a torchrun group
        world = int(os.environ["WORLD_SIZE"])
        if workers not in (1, world) or config.users or config.refit:
            raise RelsqlError(f"under torchrun, fit() trains as one of its {world} ranks: pass no callback(s) nor refit, and "
                              f"workers=1 or workers={world} (torchrun's --nproc_per_node x --nnodes)")
        distributed.fit_as_rank(learner, config)
        return
    swapped = sorted(database_embeddings(learner.template)) if not db.transactional else []
    if workers > 1 or swapped:  # an engine without transactions trains its stored embeddings on ranks only
        if config.users:
            raise RelsqlError("fit(workers=N) takes no callback nor callbacks (the steps run in other processes): "
                              "train with one worker to use them"
                              if workers > 1 else f"{db.description} has no transactions to update embeddings {swapped} "
                              "step by step, so fit() trains them on a rank process, which takes no callbacks: drop "
                              "callback= and callbacks=")
        if workers == 1:
            log.info("%s has no transactions: training embeddings %s on one rank, which writes them back whole",
                     db.description, swapped)
        distributed.fit(learner, config, threads=threads)
        _blend(learner, config)
    else:
        _in_this_process(learner, config)


def _blend(learner: Learner, config: FitConfig, found: list | None = None) -> None:
    """The GBM blend where asked, its weight picked on the validation rows by fit's monitor (from the
    candidates `found` before training, else fitted now)."""
    if config.hybrid:
        from relsql.train.gbm import hybrid as hybrids

        learner.hybrid = hybrids.fit(learner, found)


def _candidates(learner: Learner, config: FitConfig) -> list | None:
    """The blend's GBMs, fitted before the network where asked: training then also stops where the
    blend stops improving (relsql/train/loop/blendstop.py)."""
    if not config.hybrid:
        return None
    from relsql.train.gbm import hybrid as hybrids

    return hybrids.candidates(learner)


def _in_this_process(learner: Learner, config: FitConfig) -> None:
    """This process's Trainer, the blend where asked, then the refit on every labelled row where
    asked or by default (relsql/train/loop/refit.py); a diverged loss is a RelsqlError."""
    resumed = config.resume and config.checkpoint is not None and Path(config.checkpoint).exists()
    state = checkpoints.load(config.checkpoint) if resumed else None
    refit = learner.no_refit is None
    restarts = refit and refits.REFIT_SHARE is None  # only a restarting refit goes back to the initial weights
    initial, before = (learner.weights_copy() if restarts else None), len(learner.record.history)
    found = _candidates(learner, config)
    with learner.own_random_stream():
        record = train(learner, config, resume=state, crossfit=config.hybrid, blend=found)
    if record.diverged:
        raise RelsqlError(record.diverged) from None
    _blend(learner, config, found)
    if not refit:
        return
    replay = [h["lr"] / config.lr for h in record.history[before:]]  # the plateaus the selection met, epoch by epoch
    # the user's callbacks watch the selection run: the refit's epochs have no validation scores, nor a choice to make
    again = config.replace(time_budget=None, checkpoint=None, checkpoint_every=None, callback=None, callbacks=())
    with learner.own_random_stream():  # the refit's draws continue the selection's stream
        record = refits.retrain(learner, initial, lambda n, share=None: train(
            learner, again.replace(epochs=n, lr=config.lr * (share or 1.0)), keep="last", horizon=config.epochs,
            replay=replay if share is None else [1.0]), config.refit is True, replay)
    if record.diverged:
        raise RelsqlError(record.diverged) from None


def train(learner: Learner, config: FitConfig, resume: dict | None = None, **more) -> FitRecord:
    """One Trainer's fit in this process; its record (`diverged`: the message of a loss that
    stopped being a number) is the learner's from the start, so the model's history grows as the
    epochs finish (a tracker logs them) and keeps them if fit raises."""
    trainer = Trainer(learner, OneProcess(), config, **more)
    learner.record = trainer.record
    batched = learner.mini_batches or (config.batch_size is not None and not trainer.whole_net)
    return trainer.fit(batched, resume)
