"""Human-readable results: a metrics plot (PNG) and a short text report."""

from __future__ import annotations

import math
from pathlib import Path

from relsql.errors import RelsqlError
from relsql.ownfiles import save_figure
from relsql.train.gbm import baselines


def plot_history(history: list[dict], path: Path, metric: str, *, title: str = "", loss: str = "loss",
                 best_epoch: int | None = None, baseline: float | None = None) -> Path:
    """Loss per epoch (train, validation) and the validation metric, side by side: the kept epoch
    marked, the baseline's metric as a line, accuracy and AUC on a fixed [0, 1] axis. Epochs are
    numbered from 1 as the log and the report number them (`best_epoch` is 0-based, as the history's).
    Drawn on a Figure of its own, not through pyplot: the user's matplotlib backend and open figures
    are left as they are, and pyplot's import (~0.2 CPU-s) is not paid."""
    from matplotlib.figure import Figure

    epochs = [h["epoch"] + 1 for h in history]
    fig = Figure(figsize=(9, 3.8))
    left, right = fig.subplots(1, 2)
    left.plot(epochs, [h["train_loss"] for h in history], label="train")
    left.plot(epochs, [h["val_loss"] for h in history], label="validation")
    left.set_xlabel("epoch")
    left.set_ylabel(loss)
    right.plot(epochs, [h.get(f"val_{metric}", math.nan) for h in history], color="tab:green", label=f"validation {metric}")
    right.set_xlabel("epoch")
    right.set_ylabel(f"validation {metric}" + ("" if metric in UNIT_FREE else " (target units)"))
    if metric in UNIT_FREE:
        right.set_ylim(-0.02, 1.02)  # fixed, so runs compare; a little room to see 0 and 1
    if baseline is not None and math.isfinite(baseline):
        right.axhline(baseline, color="tab:gray", linestyle="--", label=f"baseline {baseline:.3f}")
    if best_epoch is not None:
        for axis in (left, right):
            axis.axvline(best_epoch + 1, color="tab:red", linestyle=":", label=f"kept epoch {best_epoch + 1}")
    left.legend(fontsize=8)
    right.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    save_figure(fig, path, "save the model under another name, or move that file away", dpi=100)
    return path


UNIT_FREE = ("accuracy", "roc_auc", "f1")
LOSSES = {"binary": "loss (binary cross-entropy)", "multiclass": "loss (cross-entropy)",
          "regression": "loss (MSE, standardized target)"}


def text_report(model) -> str:
    lines = [
        f"relsql model: target {model.target}, task {model.task.kind}"
        + (f" ({len(model.task.classes)} classes)" if model.task.classes else ""),
        f"  output relation {model.output}: {model.output_rows} rows; "
        f"labelled rows train {len(model.rows['train'])}, validation {len(model.rows['val'])}, test {len(model.rows['test'])}",
        f"  grounding {model.timings.get('grounding', 0):.2f}s, planning {model.timings.get('planning', 0):.2f}s, "
        f"training {model.timings.get('training', 0):.2f}s "
        + (f"(of which waiting on the database {model.timings['waiting_on_database']:.2f}s) "
           if "waiting_on_database" in model.timings else "")
        + f"over {len(model.history)} epochs (kept epoch {_kept(model.best_epoch)})",
    ]
    lines.append(f"  split: {describe_split(model)}")
    metric = model.task.metric
    evaluated = {}
    for split in ("val", "test"):
        if len(model.rows[split]):
            scores = evaluated[split] = model.evaluate(split)
            lines.append(f"  {split:>4}: " + ", ".join(f"{k} {v:.4f}" for k, v in scores.items()))
    blend = getattr(model, "hybrid", None)
    if blend is not None:
        lines.append(f"  hybrid: {blend.describe()}")
    chosen = getattr(model.learner, "own_columns", None)  # relsql/train/model/own_columns.py
    if chosen and chosen.get("earlier"):
        lines.append("  network: the target table's own columns only (the part an earlier fit kept on validation)")
    elif chosen:
        lines.append(f"  network alone: kept the {chosen['kept']} (validation {chosen['metric']} {chosen['own']:.4f} for the "
                     f"target table's own columns alone, {chosen['whole']:.4f} for the whole template)")
    split = "test" if len(model.rows["test"]) else "val" if len(model.rows["val"]) else None
    if split is not None:
        ours = evaluated[split].get(metric, math.nan)
        own = model.learner.baseline_lines(split, ours)  # a ranking learner's popularity, say
        lines += _baselines(model, split, ours) if own is None else own
    lines += _training(model)
    if getattr(model, "trials", None) is not None:
        from relsql.train.model.search import summary

        lines += ["  " + line for line in summary(model.trials).splitlines()]
    if getattr(model, "stopped", None) == "epochs" and model.history:
        last = model.history[-1]["epoch"]
        still = " and was still improving: train longer (more epochs)" if model.best_epoch == last else ""
        monitor = (model.learner.record.monitor or "val_loss").removeprefix("val_")
        lines.append(f"  note: training stopped at the epoch cap ({model.epoch_cap} epochs); the validation {monitor} was "
                     f"best at epoch {_kept(model.best_epoch)}{still}")
    return "\n".join(lines)


def _kept(best_epoch: int | None) -> str:
    """The kept epoch as the log and the plot number it (from 1: the epochs trained to reach it)."""
    return "none" if best_epoch is None else str(best_epoch + 1)


LOWER_IS_BETTER = ("rmse", "mae", "loss")


