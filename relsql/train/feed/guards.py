"""Checks that keep training honest: a loss that stops being a number, a log that stays short,
and tables that changed under a model that reads them again.

A model is built on one reading of its tables (row counts, dictionaries of categories). Every
later reading (mini-batches grounded in the database with `store=False`, a grounder made for
`fit(batch_size=...)` after a full-batch build) must agree with it, else the codes and row ids the
model holds point at the wrong rows or past its weights: these checks say so instead.
"""

from __future__ import annotations

import math

from relsql.errors import RelsqlError
from relsql.template import ir

LOG_LINES = 10  # progress lines per fit when there is no terminal (plus the last epoch's)


class Diverged(Exception):
    """A loss that is NaN or infinite: where it happened (0-based epoch, batch or None)."""

    def __init__(self, value: float, epoch: int, batch: int | None = None, batches: int = 1, split: str = "training"):
        super().__init__(f"{split} loss {value} at epoch {epoch + 1}")
        self.value, self.epoch, self.batch, self.batches, self.split = value, epoch, batch, batches, split


def check_loss(value: float, epoch: int, batch: int | None = None, batches: int = 1, split: str = "training") -> None:
    """Raise Diverged before a non-finite loss is back-propagated into the weights."""
    if not math.isfinite(value):
        raise Diverged(value, epoch, batch, batches, split)


def diverged_message(err: Diverged, lr: float, best_epoch: int | None, best_loss: float) -> str:
    """Where training diverged, which weights the model keeps, and what usually helps."""
    where = f"epoch {err.epoch + 1}" + (f", batch {err.batch + 1} of {err.batches}" if err.batch is not None else "")
    if best_epoch is not None:
        kept = f"the model keeps the weights of its best epoch, {best_epoch + 1} (loss {best_loss:.4g})"
    elif err.split == "training":
        kept = "no epoch finished with a finite loss: the model keeps the weights it had before that step"
    else:
        kept = "no epoch finished with a finite loss: the model's weights are that epoch's, which are not usable"
    return (f"training stopped at {where}: the {err.split} loss is {err.value}, not a finite number; {kept}. "
            f"Likely fixes: a lower learning rate (lr={lr:g} now, try {lr / 10:g}), or check the columns given to "
            "features() for huge values or outliers (e.g. SELECT max(abs(column)) ...) and filter or clip them")


def log_every(epochs: int) -> int:
    """Epochs between progress lines, so a fit of any length logs about LOG_LINES of them."""
    return max(1, math.ceil(epochs / LOG_LINES))


def logs_epoch(epoch: int, first: int, epochs: int) -> bool:
    """Whether epoch `epoch` (0-based) of a fit that started at `first` gets a progress line."""
    return epoch == first or (epoch + 1) % log_every(epochs) == 0 or epoch + 1 == epochs


CHANGED = ("the tables changed since the model was built ({what}); the model's row ids and category codes follow "
           "the tables as they were. Rebuild the Model (relsql.Model(...)) and train it again; to train on one "
           "snapshot while the database changes, keep the grounding store (the default, store=True) instead of store=False")


def check_codes(grounding, template: ir.Template) -> None:
    """Every dictionary code a batch's groundings hold lies within its weight's dictionary: a
    category the database gained after the model was built has no code (and no row of the embedding)."""
    sizes = grounding.vocab_sizes
    for relation in grounding.relations.values():
        for rule_grounding in relation.rules:
            for column, weight in ir.coded_columns(rule_grounding.rule).items():
                codes = rule_grounding.columns.get(column)
                if codes is None or codes.numel() == 0 or weight not in sizes:
                    continue
                low, high = int(codes.min()), int(codes.max())
                if low < 0 or high >= max(int(sizes[weight]), 1):
                    unknown = int(((codes < 0) | (codes >= sizes[weight])).sum())
                    raise RelsqlError(f"{relation.name}, {rule_grounding.rule.origin}: " + CHANGED.format(
                        what=f"{unknown} grounding(s) of '{weight}' have categories its dictionary of "
                             f"{sizes[weight]} does not know"))


def check_same(built: dict[str, int], now: dict[str, int], what: str) -> None:
    """The sizes (rows per relation, categories per dictionary) a new reading of the tables found
    are those the model was built with."""
    differ = [f"{name}: {built[name]} then, {now[name]} now" for name in sorted(built)
              if name in now and now[name] != built[name]]
    if differ:
        raise RelsqlError(CHANGED.format(what=f"{what}: {'; '.join(differ[:3])}{' ...' if len(differ) > 3 else ''}"))


def check_fingerprint(built: str | None, now: str, output: str) -> None:
    """The hash of every row the template reads is still the one taken when the model was built."""
    if built is not None and built != now:
        raise RelsqlError(f"{output}: " + CHANGED.format(what="rows were added, deleted or updated in the tables the "
                                                         "template reads"))
