"""The record of training: what fit did, as one value the Trainer fills and returns and the fit
entry points put on the learner (`learner.record`), where Model's read-only attributes (history,
best_epoch, stopped, ...) read it. Kept apart from the learner's weights and target so that the
trainer writes one object, not seven attributes of the model."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field


@dataclass
class FitRecord:
    """One model's record of training. A later fit continues it (`continued`): its epochs are
    appended to the history and its seconds added to the timings, the rest is the later fit's."""

    history: list[dict] = field(default_factory=list)  # one record per epoch: losses, metrics, learning rate
    best_epoch: int | None = None  # the epoch whose weights were kept (0-based)
    stopped: str | None = None  # what ended training: "epochs", "time budget (..s)", "early (...)", "diverged (...)"
    monitor: str | None = None  # the history entry model selection compared, e.g. "val_roc_auc"
    epoch_cap: int | None = None  # the epochs fit was given
    steps: int | None = None  # optimizer steps an epoch (more than one: steps_per_epoch's shares, or mini-batches)
    time_budget: float | None = None  # fit's time budget in seconds
    timings: dict[str, float] = field(default_factory=dict)  # seconds per phase: grounding, planning, training, ...
    diverged: str | None = None  # the message of a loss that stopped being a number (not saved with the model)
    crossfit: object = None  # the validation rows' cross-fitted outputs for the blend (relsql/train/loop/crossfit.py; not saved)

    def continued(self) -> FitRecord:
        """The record a new fit starts from: this one's history and timings carried (copies), the
        rest as it stands until the fit sets it."""
        return dataclasses.replace(self, history=list(self.history), timings=dict(self.timings), diverged=None,
                                   crossfit=None)

    def kept(self) -> dict | None:
        """The history's entry of the kept epoch (None if none was kept). A later fit numbers its
        epochs from 0 again, so the last entry with that number is this record's latest fit's."""
        if self.best_epoch is None:
            return None
        return next((r for r in reversed(self.history) if r["epoch"] == self.best_epoch), None)

    def add_timings(self, seconds: dict[str, float]) -> None:
        """Add `seconds` per phase (a model trained twice reports the sum)."""
        for name, value in seconds.items():
            self.timings[name] = self.timings.get(name, 0.0) + value

