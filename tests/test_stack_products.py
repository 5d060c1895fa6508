"""passes/stack_products.py: a sum of weights on constants (products, embedding lookups, lookups
of products) becomes one product of the constants side by side and the weights stacked, with the
plain plan's values and gradients (float64), fused or op by op; what it must leave alone stays."""

from __future__ import annotations

import torch

import relsql
from relsql.compile.module import CompiledNet
from relsql.compile.passes.stack_products import LOOKUP_ROWS, stack_products
from tests.plan_check import assert_same, fired_counts, run
from tests.test_small_plans import Build

ROWS = 7


def _tensor(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _plan(table_rows: int = 5, shared_lookup: bool = False) -> tuple[Build, dict[str, int]]:
    """tanh(X W1ᵀ + D W2ᵀ + E[i] + gather(C W3ᵀ, j) + tanh(X W4ᵀ)) over ROWS rows: four weights on
    constants and one term that is not (a weight on a value computed from a weight)."""
    b = Build()
    x, d = b.input(_tensor(ROWS, 3, seed=1)), b.input(_tensor(ROWS, 1, seed=2))
    i = b.input(torch.tensor([0, 2, 1, table_rows - 1, 0, 2, 1]))
    c, j = b.input(_tensor(3, 2, seed=3)), b.input(torch.tensor([2, 2, 0, 1, 0, 1, 2]))
    w1, w2 = b.weight("w1", _tensor(4, 3, seed=4)), b.weight("w2", _tensor(4, 1, seed=5))
    w3 = b.weight("w3", _tensor(4, 2, seed=6))
    e, w4 = b.weight("e", _tensor(table_rows, 4, seed=7)), b.weight("w4", _tensor(4, 3, seed=8))
    lookup = b.op("gather", e, i)
    terms = [b.op("linear", w1, x), b.op("linear", w2, d), lookup, b.op("gather", b.op("linear", w3, c), j),
             b.op("act", b.op("linear", w4, x), name="tanh")]
    total = terms[0]
    for term in terms[1:]:  # a chain of binary additions, as the plan builder writes a statement's sum
        total = b.op("binary", total, term, op="+")
    out = b.op("act", total, name="tanh")
    outputs = {"out": out}
    if shared_lookup:
        outputs["lookup"] = lookup  # the lookup is read elsewhere too: it must stay
    return b, outputs


def _values_and_gradients(net: CompiledNet) -> tuple[dict, dict]:
    for p in net.parameters():
        p.grad = None
    outputs = net()
    sum((o.sin() * (1 + torch.arange(o.numel(), dtype=o.dtype).reshape(o.shape) % 3)).sum()
        for o in outputs.values()).backward()
    return ({k: v.detach().clone() for k, v in outputs.items()},
            {n: p.grad.clone() for n, p in net.weights_by_name().items()})


def _plain_and_stacked(**options) -> tuple[tuple, tuple, CompiledNet]:
    plain_build, outputs = _plan(**options)
    plain = plain_build.net(**outputs)
    plain.execution = "ops"
    stacked_build, outputs = _plan(**options)
    stacked_build.plan.outputs.update(outputs)
    stack_products(stacked_build.plan)
    stacked = CompiledNet(stacked_build.plan, None, dtype=torch.float64)
    stacked.execution = "ops"
    return (*_values_and_gradients(plain), None), (*_values_and_gradients(stacked), None), stacked


def test_weights_on_constants_become_one_product_with_the_same_values_and_gradients():
    reference, candidate, net = _plain_and_stacked()
    assert_same(reference, candidate, "stack_products")
    kinds = [op.kind for op in net.plan.ops]
    assert kinds.count("stacked_linear") == 1 and kinds.count("gather") == 0 and kinds.count("binary") == 0
    stacked = next(op for op in net.plan.ops if op.kind == "stacked_linear")
    assert len(stacked.args) == 5 and stacked.attrs["transposed"] == (True, True, False, True)  # w1, w2, e, w3
    assert net.plan.inputs[stacked.args[0]].shape == (ROWS, 3 + 1 + 5 + 2)
    assert kinds.count("linear") == 1  # tanh(X W4ᵀ) is no weight on a constant: added to the product
    assert "stack_products: 1 sums of 4 weights" in net.plan.log[-1]


def test_fused_code_agrees_with_the_ops():
    _, _, net = _plain_and_stacked()
    ops = _values_and_gradients(net)
    net.execution = "fused"
    fused = _values_and_gradients(net)
    assert net.fused_reason is None  # the generated code ran, with its own backward of the stacked product
    for a, b in zip(ops, fused):
        for name in a:
            torch.testing.assert_close(a[name], b[name], rtol=0, atol=1e-12)


def test_a_large_table_and_a_shared_lookup_stay_gathers():
    reference, candidate, net = _plain_and_stacked(table_rows=LOOKUP_ROWS + 1)
    assert_same(reference, candidate, "stack_products, large table")
    stacked = next(op for op in net.plan.ops if op.kind == "stacked_linear")
    assert stacked.attrs["transposed"] == (True, True, True)  # w1, w2, w3; e's lookup stays a gather
    assert any(op.kind == "gather" and op.args[0] in net.plan.param_slots for op in net.plan.ops)
    reference, candidate, net = _plain_and_stacked(shared_lookup=True)
    assert_same(reference, candidate, "stack_products, shared lookup")
    assert next(op for op in net.plan.ops if op.kind == "stacked_linear").attrs["transposed"] == (True, True, True)


def test_an_automatic_template_s_encoders_are_stacked(tmp_path):
    from tests.test_auto_outside_shapes import _unknown_times_db

    db = _unknown_times_db(tmp_path / "shop.duckdb")
    template = relsql.Template.auto(db, target="customer.churned", time_column="seen")
    reference, optimized = run(template, db, ()), run(template, db, None)
    assert_same(reference, optimized, "all passes")
    assert fired_counts(optimized[2]).get("stack_products", 0) > 0


def test_replayed_batch_plans_rebuild_the_stacked_constants(tmp_path):
    # the stacked constants are made from a batch's index tensors: a plan replayed for a later batch
    # (relsql/compile/reuse.py) must make them from that batch's, not keep the first batch's
    from tests.test_auto_outside_shapes import _unknown_times_db
    from tests.test_plan_reuse import check_batches, quiet, random_batches

    db = _unknown_times_db(tmp_path / "shop.duckdb")
    template = relsql.Template.auto(db, target="customer.churned", time_column="seen")
    model = quiet(relsql.Model, db, template, target="customer.churned", time_column="seen", seed=0,
                  dtype=torch.float64, progress=False, batch_size=32)
    batch = model.batched.prepare(random_batches(model.output_rows, [32], 1, seed=3)[0], 0)
    assert any(op.kind == "stacked_linear" for op in batch.plan.ops)
    stats = check_batches(model, random_batches(model.output_rows, [32, 32, 20, 32], 16, seed=4), [0] * 16)
    assert stats["replayed"] >= 5, stats


def test_bench_pass_off_compares_a_plan_with_and_without_the_pass(tmp_path):
    from bench import pass_off
    from tests.test_auto_outside_shapes import _unknown_times_db

    _unknown_times_db(tmp_path / "shop.duckdb").close()
    manifest = {"name": "shop", "path": str(tmp_path / "shop.duckdb"), "keys": None}
    row = pass_off.measure(manifest, {"target": "customer.churned", "time_column": "seen"}, "stack_products", 1, 1)
    assert row["ops_on"] < row["ops_off"] and row["ms_on"] > 0 and row["ms_off"] > 0