def _training(model) -> list[str]:
    """How training ended and what chose the kept epoch: the metric, the budgets, a refit."""
    record, lines = model.learner.record, []
    if not record.history:
        return lines
    monitor = (record.monitor or "loss").removeprefix("val_")
    budget = record.time_budget
    stopped = record.stopped or "epochs"
    ended = "at the epoch limit" if stopped == "epochs" else f"at the {stopped}" if stopped.startswith("time") else stopped
    steps = f" of {record.steps} steps" if record.steps and record.steps > 1 else ""  # one step: the full batch
    lines.append(f"  training: kept the epoch with the best validation {monitor} (epoch {_kept(record.best_epoch)}); "
                 f"ended {ended} (limits: {record.epoch_cap} epochs{steps}" + (f", {budget:g}s" if budget else "") + ")")
    refit = getattr(model.learner, "refit", None)
    if refit and not refit.get("epochs"):
        lines.append(f"  refit: the blend gives the network weight 0, so only its GBM was fitted again, on all "
                     f"{refit.get('rows')} labelled rows (train + validation + test) for {refit.get('gbm_rounds')} rounds; "
                     "predict() and write_predictions use it. The validation and test scores above were measured "
                     "before the refit, on rows the selected model had not seen")
    elif refit:
        gbm = f" and the blend's GBM for {refit['gbm_rounds']} rounds (its weight kept)" if "gbm_rounds" in refit else ""
        how = (f"trained again on all {refit.get('rows')} labelled rows (train + validation + test) for {refit.get('epochs')} "
               "epochs" if "kept_epochs" not in refit else
               f"went on from the selected weights (epoch {refit['kept_epochs']}) over all {refit.get('rows')} labelled rows "
               f"(train + validation + test) for {refit.get('epochs')} more epochs at the kept epoch's rate")
        lines.append(f"  refit: the network {how}{gbm}; predict() and write_predictions use it. The "
                     "validation and test scores above were measured before the refit, on rows the selected model had "
                     "not seen")
    else:
        why = getattr(model.learner, "no_refit", None)
        if why:
            lines.append(f"  refit: none ({why}): predictions come from the model trained on the training rows")
    return lines


def describe_split(model) -> str:
    """How the labelled rows were split: at random (seeded) or by time on a column."""
    fractions = "/".join(f"{f:g}" for f in model.fractions)
    sizes = f"train {len(model.rows['train'])}, validation {len(model.rows['val'])}, test {len(model.rows['test'])} rows"
    if model.time_column:
        return (f"by time on {model.table}.{model.time_column} ({fractions}: the earliest rows train, the latest test; "
                f"{sizes})")
    return f"random ({fractions}, seed {model.seed}; {sizes})"


def _baselines(model, split: str, ours: float) -> list[str]:
    """The baselines on `split` and a warning for each the model does not beat, then one for the best."""
    metric, lines = model.task.metric, []
    baseline = model.baseline(split)
    what = "mean of the training rows" if model.task.kind == "regression" else "majority class of the training rows"
    lines.append(f"  baseline ({what}) on {split}: " + _scores(baseline))
    named = [("the majority baseline" if model.task.kind != "regression" else "the mean baseline", baseline)]
    own = baselines.own_columns(model, split)
    if own is not None:
        lines.append(f"  baseline (a linear model of {model.table}'s own columns {', '.join(own[1][:6])}"
                     f"{', ...' if len(own[1]) > 6 else ''}) on {split}: " + _scores(own[0]))
        named.append(("the own-columns baseline", own[0]))
    gbms, failed = _gbms(model, split)
    if failed:
        lines.append(f"  note: the GBM baselines could not be computed: {failed}")
    for key, name, text in (("gbm_own_columns", "the own-columns GBM", f"a GBM on {model.table}'s own columns"),
                            ("gbm_one_hop", "the one-hop GBM", "a GBM on one-hop SQL features: own columns, parent rows' "
                             "columns, child rows' count/mean/min/max")):
        if key in gbms:
            lines.append(f"  baseline ({text}) on {split}: " + _scores(gbms[key]))
            named.append((name, gbms[key]))
    lower = metric in LOWER_IS_BETTER
    best_name, best = None, math.nan
    for name, scores in named:
        theirs = scores.get(metric, math.nan)
        if not math.isfinite(theirs):
            continue
        if not (ours < theirs if lower else ours > theirs):
            lines.append(f"  warning: the model does not beat {name} on {split} {metric} ({ours:.4f} vs {theirs:.4f})")
        if best_name is None or (theirs < best if lower else theirs > best):
            best_name, best = name, theirs
    if best_name is not None and not (ours < best if lower else ours > best):
        gap = abs(ours - best) if math.isfinite(ours) else math.inf
        how = "only ties with it" if gap == 0 else f"trails it by {gap:.4f}"
        lines.append(f"  warning: the best baseline on {split} {metric} is {best_name} ({best:.4f}); the model "
                     f"({ours:.4f}) {how}")
    return lines


def _gbms(model, split: str) -> tuple[dict, str | None]:
    """The GBM baselines on `split` ({} and why, when the table is too large or they fail)."""
    if len(model.labelled) > baselines.CHEAP_ROWS:
        return {}, f"more than {baselines.CHEAP_ROWS} labelled rows"
    try:
        found = baselines.compare(model, split)
    except RelsqlError as err:
        return {}, str(err)
    return {k: v for k, v in found.items() if k != "majority"}, None


def _scores(scores: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.4f}" for k, v in scores.items())
