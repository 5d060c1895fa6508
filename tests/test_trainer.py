"""The trainer (relsql/train/loop/trainer.py): the one loop against a hand-written torch loop, full
batch and mini-batches; early stopping; checkpoints resumed mid-epoch; where the optimizer's kind
is chosen; and the per-rank times a torchrun rank reports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import relsql
from relsql.train.eager import eager
from relsql.train.loop.options import FitConfig
from relsql.train.loop.trainer import EarlyStopping, OneProcess, Optimizers, Trainer
from relsql.train.persist import checkpoint as checkpoints
from tests.test_batches import shop_db, shop_template

ROOT = Path(__file__).resolve().parent.parent

# customers labelled by their orders' amounts, one join away; output width 4 so the head is a Linear
TEMPLATE = """
CREATE TABLE order_h AS SELECT o.order_id, tanh(linear(features(o.amount, o.express), 6, 'w_order')) FROM orders o;
CREATE TABLE predict AS
SELECT c.customer_id, linear(avg(oh.h), 4, 'w_out')
FROM customer c JOIN orders o ON o.customer_id = c.customer_id JOIN order_h oh ON oh.order_id = o.order_id
GROUP BY c.customer_id;
"""


def customers(n: int = 240) -> relsql.Database:
    """n customers with 1-4 orders each; the label is the sign of their mean amount (NULL for every 11th)."""
    db = relsql.connect()
    db.execute(f"CREATE TABLE customer AS SELECT i AS customer_id, i % 7 AS region, "
               "DATE '2020-01-01' + CAST((i * 37) % 400 AS INTEGER) AS "
               f"signup FROM range({n}) t(i)")
    db.execute("CREATE TABLE orders AS SELECT c.customer_id * 10 + k AS order_id, c.customer_id, "
               "sin(c.customer_id * 1.7 + k) + (c.customer_id % 2) - 0.5 AS amount, (c.customer_id + k) % 3 = 0 AS express "
               "FROM customer c, range(1 + customer_id % 4) r(k)")
    db.execute("ALTER TABLE customer ADD COLUMN churned BOOLEAN")
    db.execute("UPDATE customer SET churned = CASE WHEN customer_id % 11 = 0 THEN NULL ELSE "
               "(SELECT avg(amount) FROM orders o WHERE o.customer_id = customer.customer_id) > 0 END")
    return db


def model(db: relsql.Database, **kwargs) -> relsql.Model:
    return relsql.Model(db, relsql.Template.from_sql(TEMPLATE), "customer.churned", seed=3, dtype=torch.float64,
                        progress=False, **kwargs)


def weights(m: relsql.Model) -> dict[str, torch.Tensor]:
    return {name: w.detach().clone() for name, w in m.named_weights().items()}


def assert_same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert torch.allclose(a[name], b[name], atol=1e-10, rtol=0), name


def train(m: relsql.Model, epochs: int, lr: float, batch_size: int | None = None, patience: int = 1000,
          strategy: OneProcess | None = None, **kwargs) -> Trainer:
    keep = {k: kwargs.pop(k) for k in ("keep", "horizon", "replay") if k in kwargs}
    config = FitConfig(epochs=epochs, batch_size=batch_size, lr=lr, patience=patience, **kwargs)
    trainer = Trainer(m.learner, strategy or OneProcess(), config, **keep)
    assert fit_as_model(trainer, batched=batch_size is not None).diverged is None
    return trainer


def fit_as_model(trainer: Trainer, **kwargs):
    """Trainer.fit as fit's entry points run it: its record becomes the model's (history, best_epoch, ...)."""
    trainer.learner.record = trainer.record
    return trainer.fit(**kwargs)


def reference(m: relsql.Model, epochs: int, lr: float, batch_size: int | None = None) -> list[tuple[float, float, dict]]:
    """A plain torch loop on a full-batch model: Adam on every weight, binary cross-entropy of the
    training rows (in shuffled chunks of `batch_size`, seeded by (seed, epoch)); per epoch the
    training loss (the mean over rows of the batch losses), the validation loss, the weights."""
    learner = m.learner
    net, head, output = m.net, learner.head, learner.output
    params = [p for p in [*net.parameters(), *head.parameters()] if p.requires_grad]
    adam = torch.optim.Adam(params, lr=lr)
    labelled, y, train_rows, val_rows = learner.labelled, learner.y, learner.rows["train"], learner.rows["val"]

    def logits(rows: np.ndarray) -> torch.Tensor:
        value = net()[output]
        return head(value.reshape(value.shape[0], -1))[torch.as_tensor(labelled[rows]), 0]

    out = []
    for epoch in range(epochs):
        if batch_size is None:
            chunks = [train_rows]
        else:
            shuffled = train_rows[np.random.default_rng([m.seed, epoch]).permutation(len(train_rows))]
            chunks = [shuffled[i:i + batch_size] for i in range(0, len(shuffled), batch_size)]
        total = 0.0
        for chunk in chunks:
            adam.zero_grad()
            loss = F.binary_cross_entropy_with_logits(logits(chunk), y[torch.as_tensor(chunk)])
            loss.backward()
            adam.step()
            total += float(loss.detach()) * len(chunk)
        with torch.no_grad():
            val = float(F.binary_cross_entropy_with_logits(logits(val_rows), y[torch.as_tensor(val_rows)]))
        out.append((total / len(train_rows), val, weights(m)))
    return out


def best_of(losses: list[float]) -> int:
    """The epoch early stopping keeps: the last that improved on the best so far by more than 1e-7."""
    best, kept = float("inf"), -1
    for epoch, loss in enumerate(losses):
        if loss < best - 1e-7:
            best, kept = loss, epoch
    return kept


@pytest.mark.parametrize("batch_size", [None, 50], ids=["full_batch", "mini_batches"])
def test_the_loop_takes_the_steps_of_a_plain_torch_loop(batch_size):
    db = customers()
    trained = model(db, batch_size=batch_size)
    plain = model(db)  # full batch: a mini-batch's outputs are those rows of the whole relation's
    assert_same_weights(weights(trained), weights(plain))  # same seed, same start
    epochs, lr = 6, 0.05
    train(trained, epochs, lr, batch_size)
    expected = reference(plain, epochs, lr, batch_size)
    history = trained.history
    assert [h["epoch"] for h in history] == list(range(epochs))
    if batch_size is not None:  # full batch records the loss before its one step (the next test)
        assert [h["train_loss"] for h in history] == pytest.approx([t for t, _, _ in expected], abs=1e-10)
    assert [h["val_loss"] for h in history] == pytest.approx([v for _, v, _ in expected], abs=1e-10)
    kept = best_of([v for _, v, _ in expected])
    assert trained.best_epoch == kept
    assert_same_weights(weights(trained), expected[kept][2])
    if batch_size is None:
        assert history[0]["train_loss"] > history[-1]["train_loss"]  # it learned something


def test_full_batch_records_the_loss_each_step_started_from():
    db = customers()
    trained, plain = model(db), model(db)
    train(trained, 3, 0.05)
    with torch.no_grad():
        learner = plain.learner
        index, y = learner.goal.split_index("train")
        first = float(F.binary_cross_entropy_with_logits(learner.outputs()[index, 0], y))
    assert trained.history[0]["train_loss"] == pytest.approx(first, abs=1e-12)


class Recording(OneProcess):
    """The one-process strategy that also records each batch's output rows, in training order."""

    def __init__(self):
        self.seen: list[np.ndarray] = []

    def after_step(self, trainer, batch, external, reduced) -> None:
        self.seen.append(np.asarray(batch.rids))
        super().after_step(trainer, batch, external, reduced)


