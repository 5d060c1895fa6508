"""Batch plans reused across batches (relsql/compile/reuse.py): every batch's outputs and gradients
with the replayed plan equal those of a plan made afresh for that batch, unpadded, with no reuse."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import relsql
from relsql.compile import make_plan
from relsql.compile.reuse import bucket, pad
from relsql.train.feed.batched import PASSES

ROOT = Path(__file__).resolve().parent.parent

SHOP = """
CREATE TABLE user_h AS SELECT u.user_id, tanh(linear(features(u.age), 4, 'wu')) AS h FROM users u;
CREATE TABLE item_h AS SELECT i.user_id, avg(relu(linear(features(i.x), 4, 'wi') + embed(i.kind, 4, 'kind'))) AS h
FROM item i GROUP BY i.user_id;
CREATE TABLE pred AS
SELECT i.id, linear(tanh({embed} + linear(features(i.x), 4, 'wx') + linear(uh.h, 4, 'wuh') + linear(ih.h, 4, 'wih')),
                    1, 'out') AS h
FROM item i JOIN user_h uh ON uh.user_id = i.user_id JOIN item_h ih ON ih.user_id = i.user_id;
"""


def shop_db() -> relsql.Database:
    """2,000 items of 300 users, a user's items averaged (a grouped rule with uneven counts)."""
    db = relsql.connect()
    db.execute("CREATE TABLE users AS SELECT i AS user_id, (i % 50) * 1.0 AS age FROM range(300) t(i)")
    db.execute("CREATE TABLE item AS SELECT i AS id, (i * 7919) % 300 AS user_id, (i % 13) * 0.1 AS x, "
               "'k' || (i % 5) AS kind, ((i * 7919) % 300) % 3 = 0 AS y FROM range(2000) t(i)")
    return db


def quiet(fn, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args, **kwargs)


def run(model, plan, grounding, rids: np.ndarray, external: dict[str, torch.Tensor]):
    """The plan's values of the batch's output rows and the gradients of a fixed function of them
    (every weight, stored embeddings included)."""
    net, output = model.net, model.batched.output
    external = {k: v.detach().clone().requires_grad_(True) for k, v in external.items()}
    value = net.run(plan, external)[output]
    rows = torch.searchsorted(grounding.rows[output], torch.from_numpy(np.asarray(rids, dtype=np.int64)))
    picked = value.reshape(value.shape[0], -1).index_select(0, rows)
    projection = torch.linspace(-1.0, 2.0, picked.numel(), dtype=picked.dtype).reshape(picked.shape)
    leaves = [w for w in net.weights_by_name().values() if w.requires_grad] + list(external.values())
    grads = torch.autograd.grad((torch.tanh(picked) * projection).sum(), leaves, allow_unused=True)
    return picked.detach(), [g if g is not None else torch.zeros_like(w) for g, w in zip(grads, leaves)]


def check_batches(model, batches: list[np.ndarray], samples: list[int]) -> dict:
    """Each batch prepared through the plan cache vs planned afresh: equal outputs and gradients."""
    batched = model.batched
    for rids, sample in zip(batches, samples):
        batch = batched.prepare(rids, sample)
        external = batched.fetch(batch)
        fresh = make_plan(batched.template, batch.grounding, batched.dtype, PASSES, outputs=[batched.output])
        got, got_grads = run(model, batch.plan, batch.grounding, rids, external)
        want, want_grads = run(model, fresh, batch.grounding, rids, external)
        assert got.shape == want.shape and got.shape[0] == len(rids)
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
        for g, w in zip(got_grads, want_grads):
            torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)
    return batched.plans.stats


def random_batches(n: int, sizes: list[int], count: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [np.sort(rng.choice(n, size=sizes[i % len(sizes)], replace=False)) for i in range(count)]


def test_replayed_plans_equal_fresh_ones_on_mutagenesis_with_fanout(molecules):
    model = quiet(relsql.Model, molecules, relsql.sql_templates.path("mutagenesis"), target="molecule.mutagenic", seed=0,
                  dtype=torch.float64, progress=False, batch_size=16, fanout=3)
    n = model.output_rows
    batches = random_batches(n, [16, 16, 16, 13, 7, 16], 36, seed=1)
    stats = check_batches(model, batches, [i % 3 for i in range(len(batches))])
    assert stats["replayed"] >= 10, stats  # the shapes repeat: most batches replay a recorded plan


def test_replayed_plans_equal_fresh_ones_with_stored_embeddings_and_uneven_groups():
    db = shop_db()
    tpl = relsql.Template.from_sql(SHOP.format(embed="embed(i.user_id, 4, 'user', storage='database')"))
    model = quiet(relsql.Model, db, tpl, target="item.y", seed=0, dtype=torch.float64, progress=False, batch_size=64)
    batches = random_batches(model.output_rows, [64, 64, 50, 64, 3], 40, seed=2)
    stats = check_batches(model, batches, [0] * len(batches))
    assert stats["replayed"] >= 5, stats


def test_pad_keeps_the_real_rows_and_buckets_the_sizes(molecules):
    model = quiet(relsql.Model, molecules, relsql.sql_templates.path("mutagenesis"), target="molecule.mutagenic", seed=0,
                  dtype=torch.float64, progress=False, batch_size=16)
    grounding = model.batched.source.ground(np.arange(10))
    padded, _ = pad(grounding)
    for name, relation in grounding.relations.items():
        big = padded.relations[name]
        assert big.size == bucket(big.size) and big.size >= relation.size + (1 if relation.rules else 0)
        for real, rule in zip(relation.rules, big.rules):
            g, s = real.size, real.segment_heads.shape[0]
            assert torch.equal(rule.head[:g], real.head) and torch.equal(rule.offsets[: s + 1], real.offsets)
            assert bool((rule.head[g:] >= relation.size).all())  # pad groundings feed only pad rows
            assert bool((rule.offsets.diff() > 0).all())  # no empty segment (an average of nothing)


@pytest.mark.parametrize(("n", "expected"), [(0, 0), (5, 5), (9, 9), (17, 18), (512, 512), (513, 576), (1944, 2048)])
def test_bucket_sizes(n, expected):
    assert bucket(n) == expected
