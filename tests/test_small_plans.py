"""Small plans fused into one generated function (relsql/compile/fused.py) compute what the plan
computes op by op: the same values and gradients in float64 (1e-12), on NeuraLogic's small
datasets and on hand-built plans covering every fused rule; finite differences
(torch.autograd.gradcheck) check the hand-written backward independently of autograd."""

from __future__ import annotations

import warnings

import pytest
import torch

import relsql
from relsql.compile import fused, sparse
from relsql.compile.module import CompiledNet
from relsql.compile.plan import Op, ParamSpec, Plan, make_op

TOL = 1e-12


class Build:
    """A plan written by hand: inputs, weights (with their values) and ops by kind."""

    def __init__(self):
        self.plan = Plan()

    def input(self, tensor: torch.Tensor) -> int:
        return self.plan.add_input(tensor)

    def weight(self, name: str, value: torch.Tensor) -> int:
        plan = self.plan
        plan.params[name] = ParamSpec(name, tuple(value.shape), "datalog", value.reshape(-1).tolist(), False)
        slot = plan.new_slot()
        plan.meta[slot] = torch.empty(tuple(value.shape), dtype=torch.float64, device="meta")
        plan.param_slots.add(slot)
        plan.ops.append(Op("param", slot, (), {"name": name}, rows=1, shape=tuple(value.shape)))
        return slot

    def op(self, op_kind: str, *args: int, row_count: int | None = None, **attrs) -> int:
        op = make_op(self.plan, op_kind, args, f"test {op_kind}", row_count=row_count, **attrs)
        self.plan.ops.append(op)
        return op.out

    def net(self, **outputs: int) -> CompiledNet:
        self.plan.outputs.update(outputs)
        return CompiledNet(self.plan, None, dtype=torch.float64)


def column(*values: float) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64).reshape(-1, 1)


def run(net: CompiledNet, execution: str) -> tuple[dict, dict]:
    """Outputs and weight gradients of a loss that reads every output (squares: gradients
    depend on the values)."""
    net.execution = execution
    for p in net.parameters():
        p.grad = None
    outputs = net()
    loss = sum(((o * o).sum() + o.sum() * (i + 1)) for i, o in enumerate(outputs.values()))
    loss.backward()
    grads = {n: p.grad.clone() for n, p in net.weights_by_name().items() if p.grad is not None}
    return {k: v.detach().clone() for k, v in outputs.items()}, grads


def assert_same(net: CompiledNet) -> None:
    """Fused (which must happen) and op by op agree in values and gradients."""
    ours, theirs = run(net, "fused"), run(net, "ops")
    assert net.execution == "ops"
    net.execution = "fused"
    net()
    assert net.fused_reason is None
    assert ours[0].keys() == theirs[0].keys() and ours[1].keys() == theirs[1].keys()
    for k in theirs[0]:
        assert ours[0][k].shape == theirs[0][k].shape
        torch.testing.assert_close(ours[0][k], theirs[0][k], rtol=0, atol=TOL)
    for k in theirs[1]:
        torch.testing.assert_close(ours[1][k], theirs[1][k], rtol=0, atol=TOL)


def dense_net() -> CompiledNet:
    """Every dense rule: each linear case, activations, reductions, combinations, sums."""
    b = Build()
    x = b.input(column(0.3, -1.2, 0.7, 2.0))
    v = b.input(torch.tensor([[0.1, -0.4, 0.9], [1.1, 0.2, -0.3], [-0.5, 0.6, 0.8], [0.0, 0.4, -1.0]], dtype=torch.float64))
    s = b.op("linear", b.weight("scalar", torch.tensor([0.8], dtype=torch.float64)), x)
    h = b.op("act", s, name="tanh")
    wide = b.op("linear", b.weight("vector", torch.tensor([0.5, -1.5, 2.0], dtype=torch.float64)), h)  # (m,) x (1,)
    ew = b.op("linear", b.weight("elementwise", torch.tensor([1.0, 0.3, -0.7], dtype=torch.float64)), v)
    m = b.op("linear", b.weight("matrix", torch.tensor([[0.2, -0.1, 0.4], [0.7, 0.5, -0.6]], dtype=torch.float64)), v)
    sig = b.op("act", b.op("combine", wide, ew, kind="avg"), name="sigmoid")
    relu = b.op("act", b.op("sum", ew, sig, wide), name="relu")
    back = b.op("linear", b.weight("out", torch.tensor([[0.9, -0.8, 0.3]], dtype=torch.float64)), relu)
    pooled = b.op("dense_reduce", b.op("combine", back, s, kind="sum"), kind="avg", width=2)
    summed = b.op("dense_reduce", m, kind="sum", width=4)
    again = b.op("act", b.op("linear", b.weight("scalar", torch.tensor([0.8], dtype=torch.float64)), pooled), name="exp")
    one = b.op("dense_reduce", b.op("act", m, name="identity"), kind="avg", width=1)  # width 1: an alias
    return b.net(pooled=pooled, summed=summed, again=again, one=one, h=h)


