"""Batch shapes with headroom (relsql/train/feed/shapes.py): shuffled batches of one size stop making new
plans after the first epochs, and every replayed batch still equals a plan made afresh for it."""

from __future__ import annotations

import numpy as np
import torch

import relsql
from relsql.compile import make_plan
from relsql.compile.reuse import fits, needs, shape_for, volume
from relsql.train.feed.batched import PASSES
from relsql.train.feed.shapes import HEADROOM, _grown
from tests.test_plan_reuse import SHOP, quiet, run, shop_db


def skewed_db() -> relsql.Database:
    """2,000 items of 300 users, most items on a few users: a batch's closure (its users' every
    item) varies much from batch to batch."""
    db = relsql.connect()
    db.execute("CREATE TABLE users AS SELECT i AS user_id, (i % 50) * 1.0 AS age FROM range(300) t(i)")
    db.execute("CREATE TABLE item AS SELECT i AS id, CAST(floor(300 * pow(((i * 7919) % 2000) / 2000.0, 3)) AS BIGINT) "
               "AS user_id, (i % 13) * 0.1 AS x, 'k' || (i % 5) AS kind, i % 3 = 0 AS y FROM range(2000) t(i)")
    return db


def shop_model(batch_size: int, db: relsql.Database | None = None) -> relsql.Model:
    tpl = relsql.Template.from_sql(SHOP.format(embed="embed(i.kind, 4, 'kind2')"))
    return quiet(relsql.Model, db or shop_db(), tpl, target="item.y", seed=0, dtype=torch.float64, progress=False,
                 batch_size=batch_size)


def epochs(n: int, size: int, count: int, seed: int) -> list[list[np.ndarray]]:
    """`count` epochs of shuffled batches of `size` rows out of n, the last one short (as fit cuts them)."""
    rng = np.random.default_rng(seed)
    found = []
    for _ in range(count):
        order = rng.permutation(n)
        found.append([np.sort(order[i:i + size]) for i in range(0, n, size)])
    return found


def test_grown_shapes_fit_their_batch_and_pad_relations_of_equal_rows_alike():
    model = shop_model(64)
    for rids in epochs(model.output_rows, 64, 2, seed=3)[0]:
        need = needs(model.batched.source.ground(rids))
        shape = shape_for(_grown(need, HEADROOM))
        assert fits(need, shape)
        assert volume(shape) >= volume(shape_for(need)) * 0.99  # headroom: never smaller than the batch's own
        sizes: dict[int, set[int]] = {}
        for (_, n, _), (_, size, _) in zip(need[0], shape[0]):
            assert size > n  # every relation with rows keeps a pad row
            sizes.setdefault(n, set()).add(size)
        assert all(len(found) == 1 for found in sizes.values()), sizes


def test_shuffled_epochs_stop_recording_and_replays_equal_fresh_plans():
    model = shop_model(150)
    batched = model.batched
    recorded = []
    for e, epoch in enumerate(epochs(model.output_rows, 150, 5, seed=5)):
        for b, rids in enumerate(epoch):
            batch = batched.prepare(rids)
            if e % 3 == 1 and b in (0, 1, len(epoch) - 1):  # replays (the short batch too) against a plan made afresh
                external = batched.fetch(batch)
                fresh = make_plan(batched.template, batch.grounding, batched.dtype, PASSES, outputs=[batched.output])
                got, got_grads = run(model, batch.plan, batch.grounding, rids, external)
                want, want_grads = run(model, fresh, batch.grounding, rids, external)
                assert got.shape[0] == len(rids)
                torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
                for g, w in zip(got_grads, want_grads):
                    torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)
        recorded.append(batched.plans.stats["recorded"])
    # 2,000 items in 14 batches an epoch: shapes and variants recorded early, none in the last half
    assert recorded[-1] == recorded[len(recorded) // 2 - 1], recorded
    assert batched.plans.stats["replayed"] > 10 * recorded[-1], batched.plans.stats
    assert batched.plans.stats["fresh"] <= recorded[-1]  # a fresh plan only to check each recorded one once


def test_a_batch_a_little_larger_than_any_recorded_replays_the_grown_shape():
    model = shop_model(150)
    batched, rng = model.batched, np.random.default_rng(7)
    order = rng.permutation(model.output_rows)
    first = np.sort(order[:150])
    need = needs(batched.source.ground(first))
    own = shape_for(need)
    for extra in range(1, 40):  # the first batch plus rows, until it no longer fits the first one's own bucketed shape
        second = np.sort(order[:150 + extra])
        larger = needs(batched.source.ground(second))
        if not fits(larger, own):
            break
    assert not fits(larger, own)  # without headroom, this batch would need a plan of its own
    stats = batched.plans.stats
    batched.prepare(first)
    recorded, replayed = stats["recorded"], stats["replayed"]
    batch = batched.prepare(second)
    assert stats["recorded"] == recorded and stats["replayed"] == replayed + 1, stats
    external = batched.fetch(batch)
    fresh = make_plan(batched.template, batch.grounding, batched.dtype, PASSES, outputs=[batched.output])
    got, _ = run(model, batch.plan, batch.grounding, second, external)
    want, _ = run(model, fresh, batch.grounding, second, external)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_an_unshuffled_loaders_batches_are_prepared_once_and_equal_the_full_batch(monkeypatch):
    monkeypatch.setenv("RELSQL_BATCH_PROCESS", "0")  # batches prepared in this process, where the store reads are counted
    model = shop_model(150)
    store = model.batched.grounding_store
    reads = []
    ground = store.ground
    monkeypatch.setattr(store, "ground", lambda rids, sample=0: reads.append(len(rids)) or ground(rids, sample))
    with relsql.Loader(model, split="train", batch_size=150, shuffle=False) as loader, \
            relsql.Loader(model, split="train", batch_size=None, shuffle=False) as whole:
        full = {}
        with torch.no_grad():
            for batch in whole:
                full.update(zip(batch.rows.tolist(), batch.outputs()))
        epochs = []
        for _ in range(2):
            outs = {}
            with torch.no_grad():
                for batch in loader:
                    outs.update(zip(batch.rows.tolist(), batch.outputs()))
            epochs.append((outs, len(reads)))
    (first, read_first), (second, read_second) = epochs
    assert read_first == len(loader) and read_second == read_first  # the second epoch read nothing from the store
    assert sorted(first) == sorted(second) == sorted(full)
    for row, value in full.items():
        torch.testing.assert_close(first[row], value, rtol=1e-9, atol=1e-9)
        torch.testing.assert_close(second[row], value, rtol=1e-9, atol=1e-9)
