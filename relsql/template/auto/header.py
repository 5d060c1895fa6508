"""The template's header: what it predicts and how, and everything it left out and why (tables past
the hops, hubs, empty paths, other questions' task tables, models' outputs, identifiers, events of an
unknown time), with the keys it inferred or was given. Its first line marks the text as generated."""

from __future__ import annotations

import re

from relsql.template.auto.cuts import HUB_CHILDREN, PATH_GROUNDINGS, PATH_GROWTH, Pruning
from relsql.template.auto.options import AGGREGATIONS, Options
from relsql.template.auto.paths import Node, path_tables, tree, walk
from relsql.template.auto.scope import Scope

HEADER = "-- relsql automatic template"  # the first line's start: fit() blends such a model with a GBM by default


def is_automatic(source: str) -> bool:
    """Whether a template's text was generated here (edited or not): its first line is the header."""
    return source.startswith(HEADER)


def summary(target: str, options: Options, terms: tuple[str, ...], tables: list[str]) -> list[str]:
    """The first lines: the target, the layers, the width and aggregation, the tables used
    (relsql/train/model/search.py reads the options back from them)."""
    described = "all: " + ", ".join(terms) if terms == AGGREGATIONS else ", ".join(terms)
    combined = {"gat": "attention over child rows (GAT)", "hgt": "typed attention over child rows (HGT)"}.get(
        options.layer, f"aggregation over child rows {described}")
    return [f"{HEADER} ({options.layer} layers): predict {target} from up to {options.hops} foreign-key hops away",
            f"-- width {options.width}, {combined}; edit freely and retrain.",
            f"-- tables used: {', '.join(tables)}"]


def left_out(scope: Scope, options: Options, pruning: Pruning, tables: list[str], labels: dict[str, str]) -> list[str]:
    """Tables the walk left out: rows that multiply, empty paths, models' outputs, other questions'
    task tables, tables past the hops, and tables behind ones left out for time."""
    lines = []
    if pruning.large:
        lines.append(f"-- left out, rows multiplied along the way (a parent's children when it has over {HUB_CHILDREN} on "
                     f"average, or estimated over {PATH_GROUNDINGS:,} groundings and {PATH_GROWTH}x the largest table "
                     "on the path): "
                     + ", ".join(dict.fromkeys(f"{n.table} (via {' -> '.join(path_tables(n))})" for n in pruning.large)))
    if pruning.empty:
        lines.append("-- left out, no rows along the way (a statement without groundings): "
                     + ", ".join(f"{n.table} (via {' -> '.join(path_tables(n))})" for n in pruning.empty))
    if scope.outputs:
        lines.append(f"-- left out, tables of a model's outputs (predictions, gradients): {', '.join(scope.outputs)}")
    if scope.tasks:
        lines.append(f"-- left out, task tables of other questions (their labels hold the future): {', '.join(scope.tasks)}")
    keys = scope.keys
    excluded = [t for t in dict.fromkeys(step.child for _, step in pruning.dropped) if t not in tables]
    reachable = {n.table for n in walk(tree(keys, scope.table, options.hops, labels))} if pruning.dropped else set(tables)
    unreachable = [t for t in keys.tables if t not in reachable]
    behind = [t for t in keys.tables if t in reachable and t not in tables and t not in excluded]
    if unreachable:
        lines.append(f"-- left out (not reachable within {options.hops} hops): {', '.join(unreachable)}")
    if behind:
        lines.append(f"-- left out (reached only through tables left out for time): {', '.join(behind)}")
    return lines


def keys(scope: Scope) -> list[str]:
    """The keys inferred, and those given (with where from), one line each."""
    schema = scope.keys
    lines = [f"-- inferred primary key {name}({', '.join(schema.primary_keys[name])})"
             for name in sorted(schema.inferred_primary)]
    lines += [f"-- inferred foreign key {child}({', '.join(fk.columns)}) -> {fk.table}({', '.join(fk.references)})"
              for child, fk in schema.inferred_foreign]
    given = {k: re.sub(r"[\x00-\x1f\x7f]", " ", v) for k, v in schema.origins.items() if v.startswith("given")}  # one line each
    for key, origin in given.items():
        if key[0] == "primary":
            lines.append(f"-- primary key {key[1]}({', '.join(schema.primary_keys.get(key[1], ()))}), {origin}")
        else:
            _, child, fk = key
            lines.append(f"-- foreign key {child}({', '.join(fk.columns)}) -> {fk.table}({', '.join(fk.references)}), {origin}")
    return lines


def times(scope: Scope, options: Options, pruning: Pruning, tables: list[str], nodes: list[Node],
          sibling_labels: bool = False) -> list[str]:
    """How time cuts the rows: whose times are used, what the target row's siblings bring (their labels
    where `sibling_labels`: layers.lateral reads them from strictly earlier siblings only), child tables
    left out for an unknown time, and parent tables joined without one."""
    if not options.time_column:
        return []
    events = {n.table for n in nodes[1:] if n.step.to_child}
    used = [scope.times[t].describe(t) for t in tables if t in scope.times and t in events]  # the target's own: siblings
    lines = [f"-- time: rows of {', '.join(used) or 'no table'} join a target row only if "
             f"{'at or before' if scope.inclusive else 'earlier than'} its {options.time_column}"
             + (" (RelBench's cut: an event at the task row's timestamp is known)" if scope.inclusive else "")]
    if scope.table in events:
        reads = (f"their {scope.column} only where strictly earlier than the target row's time" if sibling_labels
                 else f"never their {scope.column}")
        lines.append(f"-- siblings: other {scope.table} rows sharing a parent row join under that cut, never the target "
                     f"row itself; {reads}")
    for name, child, fk in dict.fromkeys((node.table, step.child, step.fk) for node, step in pruning.dropped):
        lines.append(f"-- left out, no time known: {child} (the child rows of {name} via "
                     f"{', '.join(fk.columns)}): events that may lie after the target row's time; give its "
                     "time with time_columns={table: column} or pass timeless='include'")
    timeless_parents = [t for t in tables if t not in scope.times and t != scope.table]
    if timeless_parents:
        verb = "joined unfiltered (timeless='include')" if options.timeless == "include" else \
            "joined only as parent rows (attributes of an entity, not events)"
        lines.append(f"-- no time known, {verb}: {', '.join(timeless_parents)}")
    return lines
