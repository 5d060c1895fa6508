"""Why a row got its prediction, as relations: per-row attributions of the input rows and columns
its groundings read (integrated gradients through the plain plan), their summaries by column and
by relation, written back like predictions (docs/explain.md)."""

from __future__ import annotations

import polars as pl

from relsql.explain.plot import plot_summary
from relsql.explain.relation import COLUMNS, STEPS, explain, summary


def explain_summary(explanation: pl.DataFrame, model=None) -> pl.DataFrame:
    """Mean |attribution| by table.column and by relation over the rows of `explanation` (what
    Model.explain returned); with `model`, a blended GBM's share and its features' importances too."""
    from relsql.errors import RelsqlError

    if not isinstance(explanation, pl.DataFrame) or not any(c.startswith("attribution") for c in explanation.columns) \
            or len(explanation.columns) <= len(COLUMNS):
        raise RelsqlError("explain_summary needs the DataFrame Model.explain(...) returned (the target's keys, then "
                          f"{', '.join(COLUMNS)})")
    learner = None if model is None else model.learner
    keys = list(learner.goal.keys) if learner is not None else explanation.columns[:-len(COLUMNS)]
    return summary(explanation, keys, None if learner is None else getattr(learner, "hybrid", None))


def write_explanation(db, name: str, explanation: pl.DataFrame, *, replace: bool = False) -> int:
    """Write an explanation (or its summary) as a new table, atomically, marked as relsql's
    explanations; an existing table needs replace=True (and must be one relsql wrote as such)."""
    db.write_table(name, explanation.to_arrow(), replace=replace, kind="explanations")
    return explanation.height


__all__ = ["STEPS", "explain", "explain_summary", "plot_summary", "summary", "write_explanation"]
