"""The distribute_aggregation pass (relsql/compile/passes/distribute_aggregation.py): what it changes in a plan, with the plain
plan's values and gradients (tests/test_passes.py runs every pass alone and together on the
template corpus)."""

from __future__ import annotations

import pytest
import torch

import relsql
from tests.plan_check import fired_counts


@pytest.mark.parametrize("model", ["sage", "gin"])
def test_pooled_readout_weights_move_after_the_pooling(model, random_graphs):
    """avg over a graph's nodes of (W·h + b) is W·avg(h) + b: with only the logits asked for,
    the last layer's weights multiply one row per graph instead of one per node."""
    template = relsql.Template.from_file(relsql.sql_templates.path(model))
    outputs = [f"{model}_out"]
    plain = relsql.compile(template, random_graphs, dtype=torch.float64, seed=4, passes=(), outputs=outputs)
    net = relsql.compile(template, random_graphs, dtype=torch.float64, seed=4, outputs=outputs)
    assert fired_counts(net)["distribute_aggregation"] >= 1
    graphs = random_graphs.con.execute("SELECT count(*) FROM graph").fetchone()[0]
    last = {op.out for op in net.plan.ops
            if op.kind == "param" and op.attrs["name"] in (f"{model}2_wr", f"{model}2_wl", f"{model}2_w2")}
    rows = [op.rows for op in net.plan.ops if op.kind in ("linear", "affine") and last & set(op.args)]
    assert rows and max(rows) == graphs, rows  # the readout layer's GEMMs run on pooled rows
    out_a, out_b = plain()[outputs[0]], net()[outputs[0]]
    assert torch.allclose(out_a, out_b, rtol=1e-9, atol=1e-11)
    (out_a.sin().sum()).backward()
    (out_b.sin().sum()).backward()
    theirs = plain.named_weights()
    for name, p in net.named_weights().items():
        assert torch.allclose(p.grad, theirs[name].grad, rtol=1e-9, atol=1e-11), name
