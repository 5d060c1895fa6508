"""A bar chart of an explanation's summary: mean |attribution| by relation and by table.column.
matplotlib is optional (not a dependency of relsql): without it the plot is refused with a message."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from relsql.errors import RelsqlError


def plot_summary(summary: pl.DataFrame, path: str | Path, title: str = "why: mean |attribution|") -> Path:
    """Write a PNG of `summary` (relsql.explain_summary's frame): one panel per kind (relation,
    column), bars longest first. Returns the path written. A Figure of its own, not pyplot's: the
    user's matplotlib backend and figures are left as they are."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise RelsqlError("plotting an explanation needs matplotlib, which relsql does not install: "
                          "pip install matplotlib, or read the summary DataFrame") from None
    if not isinstance(summary, pl.DataFrame) or not {"kind", "name", "mean_abs_attribution"} <= set(summary.columns):
        raise RelsqlError("plot_summary needs the DataFrame relsql.explain_summary(...) returned")
    kinds = [k for k in ("relation", "column") if summary.filter(pl.col("kind") == k).height]
    if not kinds:
        raise RelsqlError("the summary has no attributions to plot (no input reached the explained rows)")
    figure = Figure(figsize=(7, 1.2 + 0.45 * summary.height))
    axes = figure.subplots(len(kinds), 1, squeeze=False)
    for ax, kind in zip(axes[:, 0], kinds):
        part = summary.filter(pl.col("kind") == kind).sort("mean_abs_attribution")
        ax.barh(part["name"].to_list(), part["mean_abs_attribution"].to_list(), color="#4c72b0")
        ax.set_title(f"by {kind}", fontsize=10)
    axes[-1, 0].set_xlabel("mean |attribution| (output units)")
    figure.suptitle(title)
    figure.tight_layout()
    path = Path(path)
    figure.savefig(path, dpi=110)
    return path