def test_every_training_row_once_per_epoch_in_the_seeded_order():
    m = model(customers(), batch_size=40)
    strategy = Recording()
    train(m, 2, 0.01, batch_size=40, strategy=strategy)
    learner = m.learner
    train_rows = learner.rows["train"]
    per_epoch = -(-len(train_rows) // 40)
    assert len(strategy.seen) == 2 * per_epoch
    for epoch in range(2):
        rids = np.concatenate(strategy.seen[epoch * per_epoch:(epoch + 1) * per_epoch])
        order = train_rows[np.random.default_rng([m.seed, epoch]).permutation(len(train_rows))]
        assert rids.tolist() == learner.labelled[order].tolist()
        assert sorted(rids.tolist()) == sorted(learner.labelled[train_rows].tolist())  # each exactly once
    assert not np.array_equal(np.concatenate(strategy.seen[:per_epoch]), np.concatenate(strategy.seen[per_epoch:]))


def stopping_reference(losses: list[float], patience: int) -> tuple[int | None, int]:
    """(the epoch training stops after, or None; the best epoch): stop once `patience` epochs
    passed without a loss below the best by more than 1e-7."""
    best, kept = float("inf"), -1
    for epoch, loss in enumerate(losses):
        if loss < best - 1e-7:
            best, kept = loss, epoch
        elif epoch - kept >= patience:
            return epoch, kept
    return None, kept


def run_stopping(stopping: EarlyStopping, learner, losses: list[float], start: int = 0) -> tuple[int | None, list]:
    """Feed `losses` from epoch `start`; before each, the weights are set to a value naming the epoch."""
    stops = None
    for epoch, loss in enumerate(losses[start:], start):
        with torch.no_grad():
            for p in learner.parameters():
                p.fill_(float(epoch))
        _, stop = stopping.update(epoch, loss)
        if stop:
            stops = epoch
            break
    return stops, stopping.best_epoch


@pytest.mark.parametrize("losses,patience,stops", [
    ([1.0, 0.8, 0.85, 0.8 - 5e-8, 0.9, 0.7], 2, 3),  # 0.79999995 is no improvement (tolerance 1e-7)
    ([1.0, 0.9, 0.8, 0.7], 1, None),
    ([1.0, 1.0, 1.0], 0, 1),
    ([2.0, 1.5, 1.6, 1.4, 1.45, 1.44, 1.46, 1.3], 3, 6),
])
def test_early_stopping_stops_at_the_right_epoch_and_keeps_the_best_weights(losses, patience, stops):
    m = model(customers(60))
    learner = m.learner
    assert stopping_reference(losses, patience)[0] == stops  # the table above agrees with the reference rule
    stopping = EarlyStopping(learner, patience)
    assert stopping.monitor == "val"
    found, best = run_stopping(stopping, learner, losses)
    assert (found, best) == stopping_reference(losses, patience)
    for value in stopping.state[0].values():  # the weights as they were at the best epoch
        assert torch.all(value == float(best))
    assert stopping.loss == losses[best]


def test_early_stopping_state_round_trips_through_a_checkpoint_file(tmp_path):
    losses, patience = [2.0, 1.5, 1.6, 1.4, 1.45, 1.44, 1.46, 1.3], 3
    m = model(customers(60))
    learner = m.learner
    whole = EarlyStopping(learner, patience)
    expected = run_stopping(whole, learner, losses)
    first = EarlyStopping(learner, patience)
    run_stopping(first, learner, losses[:5])
    checkpoints.save(tmp_path / "stop.ckpt", first.state_dict())
    again = EarlyStopping(learner, patience)
    again.load_state_dict(checkpoints.load(tmp_path / "stop.ckpt"))
    assert (again.loss, again.best_epoch) == (1.4, 3)
    assert run_stopping(again, learner, losses, start=5) == expected
    for name, value in again.state[0].items():
        assert torch.equal(value, whole.state[0][name])


class Stop(Exception):
    pass


def test_a_checkpoint_taken_mid_epoch_resumes_to_the_uninterrupted_weights(tmp_path):
    db, path = customers(), tmp_path / "run.ckpt"
    epochs, lr, size = 4, 0.05, 50
    whole = model(db, batch_size=size)
    train(whole, epochs, lr, size)

    def interrupt(info):
        if (info["epoch"], info["batch"]) == (1, 1):
            raise Stop

    interrupted = model(db, batch_size=size)
    trainer = Trainer(interrupted.learner, OneProcess(), FitConfig(epochs=epochs, batch_size=size, lr=lr, patience=1000,
                                                                   checkpoint=path, checkpoint_every=2, callback=interrupt))
    with pytest.raises(relsql.RelsqlError, match="raised Stop"):
        trainer.fit(batched=True)
    state = checkpoints.load(path)
    assert (state["epoch"], state["batch"]) == (1, 2)  # taken inside the epoch, after its second batch
    resumed = model(db, batch_size=size)  # a new process would start from a model built afresh
    trainer = Trainer(resumed.learner, OneProcess(), FitConfig(epochs=epochs, batch_size=size, lr=lr, patience=1000,
                                                               checkpoint=path, checkpoint_every=2))
    assert fit_as_model(trainer, batched=True, resume=state).diverged is None
    assert_same_weights(weights(resumed), weights(whole))
    assert resumed.best_epoch == whole.best_epoch
    for a, b in zip(resumed.history, whole.history, strict=True):
        assert a["train_loss"] == pytest.approx(b["train_loss"], abs=1e-10)
        assert a["val_loss"] == pytest.approx(b["val_loss"], abs=1e-10)


def kind_rule(learner, name: str) -> type:
    """The rule: an in-memory embedding trains with the embedding optimizer where one is set; every other weight with Adam."""
    spec = learner.template.weights.get(name)
    if spec is not None and spec.kind == "embed" and learner.settings.embedding_optimizer:
        return {"sgd": torch.optim.SGD, "adagrad": torch.optim.Adagrad}[learner.settings.embedding_optimizer]
    return torch.optim.Adam


@pytest.mark.parametrize("embedding_optimizer", [None, "sgd", "adagrad"])
def test_optimizers_give_embedding_rows_and_dense_weights_their_kind(embedding_optimizer):
    m = relsql.Model(shop_db(), shop_template("memory"), "item.y", dtype=torch.float64, progress=False,
                     embedding_optimizer=embedding_optimizer, embedding_lr=0.3)
    learner = m.learner
    optimizers = Optimizers(learner, lr=0.01, weight_decay=0.5)
    holder = {id(p): o for o in optimizers.all for g in o.param_groups for p in g["params"]}
    named = learner.weights_by_name()
    assert "user" in named and len(holder) == len(named)  # every weight in exactly one optimizer
    for name, p in named.items():
        assert type(holder[id(p)]) is eager(kind_rule(learner, name)), name  # fit's: torch's, unguarded
    assert type(optimizers.all[0]) is eager(torch.optim.Adam)
    assert optimizers.all[0].param_groups[0]["lr"] == 0.01 and optimizers.all[0].param_groups[0]["weight_decay"] == 0.5
    if embedding_optimizer:
        assert len(optimizers.all) == 2 and optimizers.all[1].param_groups[0]["lr"] == 0.3
    extra = torch.nn.Parameter(torch.zeros(3, dtype=torch.float64))
    optimizers.add([extra])  # a dense weight a batch met first joins Adam with fit's settings
    group = optimizers.all[0].param_groups[-1]
    assert group["params"] == [extra] and group["lr"] == 0.01 and group["weight_decay"] == 0.5
    for index in range(len(optimizers.all)):  # a checkpoint's optimizers are rebuilt with the same kinds
        assert optimizers.kind(index) is type(optimizers.all[index])


TORCHRUN_TIMINGS = """
import os, sys, json, torch, relsql
from tests.test_batches import shop_db, shop_template
model = relsql.Model(shop_db(), shop_template("memory"), "item.y", batch_size=512, dtype=torch.float64, progress=False,
                     store=os.path.join(sys.argv[1], "store"))
model.fit(epochs=2, lr=0.05)
with open(os.path.join(sys.argv[1], f"timings{os.environ['RANK']}.json"), "w") as f:
    json.dump(model.timings, f)
"""


@pytest.mark.slow
def test_a_torchrun_rank_reports_its_own_phase_times(tmp_path):
    """Under torchrun each rank's timings hold its epochs, compute, all-reduce, validation and
    store waits besides the whole training time (they were lost when the loop became one)."""
    script = tmp_path / "train.py"
    script.write_text(TORCHRUN_TIMINGS)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           str(script), str(tmp_path)], capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    for rank in (0, 1):
        timings = json.loads((tmp_path / f"timings{rank}.json").read_text())
        for phase in ("epochs", "compute", "all_reduce", "validation", "waiting_on_store", "training"):
            assert phase in timings, (rank, phase, timings)
        assert 0 < timings["compute"] <= timings["epochs"] <= timings["training"], (rank, timings)


