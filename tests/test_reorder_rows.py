"""reorder_rows (relsql/compile/passes/reorder_rows.py): rows renumbered by reverse Cuthill–McKee give
the plain plan's values and gradients (float64), in the user's row order, and the pass declines
where it cannot pay: small plans, and rows already in a good order."""

from __future__ import annotations

import importlib

import pytest
import torch

import relsql
from bench.gnn import load_graphs, template_text
from bench.locality import grid
from relsql.compile.passes import RULES, reorder_rows
from tests.plan_check import assert_same, run

reorder_module = importlib.import_module("relsql.compile.passes.reorder_rows")  # the package names the function alike


def _forced(plan):
    return reorder_rows(plan, force=True)


FORCED = tuple(_forced if rule is reorder_rows else rule for rule in RULES)


@pytest.fixture(scope="module")
def scattered():
    """A 24 x 24 grid whose node ids are a random permutation: far apart in id, near in the graph."""
    db = relsql.connect()
    load_graphs(db.con, grid(24, scattered=True, seed=3))
    return db


@pytest.fixture(scope="module")
def natural():
    db = relsql.connect()
    load_graphs(db.con, grid(24, scattered=False, seed=3))
    return db


def _line(net) -> str:
    return next(line for line in net.plan.log if line.startswith("reorder_rows"))


def _bandwidths(line: str) -> tuple[int, int]:
    before, _, after = line.partition("bandwidth ")[2].partition(",")[0].partition(" -> ")
    return int(before), int(after)


@pytest.mark.parametrize("model", ["gcn", "sage", "gin"])
def test_renumbered_rows_give_the_plain_plans_values_and_gradients(model, scattered):
    """Two message-passing layers and a readout; every relation (node-level ones included) is
    compared with the plain plan's, so results come back in the user's row order."""
    template = relsql.Template.from_sql(template_text(model, 8))
    reference, renumbered = run(template, scattered, ()), run(template, scattered, FORCED)
    assert_same(reference, renumbered, f"{model} renumbered")
    line = _line(renumbered[2])
    assert line.startswith("reorder_rows: 1 row spaces renumbered"), line
    before, after = _bandwidths(line)
    assert after < before / 3, line  # RCM did reorder: a 24-wide grid has bandwidth ~24-48 afterwards
    ops = renumbered[2].plan.ops
    assert any(op.attrs.get("row_order") for op in ops)  # rows back in the user's order
    assert "reorder_rows" in renumbered[2].explain()


def test_renumbering_keeps_values_with_every_other_pass_too(scattered):
    """The pass alone on an otherwise optimized plan's prefix, and the whole pipeline with only
    some relations asked for (as relsql.Model does), stay exact."""
    template = relsql.Template.from_sql(template_text("gcn", 8))
    reference = run(template, scattered, ())
    at = RULES.index(reorder_rows)
    assert_same(reference, run(template, scattered, (*RULES[:at], _forced)), "prefix + reorder_rows")
    net = relsql.compile(template, scattered, dtype=torch.float64, seed=11, passes=FORCED, outputs=["gcn2"])
    assert torch.allclose(net()["gcn2"], reference[0]["gcn2"], rtol=1e-9, atol=1e-11)


def test_small_plans_are_left_alone(scattered):
    template = relsql.Template.from_sql(template_text("sage", 8))
    _, _, net = run(template, scattered, None)
    line = _line(net)
    assert line.startswith("reorder_rows: 0 row spaces renumbered (the largest pattern has"), line
    assert not any(op.attrs.get("row_order") for op in net.plan.ops)


def test_rows_in_a_good_order_are_not_timed(natural, monkeypatch):
    monkeypatch.setattr(reorder_module, "MIN_ENTRIES", 0)
    template = relsql.Template.from_sql(template_text("sage", 8))
    reference, optimized = run(template, natural, ()), run(template, natural, None)
    assert_same(reference, optimized, "natural order")
    assert "already in a good order" in _line(optimized[2]), _line(optimized[2])


def test_on_the_cpu_scattered_rows_are_renumbered_by_rule_not_by_timing(scattered, monkeypatch):
    """The decision changes the summation order, so on the CPU it must not depend on the machine's
    load: a scattered grid, which RCM bands, is renumbered without timing anything."""
    monkeypatch.setattr(reorder_module, "MIN_ENTRIES", 0)
    monkeypatch.setattr(reorder_module, "_seconds", lambda *args: pytest.fail("timed on the CPU"))
    template = relsql.Template.from_sql(template_text("sage", 8))
    reference, optimized = run(template, scattered, ()), run(template, scattered, None)
    assert_same(reference, optimized, "decided by rule")
    line = _line(optimized[2])
    assert line.startswith("reorder_rows: 1 row spaces renumbered") and "not timed on the CPU" in line, line
