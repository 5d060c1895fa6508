"""Members side by side (`Template.auto(members=K)`, `linear(..., blocks=K)`): K networks in one.

Each member must be exactly the network `members=1` builds, with that member's share of the
weights: checked against that plain network (its weights cut out of the wider one's blocks and
rows), so no linear, aggregate or encoder mixes members. Training keeps the off-block zeros at
zero, minimizes the mean of the members' own losses, and the model's output is their mean."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import relsql
from relsql.template import plain

CUSTOMERS = 160


@pytest.fixture(scope="module")
def shop(tmp_path_factory):
    """customer(id, age, segment, churned), orders(id, customer_id, amount, channel): churned when a
    customer's orders are few and small (a signal one hop away)."""
    rng = np.random.default_rng(3)
    db = relsql.connect(tmp_path_factory.mktemp("members") / "shop.duckdb")
    db.execute("""
        CREATE TABLE customer(id INT PRIMARY KEY, age DOUBLE, segment VARCHAR, churned BOOLEAN);
        CREATE TABLE orders(id INT PRIMARY KEY, customer_id INT REFERENCES customer(id), amount DOUBLE, channel VARCHAR);""")
    customers, orders = [], []
    for c in range(CUSTOMERS):
        n = int(rng.integers(0, 6))
        amounts = rng.gamma(2.0, 20.0, n)
        for a in amounts:
            orders.append((len(orders), c, float(a), str(rng.choice(["web", "shop", "phone"]))))
        customers.append((c, float(rng.integers(18, 80)), str(rng.choice(["a", "b", "c", "d"])),
                          bool(n < 2 or amounts.sum() < 40)))
    db.con.executemany("INSERT INTO customer VALUES (?, ?, ?, ?)", customers)
    db.con.executemany("INSERT INTO orders VALUES (?, ?, ?, ?)", orders)
    yield db
    db.con.close()


def _model(db, members: int, seed: int = 0) -> relsql.Model:
    template = relsql.Template.auto(db, target="customer.churned", members=members)
    return relsql.Model(db, template, target="customer.churned", seed=seed, dtype=torch.float64, progress=False)


def _member_weights(wide: dict[str, torch.Tensor], plain: dict[str, torch.Tensor], blocks: dict[str, int],
                    k: int, members: int) -> dict[str, torch.Tensor]:
    """Member k's share of each weight of the wide network, in the plain network's shapes: a
    block-diagonal weight's k-th block, else the k-th slice of every axis that is `members` times wider."""
    out = {}
    for name, small in plain.items():
        value = wide[name]
        if blocks.get(name, 1) > 1:
            rows, cols = small.shape
            out[name] = value[k * rows:(k + 1) * rows, k * cols:(k + 1) * cols]
            continue
        for axis, (a, b) in enumerate(zip(value.shape, small.shape)):
            if a != b:
                assert a == members * b, (name, value.shape, small.shape)
                value = value.narrow(axis, k * b, b)
        out[name] = value
    return out


def test_the_template_language_takes_blocks():
    text = """
        CREATE TABLE h AS SELECT c.id, tanh(linear(features(c.age), 8, 'enc')) AS h FROM customer c;
        CREATE TABLE predict AS SELECT h.id, linear(h.h, 4, 'out', blocks=4) AS h FROM h;"""
    template = relsql.Template.from_sql(text)
    assert template.weights["out"].blocks == 4 and template.weights["enc"].blocks == 1
    again = plain.loads(plain.dumps(template), source=template.source, language="sql")
    assert again.weights["out"].blocks == 4
    older = json.loads(plain.dumps(template))  # a plain form written before blocks existed reads as one block
    for weight in older["weights"]:
        weight.pop("blocks")
    assert plain.loads(json.dumps(older), source=template.source, language="sql").weights["out"].blocks == 1
    for bad, says in (("linear(h.h, 6, 'out', blocks=4)", "not a multiple"),
                      ("linear(h.h, 4, 'out', block=4)", "no keyword block"),
                      ("linear(h.h, 4, 'out', blocks=0)", "positive integer")):
        with pytest.raises(relsql.RelsqlError, match=says):
            relsql.Template.from_sql(text.replace("linear(h.h, 4, 'out', blocks=4)", bad))


