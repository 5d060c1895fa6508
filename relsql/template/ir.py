"""The template IR that both frontends produce and the grounder and compiler consume.

A template is a set of neural relations. Each relation has rules; each rule has a body query
(ordinary SQL over database tables and earlier neural relations, enumerating groundings) and
a neural expression evaluated per grounding and, above its aggregate, per head. Keeping the
body as a sqlglot AST lets the database, not Python, do all the structural work.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import sqlglot.expressions as exp

from relsql import textfile
from relsql.errors import TemplateError

if TYPE_CHECKING:
    from relsql.data.engine import Database

# Limits both frontends enforce, so that a typo or a hostile file fails with a clear message
# instead of an allocation that cannot succeed or a stack overflow.
MAX_WIDTH = 2**24  # one dimension of a weight (16,777,216): far beyond any layer, within int64 math
MAX_ELEMENTS = 2**31  # elements of one weight whose whole shape is known: 8 GiB in float32
MAX_NESTING = 32  # parentheses/brackets inside one SQL statement: sqlglot's parser recurses per level
MAX_EXPRESSION_DEPTH = 256  # levels of one neural expression (a long `a + b + ...` counts one per term)
MAX_BODY_LITERALS = 64  # literals of one Datalog rule: DuckDB's join planning grows steeply beyond

# Column names relsql's grounding queries use next to the head keys (relsql/sql.py,
# execute.py, demand.py, train/embeddings/embeddings.py); a head key with one of these names would be
# shadowed by them, so it is refused. DuckDB compares identifiers case-insensitively.
_RESERVED = re.compile(r"_(rid|head|rule|global|step|[hrc]\d+|s\d+_c\d+|v_.*)", re.IGNORECASE | re.DOTALL)


def reserved(name: str) -> bool:
    """True for a name relsql uses for its own columns in grounding queries."""
    return _RESERVED.fullmatch(name) is not None


def table_suffix(name: str) -> str:
    """A weight's name as it appears in the names of the tables relsql writes for it (database
    embeddings, gradients): letters, digits, underscores."""
    return re.sub(r"[^0-9A-Za-z_]", "_", name)


def storage_name(name: str) -> str:
    """How the database sees a weight's name in table names, compared case-insensitively as DuckDB does."""
    return table_suffix(name).lower()


def check_shape(shape: tuple, where: str) -> None:
    """A weight shape as written: at most 2 dimensions, each a positive integer within MAX_WIDTH."""
    dims = [d for d in shape if d is not None]
    if len(shape) > 2:
        raise TemplateError(f"{where}: a weight has at most 2 dimensions (a vector or a matrix), got {len(shape)}: "
                            f"{shape_text(shape)}")
    for d in dims:
        if isinstance(d, bool) or not isinstance(d, int) or d <= 0:
            raise TemplateError(f"{where}: weight dimensions must be positive integers, got {shape_text(shape)}")
        if d > MAX_WIDTH:
            raise TemplateError(f"{where}: weight dimension {d} is larger than relsql's limit of {MAX_WIDTH} "
                                "(2**24) per dimension; use a smaller width")
    if math.prod(dims) > MAX_ELEMENTS:
        raise TemplateError(f"{where}: weight {shape_text(shape)} has {math.prod(dims)} elements, more than "
                            f"relsql's limit of {MAX_ELEMENTS} (2**31) per weight; use smaller widths")


def shape_text(shape: tuple) -> str:
    return "{" + ",".join("?" if d is None else str(d) for d in shape) + "}"


