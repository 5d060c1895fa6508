"""Optimizer passes, each a function plan -> plan, applied in order (sqlglot-style RULES)."""

from __future__ import annotations

from collections.abc import Callable

from relsql.compile.plan import Plan

Pass = Callable[[Plan], Plan]

RULES: tuple[Pass, ...] = ()


def optimize(plan: Plan, passes: tuple[Pass, ...] | None = None) -> Plan:
    """Run `passes` (default: RULES) over the plan; each pass must keep values identical."""
    for rule in RULES if passes is None else passes:
        plan = rule(plan)
    return plan
