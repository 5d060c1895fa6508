"""bench.stopping's reading of a recorded default run: the stop a smaller patience makes (the
Trainer's rule replayed, against a by-hand reference) and the summary's medians (by hand)."""

from __future__ import annotations

import types

import pytest

from bench.stopping import replay, rule_name, summary


def learner():
    """What EarlyStopping reads of a learner: its validation rows and a copy of its weights."""
    return types.SimpleNamespace(rows={"val": [0, 1, 2]}, weights_copy=lambda: None)


def reference(losses: list[float], patience: int) -> tuple[int, int]:
    """(epochs run, best epoch) by hand: stop after `patience` epochs without a strictly lower loss."""
    best = 0
    for epoch, loss in enumerate(losses):
        if loss < losses[best] or epoch == 0:
            best = epoch
        elif epoch - best >= patience:
            return epoch + 1, best
    return len(losses), best


def relative_reference(losses: list[float], k: int, f: float) -> tuple[int, int]:
    """(epochs run, best epoch) by hand: stop after max(k, f x (best + 1)) epochs without a strictly lower loss."""
    best = 0
    for epoch, loss in enumerate(losses):
        if loss < losses[best] or epoch == 0:
            best = epoch
        elif epoch - best >= max(k, f * (best + 1)):
            return epoch + 1, best
    return len(losses), best


@pytest.mark.parametrize("patience", [1, 2, 3, 5, 100])
def test_replay_stops_where_the_rule_says(patience):
    losses = [1.0, 0.8, 0.85, 0.9, 0.7, 0.75, 0.76, 0.77, 0.78, 0.69, 0.9, 0.95, 0.97]
    history = [{"val_loss": x} for x in losses]
    assert replay(learner(), history, "loss", patience) == reference(losses, patience)


@pytest.mark.parametrize("k,f", [(1, 0.5), (2, 0.5), (1, 1.0), (3, 2.0), (100, 0.5)])
def test_a_patience_scaled_to_the_best_epoch_stops_where_the_rule_says(k, f):
    # best epochs 0, 1, 4, 9: a late best waits longer (max(1, 0.5 x 10) = 5 epochs after epoch 9)
    losses = [1.0, 0.8, 0.85, 0.9, 0.7, 0.75, 0.76, 0.77, 0.78, 0.69, 0.9, 0.95, 0.97, 0.98, 0.99, 1.0, 1.1]
    history = [{"val_loss": x} for x in losses]
    assert replay(learner(), history, "loss", (k, f)) == relative_reference(losses, k, f)
    assert rule_name((k, f)) == f"max({k}, {f:g} best)"


def test_replay_breaks_a_tie_of_the_metric_by_the_loss():
    """Equal ROC-AUC at epochs 0 and 2: the lower loss at 2 makes it the best, so patience 2 runs to epoch 4."""
    history = [{"val_roc_auc": 0.9, "val_loss": 0.5}, {"val_roc_auc": 0.8, "val_loss": 0.6},
               {"val_roc_auc": 0.9, "val_loss": 0.4}, {"val_roc_auc": 0.7, "val_loss": 0.7},
               {"val_roc_auc": 0.7, "val_loss": 0.7}]
    assert replay(learner(), history, "roc_auc", 2) == (5, 2)
    history[2]["val_loss"] = 0.55  # a worse loss: the tie keeps epoch 0, and patience 2 stops after epoch 2
    assert replay(learner(), history, "roc_auc", 2) == (3, 0)


def test_summary_medians_follow_the_rule():
    def run(rows, gbm, best, **cpu):
        stops = {p: {"epochs": 0, "best_epoch": best if p != "25" else best - 1, "cpu_s": s} for p, s in cpu.items()}
        return {"val_rows": rows, "gbm_cpu_s": gbm, "best_epoch": best, "cpu_s": stops["100"]["cpu_s"], "stops": stops}

    runs = [run(28, 1.0, 5, **{"25": 2.0, "30": 3.0, "40": 4.0, "100": 10.0}),
            run(500, 2.0, 5, **{"25": 4.0, "30": 6.0, "40": 8.0, "100": 12.0}),
            run(900, 1.0, 5, **{"25": 1.0, "30": 2.0, "40": 3.0, "100": 6.0})]
    text = summary(runs)
    # everywhere 40: ratios 4, 4, 3 -> median 4; 100 under 30 rows, else 40: 10, 4, 3 -> 4; under 100 rows: same
    lines = text.splitlines()
    assert ("patience 100 under 0 validation rows, else 40: median CPU ratio "
            "4.00, <= 5 on 3 of 3, default's epoch kept on 3") in lines
    # 25 everywhere: ratios 2, 2, 1 -> 2, its best epoch one off on every run
    assert ("patience 100 under 0 validation rows, else 25: median CPU ratio "
            "2.00, <= 5 on 3 of 3, default's epoch kept on 0") in lines
    # 100 under 30 rows, else 30: ratios 10, 3, 2 -> 3, two of three at most 5
    assert "patience 100 under 30 validation rows, else 30: median CPU ratio 3.00, <= 5 on 2 of 3" in text
    assert "default (measured): median CPU ratio 6.00" in text


def test_summary_names_the_runs_a_scaled_patience_moves_to_another_epoch():
    def run(name, best, moved_to, net_tests):
        stops = {"100": {"epochs": 9, "best_epoch": best, "cpu_s": 9.0, "net_test": net_tests[0]}}
        for patience in ("25", "30", "40"):
            stops[patience] = {"epochs": 5, "best_epoch": best, "cpu_s": 5.0}
        for rule in ("max(20, 0.5 best)", "max(40, 0.5 best)", "max(25, 1 best)"):
            stops[rule] = {"epochs": 4, "best_epoch": moved_to, "cpu_s": 4.0, "net_test": net_tests[1]}
        return {"database": name, "seed": 0, "val_rows": 500, "gbm_cpu_s": 1.0, "best_epoch": best, "cpu_s": 9.0,
                "stops": stops}

    text = summary([run("a", 5, 5, (0.9, 0.9)), run("b", 7, 3, (0.62, 0.66))])
    assert ("patience max(20, 0.5 best): median CPU ratio 4.00, <= 5 on 2 of 2, default's epoch kept on 1; "
            "another epoch: b seed 0 epoch 4 (net test 0.6200 -> 0.6600)") in text.splitlines()


def test_replay_with_the_overfit_stop_stops_twenty_epochs_after_the_best():
    """fit()'s default rule replayed: validation 1.3 x the best from epoch 3 on stops after epoch 2 + 20
    (23 epochs run); the same history under patience alone runs to patience; the training loss at a
    tenth of the best validation loss stops there too, at the first epoch 20 after the best."""
    overfits = [{"val_loss": v, "train_loss": 0.5} for v in [1.0, 0.8, 0.5] + [0.65] * 40]
    assert replay(learner(), overfits, "loss", 30, overfit=True) == (23, 2)
    assert replay(learner(), overfits, "loss", 30) == (33, 2)
    fitted = [{"val_loss": v, "train_loss": t} for v, t in zip([1.0, 0.6, 0.4] + [0.42] * 40,
                                                                 [0.9, 0.5, 0.3] + [0.03] * 40, strict=True)]
    assert replay(learner(), fitted, "loss", 30, overfit=True) == (23, 2)
    assert rule_name("100+overfit") == "100+overfit"
