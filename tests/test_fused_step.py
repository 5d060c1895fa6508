"""FusedStep (relsql/compile/step.py) against the regular path: the plan op by op through
autograd, the squared error as torch computes it, torch.optim's own step. Several steps of SGD
(plain, and with momentum, dampening, Nesterov and weight decay), Adam and AdamW, float64."""

from __future__ import annotations

import warnings

import pytest
import torch

import relsql
from relsql.compile.step import FusedStep, RegularStep, SquaredError
from tests.test_small_plans import dense_net, index_net

TOL = 1e-12
STEPS = 6
OPTIMIZERS = {
    "sgd": lambda ps: torch.optim.SGD(ps, lr=0.05),
    "sgd_momentum": lambda ps: torch.optim.SGD(ps, lr=0.03, momentum=0.9, dampening=0.1, weight_decay=0.01),
    "sgd_nesterov": lambda ps: torch.optim.SGD(ps, lr=0.03, momentum=0.8, nesterov=True),
    "adam": lambda ps: torch.optim.Adam(ps, lr=0.02, weight_decay=0.05),
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=0.02, weight_decay=0.1, betas=(0.8, 0.99)),
    "adam_foreach": lambda ps: torch.optim.Adam(ps, lr=0.02, foreach=True),
}


def loss_of(net) -> SquaredError:
    """Targets for two outputs: every row of one, some rows of the other (the rest have none)."""
    out = {k: v.detach() for k, v in net().items()}
    names = list(out)
    first, second = names[0], names[-1]
    rows = torch.arange(0, out[second].shape[0], 2)
    gen = torch.Generator().manual_seed(1)
    return SquaredError({first: torch.randn(out[first].shape, generator=gen, dtype=torch.float64),
                         second: torch.randn((len(rows), *out[second].shape[1:]), generator=gen, dtype=torch.float64)},
                        {first: None, second: rows})


def regular_step(net, opt, loss: SquaredError) -> torch.Tensor:
    """The path FusedStep replaces: forward op by op, torch's squared error, autograd, torch.optim."""
    opt.zero_grad(set_to_none=True)
    out = net()
    value = 0.0
    for name, target in loss.targets.items():
        rows = loss.rows[name]
        o = out[name] if rows is None else out[name].index_select(0, rows)
        value = value + torch.nn.functional.mse_loss(o, target, reduction="sum")
    value.backward()
    opt.step()
    return value.detach()


def trained(make_net, optimizer, fused_steps: int, regular_steps: int = 0, sync: bool = True):
    """Weights and losses after `fused_steps` FusedSteps then `regular_steps` regular ones (op by op)."""
    net = make_net()
    make = OPTIMIZERS[optimizer] if isinstance(optimizer, str) else optimizer
    opt = make([p for p in net.parameters() if p.requires_grad])
    loss = loss_of(net)
    losses = []
    if fused_steps:
        net.execution = "auto"
        step = FusedStep.build(net, opt, loss)
        assert step is not None
        losses += [float(step.step()) for _ in range(fused_steps)]
        if sync:
            step.sync()
    net.execution = "ops"
    losses += [float(regular_step(net, opt, loss)) for _ in range(regular_steps)]
    return {n: p.detach().clone() for n, p in net.weights_by_name().items()}, losses, net


@pytest.mark.parametrize("optimizer", list(OPTIMIZERS))
@pytest.mark.parametrize("make_net", [dense_net, index_net], ids=["dense", "index"])
def test_fused_steps_equal_the_regular_path(make_net, optimizer):
    ours, our_losses, _ = trained(make_net, optimizer, STEPS)
    theirs, their_losses, _ = trained(make_net, optimizer, 0, STEPS)
    start = {n: p.detach() for n, p in make_net().weights_by_name().items()}
    assert max(float((theirs[n] - start[n]).abs().max()) for n in theirs) > 1e-3  # the steps moved the weights
    for n in theirs:
        torch.testing.assert_close(ours[n], theirs[n], rtol=0, atol=TOL)
    assert our_losses == pytest.approx(their_losses, abs=TOL, rel=0)
    assert their_losses[-1] < their_losses[0]


