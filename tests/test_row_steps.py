"""Steps of the whole net, each with the loss on a seeded share of the training rows
(relsql/train/loop/options.py `_steps`): `fit(steps_per_epoch=K)` for a full-batch label model, and
ROW_STEPS by default where an automatic template's network is fitted alone (one step in the blend and for
hand-written templates, as before). Checked
against a plain torch loop of the same steps, with the validation forward reused by the next epoch's
first step only (the later steps run the net again), and `steps_per_epoch=` checked like any argument."""

from __future__ import annotations

import duckdb
import pytest
import torch

import relsql
from demos.synthetic import build
from relsql.train.learner.defaults import ROW_STEPS
from relsql.train.loop.options import FitConfig
from relsql.train.loop.trainer import OneProcess, Trainer
from tests.test_trainer import assert_same_weights, closed_form_rate, customers, fit_as_model, model, scheduled_reference, weights

ARGS = dict(epochs=5, lr=0.05, patience=1000, overfit=False, weight_decay=0.1, schedule="cosine", warmup=0.1,
            clip=0.05, monitor="loss", time_budget=None, loss=None, class_weight=None, negatives=None,
            hard_negatives=None, refit=False, hybrid=False, checkpoint=None, resume=False, checkpoint_every=None,
            callback=None, callbacks=None, workers=1)


def checked(m: relsql.Model, **given) -> FitConfig:
    return FitConfig.checked(m.learner, **{**ARGS, "batch_size": None, **given})


def test_steps_of_a_share_of_the_training_rows_by_default_for_an_automatic_network_alone(tmp_path):
    path = tmp_path / "shop.duckdb"
    con = duckdb.connect(str(path))
    build(con, customers=300, products=30, seed=3)
    con.close()
    db = relsql.connect(str(path))
    auto = relsql.Model(db, relsql.Template.auto(db, target="customer.churned", hops=1), target="customer.churned",
                        seed=0, progress=False)
    rows = len(auto.rows["train"])
    config = checked(auto)  # ARGS: hybrid=False
    assert ROW_STEPS == 4 and config.whole_net and config.batch_size == -(-rows // ROW_STEPS)
    for hybrid in (None, True):  # the blend (the automatic template's default): one step, as before
        blended = checked(auto, hybrid=hybrid)
        assert blended.hybrid and blended.batch_size is None and not blended.whole_net
    calls = []
    auto.fit(epochs=2, hybrid=False, refit=False, callback=calls.append)
    assert len(calls) == 2 * ROW_STEPS
    assert "(limits: 2 epochs of 4 steps)" in auto.report()  # the report says how an epoch was cut
    hand = model(customers())
    one = checked(hand)  # a hand-written template: one step on every training row, as before
    assert one.batch_size is None and not one.whole_net
    rows = len(hand.rows["train"])
    asked = checked(hand, steps_per_epoch=7)
    assert asked.whole_net and asked.batch_size == -(-rows // 7)
    assert checked(auto, steps_per_epoch=1).batch_size is None
    given = checked(hand, batch_size=50)  # the user's batch_size: mini-batches from the store, as before
    assert given.batch_size == 50 and not given.whole_net


def test_the_steps_are_a_plain_torch_loops_on_the_whole_net_and_reuse_one_forward_an_epoch():
    """AdamW, cosine rate and clipping as Model.fit runs them; each step the whole net's forward, its loss
    on the step's rows. The validation forward serves the next epoch's first step (4 + 3 + 3 + 3 + 3
    training forwards and 5 validations, not 4 x 5 + 5); the weights are the plain loop's either way."""
    db = customers()
    trained, plain = model(db), model(db)
    config = checked(trained, steps_per_epoch=ROW_STEPS).replace(optimizer="adamw")
    size, epochs = config.batch_size, config.epochs
    forwards = []
    net = trained.learner.net
    original = net.forward
    net.forward = lambda *a, **k: forwards.append(torch.is_grad_enabled()) or original(*a, **k)
    trainer = Trainer(trained.learner, OneProcess(), config, keep="last")
    assert fit_as_model(trainer, batched=False).diverged is None
    steps = epochs * ROW_STEPS
    warm = round(0.1 * steps)
    expected = scheduled_reference(plain, epochs, config.lr, size, warm, config.clip, config.weight_decay)
    assert_same_weights(weights(trained), expected)
    assert len(forwards) == ROW_STEPS + (epochs - 1) * (ROW_STEPS - 1) + epochs
    assert forwards.count(False) == 1  # the last validation alone runs without a graph: no step follows it
    done = [(h["epoch"] + 1) * ROW_STEPS for h in trained.history]
    assert [h["lr"] for h in trained.history] == pytest.approx([closed_form_rate(config.lr, d, steps, warm) for d in done],
                                                               abs=1e-12)


def test_model_fit_takes_the_steps_asked_for():
    db = customers()
    counted = {}

    def fitted(**given):
        m = model(db)
        calls = []
        m.fit(epochs=3, hybrid=False, refit=False, callback=lambda info: calls.append(info), **given)
        counted[given.get("steps_per_epoch")] = len(calls)
        return weights(m)

    default, four, one = fitted(), fitted(steps_per_epoch=4), fitted(steps_per_epoch=1)
    m = model(db)
    m.fit(epochs=2, hybrid=False, refit=False)
    assert "(limits: 2 epochs)" in m.report()  # one full-batch step an epoch: nothing to add
    assert counted == {None: 3, 4: 12, 1: 3}
    assert_same_weights(default, one)
    assert max(float((four[n] - one[n]).abs().max()) for n in one) > 1e-4


def test_steps_per_epoch_is_checked():
    db = customers()
    m = model(db)
    for bad in (0, -2, 1.5, "4"):
        with pytest.raises(relsql.RelsqlError, match="steps_per_epoch"):
            m.fit(epochs=1, steps_per_epoch=bad)
    with pytest.raises(relsql.RelsqlError, match="pass one of them"):
        m.fit(epochs=1, steps_per_epoch=4, batch_size=50)
    with pytest.raises(relsql.RelsqlError, match="mini-batches of 50 rows"):
        model(db, batch_size=50).fit(epochs=1, steps_per_epoch=4)


def test_more_steps_than_training_rows_take_one_row_each():
    m = model(customers(12))
    rows = len(m.rows["train"])
    config = checked(m, steps_per_epoch=rows + 5)
    assert rows > 1 and config.batch_size == 1 and config.whole_net


def test_the_command_line_passes_steps_per_epoch_only_when_given(tmp_path):
    from relsql.cli import _fit_options, _parser

    relsql.connect(tmp_path / "shop.duckdb").close()
    parser, _ = _parser()
    db = str(tmp_path / "shop.duckdb")

    def options(*flags):
        return _fit_options(parser.parse_args(["train", db, "--target", "customer.churned", *flags]))

    assert "steps_per_epoch" not in options()  # fit's default decides
    assert options("--steps-per-epoch", "1")["steps_per_epoch"] == 1
    with pytest.raises(SystemExit):
        options("--steps-per-epoch", "0")
