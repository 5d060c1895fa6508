"""Hashed text tables trained on the buckets their plan reads (relsql/compile/compact.py): a
full-batch fit that compacts them must end where the full-table fit ends, bit for bit. The
reference is the same fit with the compaction refused (the full tables in the optimizer, as
before): histories, weights, predictions and a saved model's predictions must be equal; a net's
compact table must give the full table's values and gradients; weight decay, which moves the
rows no plan reads, keeps the full tables."""

from __future__ import annotations

import duckdb
import numpy as np
import pytest
import torch

import relsql
from relsql.compile import compact
from relsql.train.loop.callbacks import Callback
from relsql.train.loop.options import FitConfig
from relsql.train.loop.trainer import OneProcess, Trainer
from relsql.train.model import own_columns
from tests.tables import insert_rows

TABLES = ("enc_customer_note", "enc_orders_item")


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    """customer(score, note: 3 words of 500) <- orders(amount, item: 2 words of 800); the label
    `churned` reads the note's first word. Both text columns have more than 1000 values, so
    Template.auto hashes them: text(..., 16) tables of 65,537 rows, of which ~1-2 k are read."""
    path = tmp_path_factory.mktemp("compact_tables") / "shop.duckdb"
    con = duckdb.connect(str(path))
    rng = np.random.default_rng(0)
    con.execute("CREATE TABLE customer(customer_id INTEGER PRIMARY KEY, score DOUBLE, note VARCHAR, churned BOOLEAN)")
    con.execute("CREATE TABLE orders(order_id INTEGER PRIMARY KEY, customer_id INTEGER REFERENCES customer(customer_id), "
                "amount DOUBLE, item VARCHAR)")
    customers, orders = [], []
    for c in range(1200):
        words = rng.integers(0, 500, size=3)
        for _ in range(int(rng.integers(1, 4))):
            orders.append((len(orders), c, float(rng.gamma(2, 10)), " ".join(f"item{w}" for w in rng.integers(0, 800, size=2))))
        customers.append((c, float(rng.normal()), " ".join(f"w{w}" for w in words), bool(words[0] < 200)))
    insert_rows(con, "customer", customers)
    insert_rows(con, "orders", orders)
    con.close()
    return relsql.connect(str(path), read_only=True)


def _model(db, dtype=torch.float32) -> relsql.Model:
    template = relsql.Template.auto(db, target="customer.churned")
    return relsql.Model(db, template, target="customer.churned", seed=0, progress=False, dtype=dtype)


def test_a_compact_table_gives_the_full_tables_values_and_gradients(db):
    net = _model(db).learner.net
    assert set(compact.candidates(net.plan)) == set(TABLES)
    full = {name: net.weights_by_name()[name] for name in TABLES}
    before = {name: w.detach().clone() for name, w in full.items()}
    upstream = torch.Generator().manual_seed(1)

    def run() -> tuple[dict, dict]:
        outputs = net()
        pull = {r: torch.randn(v.shape, generator=upstream.manual_seed(i), dtype=v.dtype)
                for i, (r, v) in enumerate(sorted(outputs.items()))}
        weights = net.weights_by_name()
        for w in weights.values():
            w.grad = None
        sum((v * pull[r]).sum() for r, v in outputs.items()).backward()
        return ({r: v.detach() for r, v in outputs.items()},
                {n: weights[n].grad.clone() for n in TABLES})

    dense_out, dense_grad = run()
    made = compact.compact(net)
    assert made is not None and set(made.rows) == set(TABLES)
    compact_out, compact_grad = run()
    for relation in dense_out:
        assert torch.equal(compact_out[relation], dense_out[relation]), relation
    for name in TABLES:
        rows = made.rows[name]
        # naive reference: the rows a random pull on every output reaches are the rows the plan reads
        touched = torch.nonzero(dense_grad[name].abs().sum(1)).reshape(-1)
        assert torch.equal(touched, rows), name
        assert 0 < len(rows) < full[name].shape[0] // 10
        assert compact_grad[name].shape == (len(rows), full[name].shape[1])
        assert torch.equal(compact_grad[name], dense_grad[name][rows]), name
        assert torch.equal(net.weights_by_name()[name].detach(), before[name][rows])
        with torch.no_grad():  # a step's worth of change, to see where expand() writes it
            net.weights_by_name()[name].add_(1.0)
    moved = {r: v.detach() for r, v in net().items()}
    made.expand()
    for name in TABLES:
        weight = net.weights_by_name()[name]
        assert weight is full[name] and weight.shape == before[name].shape
        rows = made.rows[name]
        assert torch.equal(weight.detach()[rows], before[name][rows] + 1.0)
        others = torch.ones(weight.shape[0], dtype=torch.bool)
        others[rows] = False
        assert torch.equal(weight.detach()[others], before[name][others])
    for relation, value in net().items():
        assert torch.equal(value.detach(), moved[relation]), relation


