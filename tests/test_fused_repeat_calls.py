"""A fused plan's repeated calls (CompiledNet reruns the last generated code after checking its
weights' requires_grad) follow weights frozen, unfrozen or replaced between calls, and the
store's sort-based distinct values equal numpy's."""

from __future__ import annotations

import numpy as np
import torch

from relsql.ground.store.read import unique
from tests.test_small_plans import TOL, dense_net, run


def test_freezing_between_fused_calls_drops_that_gradient():
    net = dense_net()
    first = run(net, "fused")
    assert net.fused_reason is None and "matrix" in first[1]
    net.weights_by_name()["matrix"].requires_grad_(False)
    frozen = run(net, "fused")
    assert "matrix" not in frozen[1]
    expected = run(net, "ops")  # op by op with the same frozen weight: autograd's own answer
    assert frozen[1].keys() == expected[1].keys()
    for k in expected[1]:
        torch.testing.assert_close(frozen[1][k], expected[1][k], rtol=0, atol=TOL)
    net.weights_by_name()["matrix"].requires_grad_(True)
    again = run(net, "fused")
    torch.testing.assert_close(again[1]["matrix"], first[1]["matrix"], rtol=0, atol=TOL)


def test_a_weight_set_between_fused_calls_is_the_one_read():
    net = dense_net()
    before = run(net, "fused")[0]
    with torch.no_grad():
        net.weights_by_name()["out"].mul_(2.0)
    after_fused = run(net, "fused")
    after_ops = run(net, "ops")
    assert not torch.allclose(after_fused[0]["pooled"], before["pooled"])
    for k in after_ops[0]:
        torch.testing.assert_close(after_fused[0][k], after_ops[0][k], rtol=0, atol=TOL)
    for k in after_ops[1]:
        torch.testing.assert_close(after_fused[1][k], after_ops[1][k], rtol=0, atol=TOL)


def test_ops_after_fused_runs_op_by_op():
    net = dense_net()
    net.execution = "fused"
    assert type(net()["pooled"].grad_fn).__name__ == "_PlanBackward"  # the one node of the fused plan
    net.execution = "ops"
    assert type(net()["pooled"].grad_fn).__name__ != "_PlanBackward"  # the interpreter's own ops
    net.execution = "fused"
    assert type(net()["pooled"].grad_fn).__name__ == "_PlanBackward"


def test_sorted_distinct_values_equal_numpy():
    rng = np.random.default_rng(0)
    for values in [np.zeros(0, np.int64), np.array([7], np.int64), np.array([3, 3, 3], np.int64),
                   rng.integers(0, 50, 1000), rng.integers(-5, 5, 17), rng.permutation(300)]:
        ours = unique(values)
        assert ours.dtype == values.dtype
        np.testing.assert_array_equal(ours, np.unique(values))
