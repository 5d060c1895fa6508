"""The training loop's callbacks (relsql/train/loop/callbacks.py) and its record (relsql/train/learner/record.py):
a callback that asks to stop ends training where an epoch budget would have (same weights, same
history), and the record says why; a user's Callback given as fit's `callback=` (no __call__
needed) or in `callbacks=[...]` runs its hooks after fit's own, in order; what is not a Callback is
refused before anything trains; a tracker logs each epoch as it ends; a second fit continues the
record; a refit keeps the selection's record; the learner keeps its record in one place
(`learner.record`, no copies of its fields)."""

from __future__ import annotations

import numpy as np
import pytest

import relsql
from relsql.train.learner.record import FitRecord
from relsql.train.loop.callbacks import Callback
from relsql.train.loop.options import FitConfig
from relsql.train.loop.tracking import Tracker
from relsql.train.loop.trainer import OneProcess, Trainer
from tests.test_trainer import assert_same_weights, customers, model, weights

REASON = "asked (epoch 3)"


class StopAt(Callback):
    """Stops after epoch `last` (0-based) and notes what each hook saw."""

    def __init__(self, last: int):
        self.last, self.seen, self.ended = last, [], None

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
    kept = m.best_epoch + 1
    assert m.stopped.startswith("early") and m.refit["epochs"] == -(-kept // 2) and kept < len(m.history) < 40
    assert m.refit["kept_epochs"] == kept  # it went on from the selected weights, for half their epochs
    assert m.epoch_cap == 40 and m.monitor == "val_loss"  # the selection run's (the refit: no validation)
    assert m.history[-1]["epoch"] == len(m.history) - 1  # its history, not the refit's


class Watch(Callback):
    """Notes every hook it hears in `log` (shared between callbacks, to see their order), and asks
    to stop after epoch `last` (None: never)."""

    def __init__(self, name: str, log: list, last: int | None = None):
        self.name, self.log, self.last = name, log, last
        self.epochs: list[tuple[int, dict]] = []

    def on_fit_start(self, trainer) -> None:
        self.log.append((self.name, "start"))

    def on_batch_end(self, trainer, step: dict) -> None:
        self.log.append((self.name, "batch", step["epoch"], step["batch"]))

    def on_epoch_end(self, trainer, epoch: int, record: dict) -> str | None:
        self.log.append((self.name, "epoch", epoch))
        self.epochs.append((epoch, dict(record)))
        return f"{self.name} asked" if epoch == self.last else None

    def on_fit_end(self, trainer, last: int | None) -> None:
        self.log.append((self.name, "end", last))


def test_fit_callbacks_see_every_epoch_in_order_after_callback():
    m = model(customers(60))
    log: list = []
    first, second, given = Watch("first", log), Watch("second", log), Watch("given", log)
    m.fit(epochs=4, patience=1000, hybrid=False, time_budget=None, callback=given, callbacks=[first, second])
    assert len(m.history) == 4 and m.stopped == "epochs"
    for watch in (first, second, given):  # every epoch, in order, each record as the model keeps it
        assert [e for e, _ in watch.epochs] == [0, 1, 2, 3]
        assert [r for _, r in watch.epochs] == m.history
    # full batch: one step an epoch; each hook runs callback= first, then callbacks= in the list's order
    order = ["given", "first", "second"]
    expected = [(n, "start") for n in order]
    for epoch in range(4):
        expected += [(n, "batch", epoch, 0) for n in order] + [(n, "epoch", epoch) for n in order]
    expected += [(n, "end", 3) for n in order]
    assert log == expected


def test_fit_callbacks_stop_training_and_the_first_reason_is_the_records():
    db = customers(60)
    stopped, budget = model(db), model(db)
    log: list = []
    late, early = Watch("late", log, last=3), Watch("early", log, last=1)
    also = Watch("also", log, last=1)  # asks at the same epoch as `early`, after it: `early`'s reason is kept
    stopped.fit(epochs=10, patience=1000, hybrid=False, time_budget=None, callbacks=[late, early, also])
    budget.fit(epochs=2, patience=1000, hybrid=False, time_budget=None)
    assert stopped.stopped == "early asked" and stopped.learner.record.stopped == "early asked"
    assert len(stopped.history) == 2 and stopped.epoch_cap == 10
    assert [h["val_loss"] for h in stopped.history] == [h["val_loss"] for h in budget.history]
    assert stopped.best_epoch == budget.best_epoch
    assert log[-3:] == [("late", "end", 1), ("early", "end", 1), ("also", "end", 1)]


@pytest.mark.parametrize("given, match", [
    ([lambda step: None], r"callbacks\[0\] must be a relsql.Callback instance, got function: a function of each step "
                          "goes to callback="),
    ([StopAt], r"callbacks\[0\] must be a relsql.Callback instance, got type: pass an instance, callbacks=\[StopAt"),
    ([StopAt(1), "early"], r"callbacks\[1\] must be a relsql.Callback instance, got str: subclass relsql.Callback"),
    (StopAt(1), "callbacks must be a list of relsql.Callback objects"),
    ("early", "callbacks must be a list of relsql.Callback objects"),
])
def test_what_is_not_a_list_of_callbacks_is_refused_before_training(given, match):
    m = model(customers(40))
    before = weights(m)
    with pytest.raises(relsql.RelsqlError, match=match):
        m.fit(epochs=2, hybrid=False, callbacks=given)
    assert m.history == [] and m.best_epoch is None
    assert_same_weights(weights(m), before)


def test_callback_takes_a_function_or_a_callback_and_refuses_the_rest():
    m = model(customers(40))
    steps: list = []
    m.fit(epochs=2, hybrid=False, time_budget=None, callback=steps.append)
    assert [(s["epoch"], s["batch"]) for s in steps] == [(0, 0), (1, 0)]
    with pytest.raises(relsql.RelsqlError, match="callback must be a function of one dict .* or a relsql.Callback, got int"):
        m.fit(epochs=2, hybrid=False, callback=42)
    assert relsql.Callback is Callback and "Callback" in relsql.__all__


def test_the_learner_keeps_its_record_in_one_place():
    """The learner's old pass-through attributes are gone: its record is `learner.record`."""
    from relsql.train.learner.learner import Learner

    for name in ("history", "best_epoch", "stopped", "monitor", "epoch_cap", "time_budget", "timings"):
        assert not hasattr(Learner, name), name
    m = model(customers(40))
    assert {"grounding", "planning"} <= set(m.learner.record.timings) and m.timings is m.learner.record.timings


def test_ranks_take_no_callbacks():
    """fit(workers=2) refuses callbacks= as it refuses callback= (the steps would run elsewhere), before any rank starts."""
    m = model(customers(40), batch_size=10)
    with pytest.raises(relsql.RelsqlError, match="takes no callback nor callbacks"):
        m.fit(epochs=1, hybrid=False, workers=2, callbacks=[Watch("w", [])])
    assert m.history == []
