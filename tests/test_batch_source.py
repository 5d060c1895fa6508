"""The batch source (relsql/train/feed/source.py): the chunks of an epoch in order, each batch prepared
ahead equal to one prepared on the spot, and no background thread left however the consumer stops."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

import relsql
from relsql.train.feed.batched import Batched
from relsql.train.feed.batches import batches
from relsql.train.feed.source import BatchSource, Whole
from relsql.train.loop.options import FitConfig
from relsql.train.loop.trainer import OneProcess, Trainer
from tests.test_trainer import TEMPLATE, customers


@pytest.fixture(scope="module")
def learner():
    """A mini-batch model whose batches sample at most 2 orders per customer (so the sample number matters)."""
    m = relsql.Model(customers(), relsql.Template.from_sql(TEMPLATE), "customer.churned", seed=3, dtype=torch.float64,
                     progress=False, batch_size=40, fanout={"predict": 2})
    return m.learner


def db_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("relsql-db")}


def chunks_of(learner, epoch: int) -> list[np.ndarray]:
    order = batches(learner.rows["train"], 40, np.random.default_rng([learner.seed, epoch]))
    return [learner.labelled[c] for c in order]


def outputs(learner, batch) -> torch.Tensor:
    with torch.no_grad():
        return Batched.outputs(learner.net, learner.head, batch, {}, learner.output)


def test_an_epoch_yields_every_chunk_once_in_order(learner):
    chunks = chunks_of(learner, 0)
    with BatchSource(learner.batched) as source:
        seen = [(b, batch.rids.tolist()) for b, batch, _ in source.epoch(chunks, 0)]
        assert [b for b, _ in seen] == list(range(len(chunks)))
        assert [r for _, r in seen] == [c.tolist() for c in chunks]
        assert sorted(r for _, rids in seen for r in rids) == sorted(learner.labelled[learner.rows["train"]].tolist())
        resumed = [b for b, _, _ in source.epoch(chunks, 0, first=2)]  # a resumed epoch starts at its batch
        assert resumed == list(range(2, len(chunks)))


def test_a_prefetched_batch_equals_one_prepared_on_the_spot(learner):
    chunks, sample = chunks_of(learner, 1), 1
    with BatchSource(learner.batched) as source:
        for b, batch, _ in source.epoch(chunks, sample):
            fresh = learner.batched.prepare(chunks[b], sample)
            assert np.array_equal(batch.rids, fresh.rids) and torch.equal(batch.rows, fresh.rows)
            assert torch.equal(outputs(learner, batch), outputs(learner, fresh)), b
    other = [learner.batched.prepare(c, 0) for c in chunks]  # another sample draws other orders
    with BatchSource(learner.batched) as source:
        differs = [not torch.equal(outputs(learner, batch), outputs(learner, o))
                   for (_, batch, _), o in zip(source.epoch(chunks, sample), other)]
    assert any(differs)  # so the equality above says the source prepared the sample it was given


def test_full_batch_yields_the_whole_relation_per_chunk():
    before = db_threads()
    source = BatchSource(None)
    chunks = [np.array([3, 1]), np.array([2])]
    got = list(source.epoch(chunks))
    assert [b for b, _, _ in got] == [0, 1] and all(isinstance(w, Whole) and e == {} for _, w, e in got)
    assert [w.rids.tolist() for _, w, _ in got] == [[3, 1], [2]]
    assert source.full and db_threads() == before  # no worker thread is made for the full batch
    source.close()


class Stop(Exception):
    pass


def test_no_thread_is_left_when_the_consumer_breaks_or_raises(learner, monkeypatch):
    monkeypatch.setenv("RELSQL_BATCH_PROCESS", "0")  # batches prepared in the worker thread
    before = db_threads()
    chunks = chunks_of(learner, 0)
    with BatchSource(learner.batched) as source:
        for b, _, _ in source.epoch(chunks):
            assert db_threads() - before  # the prefetching thread runs
            if b == 1:
                break  # batch 2 was being prepared
    assert not db_threads() - before
    with pytest.raises(Stop):
        with BatchSource(learner.batched) as source:
            for _ in source.epoch(chunks):
                raise Stop
    assert not db_threads() - before
    source = BatchSource(learner.batched)
    list(source.epoch(chunks[:2]))
    assert db_threads() - before  # without close, the worker waits for more: close is what ends it
    source.close()
    assert not db_threads() - before


def test_no_thread_is_left_when_training_or_predicting_stops(learner):
    before = db_threads()

    def interrupt(info):
        if info["batch"] == 1:
            raise Stop

    trainer = Trainer(learner, OneProcess(), FitConfig(epochs=2, batch_size=40, lr=0.01, patience=10, callback=interrupt))
    with pytest.raises(relsql.RelsqlError, match="raised Stop"):
        trainer.fit(batched=True)
    assert not db_threads() - before
    learner.outputs_of(learner.labelled[:90])
    assert not db_threads() - before
