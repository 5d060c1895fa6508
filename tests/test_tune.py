"""relsql.tune (relsql/compile/tune.py): a plan per gather strength, the fastest kept, the same numbers."""

from __future__ import annotations

import warnings
from pathlib import Path

import torch

import relsql

ROOT = Path(__file__).resolve().parent.parent


def test_tune_keeps_the_fastest_plan_and_the_same_numbers(mutag):
    from relsql.compile.passes.propagate_gathers import PRESETS

    tpl = relsql.Template.from_file(relsql.sql_templates.path("gin"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tuned = relsql.tune(tpl, mutag, dtype=torch.float64, seed=3)
        plain = relsql.compile(tpl, mutag, dtype=torch.float64, seed=3)
    assert sorted(t.strength for t in tuned.tuning) == sorted(PRESETS)
    fastest = min(tuned.tuning, key=lambda t: t.step_ms)
    assert len(tuned.plan.ops) == fastest.ops and "tuned: strength" in tuned.explain()
    ours, theirs = tuned(), plain()
    assert all(torch.allclose(ours[k], theirs[k], rtol=1e-9, atol=1e-11) for k in theirs)
