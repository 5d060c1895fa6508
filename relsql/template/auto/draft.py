"""The template being written: what its statements share (the database, its keys, the target, the
options, the names handed out so far, the text so far) and the conventions every statement keeps:
node relations keyed by the target row (r_*, and r_time), then by the node row (n_*), and the time
cut that keeps a target row's future out."""

from __future__ import annotations

from relsql.data.engine import Database
from relsql.data.keys import Schema
from relsql.template import ir
from relsql.template.auto.cuts import Sizes
from relsql.template.auto.names import Names, distinct, quoted, safe
from relsql.template.auto.options import Options
from relsql.template.auto.paths import Node, Step
from relsql.template.auto.times import Time, before


class Draft:
    """A template's statements so far (`out`) and what writing the next one needs."""

    def __init__(self, db: Database, schema: Schema, target: str, column: str, options: Options, *,
                 aggregation: tuple[str, ...], times: dict[str, Time], labels: dict[str, str], sizes: Sizes,
                 inclusive: bool = False, members: int = 1, ranking: bool = False):
        self.db, self.schema, self.target, self.column = db, schema, target, column
        self.numbers, self.dropout = options.numbers, options.dropout
        self.labels = labels
        self.weight_name = Names()
        self.per_table: dict[str, str] = {}  # HGT's weights of a table (node type), shared by its statements
        # every vector holds the members' vectors side by side; a linear map between two such vectors is
        # block-diagonal (`blocks`), so the members never mix (relsql/compile/members.py)
        self.members = members
        self.width, self.aggregation, self.layer = options.width * members, aggregation, options.layer
        self.blocks = f", blocks={members}" if members > 1 else ""
        self.time_column, self.time_columns = options.time_column, times
        self.inclusive = inclusive  # RelBench's cut (`<=`): relsql.template.auto.scope.relbench_cut
        self.out: list[str] = []
        self.identifiers: list[str] = []  # table.column named like an identifier and left out
        self.sizes = sizes
        self.ranking = ranking  # a ranking target's towers: layers.row_value adds its event rows' ages linearly
        self.label_kind: str | None = None  # "boolean", "number" or "float": earlier siblings' labels are read (layers.lateral)
        self.label_scale: tuple[float, float] | None = None  # a squeezed numeric label's (mean, spread): labels.py
        self.counted: dict[tuple[str, str], tuple[int, int]] = {}  # (table, column) -> (distinct values, non-NULL rows)
        self.nonfinite: set[tuple[str, str]] = set()  # floating-point columns holding NaN or an infinity (`count_all`)
        self.inline: dict[str, tuple[str, list[str], str]] = {}  # keyless table -> its rows' encoding (encoders.encoding)
        self.target_keys = list(schema.primary_keys[target])
        # Key columns of node relations: r_<target key> (and r_time), then n_<node table key>.
        r_names = distinct([f"r_{safe(k)}" for k in self.target_keys] + (["r_time"] if self.time_column else []))
        self.r = dict(zip(self.target_keys, r_names))
        self.r_time = r_names[-1] if self.time_column else ""

    def own(self, table: str) -> dict[str, str]:
        """`table`'s key columns as enc_<table> (and, for the target, p_/h_/predict) name them: as the
        table does, but a key column named h (every relation's value column) or like a column of
        relsql's own (`_rid`, `_rule`, ...: relsql.template.ir.reserved) is renamed."""
        pk = self.schema.primary_keys[table]
        if not any(_clashes(k) for k in pk):
            return {k: k for k in pk}
        return dict(zip(pk, distinct([f"{k.lstrip('_')}_key" if _clashes(k) else k for k in pk])))

    def n(self, table: str) -> dict[str, str]:
        """The node relation's key column name for each key column of `table`."""
        pk = self.schema.primary_keys[table]
        return dict(zip(pk, distinct([f"n_{safe(k)}" for k in pk])))

    def keys(self, node: Node) -> list[str]:
        """Key columns of a node relation: the target row's key (and time), then the node row's."""
        own = list(self.n(node.table).values())
        return list(self.r.values()) + ([self.r_time] if self.time_column else []) + own

    def activation(self, value: str) -> str:
        """A layer's nonlinearity: tanh, then dropout when asked for. Measured on bench.quality
        --quick (4 targets x 2 seeds, ple encoders), tanh against gelu followed by layer_norm:
        ROC-AUC 0.867 vs 0.831 and 0.935 vs 0.932, MAE 0.423 vs 0.541; accuracy 0.831 vs 0.840
        the one where the layer norm was ahead."""
        out = f"tanh({value})"
        return f"dropout({out}, {self.dropout:g})" if self.dropout else out

    def event_time(self, table: str, step: Step | None = None) -> Time | None:
        """The time that cuts `table`'s rows: none for a parent row reached by its key (an attribute
        of the row that references it, known when that row is: a parent keyed by a time, such as
        hourly weather, would otherwise never match), nor for a table without a comparable time."""
        if not self.time_column or (step is not None and not step.to_child):
            return None
        return self.time_columns.get(table)

    @property
    def target_kind(self) -> str:
        return self.time_columns[self.target].kind if self.target in self.time_columns else "date"

    def time_join(self, table: str, alias: str, target_time: str, step: Step | None = None) -> tuple[str, str]:
        """(extra ON condition for `alias`, extra JOIN of a date dimension) keeping later rows out."""
        time = self.event_time(table, step)
        if time is None:
            return "", ""
        if time.via is None:
            cut = before(f"{alias}.{quoted(time.column)}", time.kind, target_time, self.target_kind, self.inclusive)
            return f" AND {cut}", ""
        dim = f"{alias}d"
        on = " AND ".join(f"{dim}.{quoted(r)} = {alias}.{quoted(c)}" for c, r in zip(time.via.columns, time.via.references))
        cut = before(f"{dim}.{quoted(time.column)}", time.kind, target_time, self.target_kind, self.inclusive)
        return "", f"\nJOIN {quoted(time.via.table)} {dim} ON {on} AND {cut}"


def _clashes(key: str) -> bool:
    """Whether a key column's name cannot be a head key of a generated relation as it is."""
    return key.casefold() == "h" or ir.reserved(key)
