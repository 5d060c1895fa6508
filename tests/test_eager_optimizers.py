"""fit's optimizers without torch.compile's guards (relsql/train/eager.py): torch's own
optimizers are the oracle (bitwise the same weights and state, a state dict that passes between
the two), and a fit, report and save in a fresh process no longer import torch._dynamo (~1 CPU-s
at the first optimizer before) nor matplotlib's pyplot (which also switched the user's backend)."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from relsql.train.eager import eager

SETTINGS = [
    (torch.optim.Adam, {"lr": 0.01, "fused": True}),  # fit's default: Adam with torch's fused kernel
    (torch.optim.AdamW, {"lr": 0.01, "weight_decay": 0.1, "fused": True}),
    (torch.optim.Adam, {"lr": 0.01, "foreach": True}),  # weights on several devices or of other dtypes
    (torch.optim.Adagrad, {"lr": 0.1}),  # embedding_optimizer="adagrad"
    (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9}),
]


def _weights() -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(3)
    return [torch.randn(6, 4, dtype=torch.float64, generator=generator), torch.randn(5, generator=generator)]


def _steps(optimizer: torch.optim.Optimizer, weights: list[torch.nn.Parameter], seed: int, n: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    for _ in range(n):
        for w in weights:
            w.grad = torch.randn(w.shape, dtype=w.dtype, generator=generator)
        optimizer.step()
        optimizer.zero_grad()


@pytest.mark.parametrize("base, settings", SETTINGS, ids=lambda v: v.__name__ if isinstance(v, type) else "")
def test_the_same_weights_and_state_as_torchs_optimizer(base, settings):
    ours = [torch.nn.Parameter(w.clone()) for w in _weights()]
    theirs = [torch.nn.Parameter(w.clone()) for w in _weights()]
    mine, reference = eager(base)(ours, **settings), base(theirs, **settings)
    assert isinstance(mine, base) and type(mine) is not base
    _steps(mine, ours, 0, 6)
    _steps(reference, theirs, 0, 6)
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs))
    assert all(a.grad is None for a in ours)  # zero_grad's default: set to None
    # the state dict passes from one to the other (a checkpoint written by either resumes in the other)
    restored = eager(base)([torch.nn.Parameter(w.detach().clone()) for w in theirs], **settings)
    restored.load_state_dict(copy.deepcopy(reference.state_dict()))  # as from a file: no tensor shared
    moved = list(restored.param_groups[0]["params"])
    _steps(restored, moved, 1, 3)
    _steps(reference, theirs, 1, 3)
    assert all(torch.equal(a, b) for a, b in zip(moved, theirs))
    assert str(mine.state_dict()["state"].keys()) == str(reference.state_dict()["state"].keys())


def test_a_new_param_group_trains_like_torchs():
    first, later = _weights()
    ours = [torch.nn.Parameter(first.clone()), torch.nn.Parameter(later.clone())]
    theirs = [torch.nn.Parameter(first.clone()), torch.nn.Parameter(later.clone())]
    mine, reference = eager(torch.optim.Adam)(ours[:1], lr=0.01), torch.optim.Adam(theirs[:1], lr=0.01)
    mine.add_param_group({"params": ours[1:], "lr": 0.05})  # what a batch's new weights do (Optimizers.add)
    reference.add_param_group({"params": theirs[1:], "lr": 0.05})
    _steps(mine, ours, 2, 4)
    _steps(reference, theirs, 2, 4)
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs))


def test_lbfgs_reaches_the_same_minimum_as_torchs():
    """The report's linear baseline (relsql/train/gbm/baselines.py: own_columns): LBFGS with a closure."""
    generator = torch.Generator().manual_seed(5)
    x, y = torch.randn(40, 3, dtype=torch.float64, generator=generator), torch.randn(40, dtype=torch.float64, generator=generator)
    found = []
    for make in (eager(torch.optim.LBFGS), torch.optim.LBFGS):
        weight = torch.zeros(3, dtype=torch.float64, requires_grad=True)
        optimizer = make([weight], max_iter=50, line_search_fn="strong_wolfe")

        def closure(optimizer=optimizer, weight=weight):
            optimizer.zero_grad()
            loss = (x @ weight - y).pow(2).mean()
            loss.backward()
            return loss

        optimizer.step(closure)
        found.append(weight.detach().clone())
    assert torch.equal(found[0], found[1])
    assert torch.allclose(found[0], torch.linalg.lstsq(x, y).solution, atol=1e-4)  # the least-squares answer, to its tolerance


def test_step_hooks_run_once_a_step_after_torchs_own_class_was_used():
    """torch wraps a class's step with its hook runner when the first instance is made; fit's class
    runs that wrapper once, and never a second one from torch's class."""
    torch.optim.Adam([torch.nn.Parameter(torch.zeros(2))], lr=0.1).step()  # torch's Adam.step now wrapped
    calls = []
    handle = register_optimizer_step_post_hook(lambda *_: calls.append(1))
    try:
        weight = torch.nn.Parameter(torch.ones(2))
        optimizer = eager(torch.optim.Adam)([weight], lr=0.1)
        for _ in range(3):
            weight.grad = torch.ones(2)
            optimizer.step()
    finally:
        handle.remove()
    assert len(calls) == 3


def test_no_graph_is_built_through_the_update():
    weight = torch.nn.Parameter(torch.ones(3))
    optimizer = eager(torch.optim.SGD)([weight], lr=0.5)
    weight.grad = torch.ones(3)
    with torch.enable_grad():
        optimizer.step()
    assert weight.grad_fn is None and torch.equal(weight.detach(), torch.full((3,), 0.5))


def test_a_fit_in_a_fresh_process_does_not_import_the_compiler(tmp_path):
    """Nor pyplot: the metrics plot that save() writes is drawn on a Figure of its own."""
    code = textwrap.dedent(f"""
        import sys
        import matplotlib
        matplotlib.use("svg")  # the user's backend: saving a model's metrics plot must leave it as it is
        import relsql
        from bench import relgen
        path = relgen.write(relgen.shop(0, scale=0.05), {str(tmp_path / "shop.duckdb")!r}, "customer.churned")
        db = relsql.connect(path)
        model = relsql.Model(db, relsql.Template.auto(db, target="customer.churned"), target="customer.churned",
                             progress=False)
        model.fit(epochs=3)
        rows = model.predict().height
        assert "baseline (a linear model" in model.report()  # LBFGS, as the CLI's train prints it
        saved = model.save({str(tmp_path / "model.pt")!r})
        plot = {str(tmp_path / "model.png")!r}
        with open(plot, "rb") as f:
            assert f.read(8) == bytes([137, 80, 78, 71, 13, 10, 26, 10]), "not a PNG"  # the metrics plot
        assert matplotlib.get_backend() == "svg" and "matplotlib.pyplot" not in sys.modules
        print("rows", rows, "compiler imported:", "torch._dynamo" in sys.modules)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert done.returncode == 0, done.stderr[-3000:]
    line = done.stdout.strip().splitlines()[-1]
    assert line.startswith("rows ") and int(line.split()[1]) > 0
    assert line.endswith("compiler imported: False"), line
