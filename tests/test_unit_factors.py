"""The unit_factors pass (relsql/compile/passes/unit_factors.py): what it changes in a plan, with the plain
plan's values and gradients (tests/test_passes.py runs every pass alone and together on the
template corpus)."""

from __future__ import annotations

import torch

import relsql
from relsql.compile.passes import RULES
from tests.plan_check import fired_counts, run


def test_factors_of_one_are_dropped_exactly(neuralogic_mutagenesis):
    """The bond facts' value 1 multiplies every grounding of elementProduct's rule: dropping it
    leaves values and gradients bit for bit the same."""
    db, dataset = neuralogic_mutagenesis
    template = relsql.Template.from_file(dataset.template.parent / "template_elementProduct.txt")
    without = tuple(rule for rule in RULES if rule.__name__ != "unit_factors")
    (out_a, grad_a, _), (out_b, grad_b, net) = run(template, db, without), run(template, db, None)
    assert fired_counts(net)["unit_factors"] == 2
    assert all(torch.equal(out_a[k], out_b[k]) for k in out_a)
    assert all(torch.equal(grad_a[k], grad_b[k]) for k in grad_a)