def test_every_member_is_the_plain_network_with_its_share_of_the_weights(shop):
    members = 3
    wide, plain = _model(shop, members), _model(shop, 1)
    blocks = {n: s.blocks for n, s in wide.learner.template.weights.items()}
    assert any(b == members for b in blocks.values())
    assert "blocks" not in plain.learner.template.source  # members=1 writes today's template
    wide.fit(epochs=3, hybrid=False, refit=False)  # trained a little: the blocks must stay apart
    weights = {n: p.detach() for n, p in wide.learner.net.weights_by_name().items()}
    for name, value in weights.items():
        if blocks.get(name, 1) > 1:
            rows, cols = value.shape[0] // members, value.shape[1] // members
            off = value.clone()
            for k in range(members):
                off[k * rows:(k + 1) * rows, k * cols:(k + 1) * cols] = 0
            assert torch.count_nonzero(off) == 0, name
    with torch.no_grad():
        value = wide.learner.net()[wide.learner.output]
        both = value.reshape(value.shape[0], members, -1)
        plain_weights = {n: p.detach() for n, p in plain.learner.net.weights_by_name().items()}
        for k in range(members):
            plain.learner.net.set_named_weights(_member_weights(weights, plain_weights, blocks, k, members))
            alone = plain.learner.net()[plain.learner.output]
            np.testing.assert_allclose(both[:, k].numpy(), alone.numpy(), rtol=0, atol=1e-10)
        # the model's output is the members' mean
        np.testing.assert_allclose(wide.learner.outputs().numpy(), both.mean(1).numpy(), rtol=0, atol=1e-12)


def test_training_minimizes_the_members_own_losses_and_a_saved_model_predicts_the_same(shop, tmp_path):
    model = _model(shop, 2)
    learner = model.learner
    from relsql.train.feed.source import Whole

    rows = learner.rows["train"]
    whole = learner.outputs()
    parts = whole.members
    y = learner.y[torch.as_tensor(rows)]
    by_hand = torch.stack([learner.task.loss(parts[torch.as_tensor(learner.labelled[rows]), k], y) for k in range(2)]).mean()
    fitted = learner.batch_loss(Whole(learner.labelled[rows]), {}, rows, whole)
    assert float(fitted.detach()) == pytest.approx(float(by_hand.detach()), rel=1e-12)
    of_mean = learner.task.loss(whole[torch.as_tensor(learner.labelled[rows])], y)
    assert abs(float(fitted.detach()) - float(of_mean.detach())) > 1e-6  # not the loss of the members' mean
    model.fit(epochs=20, hybrid=False, refit=False)
    assert type(learner.head).__name__ == "MemberMean"
    predicted = model.predict()
    loaded = relsql.Model.load(model.save(tmp_path / "members.pt"), shop)
    again = loaded.predict()
    assert predicted.columns == again.columns
    for column in predicted.columns:
        a, b = predicted[column].to_numpy(), again[column].to_numpy()
        assert (a == b).all() if a.dtype.kind not in "fc" else np.allclose(a, b, rtol=0, atol=1e-12)


def test_members_are_refused_where_scores_read_every_feature(shop):
    for layer in ("gat", "hgt"):
        with pytest.raises(relsql.RelsqlError, match="members=1"):
            relsql.Template.auto(shop, target="customer.churned", layer=layer, members=2)
    with pytest.raises(relsql.RelsqlError, match="members"):
        relsql.Template.auto(shop, target="customer.churned", members=0)


def test_a_search_regenerates_a_members_template_and_gives_attention_layers_one_member(shop):
    from relsql.train.model.search import draw, generate_options, header_options

    for members in (1, 3):
        template = relsql.Template.auto(shop, target="customer.churned", members=members)
        options = header_options(template.source)
        assert options["members"] == members
        again = relsql.Template.auto(shop, target="customer.churned", **options)
        assert again.source == template.source
    base = header_options(relsql.Template.auto(shop, target="customer.churned", members=3).source)
    rng = np.random.default_rng(0)
    drawn = [draw(rng, i, base, generate_options()).template for i in range(40)]
    assert any(d["layer"] in ("gat", "hgt") for d in drawn) and any(d["layer"] == "sage" for d in drawn)
    for d in drawn:
        assert d.get("members", 1) == (1 if d["layer"] in ("gat", "hgt") else 3)
        relsql.Template.auto(shop, target="customer.churned", **d)  # every drawn trial builds


def test_the_command_line_writes_members_and_refuses_them_with_attention(shop, tmp_path, capsys):
    from relsql.cli import main

    path = shop.con.execute("SELECT path FROM duckdb_databases() WHERE database_name = current_database()").fetchone()[0]
    copy = tmp_path / "copy.duckdb"
    shop.con.execute("CHECKPOINT")
    copy.write_bytes(open(path, "rb").read())
    out = tmp_path / "members.sql"
    assert main(["template", str(copy), "--target", "customer.churned", "--members", "2", "-o", str(out)]) == 0
    text = out.read_text()
    assert "blocks=2" in text and text == relsql.Template.auto(shop, target="customer.churned", members=2).source
    capsys.readouterr()
    assert main(["template", str(copy), "--target", "customer.churned", "--members", "2", "--layer", "gat"]) == 1
    err = capsys.readouterr().err
    assert "members=1" in err and "Traceback" not in err