def index_net() -> CompiledNet:
    """Rows moved around: gather, scatter, cat, slice, columns, affine, sparse products."""
    b = Build()
    x = b.input(torch.tensor([[0.3, -1.0], [1.2, 0.5], [-0.7, 0.8]], dtype=torch.float64))
    w = b.weight("w", torch.tensor([[0.4, -0.2], [0.1, 0.9], [-0.6, 0.3]], dtype=torch.float64))
    h = b.op("act", b.op("linear", w, x), name="tanh")  # (3, 3)
    picked = b.op("gather", h, b.input(torch.tensor([2, 0, 2, 1, 0])))
    placed = b.op("scatter", picked, b.input(torch.tensor([1, 1, 0, 3, 2])), rows=4)
    stacked = b.op("cat", placed, b.op("slice", h, start=1, rows=2), row_count=6)  # (6, 3)
    narrow = b.op("columns", stacked, start=1, width=2)
    affine = b.op("affine", b.weight("bias", torch.tensor([[0.05, -0.1]], dtype=torch.float64)), narrow,
                  b.weight("square", torch.tensor([[1.0, 0.5], [-0.3, 0.8]], dtype=torch.float64)))
    matrix = sparse.from_coo(torch.tensor([0, 0, 1, 3, 3]), torch.tensor([1, 4, 5, 0, 2]),
                             torch.tensor([1.0, 0.5, 2.0, -1.0, 0.25], dtype=torch.float64), (4, 6))
    csr, transposed = sparse.moved(matrix, "cpu", torch.float64)
    product = b.op("spmm", b.input(csr), b.input(transposed), b.op("act", affine, name="sigmoid"))
    dense = b.input(torch.tensor([[1.0, 0.0, 2.0, 0.0], [0.0, -1.0, 0.0, 3.0]], dtype=torch.float64))
    added = b.op("addspmm", b.op("act", b.op("slice", affine, start=0, rows=2), name="tanh"), dense, product)
    return b.net(product=product, added=added)


@pytest.mark.parametrize("make", [dense_net, index_net], ids=["dense", "index"])
def test_every_rule_equals_the_op_by_op_plan(make):
    assert_same(make())


@pytest.mark.parametrize("make", [dense_net, index_net], ids=["dense", "index"])
def test_fused_gradients_match_finite_differences(make):
    """The generated backward against finite differences (no autograd formula involved)."""
    assert fused_gradcheck(make())


def fused_gradcheck(net) -> bool:
    """torch's gradcheck of `net`'s generated fused code (forward and backward) at its weights."""
    net.execution = "fused"
    net()
    code = next(c for c in net._fused.values() if isinstance(c, fused.Fused))
    inputs = [net._buffers[net._inputs[s]] for s in code.inputs]
    weights = net.weights_by_name()
    start = [weights[n].detach().clone().requires_grad_(True) for n in code.names]
    return torch.autograd.gradcheck(lambda *w: tuple(fused.run(code, list(w), inputs).values()), start)


def test_training_steps_agree():
    """Ten SGD steps fused and ten op by op end at the same weights."""
    ends = {}
    for execution in ("fused", "ops"):
        net = dense_net()
        net.execution = execution
        opt = torch.optim.SGD(net.parameters(), lr=0.05)
        for _ in range(10):
            opt.zero_grad(set_to_none=True)
            out = net()
            (out["pooled"].square().sum() + out["again"].sum()).backward()
            opt.step()
        ends[execution] = {n: p.detach().clone() for n, p in net.weights_by_name().items()}
    for n in ends["ops"]:
        torch.testing.assert_close(ends["fused"][n], ends["ops"][n], rtol=0, atol=TOL)


