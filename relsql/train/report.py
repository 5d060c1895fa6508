"""Human-readable results: a metrics plot (PNG) and a short text report."""

from __future__ import annotations

import math
from pathlib import Path


def plot_history(history: list[dict], path: Path, metric: str) -> Path:
    """Loss per epoch (train, validation) and the validation metric, side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    epochs = [h["epoch"] for h in history]
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.5))
    left.plot(epochs, [h["train_loss"] for h in history], label="train")
    left.plot(epochs, [h["val_loss"] for h in history], label="validation")
    left.set_xlabel("epoch")
    left.set_ylabel("loss")
    left.legend()
    right.plot(epochs, [h.get(f"val_{metric}", math.nan) for h in history], color="tab:green")
    right.set_xlabel("epoch")
    right.set_ylabel(f"validation {metric}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def text_report(model) -> str:
    lines = [
        f"relsql model: target {model.target}, task {model.task.kind}"
        + (f" ({len(model.task.classes)} classes)" if model.task.classes else ""),
        f"  output relation {model.output}: {model.output_rows} rows; "
        f"labelled rows train {len(model.rows['train'])}, validation {len(model.rows['val'])}, test {len(model.rows['test'])}",
        f"  grounding {model.timings.get('grounding', 0):.2f}s, training {model.timings.get('training', 0):.2f}s "
        + (f"(of which waiting on the database {model.timings['waiting_on_database']:.2f}s) "
           if "waiting_on_database" in model.timings else "")
        + f"over {len(model.history)} epochs (best epoch {model.best_epoch})",
    ]
    for split in ("val", "test"):
        if len(model.rows[split]):
            scores = model.evaluate(split)
            lines.append(f"  {split:>4}: " + ", ".join(f"{k} {v:.4f}" for k, v in scores.items()))
    return "\n".join(lines)
