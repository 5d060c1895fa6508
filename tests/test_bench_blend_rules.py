"""bench/blend_replay.py's rules that average the blend's members or select an ensemble of them, on
made-up outputs whose best mix is known (a regression scored by RMSE)."""

from __future__ import annotations

import numpy as np
import pytest

from bench import blend_replay

PARTS = ("train", "val", "test")


def _run(members: dict[str, tuple[np.ndarray, np.ndarray]], truth: tuple[np.ndarray, np.ndarray]) -> tuple[dict, dict]:
    """A recorded run: `members` {name: (validation outputs, test outputs)} ("net" and cand_<reach>)."""
    run = {"database": "made_0", "metric": "rmse", "chosen_on": "rmse",
           "task": {"kind": "regression", "classes": [], "mean": 0.0, "std": 1.0, "regression_loss": "mse",
                    "class_weights": None}}
    arrays = {"y_val": truth[0][:, 0], "y_test": truth[1][:, 0], "y_train": truth[0][:1, 0]}  # labels: one per row
    for name, (val, test) in members.items():
        arrays.update({f"{name}_val": val, f"{name}_test": test, f"{name}_train": val[:1]})
    arrays["gbm2_val"], arrays["gbm2_test"] = members["cand_two-hop"]
    return run, arrays


def test_ensemble_selection_keeps_a_perfect_member_alone():
    rng = np.random.default_rng(0)
    y = rng.normal(size=(2, 50, 1))
    noisy = {n: (y[0] + rng.normal(size=y[0].shape), y[1] + rng.normal(size=y[1].shape)) for n in ("net", "cand_two-hop")}
    run, a = _run({**noisy, "cand_one-hop": (y[0].copy(), y[1] + 0.5)}, (y[0], y[1]))
    out = blend_replay.selected_ensemble(run, a, 10, "test")
    np.testing.assert_allclose(out, y[1] + 0.5)  # every step adds the member with no validation error


def test_ensemble_selection_mixes_members_whose_errors_cancel():
    """Two members off by +1 and -1 on every row: their half-and-half mix is exact, either alone is not."""
    y = np.linspace(-1, 1, 40).reshape(-1, 1)
    run, a = _run({"net": (y + 3.0, y + 3.0), "cand_two-hop": (y + 1.0, y + 1.0), "cand_one-hop": (y - 1.0, y - 1.0),
                   "cand_own-column": (y + 2.0, y + 2.0)}, (y, y))
    out = blend_replay.selected_ensemble(run, a, 10, "test")
    np.testing.assert_allclose(out, y, atol=1e-12)


def test_gbms_averaged_is_one_candidate_weighed_against_the_network():
    rng = np.random.default_rng(1)
    y = rng.normal(size=(60, 1))
    run, a = _run({"net": (y + rng.normal(size=y.shape), y), "cand_two-hop": (y + 0.4, y + 0.4),
                   "cand_one-hop": (y - 0.4, y - 0.4)}, (y, y))
    weight, prefix = blend_replay.chosen_average(run, a)
    np.testing.assert_allclose(a[f"{prefix}_test"], y, atol=1e-12)  # the two GBMs' errors cancel in their mean
    assert weight == 0.0  # the exact average leaves the noisy network nothing to add
    assert blend_replay._equal_shares(a, prefix) == (pytest.approx(1 / 3), prefix)
