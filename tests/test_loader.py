"""relsql.train.model.loader.Loader: the documented ten-line torch loop takes fit's steps (per-step losses
and the kept epoch's weights to 1e-6), in full batch and in mini-batches, and its batches are the
rows fit would use."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import relsql
from relsql.train.model.loader import Loader
from tests.test_trainer import customers, model, weights

EPOCHS, LR = 5, 0.02


def fit_steps(batch_size: int | None) -> tuple[list[float], relsql.Model]:
    trained = model(customers(), batch_size=batch_size)
    losses: list[float] = []
    trained.fit(epochs=EPOCHS, batch_size=batch_size, lr=LR, patience=1000, schedule=None, clip=None, hybrid=False, refit=False,
                time_budget=None, monitor="loss", callback=lambda info: losses.append(info["loss"]))
    return losses, trained


def own_loop(m: relsql.Model, batch_size: int | None) -> tuple[list[float], list[dict]]:
    """The loop of relsql/train/model/loader.py's docstring, recording each step's loss and each epoch's weights."""
    losses, after = [], []
    loader = Loader(m, batch_size=batch_size)
    optimizer = torch.optim.AdamW(loader.parameters(), lr=LR, weight_decay=0.0)
    loader.optimizer = optimizer
    for _ in range(EPOCHS):
        for batch in loader:
            optimizer.zero_grad()
            loss = batch.loss()
            loss.backward()
            optimizer.step()
            losses.append(float(loss.detach()))
        after.append(weights(m))
    return losses, after


@pytest.mark.parametrize("batch_size", [None, 40], ids=["full_batch", "mini_batches"])
def test_a_plain_torch_loop_over_the_loader_takes_fits_steps(batch_size):
    expected, trained = fit_steps(batch_size)
    mine = model(customers(), batch_size=batch_size)
    losses, after = own_loop(mine, batch_size)
    assert len(losses) == len(expected) == EPOCHS * (1 if batch_size is None else -(-len(mine.rows["train"]) // batch_size))
    assert losses == pytest.approx(expected, abs=1e-6, rel=0)
    kept = after[trained.best_epoch]
    for name, value in weights(trained).items():
        assert torch.allclose(value, kept[name], atol=1e-6, rtol=0), name
    assert losses[-1] < losses[0]


def test_batches_cover_the_split_in_fits_seeded_order():
    m = model(customers(), batch_size=32)
    loader = Loader(m, batch_size=32)
    seen = [batch.rows for batch in loader]
    train = m.rows["train"]
    assert np.array_equal(np.concatenate(seen), train[np.random.default_rng([m.seed, 0]).permutation(len(train))])
    assert loader.epoch == 1 and len(loader) == -(-len(train) // 32)
    second = np.concatenate([batch.rows for batch in loader])
    assert np.array_equal(second, train[np.random.default_rng([m.seed, 1]).permutation(len(train))])
    val = list(Loader(m, split="val", batch_size=1000))
    assert len(val) == 1 and np.array_equal(val[0].rows, m.rows["val"])
    assert np.array_equal(val[0].keys, m.labelled[m.rows["val"]])
    with torch.no_grad():
        assert val[0].outputs().shape == (len(m.rows["val"]), m.task.units)


def test_bad_arguments_are_refused():
    m = model(customers(60))
    with pytest.raises(relsql.RelsqlError, match="split must be"):
        Loader(m, split="validation")
    with pytest.raises(relsql.RelsqlError, match="batch_size"):
        Loader(m, batch_size=0)
    with pytest.raises(relsql.RelsqlError, match="Loader takes"):
        Loader(object())


def test_database_stored_embeddings_are_updated_between_batches_as_fit_updates_them():
    from tests.test_store_safety import TEMPLATE as STORED
    from tests.test_store_safety import world

    def build() -> relsql.Model:
        return relsql.Model(world(600), relsql.Template.from_sql(STORED), "item.y", dtype=torch.float64, progress=False,
                            batch_size=150, seed=1)

    expected = []
    fitted = build()
    fitted.fit(epochs=3, batch_size=150, lr=LR, patience=1000, schedule=None, clip=None, hybrid=False, refit=False,
               time_budget=None, monitor="loss", callback=lambda info: expected.append(info["loss"]))
    m = build()
    loader = Loader(m)
    optimizer = torch.optim.AdamW(loader.parameters(), lr=LR, weight_decay=0.0)
    loader.optimizer = optimizer
    losses = []
    for _ in range(3):
        for batch in loader:
            optimizer.zero_grad()
            loss = batch.loss()
            loss.backward()
            optimizer.step()
            losses.append(float(loss.detach()))
    assert len(losses) == len(expected) == 3 * 3
    assert losses == pytest.approx(expected, abs=1e-6, rel=0)


def test_the_batch_process_serves_every_epoch_and_close_ends_it():
    """Forking per epoch cost ~0.5 s an epoch on a 25k-row shop: the loader keeps one process for
    all its epochs (the one fit keeps too), an abandoned epoch included, and close() ends it."""
    import multiprocessing

    def batch_children() -> set[int]:
        return {p.pid for p in multiprocessing.active_children() if p.name == "relsql-batches"}

    from relsql.train.learner.threads import torch_threads

    m = model(customers(), batch_size=32)
    before = batch_children()
    with torch_threads(1), Loader(m, batch_size=32) as loader:  # a core left for the child (batch_process.usable)
        first = [batch.rows for batch in loader]
        started = batch_children() - before
        assert len(started) == 1  # this machine has two cores and fork (tests/test_batch_process.py)
        for _ in loader:  # an epoch left early
            break
        again = [batch.rows for batch in loader]
        assert batch_children() - before == started
    assert len(first) == len(again) > 1 and loader.epoch == 3
    assert np.array_equal(np.concatenate(again),
                          m.rows["train"][np.random.default_rng([m.seed, 2]).permutation(len(m.rows["train"]))])
    assert not batch_children() - before
