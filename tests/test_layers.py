"""layer_norm(x [, 'name']) and dropout(x, p): exact in float64 against numpy, in full batch, in
mini-batches and in saved models; dropout only in train() mode, scaled by 1/(1-p)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import relsql

EPS = 1e-5  # torch.nn.LayerNorm's default, which layer_norm uses


@pytest.fixture
def db():
    db = relsql.connect()
    db.execute("CREATE TABLE t(id INT PRIMARY KEY, a DOUBLE, b DOUBLE, c DOUBLE, y BOOLEAN)")
    db.execute("INSERT INTO t SELECT i, sin(i) * 3, cos(i * 0.7) + i / 40.0, (i * 37 % 11) - 5.0, i % 3 = 0 "
               "FROM range(1, 81) r(i)")
    yield db
    db.con.close()


def rows(db) -> np.ndarray:
    return np.array(db.con.execute("SELECT a, b, c FROM t ORDER BY id").fetchall(), dtype=np.float64)


def standardized(x: np.ndarray) -> np.ndarray:
    return (x - x.mean(axis=0)) / x.std(axis=0)


def layer_norm(x: np.ndarray, gain: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """Naive: each row minus its mean, over the root of its (population) variance plus EPS."""
    out = np.empty_like(x)
    for i, row in enumerate(x):
        mean = sum(row) / len(row)
        var = sum((v - mean) ** 2 for v in row) / len(row)
        out[i] = [(v - mean) / np.sqrt(var + EPS) * g + b for v, g, b in zip(row, gain, bias)]
    return out


def compiled(db, text: str) -> relsql.CompiledNet:
    return relsql.compile(relsql.Template.from_sql(text), db, dtype=torch.float64)


def set_weights(net, **values) -> None:
    net.set_named_weights({name.replace("__", "."): torch.as_tensor(v, dtype=torch.float64) for name, v in values.items()})


def test_layer_norm_equals_naive_with_its_gain_and_bias(db):
    net = compiled(db, "CREATE TABLE f AS SELECT t.id, layer_norm(linear(features(t.a, t.b, t.c), 5, 'w'), 'ln') FROM t;")
    rng = np.random.default_rng(0)
    w, gain, bias = rng.normal(size=(5, 3)), rng.normal(size=5), rng.normal(size=5)
    set_weights(net, w=w, ln__gain=gain, ln__bias=bias)
    expected = layer_norm(standardized(rows(db)) @ w.T, gain, bias)
    assert np.allclose(net()["f"].detach().numpy(), expected, rtol=0, atol=1e-10)


def test_layer_norm_weights_start_as_identity_and_are_named(db):
    net = compiled(db, "CREATE TABLE f AS SELECT t.id, layer_norm(features(t.a, t.b, t.c)) FROM t;")
    weights = net.named_weights()
    assert set(weights) == {"f.layer_norm0.gain", "f.layer_norm0.bias"}
    assert torch.equal(weights["f.layer_norm0.gain"], torch.ones(3, dtype=torch.float64))
    assert torch.equal(weights["f.layer_norm0.bias"], torch.zeros(3, dtype=torch.float64))
    expected = layer_norm(standardized(rows(db)), np.ones(3), np.zeros(3))
    assert np.allclose(net()["f"].detach().numpy(), expected, rtol=0, atol=1e-10)


def test_layer_norm_gets_gradients(db):
    net = compiled(db, "CREATE TABLE f AS SELECT t.id, linear(layer_norm(features(t.a, t.b, t.c), 'ln'), 1, 'o') FROM t;")
    net()["f"].sum().backward()
    grads = {n: p.grad for n, p in net.weights_by_name().items()}
    assert grads["ln.gain"] is not None and grads["ln.bias"] is not None and float(grads["ln.bias"].abs().sum()) > 0


DROPPED = "CREATE TABLE f AS SELECT t.id, dropout(linear(features(t.a, t.b, t.c), 25, 'w'), 0.25) FROM t;"


def test_dropout_is_the_identity_in_eval_mode(db):
    net = compiled(db, DROPPED)
    w = np.random.default_rng(1).normal(size=(25, 3))
    set_weights(net, w=w)
    expected = standardized(rows(db)) @ w.T
    assert not net.training  # a compiled net starts in eval mode
    assert np.allclose(net()["f"].detach().numpy(), expected, rtol=0, atol=1e-10)
    net.train()
    net.eval()
    assert np.allclose(net()["f"].detach().numpy(), expected, rtol=0, atol=1e-10)


def test_dropout_while_training_zeroes_elements_and_scales_the_rest(db):
    net = compiled(db, DROPPED)
    clean = net()["f"].detach().numpy()
    net.train()
    torch.manual_seed(3)
    first = net()["f"].detach().numpy()
    torch.manual_seed(3)
    again = net()["f"].detach().numpy()
    other = net()["f"].detach().numpy()
    kept = first != 0
    assert np.allclose(first[kept], clean[kept] / (1 - 0.25), rtol=0, atol=1e-12)
    assert abs((~kept).mean() - 0.25) < 0.05  # 2,000 elements: a binomial's spread is 0.01
    assert np.array_equal(first, again)  # deterministic given torch's generator
    assert not np.array_equal(first, other)


def test_dropout_of_a_constant_input_is_not_folded_away(db):
    """features(...) is an input of the plan: constant folding must not run dropout once at compile time."""
    net = compiled(db, "CREATE TABLE f AS SELECT t.id, dropout(features(t.a, t.b, t.c), 0.5) FROM t;")
    net.train()
    assert int((net()["f"] == 0).sum()) > 0
    net.eval()
    assert np.allclose(net()["f"].numpy(), standardized(rows(db)), rtol=0, atol=1e-10)


def test_two_dropouts_of_one_value_draw_two_masks(db):
    net = compiled(db, "CREATE TABLE f AS SELECT t.id, dropout(features(t.a, t.b, t.c), 0.5) - "
                       "dropout(features(t.a, t.b, t.c), 0.5) FROM t;")
    net.train()
    assert float(net()["f"].abs().sum()) > 0


@pytest.mark.parametrize("p", ["1", "1.5", "-0.1", "'x'"])
def test_dropout_probability_must_be_in_0_1(p):
    with pytest.raises(relsql.TemplateError, match="dropout"):
        relsql.Template.from_sql(f"CREATE TABLE f AS SELECT t.id, dropout(features(t.a), {p}) FROM t;")


def test_layer_norm_arguments_are_checked():
    with pytest.raises(relsql.TemplateError, match="layer_norm"):
        relsql.Template.from_sql("CREATE TABLE f AS SELECT t.id, layer_norm(features(t.a), 'n', 3) FROM t;")


MODEL = ("CREATE TABLE f AS SELECT t.id, linear(dropout(tanh(layer_norm(linear(features(t.a, t.b, t.c), 4, 'w'), 'ln')), 0.2), "
         "1, 'out') AS h FROM t;")


def model(db, **kwargs) -> relsql.Model:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return relsql.Model(db, relsql.Template.from_sql(MODEL), "t.y", dtype=torch.float64, progress=False, **kwargs)


def naive_probability(db, weights: dict) -> np.ndarray:
    w = {n: weights[n].detach().numpy() for n in ("w", "ln.gain", "ln.bias", "out")}
    hidden = np.tanh(layer_norm(standardized(rows(db)) @ w["w"].T, w["ln.gain"], w["ln.bias"]))
    return 1 / (1 + np.exp(-(hidden @ w["out"].T)[:, 0]))


def test_full_batch_mini_batches_and_saved_model_agree_with_naive(db, tmp_path):
    full, batched = model(db), model(db, batch_size=7)
    rng = np.random.default_rng(2)
    values = {"w": rng.normal(size=(4, 3)), "ln.gain": rng.normal(size=4), "ln.bias": rng.normal(size=4),
              "out": rng.normal(size=(1, 4))}
    for m in (full, batched):
        m.net.set_named_weights({n: torch.as_tensor(v) for n, v in values.items()})
    expected = naive_probability(db, full.net.named_weights())
    assert full.predict()["id"].to_list() == list(range(1, 81))
    for m in (full, batched):
        assert np.allclose(m.predict()["probability"].to_numpy(), expected, rtol=0, atol=1e-10)
    path = full.save(tmp_path / "m.relsql")
    loaded = relsql.Model.load(path, db)
    assert np.allclose(loaded.predict()["probability"].to_numpy(), expected, rtol=0, atol=1e-10)
    assert np.allclose(relsql.Model.load(path, db, batch_size=5).predict()["probability"].to_numpy(), expected,
                       rtol=0, atol=1e-10)
