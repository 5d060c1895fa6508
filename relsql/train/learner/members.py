"""A network of K independent members (relsql/compile/members.py): its head and its loss.

An output relation whose terms are all linears of K blocks, K x units wide, gives each member's
outputs side by side. The model's output is their mean (in the task's output space: log-odds,
class scores, standardized numbers), which everything downstream reads (metrics, model
selection, the blend, predict); training minimizes the mean of the members' own losses, so each
member learns as if alone, as the members of a seed ensemble do: trained on the loss of their mean,
the members of a prototype fell back to a single wider network's scores (docs/quality.md).
"""

from __future__ import annotations

import torch
from torch import nn

from relsql.compile.members import rows
from relsql.template import ir

__all__ = ["MemberMean", "count", "head", "loss", "rows"]


def count(template: ir.Template, output: str, width: int, units: int) -> int:
    """K where every term of the output relation's rules is a linear of K > 1 blocks and the relation
    is K x units wide; else 1 (a plain output, read by a linear head or as it is)."""
    found = set()
    for rule in template.relations[output].rules:
        for term in _terms(rule.expr):
            spec = template.weights.get(term.weight) if isinstance(term, ir.Apply) and term.types is None else None
            found.add(spec.blocks if spec is not None and spec.kind == "linear" else 1)
    blocks = found.pop() if len(found) == 1 else 1
    return blocks if blocks > 1 and width == blocks * units else 1


def _terms(expr: ir.Expr) -> list[ir.Expr]:
    """The terms of a sum (one term if the expression is not a sum)."""
    if isinstance(expr, ir.Binary) and expr.op == "+":
        return _terms(expr.left) + _terms(expr.right)
    return [expr]


class MemberMean(nn.Module):
    """The head of a network of `members` members: the mean of their `units` outputs each. The
    members' own outputs ride along on the result as `.members` (rows, members, units), for `loss`."""

    def __init__(self, members: int, units: int):
        super().__init__()
        self.members, self.units = members, units

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = x.reshape(x.shape[0], self.members, self.units)
        out = parts.mean(1)
        out.members = parts
        return out

    def extra_repr(self) -> str:
        return f"members={self.members}, units={self.units}"


def loss(task, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The mean of the members' own losses where `out` carries them, else the task's loss of `out`."""
    parts = getattr(out, "members", None)
    if parts is None:
        return task.loss(out, y)
    return task.losses(parts.transpose(0, 1), y).mean()  # one call for all members (Task.losses)


def head(template: ir.Template, output: str, width: int, units: int, dtype: torch.dtype) -> nn.Module:
    """The head a freshly built model gets: the members' mean, nothing (the output is the task's
    width already), or a linear map to the task's units."""
    k = count(template, output, width, units)
    if k > 1:
        return MemberMean(k, units)
    return nn.Identity() if width == units else nn.Linear(width, units, dtype=dtype)
