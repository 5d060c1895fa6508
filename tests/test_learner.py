"""The learner draws its random numbers from the model's seed in a stream of its own (issue #31:
`Model(seed=...)` reseeded torch's global generator, so the caller's random stream changed)."""

from __future__ import annotations

import torch

import relsql
from tests.test_model import SIMPLE, build


def _next_draws(seed: int) -> torch.Tensor:
    """What the caller's generator gives after torch.manual_seed(seed), untouched."""
    torch.manual_seed(seed)
    return torch.rand(4)


def test_the_callers_torch_stream_is_left_alone(tmp_path):
    db = build(tmp_path / "shop.duckdb", n=80)
    template = relsql.Template.from_sql(SIMPLE)
    expected = _next_draws(11)
    for batch_size in (None, 32):
        torch.manual_seed(11)
        model = relsql.Model(db, template, target="customer.churned", seed=5, progress=False, batch_size=batch_size)
        model.fit(epochs=2)
        model.predict()
        path = model.save(tmp_path / f"m{batch_size}.pt")
        relsql.Model.load(path, db)
        assert torch.equal(torch.rand(4), expected), batch_size


def test_the_same_seed_gives_the_same_model_whatever_the_callers_stream(tmp_path):
    db = build(tmp_path / "shop.duckdb", n=80)
    template = relsql.Template.from_sql(SIMPLE)
    weights = []
    for caller in (0, 1):
        torch.manual_seed(caller)
        model = relsql.Model(db, template, target="customer.churned", seed=5, progress=False)
        weights.append({n: w.detach().clone() for n, w in model.named_weights().items()})
        weights[-1].update({f"head.{n}": p.detach().clone() for n, p in model.learner.head.named_parameters()})
    assert weights[0].keys() == weights[1].keys() and any(k.startswith("head.") for k in weights[0])
    assert all(torch.equal(weights[0][n], weights[1][n]) for n in weights[0])
    other = relsql.Model(db, template, target="customer.churned", seed=6, progress=False)
    assert not torch.equal(other.learner.head.weight, weights[0]["head.weight"])
