"""The template IR that both frontends produce and the grounder and compiler consume.

A template is a set of neural relations. Each relation has rules; each rule has a body query
(ordinary SQL over database tables and earlier neural relations, enumerating groundings) and
a neural expression evaluated per grounding and, above its aggregate, per head. Keeping the
body as a sqlglot AST lets the database, not Python, do all the structural work.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import sqlglot.expressions as exp

if TYPE_CHECKING:
    from relsql.db import Database

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
    """A weight times a value: matrix-vector product, or a scaling where shapes say so."""

    weight: str
    arg: Expr

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


@dataclass
class WeightSpec:
    """A learnable tensor. `None` in `shape` is an input width inferred at compile time."""

    name: str
    shape: tuple[int | None, ...]
    init: list | float | None = None
    fixed: bool = False
    kind: str = "matrix"  # matrix | embedding | bias | offset
    origin: str = ""  # where it was declared, for error messages
    storage: str = "memory"  # embeddings: "memory" (a torch parameter) or "database" (a table, see relsql/train/embeddings.py)


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

    def order(self) -> list[str]:
        """Relations in dependency order; a cycle is an error the user must break."""
        from relsql.errors import TemplateError

        done: list[str] = []
        state: dict[str, int] = {}

        def visit(name: str, path: list[str]) -> None:
            if state.get(name) == 2:
                return
            if state.get(name) == 1:
                cycle = " -> ".join([*path[path.index(name):], name])
                raise TemplateError(
                    f"recursive template: {cycle}. relsql does not ground recursive rules yet;"
                    " unroll the recursion into layers (l1, l2, ...) with distinct names."
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

    @classmethod
    def from_sql(cls, text: str) -> Template:
        """A template of `CREATE TABLE name AS SELECT ...` statements (DuckDB dialect)."""
        from relsql.template.sqlrule import parse_sql_template

        return parse_sql_template(text)

    @classmethod
    def from_datalog(cls, text: str, base_dir: str | None = None) -> Template:
        """A NeuraLogic text template; `import ./file` is resolved against `base_dir`."""
        from relsql.template.datalog import parse_datalog_template

        return parse_datalog_template(text, base_dir=base_dir)

    @classmethod
    def auto(cls, db, target: str, **options) -> Template:
        """A template generated from the schema's keys; `.source` is its editable SQL text.

        Options: hops (2), width (16), aggregation ("avg" | "sum" | "max"), time_column,
        time_columns ({table: column}), infer_keys (True). See relsql/template/auto.py.
        """
        from relsql.template.auto import generate

        return cls.from_sql(generate(db, target, **options))

    @classmethod
    def from_file(cls, path) -> Template:
        """`.sql` files are SQL templates; anything else is read as NeuraLogic Datalog."""
        from pathlib import Path

        from relsql.errors import TemplateError

        path = Path(path)
        try:
            text = path.read_text()
        except OSError as err:
            raise TemplateError(f"cannot read template file {path}: {err.strerror}") from None
        if path.suffix.lower() == ".sql":
            return cls.from_sql(text)
        return cls.from_datalog(text, base_dir=str(path.parent))

    @property
    def output(self) -> str:
        """The last declared relation: the template's default output."""
        return list(self.relations)[-1]


def walk(expr: Expr):
    """Pre-order traversal of an expression tree."""
    yield expr
    for child in expr.children():
        yield from walk(child)
