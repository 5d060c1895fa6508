"""Batches prepared in a forked child process (relsql/train/feed/batch_process.py): the same batches
and the same training as in the database worker thread, errors and a dead child reported as
RelsqlErrors, and no child left however the consumer stops."""

from __future__ import annotations

import gc
import multiprocessing
import os
import signal

import numpy as np
import pytest
import torch

import relsql
from relsql.compile.reuse import plans_equal
from relsql.train.feed import batch_process
from relsql.train.feed.batch_process import _decode, _encode
from relsql.train.feed.source import BatchSource
from tests.test_batch_source import chunks_of, outputs
from tests.test_trainer import TEMPLATE, customers


def model(**settings) -> relsql.Model:
    return relsql.Model(customers(), relsql.Template.from_sql(TEMPLATE), "customer.churned", seed=3, dtype=torch.float64,
                        progress=False, batch_size=40, fanout={"predict": 2}, **settings)


@pytest.fixture(autouse=True)
def one_torch_thread():
    """fit's default on two cores (half of them): a core left for the child, so it forks (batch_process.usable)."""
    from relsql.train.learner.threads import torch_threads

    with torch_threads(1):
        yield


@pytest.fixture(scope="module")
def learner():
    return model().learner


def children() -> set[int]:
    return {p.pid for p in multiprocessing.active_children() if p.name == "relsql-batches"}


def test_one_process_training_from_a_store_prepares_in_a_child(learner, monkeypatch):
    from relsql.train.learner.threads import torch_threads

    with torch_threads(os.cpu_count()):  # torch on every core: the child would take one of its threads' cores
        assert not batch_process.usable(learner.batched)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)  # fit's default on two cores: half of them
    assert batch_process.usable(learner.batched)  # this machine has two cores and fork
    monkeypatch.setenv("RELSQL_BATCH_PROCESS", "0")
    assert not batch_process.usable(learner.batched)
    monkeypatch.delenv("RELSQL_BATCH_PROCESS")
    monkeypatch.setenv("RELSQL_RANK", "1")  # a training rank is a process already
    assert not batch_process.usable(learner.batched)
    monkeypatch.delenv("RELSQL_RANK")
    assert not batch_process.usable(model(store=False).learner.batched)  # grounded in the database: the thread
    with BatchSource(learner.batched) as source:  # prediction's source: the thread, whose recorded plans stay
        assert len(list(source.epoch(chunks_of(learner, 0)))) > 1 and source.process is None


def test_a_batch_from_the_child_equals_one_prepared_here(learner):
    chunks, sample = chunks_of(learner, 1), 1
    with BatchSource(learner.batched, fork=True) as source:
        got = list(source.epoch(chunks, sample))
        assert source.process is not None and source.process.process.pid != os.getpid()
        assert len(source.process.frames) >= 1  # plans came as frames filled with a batch's tensors
    for b, batch, _ in got:
        here = learner.batched.prepare(chunks[b], sample)
        assert batch.grounding is None and np.array_equal(batch.rids, here.rids) and torch.equal(batch.rows, here.rows)
        assert plans_equal(batch.plan, here.plan), b
        assert torch.equal(outputs(learner, batch), outputs(learner, here)), b


def test_training_is_the_same_in_the_child_and_in_the_thread(monkeypatch):
    def trained():
        m = model()
        m.fit(epochs=3, lr=0.05)
        return [h["train_loss"] for h in m.history], {n: p.detach().clone() for n, p in m.learner.weights_by_name().items()}

    losses, weights = trained()
    monkeypatch.setenv("RELSQL_BATCH_PROCESS", "0")
    thread_losses, thread_weights = trained()
    assert losses == thread_losses and len(losses) == 3
    assert weights.keys() == thread_weights.keys() and all(torch.equal(weights[n], thread_weights[n]) for n in weights)


def test_no_child_is_left_when_the_consumer_breaks_raises_or_closes(learner):
    before = children()
    chunks = chunks_of(learner, 0)
    with BatchSource(learner.batched, fork=True) as source:
        for b, _, _ in source.epoch(chunks):
            assert children() - before  # the child runs
            assert gc.get_freeze_count() > 0  # this process's objects are out of the collector's way meanwhile
            if b == 1:
                break  # batch 2 was being prepared
        # an epoch abandoned mid-way leaves a reply in the pipe: the next epoch skips it
        again = [batch.rids.tolist() for _, batch, _ in source.epoch(chunks)]
        assert again == [c.tolist() for c in chunks]
    assert not children() - before and gc.get_freeze_count() == 0  # and back in its care
    with pytest.raises(ZeroDivisionError):
        with BatchSource(learner.batched, fork=True) as source:
            for _ in source.epoch(chunks):
                raise ZeroDivisionError
    assert not children() - before


def test_an_error_in_the_child_reaches_the_trainer(learner, monkeypatch):
    def damaged(rids, sample=0):
        raise relsql.RelsqlError(f"grounding store: batch of {len(rids)} rows is damaged")

    monkeypatch.setattr(learner.batched.grounding_store, "ground", damaged)  # the child forks with it
    monkeypatch.setattr(learner.batched, "kept", type(learner.batched.kept)())  # not the batches earlier tests kept
    with BatchSource(learner.batched, fork=True) as source:
        with pytest.raises(relsql.RelsqlError, match="batch of 40 rows is damaged"):
            list(source.epoch(chunks_of(learner, 0)))
        assert source.process is not None and source.process.process.is_alive()  # it goes on serving


def test_a_killed_child_is_a_relsql_error_not_a_hang(learner):
    chunks = chunks_of(learner, 0)
    with BatchSource(learner.batched, fork=True) as source:
        stream = source.epoch(chunks)
        next(stream)
        os.kill(source.process.process.pid, signal.SIGKILL)
        source.process.process.join(10)
        with pytest.raises(relsql.RelsqlError, match="RELSQL_BATCH_PROCESS=0"):
            list(stream)


def test_a_stopped_child_is_a_relsql_error_not_a_hang(learner, monkeypatch):
    """A child stopped by SIGSTOP never answers nor dies: the trainer names it and the way out
    instead of waiting forever, and closing the source still ends the child."""
    monkeypatch.setattr(batch_process, "STOPPED_LIMIT", 2.0)
    chunks = chunks_of(learner, 0)
    with BatchSource(learner.batched, fork=True) as source:
        stream = source.epoch(chunks)
        next(stream)
        child = source.process.process
        os.kill(child.pid, signal.SIGSTOP)
        with pytest.raises(relsql.RelsqlError, match=f"stopped by a signal.*kill -CONT {child.pid}"):
            list(stream)
    child.join(10)
    assert not child.is_alive()


def test_messages_keep_arrays_writable_and_aligned():
    arrays = [np.arange(5, dtype=np.int64), np.ones((3, 2), dtype=np.float32), np.zeros(0, dtype=np.int64)]
    message = ("batch", 7, arrays, {"s": torch.arange(4)})
    got = _decode(_encode(message))
    assert got[:2] == ("batch", 7) and torch.equal(got[3]["s"], torch.arange(4))
    for sent, back in zip(arrays, got[2]):
        assert np.array_equal(sent, back) and back.dtype == sent.dtype and back.flags.writeable
        assert back.ctypes.data % 64 == 0 or back.size == 0