@pytest.mark.parametrize("optimizer", ["sgd_momentum", "adam", "adamw"])
def test_sync_hands_the_moments_to_torch_optim(optimizer):
    """Three fused steps, sync, three regular ones equal six regular ones (the moments and the
    step count reached the torch optimizer's state); and back: a FusedStep built on an
    optimizer with state continues from it."""
    ours, our_losses, _ = trained(dense_net, optimizer, 3, 3)
    theirs, their_losses, _ = trained(dense_net, optimizer, 0, 6)
    for n in theirs:
        torch.testing.assert_close(ours[n], theirs[n], rtol=0, atol=TOL)
    assert our_losses == pytest.approx(their_losses, abs=TOL, rel=0)

    net = dense_net()
    opt = OPTIMIZERS[optimizer]([p for p in net.parameters() if p.requires_grad])
    loss = loss_of(net)
    net.execution = "ops"
    for _ in range(3):
        regular_step(net, opt, loss)
    net.execution = "auto"
    step = FusedStep.build(net, opt, loss)
    for _ in range(3):
        step.step()
    for n, p in net.weights_by_name().items():
        torch.testing.assert_close(p.detach(), theirs[n], rtol=0, atol=TOL)


def test_weights_stay_the_modules_parameters():
    """After fused steps the Parameters are the same objects holding the stepped values (the
    net's own forward reads them), and their .grad is the last step's gradient: autograd's at
    the weights before that step, None where the loss does not reach the weight."""
    net = dense_net()
    before = dict(net.weights_by_name())
    loss = loss_of(net)
    step = FusedStep.build(net, torch.optim.SGD(list(net.parameters()), lr=0.05), loss)
    step.step()
    at = {n: p.detach().clone() for n, p in net.weights_by_name().items()}
    value = step.step()
    assert all(net.weights_by_name()[n] is p for n, p in before.items())

    reference = dense_net()
    reference.set_named_weights(at)
    reference.execution = "ops"
    expected = regular_step(reference, torch.optim.SGD(list(reference.parameters()), lr=0.05), loss)
    assert float(value) == pytest.approx(float(expected), abs=TOL, rel=0)
    theirs = reference.weights_by_name()
    assert {n for n, p in theirs.items() if p.grad is not None} == {n for n, p in before.items() if p.grad is not None}
    for n, p in before.items():
        if p.grad is not None:
            torch.testing.assert_close(p.grad, theirs[n].grad, rtol=0, atol=TOL)
            torch.testing.assert_close(p.detach(), theirs[n].detach(), rtol=0, atol=TOL)  # both stepped from `at`
    net.execution = "ops"
    torch.testing.assert_close(net()["pooled"], reference()["pooled"], rtol=0, atol=TOL)


def test_unsupported_settings_keep_the_regular_path():
    net = dense_net()
    loss = loss_of(net)
    params = [p for p in net.parameters() if p.requires_grad]
    assert FusedStep.build(net, torch.optim.Adam(params, amsgrad=True), loss) is None
    assert FusedStep.build(net, torch.optim.RMSprop(params), loss) is None
    assert FusedStep.build(net, torch.optim.SGD(params[1:], lr=0.1), loss) is None  # a weight the optimizer misses
    assert FusedStep.build(net, torch.optim.SGD([{"params": params[:1]}, {"params": params[1:]}], lr=0.1), loss) is None
    net.execution = "ops"
    assert FusedStep.build(net, torch.optim.SGD(params, lr=0.1), loss) is None
    net.execution = "auto"
    assert FusedStep.build(net, torch.optim.SGD(params, lr=0.1), loss) is not None