# -- convergence settings (issue #29): AdamW, warm-up + cosine, clipping, selection on a metric -----
def closed_form_rate(lr: float, step: int, total: int, warm: int) -> float:
    """The rate of step `step` (0-based): linear warm-up over `warm` steps, then cosine decay to 0."""
    if step < warm:
        return lr * (step + 1) / warm
    return lr * 0.5 * (1 + np.cos(np.pi * (step - warm) / (total - warm)))


def scheduled_reference(m: relsql.Model, epochs: int, lr: float, batch_size: int, warm: int, clip: float | None,
                        weight_decay: float) -> dict:
    """A plain torch loop: AdamW, each step's rate from the closed form, the gradient's norm
    clipped to `clip` before the step; returns the last epoch's weights."""
    learner = m.learner
    net, head, output = m.net, learner.head, learner.output
    params = [p for p in [*net.parameters(), *head.parameters()] if p.requires_grad]
    adamw = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    labelled, y, train_rows = learner.labelled, learner.y, learner.rows["train"]
    steps_per_epoch = -(-len(train_rows) // batch_size)
    total, step = epochs * steps_per_epoch, 0
    for epoch in range(epochs):
        shuffled = train_rows[np.random.default_rng([m.seed, epoch]).permutation(len(train_rows))]
        for i in range(0, len(shuffled), batch_size):
            chunk = shuffled[i:i + batch_size]
            adamw.zero_grad()
            value = net()[output]
            logits = head(value.reshape(value.shape[0], -1))[torch.as_tensor(labelled[chunk]), 0]
            F.binary_cross_entropy_with_logits(logits, y[torch.as_tensor(chunk)]).backward()
            if clip is not None:
                norm = torch.sqrt(sum((p.grad ** 2).sum() for p in params if p.grad is not None))
                scale = min(1.0, clip / (float(norm) + 1e-6))
                for p in params:
                    if p.grad is not None:
                        p.grad.mul_(scale)
            for group in adamw.param_groups:
                group["lr"] = closed_form_rate(lr, step, total, warm)
            adamw.step()
            step += 1
    return weights(m)


@pytest.mark.parametrize("clip", [None, 0.05], ids=["unclipped", "clipped"])
def test_adamw_cosine_and_clipping_take_the_steps_of_a_plain_torch_loop(clip):
    db = customers()
    epochs, lr, size, decay = 5, 0.05, 50, 0.1
    trained, plain = model(db, batch_size=size), model(db)
    trainer = Trainer(trained.learner, OneProcess(), FitConfig(epochs=epochs, batch_size=size, lr=lr, patience=1000,
                                                               weight_decay=decay, optimizer="adamw", schedule="cosine",
                                                               warmup=0.1, clip=clip), keep="last")
    assert fit_as_model(trainer, batched=True).diverged is None
    steps = epochs * -(-len(trained.rows["train"]) // size)
    warm = round(0.1 * steps)
    expected = scheduled_reference(plain, epochs, lr, size, warm, clip, decay)
    assert_same_weights(weights(trained), expected)
    for record in trained.history:  # the rate the next step gets, after each epoch
        done = (record["epoch"] + 1) * steps // epochs
        assert record["lr"] == pytest.approx(closed_form_rate(lr, done, steps, warm), abs=1e-12)
    if clip is not None:  # clipping changed the steps: the unclipped loop ends elsewhere
        unclipped = scheduled_reference(model(db), epochs, lr, size, warm, None, decay)
        assert max(float((expected[n] - unclipped[n]).abs().max()) for n in expected) > 1e-4


def test_a_checkpoint_resumes_the_schedule_to_the_uninterrupted_weights(tmp_path):
    db, path = customers(), tmp_path / "run.ckpt"
    epochs, lr, size = 4, 0.05, 50
    settings = dict(optimizer="adamw", schedule="cosine", warmup=0.2, clip=0.5, monitor="roc_auc")
    whole = model(db, batch_size=size)
    train(whole, epochs, lr, size, **settings)

    def interrupt(info):
        if (info["epoch"], info["batch"]) == (2, 1):
            raise Stop

    interrupted = model(db, batch_size=size)
    trainer = Trainer(interrupted.learner, OneProcess(), FitConfig(epochs=epochs, batch_size=size, lr=lr, patience=1000,
                                                                   checkpoint=path, checkpoint_every=2, callback=interrupt,
                                                                   **settings))
    with pytest.raises(relsql.RelsqlError, match="raised Stop"):
        trainer.fit(batched=True)
    state = checkpoints.load(path)
    assert state["schedule"]["step"] == 2 * 4 + 2  # 4 batches an epoch: two epochs and two batches taken
    resumed = model(db, batch_size=size)
    trainer = Trainer(resumed.learner, OneProcess(), FitConfig(epochs=epochs, batch_size=size, lr=lr, patience=1000,
                                                               checkpoint=path, checkpoint_every=2, **settings))
    assert fit_as_model(trainer, batched=True, resume=state).diverged is None
    assert_same_weights(weights(resumed), weights(whole))
    assert resumed.best_epoch == whole.best_epoch
    assert [h["lr"] for h in resumed.history] == pytest.approx([h["lr"] for h in whole.history], abs=1e-15)


def test_selection_picks_the_best_metric_where_the_loss_disagrees():
    """Validation ROC-AUC best at epoch 1, validation loss best at epoch 3: the metric decides;
    equal AUCs fall to the loss; an undefined AUC ranks below any defined one."""
    learner = model(customers()).learner
    records = [{"val_loss": 0.70, "val_roc_auc": 0.80}, {"val_loss": 0.60, "val_roc_auc": 0.95},
               {"val_loss": 0.50, "val_roc_auc": 0.90}, {"val_loss": 0.40, "val_roc_auc": 0.91},
               {"val_loss": 0.30, "val_roc_auc": float("nan")}]
    stopping = EarlyStopping(learner, patience=1000, metric="roc_auc")
    for epoch, record in enumerate(records):
        stopping.update(epoch, record)
    assert stopping.best_epoch == 1 and stopping.key == "val_roc_auc"
    by_loss = EarlyStopping(learner, patience=1000)
    for epoch, record in enumerate(records):
        by_loss.update(epoch, record)
    assert by_loss.best_epoch == 4
    ties = EarlyStopping(learner, patience=1000, metric="roc_auc")
    for epoch, record in enumerate([{"val_loss": 0.5, "val_roc_auc": 1.0}, {"val_loss": 0.3, "val_roc_auc": 1.0},
                                    {"val_loss": 0.4, "val_roc_auc": 1.0}]):
        ties.update(epoch, record)
    assert ties.best_epoch == 1
    mae = EarlyStopping(learner, patience=1, metric="mae")  # minimized; patience counts epochs without a better MAE
    results = [mae.update(e, {"val_loss": 1.0 - e / 10, "val_mae": m}) for e, m in enumerate([0.5, 0.3, 0.4, 0.35])]
    assert mae.best_epoch == 1 and results[-1] == (False, True)
