"""average_from_sum: a mean and a sum of the same groundings become one sum and a constant factor.
Values and gradients equal the plain plan's in float64 (an empty segment's mean is 0, whichever
aggregate comes first); a mean without a sum of its groundings, or over other groundings, is left
alone; Template.auto's plans, which take both, fire it and fuse."""

from __future__ import annotations

import torch

from relsql.compile.passes import average_from_sum
from tests.test_small_plans import Build, assert_same, column


def mean_and_sum_net(mean_first: bool) -> tuple:
    """Groundings of 6 rows into 4 segments (segment 2 empty), their mean and sum each through a
    weight, plus a mean of other groundings (a gather of the same values) that has no sum."""
    b = Build()
    x = b.input(torch.tensor([[0.3, -1.0], [1.2, 0.5], [0.9, 0.2], [-0.7, 0.8], [0.4, -0.3], [1.1, 0.6]],
                             dtype=torch.float64))
    h = b.op("act", b.op("linear", b.weight("w", torch.tensor([[0.4, -0.2], [0.1, 0.9]], dtype=torch.float64)), x),
             name="tanh")
    ids, counts = b.input(torch.tensor([0, 0, 1, 1, 3, 3])), b.input(torch.tensor([2, 2, 0, 2]))
    kinds = ("avg", "sum") if mean_first else ("sum", "avg")
    reduced = {kind: b.op("segment", h, ids, counts, kind=kind) for kind in kinds}
    other = b.op("segment", b.op("gather", h, b.input(torch.tensor([5, 4, 3, 2, 1, 0]))), ids, counts, kind="avg")
    mixed = {kind: b.op("linear", b.weight(f"m_{kind}", torch.tensor([[0.7, -0.3], [0.2, 0.5]], dtype=torch.float64)),
                        slot) for kind, slot in reduced.items()}
    out = b.op("act", b.op("sum", mixed["avg"], mixed["sum"], other), name="tanh")
    scale = b.input(column(1.0, 2.0, 3.0, 4.0))
    return b, dict(out=out, mean=reduced["avg"], scaled=b.op("binary", reduced["sum"], scale, op="*"))


def values_and_gradients(net) -> tuple[dict, dict]:
    net.execution = "ops"
    outputs = net()
    sum(((o * o).sum() + o.sum() * (i + 1)) for i, o in enumerate(outputs.values())).backward()
    return ({k: v.detach() for k, v in outputs.items()},
            {n: p.grad.clone() for n, p in net.weights_by_name().items()})


def test_a_mean_reads_the_sum_of_its_groundings():
    for mean_first in (True, False):
        b, outputs = mean_and_sum_net(mean_first)
        plain = values_and_gradients(b.net(**outputs))
        b, outputs = mean_and_sum_net(mean_first)
        b.plan.outputs.update(outputs)  # the pass redirects the relations' outputs it moves
        b.plan = average_from_sum(b.plan)
        segments = [op.attrs["kind"] for op in b.plan.ops if op.kind == "segment"]
        assert sorted(segments) == ["avg", "sum"], segments  # one sum for both; the other groundings' mean stays
        assert b.plan.log[-1] == "average_from_sum: 1 means read the sum of the same groundings"
        net = b.net()
        rewritten = values_and_gradients(net)
        assert torch.equal(rewritten[0]["mean"][2], torch.zeros(2, dtype=torch.float64))  # the empty segment
        for got, want in zip(rewritten, plain):
            assert got.keys() == want.keys()
            for k in want:
                torch.testing.assert_close(got[k], want[k], rtol=0, atol=1e-14)
        assert_same(net)  # and the fused plan agrees with op by op


def test_a_mean_without_its_sum_is_left_alone():
    b = Build()
    x = b.input(torch.tensor([[0.3], [1.2], [0.9]], dtype=torch.float64))
    h = b.op("linear", b.weight("w", torch.tensor([[0.4]], dtype=torch.float64)), x)
    ids, counts = b.input(torch.tensor([0, 0, 1])), b.input(torch.tensor([2, 1]))
    mean = b.op("segment", h, ids, counts, kind="avg")
    top = b.op("segment", h, ids, counts, kind="max")
    b.plan.outputs.update(mean=mean, top=top)
    before = [(op.kind, op.attrs.get("kind")) for op in b.plan.ops]
    plan = average_from_sum(b.plan)
    assert [(op.kind, op.attrs.get("kind")) for op in plan.ops] == before
    assert plan.log[-1] == "average_from_sum: 0 means read the sum of the same groundings"
    out = b.net()()
    torch.testing.assert_close(out["mean"], torch.tensor([[0.3], [0.36]], dtype=torch.float64))


def test_template_auto_plans_take_one_sum_for_both():
    import relsql
    from demos.synthetic import build
    from tests.plan_check import run

    db = relsql.connect()
    build(db.con, customers=120, seed=3)
    template = relsql.Template.auto(db, "customer.churned", hops=2)
    plain, optimized = run(template, db, ()), run(template, db, None)
    fired = [line for line in optimized[2].plan.log if line.startswith("average_from_sum")]
    assert fired and int(fired[0].split()[1]) >= 1, fired
    for got, want in zip(optimized[:2], plain[:2]):
        for k in want:
            torch.testing.assert_close(got[k], want[k], rtol=1e-9, atol=1e-11)