@pytest.mark.parametrize("name", ["xor", "xor_vectorized", "family", "trains"])
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_neuralogic_small_datasets_step_exactly(name, optimizer):
    """NeuraLogic's small datasets with their shipped templates and their queries' targets."""
    pytest.importorskip("neuralogic")
    from relsql.datasets.neuralogic_files import BUILTIN_DATASETS, builtin_dataset_root, import_files

    root = builtin_dataset_root()
    spec = BUILTIN_DATASETS[name]

    def build():
        db = relsql.connect()
        tables = import_files(db.con, root / spec.examples, root / spec.queries if spec.queries else None)
        heads = [t.removeprefix("query_") for t in tables if t.startswith("query_")]
        template = relsql.Template.from_datalog((root / spec.template).read_text(),
                                                base_dir=str((root / spec.template).parent))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return relsql.compile(template, db, dtype=torch.float64, seed=3, outputs=heads)

    nets = [build(), build()]
    results = []
    for k, net in enumerate(nets):
        opt = OPTIMIZERS[optimizer]([p for p in net.parameters() if p.requires_grad])
        loss = loss_of(net)
        if k == 0:
            step = FusedStep.build(net, opt, loss)
            assert step is not None
            losses = [float(step.step()) for _ in range(STEPS)]
        else:
            net.execution = "ops"
            losses = [float(regular_step(net, opt, loss)) for _ in range(STEPS)]
        results.append(({n: p.detach().clone() for n, p in net.weights_by_name().items()}, losses))
    (ours, our_losses), (theirs, their_losses) = results
    for n in theirs:
        torch.testing.assert_close(ours[n], theirs[n], rtol=0, atol=TOL)
    assert our_losses == pytest.approx(their_losses, abs=TOL, rel=0)


@pytest.mark.parametrize("optimizer", ["sgd_momentum", "adam"])
def test_choice_by_timing_leaves_no_trace(optimizer):
    """`choose` times the regular path and the fused steps on the real weights, then puts the
    weights and the optimizer state back: whichever it picks, training from there equals the
    regular path from the start."""
    from relsql.compile.step import choose
    from relsql.compile.step import regular_step as step_of

    net = dense_net()
    opt = OPTIMIZERS[optimizer]([p for p in net.parameters() if p.requires_grad])
    loss = loss_of(net)
    start = {n: p.detach().clone() for n, p in net.weights_by_name().items()}
    chosen = choose(net, opt, loss)
    assert chosen is None or isinstance(chosen, FusedStep | RegularStep)
    assert not opt.state
    for n, p in net.weights_by_name().items():
        assert torch.equal(p.detach(), start[n]) and (p.grad is None or not p.grad.any())  # a FusedStep's grads start at 0
    losses = [float(chosen.step() if chosen is not None else step_of(net, opt, loss)) for _ in range(STEPS)]
    if isinstance(chosen, FusedStep):  # the fused steps replace the op-by-op path
        theirs, their_losses, _ = trained(dense_net, optimizer, 0, STEPS)
    else:  # the regular path as the net runs it (fused through autograd): there, a weight read only by
        # outputs the loss leaves out ('matrix') gets a zero gradient rather than none, so SGD's weight
        # decay moves it where the op-by-op path leaves it (3.5e-3 after 6 steps; picked only under load)
        fresh = dense_net()
        fresh_opt = OPTIMIZERS[optimizer]([p for p in fresh.parameters() if p.requires_grad])
        fresh_loss = loss_of(fresh)
        their_losses = [float(step_of(fresh, fresh_opt, fresh_loss)) for _ in range(STEPS)]
        theirs = {n: p.detach().clone() for n, p in fresh.weights_by_name().items()}
    for n, p in net.weights_by_name().items():
        torch.testing.assert_close(p.detach(), theirs[n], rtol=0, atol=TOL)
    assert losses == pytest.approx(their_losses, abs=TOL, rel=0)


@pytest.mark.parametrize("kind", ["fused", "regular"])
def test_a_step_on_one_thread_trains_alike_and_gives_the_threads_back(kind):
    """A step `choose` puts on one torch thread (small plans: no waking of the others for each
    product), fused or regular, trains as the regular path does and leaves the caller's count."""
    net = dense_net()
    opt = OPTIMIZERS["adam"]([p for p in net.parameters() if p.requires_grad])
    if kind == "fused":
        step = FusedStep.build(net, opt, loss_of(net))
        step.threads = 1
    else:
        net.execution = "ops"  # as `trained` runs the regular path
        step = RegularStep(net, opt, loss_of(net), 1)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        losses = [float(step.step()) for _ in range(STEPS)]
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    theirs, their_losses, _ = trained(dense_net, "adam", 0, STEPS)
    for n, p in net.weights_by_name().items():
        torch.testing.assert_close(p.detach(), theirs[n], rtol=0, atol=TOL)
    assert losses == pytest.approx(their_losses, abs=TOL, rel=0)
