"""`generate`'s options, checked once: the template's shape (hops, width, layer, aggregation,
encoders, dropout), its handling of time, its keys, and a ranking target's towers."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from relsql import arguments
from relsql.errors import SchemaError
from relsql.template import ir

NUMBERS = ("ple", "standardized")  # encoders: ranges, calendars, rare buckets, text | the earlier standardized numbers
AGGREGATIONS = ("avg", "sum", "max", "count")  # terms over child rows; "all" is all of them
TIMELESS = ("exclude", "include")
LAYERS = ("sage", "rgcn", "gat", "hgt")  # how a node combines the rows of each foreign key and direction
# independent networks side by side, each `width` wide, trained each on its own loss, their outputs
# averaged (relsql/compile/members.py; docs/quality.md: the measurement behind the default)
MEMBERS = 1
# a ranking target's default terms over child rows: no max. Its backward (gather, compare, scatter over every
# (target row, child row) pair) took half of each step on bench.recommend's shop (183k customer-purchase pairs
# x 16); without it, seeds 0-2 test MAP@10 0.1252 / 0.1189 / 0.1229 (mean 0.1223, as with max: 0.1213 / 0.1239
# / 0.1218) in 17 s of CPU per fit instead of 24-35 s. The history term already averages the bought items.
RANKING_AGGREGATION = ("avg", "sum", "count")


def aggregation_terms(aggregation) -> tuple[str, ...]:
    """`aggregation` as its terms: "all", one name, "avg,sum", or a list of names ("mean" is avg)."""
    if isinstance(aggregation, str):
        parts = [p.strip().lower() for p in aggregation.split(",")]
    elif isinstance(aggregation, (list, tuple)) and all(isinstance(p, str) for p in aggregation):
        parts = [p.strip().lower() for p in aggregation]
    else:
        parts = None
    if parts == ["all"]:
        return AGGREGATIONS
    terms = tuple(dict.fromkeys("avg" if p == "mean" else p for p in parts or ()))
    if not terms or not all(t in AGGREGATIONS for t in terms) or len(terms) != len(parts):
        raise SchemaError(f"aggregation must be all, one of {', '.join(AGGREGATIONS[:3])}, or a list of distinct "
                          f"terms from {', '.join(AGGREGATIONS)} (\"avg,count\"); got {aggregation!r}")
    return terms


@dataclass(frozen=True)
class Options:
    """What `generate` takes besides the database and the target (its docstring says what each does)."""

    hops: int = 2  # foreign-key steps from the target row
    width: int = 16  # the vectors' width
    aggregation: object = None  # terms over child rows: "all" (None), one name, "avg,count" or a list
    time_column: str | None = None  # the target table's time: later rows are kept out
    time_columns: dict[str, str] | None = None  # other tables' times, {table: column}
    infer_keys: bool = True  # infer keys the database does not declare
    timeless: str = "exclude"  # child tables whose rows' time is unknown: "exclude" or "include"
    keys: object = None  # given keys (a keys file, its text or tuples: relsql/data/keyfile.py)
    layer: str = "sage"  # one of LAYERS
    numbers: str = "ple"  # encoders, one of NUMBERS
    dropout: float = 0.0  # the rate after each layer
    dimension: int | None = None  # a ranking target's towers' width (32)
    history: bool | None = None  # a ranking target's history term (True)
    members: int | None = None  # independent networks side by side (MEMBERS; 1 for gat, hgt and ranking targets)

    def checked(self) -> Options:
        """These options in their canonical types; a SchemaError (or RelsqlError) names the first
        bad one. What needs the database (the target's columns, a ranking target) is checked later."""
        hops = arguments.integer("hops", self.hops, minimum=0, maximum=16)
        width = arguments.integer("width", self.width, maximum=ir.MAX_WIDTH)
        arguments.text("time_column", self.time_column, optional=True)
        if self.time_columns is not None and (not isinstance(self.time_columns, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in self.time_columns.items())):
            raise SchemaError(f"time_columns must map table names to column names, got {self.time_columns!r}")
        if not isinstance(self.timeless, str) or self.timeless not in TIMELESS:
            raise SchemaError(f"timeless must be exclude or include, got {self.timeless!r}")
        aggregation_terms("all" if self.aggregation is None else self.aggregation)
        if not isinstance(self.numbers, str) or self.numbers not in NUMBERS:
            raise SchemaError(f"numbers must be one of {', '.join(NUMBERS)}, got {self.numbers!r}")
        dropout = arguments.number("dropout", self.dropout)
        if not 0 <= dropout < 1:
            raise SchemaError(f"dropout must be at least 0 and below 1, got {dropout!r}")
        if not isinstance(self.layer, str) or self.layer not in LAYERS:
            raise SchemaError(f"layer must be one of {', '.join(LAYERS)}, got {self.layer!r}")
        if self.layer == "rgcn" and self.aggregation not in (None, "all", "avg"):
            raise SchemaError(f"layer='rgcn' takes the mean per key and direction; leave aggregation out "
                              f"(got {self.aggregation!r})")
        members = self.members
        if members is not None:
            members = arguments.integer("members", members, maximum=64)
            if members > 1 and self.layer in ("gat", "hgt"):
                raise SchemaError(f"layer={self.layer!r} scores attention from every feature of a row, which would mix the "
                                  f"members; use members=1 with it (got members={members})")
            if width * members > ir.MAX_WIDTH:
                raise SchemaError(f"width {width} x members {members} is wider than relsql's limit of {ir.MAX_WIDTH}")
        return dataclasses.replace(self, hops=hops, width=width, dropout=dropout, members=members)

    def member_count(self, ranking: bool) -> int:
        """The members the template gets: as asked, else MEMBERS (1 for attention layers and ranking targets)."""
        if ranking or self.layer in ("gat", "hgt"):
            if ranking and (self.members or 1) > 1:
                raise SchemaError(f"a ranking target's towers are scored by dot products, which would mix the members; "
                                  f"use members=1 (got members={self.members})")
            return 1
        return MEMBERS if self.members is None else self.members

    def terms(self, ranking: bool) -> tuple[str, ...]:
        """The aggregation's terms: RGCN's mean, a ranking target's RANKING_AGGREGATION unless asked
        for others, else `aggregation` ("all" when not given)."""
        if self.layer == "rgcn":
            return ("avg",)
        if ranking and self.aggregation is None:
            return RANKING_AGGREGATION
        return aggregation_terms("all" if self.aggregation is None else self.aggregation)
