"""The cost constants (relsql/compile/costs.py): fixed on CPU, measured on another device, and a
plan takes those of its own device."""

from __future__ import annotations

import relsql
from relsql.compile.passes import RULES
from tests.plan_check import assert_same, run


def test_cost_decisions_are_those_of_the_plans_device(neuralogic_mutagenesis, monkeypatch):
    """The constants are fixed on CPU and measured on another device (once per process); a plan
    made for another device takes that device's: with a dense limit of 0 there, no small matrix
    goes dense. Either plan is exact."""
    from relsql.compile import costs, ground

    assert costs.for_device("cpu") is costs.CPU and not costs.CPU.measured
    measured = costs.measure("cpu")  # the experiment a CUDA plan runs on its device
    assert measured.measured and 1.0 <= measured.sparse_element < 1e5 and measured.dense_limit >= 1 << 12
    monkeypatch.setattr(costs, "measure", lambda device: costs.Costs(sparse_element=25.0, dense_limit=0, measured=True))
    db, dataset = neuralogic_mutagenesis
    template = relsql.Template.from_file(dataset.template.parent / "template_graphlets.txt")
    grounding = ground(template, db)
    passes = tuple(rule for rule in RULES if rule.__name__ != "choose_segment_kernels")
    reference = run(template, db, ())
    on_cpu, elsewhere = run(template, db, passes, grounding), run(template, db, passes, grounding, device="cuda")
    assert on_cpu[2].plan.device == "cpu" and elsewhere[2].plan.device == "cuda"  # planned for CUDA, run here
    dense = [line for line in on_cpu[2].plan.log if line.startswith("dense_small_matrices")]
    assert dense and not dense[0].startswith("dense_small_matrices: 0 ")
    assert any(line.startswith("dense_small_matrices: 0 ") for line in elsewhere[2].plan.log), elsewhere[2].plan.log
    assert_same(reference, on_cpu, "graphlets, CPU constants")
    assert_same(reference, elsewhere, "graphlets, another device's constants")
