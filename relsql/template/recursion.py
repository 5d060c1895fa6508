"""Recursive templates, unrolled to a declared depth (the thesis, §5.1.8).

A relation that reads itself, directly or through a cycle of relations, becomes `depth + 1`
levels: level 0 holds its base rules (those reading no relation of the cycle), level k its base
rules plus its recursive rules reading level k - 1. Every level shares the rules' weights (the
names are the template's), and the last level keeps the relation's name, so readers of the
relation (and outputs) see the deepest one. Each level is an ordinary relation the database
grounds with a join; on an acyclic ground graph no deeper than `depth` the values equal
NeuraLogic's fixpoint grounding.

The depth is declared in the template (`-- relsql: depth 3`; in Datalog `% relsql: depth 3`)
or given to `Template.from_sql/from_datalog/from_file(..., depth=3)`.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping

import sqlglot.expressions as exp

from relsql.errors import TemplateError
from relsql.template import ir

MAX_DEPTH = 64
_DIRECTIVE = re.compile(r"^[ \t]*(?:--|%|//)[ \t]*relsql:[ \t]*depth\b(.*)$", re.MULTILINE | re.IGNORECASE)


def declared_depth(text: str) -> int | None:
    """The depth a `relsql: depth N` comment line declares (None without one)."""
    found = [m.group(1).strip() for m in _DIRECTIVE.finditer(text)]
    if not found:
        return None
    if len(set(found)) > 1:
        raise TemplateError(f"the template declares the recursion depth more than once ({', '.join(found)}); keep one "
                            "`relsql: depth N` line")
    return _checked(found[0], "`relsql: depth` comment")


def _checked(value, where: str) -> int:
    text = str(value).strip()
    if isinstance(value, bool) or not re.fullmatch(r"[0-9]{1,3}", text) or not 1 <= int(text) <= MAX_DEPTH:
        raise TemplateError(f"{where}: the recursion depth must be a whole number from 1 to {MAX_DEPTH}, got {value!r}")
    return int(text)


def cycles(template: ir.Template) -> list[list[str]]:
    """The relations that read themselves, grouped by cycle (strongly connected components with
    a cycle), in declaration order."""
    graph = {name: [r for rule in relation.rules for r in (*rule.refs, *rule.depends) if r in template.relations]
             for name, relation in template.relations.items()}
    order = list(template.relations)
    found = [[n for n in order if n in component] for component in strongly_connected(graph)]
    return sorted(found, key=lambda c: order.index(c[0]))


def strongly_connected(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The strongly connected components of `graph` that hold a cycle (more than one node, or a node
    that points at itself), by Tarjan's algorithm done iteratively (a long chain must not exhaust the
    stack). Nodes are visited in the graph's order; every node a node points at must be a key."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(graph[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            step = next(edges, None)
            if step is not None:
                if step not in index:
                    index[step] = low[step] = len(index)
                    stack.append(step)
                    on_stack.add(step)
                    work.append((step, iter(graph[step])))
                elif step in on_stack:
                    low[node] = min(low[node], index[step])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in graph[node]:
                    found.append(component)
    return found


def unroll(template: ir.Template, depth: int | None, comment: str = "--") -> None:
    """Replace every cycle of relations by `depth` + 1 levels (in place). The depth the source
    declares counts when `depth` is None; a given one must agree with it, and is written into
    the source (a `comment` line) so that a saved model reloads the same relations."""
    declared = declared_depth(template.source)
    if depth is not None:
        depth = _checked(depth, "depth")
        if declared is not None and declared != depth:
            raise TemplateError(f"depth={depth} disagrees with the template's `relsql: depth {declared}` line; give one")
        if declared is None:
            template.source = f"{comment} relsql: depth {depth}\n{template.source}"
    depth = depth if depth is not None else declared
    loops = cycles(template)
    if not loops:
        return
    if depth is None:
        shown = " -> ".join([*loops[0], loops[0][0]])
        raise TemplateError(f"recursive template: {shown}. Give the depth to unroll it to: a `-- relsql: depth 3` line "
                            "(`% relsql: depth 3` in Datalog) or depth=3")
    names = _Levels(template)
    levels: dict[str, list[ir.Relation]] = {}
    for members in loops:
        _unroll_cycle(template, members, depth, names, levels)
    relations: dict[str, ir.Relation] = {}
    for name, relation in template.relations.items():
        for level in levels.get(name, []):
            relations[level.name] = level
        relations[name] = relation
    template.relations = relations


class _Levels:
    """Names of relations' lower levels, `name_level<k>` (an identifier wherever the name is one,
    as engines such as Spark want table names), never a name the template's text holds: a
    relation's, or a database table's that a rule reads (a level of that name would hide it)."""

    def __init__(self, template: ir.Template):
        self.taken = {n.casefold() for n in template.relations}
        self.taken |= {word.casefold() for word in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", template.source)}

    def __call__(self, name: str, level: int) -> str:
        base, n = f"{name}_level{level}", 1
        chosen = base
        while chosen.casefold() in self.taken:
            n += 1
            chosen = f"{base}_{n}"
        self.taken.add(chosen.casefold())
        return chosen


def _unroll_cycle(template: ir.Template, members: list[str], depth: int, names: _Levels,
                  levels: dict[str, list[ir.Relation]]) -> None:
    inside = set(members)
    recursive = {id(rule) for name in members for rule in template.relations[name].rules
                 if inside & {*rule.refs, *rule.depends}}
    if all(id(rule) in recursive for name in members for rule in template.relations[name].rules):
        raise TemplateError(f"recursive template: {' -> '.join([*members, members[0]])} has no base rule (one that "
                            "reads none of these relations), so no level has groundings; add one")
    below: dict[str, str] = {}  # each member's name at the level below (absent: that level has no rules)
    for level in range(depth + 1):
        here: dict[str, str] = {}
        for name in members:
            relation = template.relations[name]
            rules = []
            for rule in relation.rules:
                if id(rule) not in recursive:
                    rules.append(rule)
                elif all(r in below for r in {*rule.refs, *rule.depends} & inside):
                    rules.append(_renamed(template, rule, below, level))
            final = level == depth
            if final:
                relation.rules = rules  # the relation itself: none of its original rules may stay
            if not rules:
                continue
            here[name] = name if final else names(name, level)
            if not final:
                levels.setdefault(name, []).append(dataclasses.replace(relation, name=here[name], rules=[
                    dataclasses.replace(rule, head=here[name]) for rule in rules]))
        below = here
    for name in members:
        if not template.relations[name].rules:
            raise TemplateError(f"recursive relation `{name}`: no rule reaches depth {depth}; raise the depth")


def _renamed(template: ir.Template, rule: ir.Rule, below: dict[str, str], level: int) -> ir.Rule:
    """`rule` reading the level below for the relations of its cycle."""
    mapping = {name: below[name] for name in below if name in {*rule.refs, *rule.depends}}
    query = _RenamedQuery(rule.query, mapping) if callable(rule.query) else rename_tables(rule.query.copy(), mapping)
    return dataclasses.replace(rule, query=query, refs=[mapping.get(r, r) for r in rule.refs],
                               depends=[mapping.get(r, r) for r in rule.depends],
                               origin=f"{rule.origin}, recursion level {level}")


def rename_tables(select: exp.Select, mapping: dict[str, str]) -> exp.Select:
    """Table references to relations in `mapping` read the mapped relation instead, under their
    old name as alias (so `path.a0` still resolves); in place."""
    local = {cte.alias.casefold() for cte in select.find_all(exp.CTE)}  # a CTE of that name shadows the relation
    folded = {k.casefold(): v for k, v in mapping.items() if k.casefold() not in local}

    def swap(node: exp.Expression) -> exp.Expression:
        if isinstance(node, exp.Table) and not node.args.get("db") and node.name.casefold() in folded:
            table = exp.Table(this=exp.to_identifier(folded[node.name.casefold()], quoted=True))
            return exp.alias_(table, node.alias or node.name, table=True, quoted=True)
        return node

    return select.transform(swap, copy=False)


@dataclasses.dataclass
class _RenamedQuery:
    """A Datalog rule's body query (built once the schema is known), reading lower levels."""

    build: object
    mapping: dict[str, str]

    def __call__(self, db) -> exp.Select | None:
        select = self.build(db)
        return None if select is None else rename_tables(select, self.mapping)
