"""The training loop's callbacks (relsql/train/callbacks.py) and its record (relsql/train/record.py):
a callback that asks to stop ends training where an epoch budget would have (same weights, same
history), and the record says why; a user's Callback given as fit's `callback=` runs its epoch
hooks; a tracker logs each epoch as it ends; a second fit continues the record; a refit keeps the
selection's record."""

from __future__ import annotations

import numpy as np
import pytest

import relsql
from relsql.train.callbacks import Callback
from relsql.train.options import FitConfig
from relsql.train.record import FitRecord
from relsql.train.tracking import Tracker
from relsql.train.trainer import OneProcess, Trainer
from tests.test_trainer import assert_same_weights, customers, model, weights

REASON = "asked (epoch 3)"


class StopAt(Callback):
    """Stops after epoch `last` (0-based) and notes what each hook saw."""

    def __init__(self, last: int):
        self.last, self.seen, self.ended = last, [], None

    def __call__(self, step: dict) -> None:  # fit(callback=) takes a callable
        pass

    def on_epoch_end(self, trainer, epoch: int, record: dict) -> str | None:
        self.seen.append((epoch, record["val_loss"], len(trainer.record.history)))
        return REASON if epoch == self.last else None

    def on_fit_end(self, trainer, last: int | None) -> None:
        self.ended = (last, trainer.record.best_epoch)


def test_a_callback_that_stops_at_epoch_3_ends_where_an_epoch_budget_of_3_does():
    db = customers(120)
    config = dict(batch_size=30, lr=0.05, patience=1000)
    stopped, budget = model(db, batch_size=30), model(db, batch_size=30)
    stop = StopAt(2)
    trainer = Trainer(stopped.learner, OneProcess(), FitConfig(epochs=10, **config), callbacks=[stop])
    record = trainer.fit(batched=True)
    assert isinstance(record, FitRecord) and record.diverged is None
    assert record.stopped == REASON and len(record.history) == 3 and record.epoch_cap == 10
    reference = Trainer(budget.learner, OneProcess(), FitConfig(epochs=3, **config)).fit(batched=True)
    assert reference.stopped == "epochs"
    assert_same_weights(weights(stopped), weights(budget))
    assert [h["val_loss"] for h in record.history] == [h["val_loss"] for h in reference.history]
    assert record.best_epoch == reference.best_epoch
    # the hooks saw each epoch's record once it was in the history, and the end of fit after the last one
    assert stop.seen == [(e, h["val_loss"], e + 1) for e, h in enumerate(record.history)]
    assert stop.ended == (2, record.best_epoch)
    assert stopped.history == []  # the trainer wrote nothing into the model: its entry point puts the record there


def test_a_users_callback_stops_model_fit_and_the_model_says_why():
    db = customers(120)
    stopped, budget = model(db), model(db)
    stop = StopAt(2)
    stopped.fit(epochs=20, patience=1000, hybrid=False, time_budget=None, callback=stop)
    budget.fit(epochs=3, patience=1000, hybrid=False, time_budget=None)
    assert stopped.stopped == REASON and budget.stopped == "epochs"
    assert len(stopped.history) == 3 and stopped.epoch_cap == 20
    assert stopped.best_epoch == budget.best_epoch and stop.ended == (2, stopped.best_epoch)
    np.testing.assert_array_equal(stopped.predict()["probability"].to_numpy(), budget.predict()["probability"].to_numpy())
    assert stopped.learner.record.history is stopped.history  # the model reads its one record


def test_a_raising_epoch_hook_is_a_relsql_error_and_the_finished_epochs_stay():
    m = model(customers(60))

    class Broken(StopAt):
        def on_epoch_end(self, trainer, epoch, record):
            if epoch == 1:
                raise KeyError("oops")

    with pytest.raises(relsql.RelsqlError, match="callback Broken raised KeyError.*after epoch 2") as caught:
        m.fit(epochs=5, hybrid=False, time_budget=None, callback=Broken(99))
    assert isinstance(caught.value.__cause__, KeyError)
    assert [h["epoch"] for h in m.history] == [0, 1]


class Recording(Tracker):
    """A tracker that keeps what it logs."""

    def __init__(self, model):
        super().__init__(model)
        self.epochs, self.steps_logged = [], []

    def log_step(self, step, loss):
        self.steps_logged.append(step)

    def log_epoch(self, index, values):
        self.epochs.append((index, values["val_loss"]))

    def log_text(self, name, text):
        pass


def test_a_tracker_logs_each_epoch_as_it_ends():
    m = model(customers(60))
    tracker = Recording(m)
    m.fit(epochs=4, hybrid=False, time_budget=None, callback=tracker)
    # full batch: one step an epoch; the last epoch is logged before finish(), as it ended
    assert tracker.epochs == [(i, h["val_loss"]) for i, h in enumerate(m.history)] and len(m.history) == 4
    assert tracker.steps_logged == [0, 1, 2, 3]
    tracker.finish()
    assert len(tracker.epochs) == 4  # nothing logged twice


def test_a_second_fit_continues_the_record():
    m = model(customers(60))
    m.fit(epochs=2, hybrid=False, time_budget=None)
    first = list(m.history)
    m.fit(epochs=3, patience=1000, hybrid=False, time_budget=None)
    assert m.history[:2] == first and [h["epoch"] for h in m.history[2:]] == [0, 1, 2]
    assert m.epoch_cap == 3 and m.stopped == "epochs" and m.best_epoch in (0, 1, 2)
    assert {"grounding", "planning", "training"} <= set(m.timings)


def test_a_refit_keeps_the_selection_record():
    m = model(customers(150))
    m.fit(epochs=40, lr=0.1, patience=3, hybrid=False, time_budget=None, refit=True)
    assert m.stopped.startswith("early") and m.refit["epochs"] == m.best_epoch + 1 < len(m.history) < 40
    assert m.epoch_cap == 40 and m.monitor == "val_loss"  # the selection run's (the refit: best_epoch + 1, no validation)
    assert m.history[-1]["epoch"] == len(m.history) - 1  # its history, not the refit's