def test_frozen_weights_get_no_gradient_and_no_grad_calls_work():
    net = dense_net()
    net.execution = "fused"
    net.weights_by_name()["matrix"].requires_grad_(False)
    ours = run(net, "fused")
    assert net.fused_reason is None and "matrix" not in ours[1]
    theirs = run(net, "ops")
    for k in theirs[1]:
        torch.testing.assert_close(ours[1][k], theirs[1][k], rtol=0, atol=TOL)
    net.execution = "fused"
    with torch.no_grad():
        values = net()
    assert not values["pooled"].requires_grad
    torch.testing.assert_close(values["pooled"], theirs[0]["pooled"], rtol=0, atol=TOL)


def test_an_output_that_is_a_weight_is_a_copy():
    """Writing into an output (the weight itself op by op) must not change the fused net's weight."""
    b = Build()
    w = b.weight("w", torch.tensor([[0.5], [-0.5]], dtype=torch.float64))
    x = b.input(column(1.0, 2.0))
    y = b.op("act", b.op("linear", b.weight("s", torch.tensor([2.0], dtype=torch.float64)), x), name="identity")
    net = b.net(w=w, y=y)
    assert_same(net)
    net.execution = "fused"
    out = net()
    assert net.fused_reason is None
    with torch.no_grad():
        out["w"].add_(1.0)
    assert net.weights_by_name()["w"].detach().tolist() == [[0.5], [-0.5]]


def test_unfusable_plans_run_op_by_op():
    b = Build()
    x = b.input(column(1.0, 2.0, 3.0))
    y = b.op("dropout", b.op("linear", b.weight("s", torch.tensor([2.0], dtype=torch.float64)), x), p=0.5)
    net = b.net(y=y)
    net()
    assert net.fused_reason == "op dropout"
    big = Build()
    x = big.input(torch.ones((fused.OP_ELEMENTS + 1, 1), dtype=torch.float64))
    net = big.net(y=big.op("act", big.op("linear", big.weight("s", torch.tensor([2.0], dtype=torch.float64)), x),
                           name="tanh"))
    values = net()
    assert net.fused_reason == f"its ops' values hold {fused.OP_ELEMENTS + 1} elements on average (fused up to " \
                               f"{fused.OP_ELEMENTS})" and values["y"].shape == (fused.OP_ELEMENTS + 1, 1)
    assert_same(net)  # the switch fuses whatever the size; (1,) weights' gradients one by one at this many rows


DATASETS = ("xor", "xor_vectorized", "family", "trains")


@pytest.mark.parametrize("name", DATASETS)
def test_neuralogic_small_datasets_fuse_exactly(name, tmp_path):
    """NeuraLogic's small datasets with their shipped templates: fused, and equal to op by op."""
    pytest.importorskip("neuralogic")
    from relsql.datasets.neuralogic_files import BUILTIN_DATASETS, builtin_dataset_root, import_files

    root = builtin_dataset_root()
    spec = BUILTIN_DATASETS[name]
    db = relsql.connect()
    tables = import_files(db.con, root / spec.examples, root / spec.queries if spec.queries else None)
    heads = [t.removeprefix("query_") for t in tables if t.startswith("query_")]
    template = relsql.Template.from_datalog((root / spec.template).read_text(), base_dir=str((root / spec.template).parent))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        net = relsql.compile(template, db, dtype=torch.float64, seed=3, outputs=heads)
    assert_same(net)


def test_outputs_sharing_a_tensor_and_views_of_outputs():
    """Two outputs that are one tensor come back as two; a view of an output that the backward
    reads is saved with autograd's checks, not kept on ctx: the outputs die with their last
    reference, without the cycle collector."""
    import gc
    import weakref

    b = Build()
    x = b.input(column(0.1, 0.2, 0.3))
    h = b.op("act", b.op("linear", b.weight("w", torch.tensor([0.7], dtype=torch.float64)), x), name="tanh")
    same = b.op("dense_reduce", h, kind="avg", width=1)
    y = b.op("linear", b.weight("v", torch.tensor([1.5], dtype=torch.float64)), b.op("slice", h, start=1, rows=2))
    net = b.net(h=h, same=same, y=y)
    assert_same(net)
    net.execution = "fused"
    out = net()
    assert out["h"] is not out["same"]
    gc.disable()
    try:
        out = net()
        alive = weakref.ref(out["h"])
        del out
        assert alive() is None
    finally:
        gc.enable()