def check_expression_depth(expr: exp.Expression, where: str) -> None:
    """Refuse a sqlglot expression nested deeper than MAX_EXPRESSION_DEPTH (counted without recursion)."""
    stack = [(expr, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_EXPRESSION_DEPTH:
            raise TemplateError(
                f"{where}: the neural expression nests too deeply (more than {MAX_EXPRESSION_DEPTH} levels; each term "
                "of a long sum a + b + ... adds one). Split it: statements with one name are summed, and "
                "intermediate relations can hold parts.")
        stack.extend((child, depth + 1) for child in node.iter_expressions())


def check_names(template: Template) -> None:
    """Names the database would fold together: relations differing only in case share one key
    table, weights whose table names agree case-insensitively share one table."""
    relations: dict[str, str] = {}
    for name, relation in template.relations.items():
        other = relations.setdefault(name.lower(), name)
        if other != name:
            where = relation.rules[0].origin if relation.rules else ""
            raise TemplateError(
                f"{where + ': ' if where else ''}relations `{other}` and `{name}` differ only in case, and the database "
                "does not tell identifiers apart by case; rename one of them")
    weights: dict[str, str] = {}
    for name, spec in template.weights.items():
        other = weights.setdefault(storage_name(name), name)
        if other != name:
            first = template.weights[other]
            raise TemplateError(
                f"{spec.origin}: weight '{name}' and weight '{other}' (declared in {first.origin}) map to the same "
                "database table name (names are compared ignoring case, with characters other than letters, digits "
                "and _ read as _); rename one of them")


def read_text(path: Path, what: str) -> str:
    """A template file's text: a bounded regular file, decoded as UTF-8 (a byte-order mark is allowed)."""
    return textfile.read_text(path, what, TemplateError)


def check_text(text: object, what: str = "template") -> str:
    """A template's text: a str that UTF-8 can carry (a lone surrogate cannot reach the database)."""
    if not isinstance(text, str):
        raise TemplateError(f"the {what} must be text (a str), got {type(text).__name__}; use Template.from_file for a path")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        line = text.count("\n", 0, err.start) + 1
        raise TemplateError(f"the {what} has a character UTF-8 cannot hold at line {line} ({text[err.start]!r}, a lone "
                            "surrogate); remove it") from None
    return text


class Expr:
    """A node of a neural expression."""

    def children(self) -> tuple[Expr, ...]:
        return ()


@dataclass(frozen=True)
class Ref(Expr):
    """The value of the rule's `index`-th neural body reference in this grounding."""

    index: int


@dataclass(frozen=True)
class Column(Expr):
    """A numeric (or list-of-numbers) column of the grounding row, used as a vector."""

    index: int


@dataclass(frozen=True)
class Features(Expr):
    """Numeric grounding columns stacked into one vector, standardized with SQL statistics."""

    columns: tuple[int, ...]


@dataclass(frozen=True)
class Encode(Expr):
    """Grounding columns encoded by the database with statistics it computes once (kept with a
    saved model): `kind` "ple" (piecewise-linear over `bins` quantile bins, plus a NULL
    indicator, per column) or "calendar" (cyclic date parts and the standardized year)."""

    kind: str
    columns: tuple[int, ...]
    bins: int = 0


@dataclass(frozen=True)
class Text(Expr):
    """A text column as the mean of learnable vectors (the rows of weight `weight`, `buckets` + 1
    of them, the last a padding row) of its hashed words and character 3-grams, at most `tokens`
    of them per value (relsql/ground/text.py); `kind` "codes": a list column's hashed elements."""

    weight: str
    column: int
    buckets: int
    tokens: int
    kind: str = "text"


@dataclass(frozen=True)
class LayerNorm(Expr):
    """Each row's vector normalized to mean 0 and variance 1, then scaled by the weight `gain`
    and shifted by the weight `bias` (both as wide as the vector)."""

    gain: str
    bias: str
    arg: Expr

    def children(self) -> tuple[Expr, ...]:
        return (self.arg,)


@dataclass(frozen=True)
class Dropout(Expr):
    """While the net trains, each element is zeroed with probability `p` and the rest scaled by
    1/(1-p); in eval mode the identity."""

    p: float
    arg: Expr

    def children(self) -> tuple[Expr, ...]:
        return (self.arg,)


@dataclass(frozen=True)
class Embed(Expr):
    """A learnable embedding row per distinct value of a categorical grounding column."""

    weight: str
    column: int


@dataclass(frozen=True)
class Param(Expr):
    """A learnable (or fixed) tensor used directly as a value: a bias or a constant term."""

    weight: str


@dataclass(frozen=True)
class Const(Expr):
    value: float


@dataclass(frozen=True)
class Apply(Expr):
    """A weight times a value: matrix-vector product, or a scaling where shapes say so. With
    `types` (a categorical grounding column), one matrix per value of that column."""

    weight: str
    arg: Expr
    types: int | None = None

    def children(self) -> tuple[Expr, ...]:
        return (self.arg,)


@dataclass(frozen=True)
class Binary(Expr):
    op: str  # one of + - *
    left: Expr
    right: Expr

    def children(self) -> tuple[Expr, ...]:
        return (self.left, self.right)


@dataclass(frozen=True)
class Act(Expr):
    name: str
    arg: Expr
    param: float | None = None  # leaky_relu's negative slope (None: 0.01), sum_per_head's number of heads

    def children(self) -> tuple[Expr, ...]:
        return (self.arg,)


@dataclass(frozen=True)
class Combine(Expr):
    """NeuraLogic's combination of a rule's body values (sum, product, crosssum, ...)."""

    kind: str
    args: tuple[Expr, ...]

    def children(self) -> tuple[Expr, ...]:
        return self.args


@dataclass(frozen=True)
class Agg(Expr):
    """Aggregation over all groundings of one head; `count` ignores its argument."""

    kind: str
    arg: Expr

    def children(self) -> tuple[Expr, ...]:
        return (self.arg,)


@dataclass(frozen=True)
class Attention(Agg):
    """Attention over all groundings of one head: `sum_g softmax_g(score_g) * value_g`, the
    softmax per head over its groundings. `score` (the Agg's `arg`) of width H and `value` of
    width H*C give H heads of width C, concatenated (mode "concat") or averaged ("mean")."""

    value: Expr = None  # type: ignore[assignment]
    mode: str = "concat"

    def children(self) -> tuple[Expr, ...]:
        return (self.arg, self.value)


@dataclass
class WeightSpec:
    """A learnable tensor. `None` in `shape` is an input width inferred at compile time."""

    name: str
    shape: tuple[int | None, ...]
    init: list | float | None = None
    fixed: bool = False
    kind: str = "matrix"  # matrix | embedding | bias | offset
    origin: str = ""  # where it was declared, for error messages
    storage: str = "memory"  # embeddings: "memory" (a torch parameter) or "database" (a table: relsql/train/embeddings/)
    min_count: int | None = None  # embeddings: values in fewer groundings share row 0 with unseen values and NULL
    blocks: int = 1  # linear: block-diagonal with this many blocks (independent members side by side; relsql/compile/members.py)


@dataclass
class Rule:
    """One statement: groundings from `query`, one value per head from `expr`.

    `query` selects `_h{i}` head keys, `_r{j}` row ids of neural references (taken from the
    `_rid` column of relation `refs[j]`'s key table) and `_c{k}` raw columns. Table names in
    it that equal a neural relation's name stand for that relation's key table.
    """

    head: str
    query: exp.Select | Callable[[Database], exp.Select | None]  # Datalog: built once the schema is known
    refs: list[str]
    expr: Expr
    grouped: bool
    distinct: bool = False
    origin: str = ""  # e.g. "statement 3 (line 12)"
    n_columns: int = 0
    depends: list[str] = field(default_factory=list)  # relations joined only for their keys
    offset_applies: bool = False  # Datalog: the relation's offset is added to heads this rule grounds


@dataclass
class Relation:
    """A neural relation: one value per distinct head key over all its rules."""

    name: str
    keys: list[str]
    rules: list[Rule] = field(default_factory=list)
    activation: str | None = None
    offset: str | None = None  # weight added before the activation


@dataclass
class Template:
    relations: dict[str, Relation] = field(default_factory=dict)
    weights: dict[str, WeightSpec] = field(default_factory=dict)
    language: str = "sql"
    source: str = ""

    def relation_named(self, name: str) -> str | None:
        """The relation a table reference `name` means: names compare as the database compares
        unquoted identifiers, ignoring case (relation names that differ only in case are refused)."""
        if name in self.relations:
            return name
        folded = name.casefold()
        return next((r for r in self.relations if r.casefold() == folded), None)

    def order(self) -> list[str]:
        """Relations in dependency order; a cycle is an error the user must break."""
        done: list[str] = []
        state: dict[str, int] = {}

        def visit(name: str, path: list[str]) -> None:
            if state.get(name) == 2:
                return
            if state.get(name) == 1:
                cycle = " -> ".join([*path[path.index(name):], name])
                raise TemplateError(
                    f"recursive template: {cycle}. Give the depth to unroll it to: a `-- relsql: depth 3` line"
                    " (`% relsql: depth 3` in Datalog) or depth=3"
                )
            state[name] = 1
            for rule in self.relations[name].rules:
                for ref in [*rule.refs, *rule.depends]:
                    if ref in self.relations:
                        visit(ref, [*path, name])
            state[name] = 2
            done.append(name)

        for name in self.relations:
            visit(name, [])
        return done

    @property
    def output(self) -> str:
        """The last declared relation: the template's default output."""
        return list(self.relations)[-1]


def coded_columns(rule: Rule) -> dict[int, str]:
    """A rule's categorical grounding columns, dictionary-encoded per weight: embedded keys and
    the type columns of typed linears (column -> weight)."""
    coded = {}
    for e in walk(rule.expr):
        if isinstance(e, Embed):
            coded[e.column] = e.weight
        elif isinstance(e, Apply) and e.types is not None:
            coded[e.types] = e.weight
    return coded


def walk(expr: Expr):
    """Pre-order traversal of an expression tree."""
    yield expr
    for child in expr.children():
        yield from walk(child)