def test_a_table_read_by_most_of_its_rows_stays_whole(db):
    net = _model(db).learner.net
    assert compact.compact(net, share=1e-4) is None
    assert all(net.weights_by_name()[name].shape[0] == 65537 for name in TABLES)


def _spy(monkeypatch, dense: bool) -> list:
    """What each Trainer.fit compacted (None: nothing); `dense`: refuse the compaction (the reference)."""
    made = []
    own = Trainer.compact_tables

    def spied(self, resume):
        found = None if dense else own(self, resume)
        made.append(found)
        return found
    monkeypatch.setattr(Trainer, "compact_tables", spied)
    return made


def _same_model(new: relsql.Model, old: relsql.Model) -> None:
    assert len(new.history) == len(old.history) > 1
    assert new.history == old.history  # every loss, metric and rate, exactly
    assert new.learner.record.best_epoch == old.learner.record.best_epoch
    a, b = new.learner.weights_by_name(), old.learner.weights_by_name()
    assert a.keys() == b.keys()
    for name in a:
        assert a[name].shape == b[name].shape and torch.equal(a[name], b[name]), name
    assert new.predict().equals(old.predict())


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_fit_with_compact_tables_ends_where_the_full_tables_fit_ends(db, tmp_path, monkeypatch, dtype):
    """fit()'s defaults: AdamW at weight decay 0, gradients clipped to norm 1, the plateau schedule
    with warmup, early stopping and the refit on every labelled row."""
    fits = {}
    for dense in (True, False):
        with monkeypatch.context() as patch:
            made = _spy(patch, dense)
            model = _model(db, dtype)
            model.fit(epochs=10, patience=4)
            fits[dense] = model
        assert len(made) == 2 and model.learner.refit is not None  # the selection run and the refit
        if not dense:
            assert all(m is not None and set(m.rows) == set(TABLES) for m in made)
    _same_model(fits[False], fits[True])
    saved = fits[False].save(tmp_path / "compact.pt")
    loaded = relsql.Model.load(saved, db)
    assert loaded.learner.net.weights_by_name()["enc_orders_item"].shape == (65537, 16)
    assert loaded.predict().equals(fits[True].predict())


@pytest.mark.slow
def test_adam_with_clipping_and_a_cosine_rate_on_compact_tables_takes_the_full_tables_steps(db, monkeypatch):
    """Plain Adam, clipping that binds (norm 0.05), a cosine rate with warmup, the last epoch kept."""
    config = FitConfig(epochs=12, lr=0.03, patience=1000, optimizer="adam", schedule="cosine", warmup=0.2, clip=0.05)
    fits = {}
    for dense in (True, False):
        with monkeypatch.context() as patch:
            made = _spy(patch, dense)
            model = _model(db)
            trainer = Trainer(model.learner, OneProcess(), config, keep="last")
            model.learner.record = trainer.record
            assert trainer.fit(batched=False).diverged is None
            fits[dense] = model
        assert (made[0] is None) == dense
    _same_model(fits[False], fits[True])
    start = _model(db).learner.weights_by_name()["enc_customer_note"].detach()
    trained = fits[False].learner.weights_by_name()["enc_customer_note"].detach()
    changed = (trained != start).any(1)
    assert 0 < int(changed.sum()) < 65537 // 10  # the rows read moved, the others kept their start


@pytest.mark.slow
def test_weight_decay_or_a_callback_keeps_the_full_tables(db, monkeypatch):
    """AdamW's decay shrinks every row, read or not, so the full tables train; a user's callback may
    read the weights by name mid-fit, so they stay whole for it too."""
    made = _spy(monkeypatch, dense=False)
    monkeypatch.setattr(own_columns, "CHOOSE", False)  # one model's fits: not a second of the template's own columns
    model = _model(db)
    start = model.learner.weights_by_name()["enc_orders_item"].detach().clone()
    model.fit(epochs=3, weight_decay=0.01, refit=False, hybrid=False)
    assert made == [None]
    decayed = model.learner.weights_by_name()["enc_orders_item"].detach()
    unread = (start != 0).any(1) & torch.isin(torch.arange(65537), compact.compact(_model(db).learner.net).rows[
        "enc_orders_item"], invert=True)
    assert bool((decayed[unread].abs() < start[unread].abs()).all())  # rows no plan reads moved: compacting would be wrong

    class Watch(Callback):
        shapes: list = []

        def on_epoch_end(self, trainer, epoch, record):
            self.shapes.append(tuple(trainer.learner.weights_by_name()["enc_orders_item"].shape))

    made.clear()
    _model(db).fit(epochs=2, callbacks=[Watch()], refit=False, hybrid=False)
    assert made == [None] and Watch.shapes == [(65537, 16)] * 2
