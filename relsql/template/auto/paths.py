"""The walk over the schema's foreign-key paths: the computation tree of a relational GNN rooted at
the target table. Every table reachable within `hops` foreign-key steps (both directions, never
straight back over the edge just used, except from a parent row to its other, earlier child rows in
a temporal template: `Cuts.siblings`) becomes a tree node; what a `Cuts` refuses is left out with
everything beyond it (relsql/template/auto/cuts.py decides what and records why)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Protocol

from relsql.data.catalog import ForeignKey
from relsql.data.keys import Schema
from relsql.template.auto.names import Names, quoted, safe


@dataclass
class Step:
    """A move from one table to a neighbour over one foreign key."""

    fk: ForeignKey
    child: str  # the table holding the foreign key
    to_child: bool  # True: one row → its many child rows; False: a row → its one parent row

    @property
    def near_columns(self) -> tuple[str, ...]:
        """The columns of the near table's row this step reads."""
        return tuple(self.fk.references if self.to_child else self.fk.columns)

    def condition(self, near: str, far: str, held: dict[str, str] | None = None) -> str:
        """SQL joining the far table's rows (alias `far`) to the near table's row (alias `near`), or
        to the near columns `held` already names ({column: SQL})."""
        parts = []
        for child_col, parent_col in zip(self.fk.columns, self.fk.references):
            near_col, far_col = (parent_col, child_col) if self.to_child else (child_col, parent_col)
            parts.append(f"{far}.{quoted(far_col)} = {held[near_col] if held else f'{near}.{quoted(near_col)}'}")
        return " AND ".join(parts)

    @property
    def far(self) -> str:
        """The table this step reaches."""
        return self.child if self.to_child else self.fk.table

    def reverses(self, other: Step | None) -> bool:
        """Whether this step goes straight back over `other` (the same key, the other direction)."""
        return other is not None and self.fk == other.fk and self.child == other.child and self.to_child != other.to_child


@dataclass
class Node:
    name: str
    table: str
    step: Step | None
    parent: Node | None
    children: list[Node] = field(default_factory=list)


class Cuts(Protocol):
    """What the walk may not take: a step (before its node is named), or a named node."""

    def takes(self, node: Node, step: Step) -> bool: ...

    def siblings(self, node: Node, step: Step) -> bool: ...

    def admits(self, child: Node) -> bool: ...


def steps(schema: Schema, table: str) -> list[Step]:
    """The steps out of `table`: to its child rows (keyed or not: a table without a key of its own,
    an event log, is a leaf whose rows are aggregated where they are read) and to its keyed parent rows."""
    found = []
    for child, fk in schema.foreign_keys:
        if fk.table == table:
            found.append(Step(fk, child, to_child=True))
        if child == table and schema.primary_keys.get(fk.table):
            found.append(Step(fk, child, to_child=False))
    return found


def tree(schema: Schema, target: str, hops: int, labels: dict[str, str], cuts: Cuts | None = None) -> Node:
    """The computation tree; `labels` are the tables' distinct sanitized names. Node names are
    distinct too (they name relations x_<node>, p_<node>, h_<node> and weights). A step or node
    that `cuts` refuses is not taken, nor anything beyond it."""
    root = Node(labels[target], target, None, None)
    node_names = Names([root.name])

    def grow(node: Node, depth: int) -> None:
        if depth == hops:
            return
        seen: dict[str, int] = {}
        out = steps(schema, node.table)
        neighbours = Counter(s.far for s in out)  # tables reached over several keys
        for step in out:
            if step.reverses(node.step) and (cuts is None or not cuts.siblings(node, step)):
                continue  # never straight back over the edge we came by, but to a parent's earlier child rows
            if cuts is not None and not cuts.takes(node, step):
                continue
            label = labels[step.far]
            seen[label] = seen.get(label, 0) + 1
            if seen[label] > 1 or neighbours[step.far] > 1:
                label = f"{label}_by_{safe('_'.join(step.fk.columns))}"
            child = Node(node_names(f"{node.name}__{label}" if node.parent else label), step.far, step, node)
            if cuts is None or cuts.admits(child):
                node.children.append(child)
                if keyed(schema, child):  # a keyless table's rows cannot be named as a node's: nothing beyond them
                    grow(child, depth + 1)

    grow(root, 0)
    return root


def keyed(schema: Schema, node: Node) -> bool:
    """Whether `node`'s table has a primary key: its rows get relations of their own (enc_, x_);
    a keyless table's rows are encoded inside the aggregate that reads them (a leaf)."""
    return bool(schema.primary_keys.get(node.table))


def walk(node: Node):
    """The tree's nodes, depth first, parents before children."""
    yield node
    for child in node.children:
        yield from walk(child)


def path_tables(node: Node) -> list[str]:
    """The tables from the root to `node`."""
    tables = []
    while node is not None:
        tables.append(node.table)
        node = node.parent
    return tables[::-1]
