"""The propagate_gathers pass (relsql/compile/passes/propagate_gathers.py): what it changes in a plan, with the plain
plan's values and gradients (tests/test_passes.py runs every pass alone and together on the
template corpus)."""

from __future__ import annotations

import warnings

import torch

import relsql


def test_a_gather_that_keeps_few_rows_is_pulled_before_the_op(neuralogic_mutagenesis):
    """template_product scales a matrix per bond fact, of which compression keeps a handful:
    the matrix is scaled for the kept rows only."""
    db, dataset = neuralogic_mutagenesis
    tpl = relsql.Template.from_file(dataset.template.parent / "template_product.txt")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plain = relsql.compile(tpl, db, dtype=torch.float64, seed=2, passes=())
        optimized = relsql.compile(tpl, db, dtype=torch.float64, seed=2, outputs=["predict"])
    assert torch.allclose(plain()["predict"], optimized()["predict"], rtol=1e-9, atol=1e-12)
    bonds = db.con.execute("SELECT count(*) FROM bond").fetchone()[0]
    widest = {op.rows for op in plain.plan.ops if op.kind == "linear" and len(op.shape) == 2}
    assert max(widest) >= bonds  # the plain plan scales the matrix for every bond fact
    assert max(op.rows for op in optimized.plan.ops if op.kind == "linear" and len(op.shape) == 2) < 100
    assert "propagate_gathers: 0 gathers pulled" not in optimized.explain()
