"""The plain (unoptimized) plan of a grounded template, in float64, with its inputs found: every
per-grounding value that comes from the database (a column, features(...), an encoder, an
embedding row or a text column's vector), named by the table and column it was read from.

Attributions need the plan's inputs one row per grounding, in grounding order: the optimizer's
passes fold gathers into matrices and deduplicate rows, so explanations run the plan the builder
makes before any pass (the same values: every pass is verified against it)."""

from __future__ import annotations

from dataclasses import dataclass

import sqlglot.expressions as exp
import torch

from relsql.compile.plan import Plan, PlanBuilder, RuleContext
from relsql.ground.execute import Grounding, RuleGrounding
from relsql.template import ir

READ = (ir.Column, ir.Features, ir.Encode, ir.Embed, ir.Text)  # what a rule reads from the database


@dataclass
class Input:
    """One input slot of the plan: `slot`'s row i is grounding `order[i]` of rule grounding `rg`
    (order None: row i is grounding i); its width is split among `columns` as `widths`;
    `computed`: the slot is an op's output (an embedding or text vector), else a plan input."""

    slot: int
    rg: RuleGrounding
    relation: str
    rule: str
    columns: list[tuple[str, str]]  # (table, column) per part
    widths: list[int]
    order: torch.Tensor | None
    computed: bool


def _sources(rule: ir.Rule) -> dict[int, tuple[str, str]]:
    """(table, column) of each raw column `_c{k}` the rule's query selects, where the expression is a
    column of a table in its FROM/JOINs; else the expression's SQL text and the rule's head."""
    found: dict[int, tuple[str, str]] = {}
    query = rule.query if isinstance(rule.query, exp.Select) else None
    if query is None:
        return found
    tables = {}
    for source in query.find_all(exp.Table):
        tables[(source.alias_or_name or source.name).casefold()] = source.name
    for projection in query.expressions:
        name = projection.alias_or_name
        if not name.startswith("_c") or not name[2:].isdigit():
            continue
        inner = projection.this if isinstance(projection, exp.Alias) else projection
        if isinstance(inner, exp.Column):
            table = tables.get(inner.table.casefold(), inner.table or rule.head) if inner.table else \
                (next(iter(tables.values())) if len(tables) == 1 else rule.head)
            found[int(name[2:])] = (table, inner.name)
        else:
            found[int(name[2:])] = (rule.head, inner.sql())
    return found


class _Recording(RuleContext):
    """A rule's context that records the slots of what it reads from the database."""

    found: list[Input]

    def compile(self, expr: ir.Expr) -> tuple[int, str]:
        slot, level = super().compile(expr)
        if isinstance(expr, READ) and level == "g" and all(i.slot != slot for i in self.found):
            rule = self.rg.rule
            named = _sources(rule)
            indices = {ir.Column: lambda e: (e.index,), ir.Embed: lambda e: (e.column,),
                       ir.Text: lambda e: (e.column,)}.get(type(expr), lambda e: tuple(e.columns))(expr)
            columns = [named.get(i, (rule.head, f"_c{i}")) for i in indices]
            if isinstance(expr, ir.Features | ir.Encode):
                widths = [int(self.rg.columns[i].shape[1]) if self.rg.columns[i].dim() == 2 else 1 for i in indices]
            else:
                widths = [int(self.b.plan.meta[slot].shape[1]) if self.b.plan.meta[slot].dim() == 2 else 1]
            self.found.append(Input(slot, self.rg, rule.head, rule.origin, columns, widths, self.permutation,
                                    computed=isinstance(expr, ir.Embed | ir.Text)))
        return slot, level


def plain_plan(template: ir.Template, grounding: Grounding) -> tuple[Plan, list[Input]]:
    """The unoptimized float64 plan of `grounding` and the inputs it reads from the database."""
    found: list[Input] = []
    recording = type("_Recording", (_Recording,), {"found": found})
    builder = PlanBuilder(template, grounding, torch.float64, compress=False)
    builder.context = recording
    return builder.build(), found
