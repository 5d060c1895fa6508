"""NeuraLogic's Datalog template syntax → the IR, with NeuraLogic's numeric semantics.

Syntax handled: weighted rules `{3,3} h(X) :- {3,3} a(Y), b(X,Y). [transformation=tanh]`,
weights as dimensions `{m,n}`, numbers, vectors/matrices `[1, 2]`, fixed values `<-7>`,
named weights `$w={3,3}` (shared by name, `$w` reuses), hidden literals `*p(...)` / `_p(...)`,
predicate metadata `p/1 [transformation=...]` and offsets `p/1 {3,1}`, `import ./file`, `%`
and `//` comments. Template facts: `{3} f(a).` (a learnable value), `<[1, 2]> f(a).` (fixed),
`2.0 f(a).`, `f(a).` (1.0): constant arguments, true in every sample (a relation without the
`sample` key), untransformed; their weights are numbered after all rules' weights, as
NeuraLogic does; a predicate has either template facts or rules and dataset facts, not both.

Functions (NeuraLogic's names): transformations sigmoid tanh relu leakyrelu identity exp log
sqrt signum inverse reverse softmax sparsemax norm transpose lukasiewicz; combinations sum avg
max min product elproduct crosssum concat softmax sparsemax cossim count; aggregations avg sum
max min count concat (groundings in grounding order: the rows of the neural relations read,
then the dataset facts' values; NeuraLogic's order follows its hash sets). Not handled:
layernorm, slice, reshape, the softmax aggregation and parametrized functions (`concat(axis=)`).

Limits (relsql/template/ir.py): weights have at most 2 dimensions of at most 2**24 each and
2**31 elements; a rule has at most 64 body literals.

Grounding follows NeuraLogic: distinct substitutions of all body variables; each dataset
table carries an implicit `sample` key (a table without one belongs to sample 0).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import sqlglot.expressions as exp

from relsql.errors import TemplateError
from relsql.template import ir, recursion

# NeuraLogic's defaults (PyNeuraLogic 0.9.2 Settings), see docs/neuralogic-semantics.md.
DEFAULT_RELATION_ACTIVATION = "identity"
DEFAULT_RULE_ACTIVATION = "identity"
DEFAULT_AGGREGATION = "avg"
DEFAULT_COMBINATION = "sum"

_ACTIVATION_NAMES = {
    "sigmoid": "sigmoid", "sigm": "sigmoid", "tanh": "tanh", "relu": "relu", "identity": "identity", "linear": "identity",
    "leaky_relu": "leaky_relu", "leakyrelu": "leaky_relu", "exp": "exp", "exponentiation": "exp",
    "log": "log", "logarithm": "log", "softmax": "softmax", "signum": "signum", "sqrt": "sqrt",
    "inverse": "inverse", "reverse": "reverse", "lukasiewicz": "lukasiewicz", "norm": "norm",
    "sparsemax": "sparsemax", "transpose": "transpose", "transp": "transpose",
}
# NeuraLogic's max/min keep the whole value with the largest/smallest element sum: `argmax`.
_COMBINATION_NAMES = {
    "sum": "sum", "avg": "avg", "average": "avg", "max": "argmax", "maximum": "argmax", "min": "argmin",
    "minimum": "argmin", "product": "product", "elementproduct": "elementproduct", "elproduct": "elementproduct",
    "crosssum": "crosssum", "concat": "concat", "concatenation": "concat", "softmax": "softmax",
    "sparsemax": "sparsemax", "cossim": "cossim", "count": "count",
}
_AGGREGATION_NAMES = {"avg": "avg", "average": "avg", "sum": "sum", "max": "argmax", "maximum": "argmax",
                      "min": "argmin", "minimum": "argmin", "count": "count", "concat": "concat"}

_TOKEN = re.compile(r"""
    (?P<ws>[ \t\r\n]+) | (?P<comment>%[^\n]*|//[^\n]*) |
    (?P<number>[0-9]+\.[0-9]*(?:[eE][-+]?[0-9]+)?|[0-9]+(?:[eE][-+]?[0-9]+)?|\.[0-9]+) |
    (?P<implies>:-|<=) | (?P<string>"[^"\n]*"|'[^'\n]*') |
    (?P<name>[A-Za-z_][A-Za-z0-9_]*) | (?P<punct>[(){}\[\]<>,.=/$*~@\-+:])
""", re.VERBOSE)


_IMPORT = re.compile(r"\s*import\s+(\S+?)\s*\.?\s*$")


@dataclass
class Token:
    kind: str
    text: str
    where: str  # "file:line"


def _tokenize(text: str, source: str) -> list[Token]:
    tokens: list[Token] = []
    pos, line = 0, 1
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise TemplateError(f"{source}:{line}: unexpected character {text[pos]!r}")
        kind = m.lastgroup
        if kind not in ("ws", "comment"):
            tokens.append(Token(kind, m.group(), f"{source}:{line}"))
        line += m.group().count("\n")
        pos = m.end()
    return tokens


# --- parsed forms ------------------------------------------------------------------------
@dataclass
class WeightRef:
    """A weight as written: dimensions, a value, fixed or learnable, maybe named."""

    shape: tuple[int, ...] | None = None
    value: list | float | None = None
    fixed: bool = False
    name: str | None = None


@dataclass
class Atom:
    name: str
    terms: list[str]
    hidden: bool = False
    negated: bool = False
    weight: WeightRef | None = None
    where: str = ""


@dataclass
class RuleAst:
    head: Atom
    body: list[Atom | WeightRef]
    meta: dict[str, str]
    where: str


@dataclass
class PredicateMeta:
    name: str
    arity: int
    meta: dict[str, str] = field(default_factory=dict)
    offset: WeightRef | None = None


def _load(text: str, source: str, base_dir: Path | None, seen: set[Path]) -> list[Token]:
    """Tokens of a file with `import ./other` lines replaced by the imported file's tokens."""
    tokens: list[Token] = []
    chunk: list[str] = []
    chunk_start = 1
    for number, line in enumerate(text.splitlines(keepends=True), start=1):
        m = _IMPORT.match(line)
        if m is None:
            chunk.append(line)
            continue
        tokens += _tokenize("\n" * (chunk_start - 1) + "".join(chunk), source)
        chunk, chunk_start = [], number + 1
        if base_dir is None:
            raise TemplateError(f"{source}:{number}: `import {m.group(1)}` needs a base folder: use Template.from_file "
                                "or pass base_dir")
        path = (base_dir / m.group(1)).resolve()
        if path in seen:
            raise TemplateError(f"{source}:{number}: {path} imports itself")
        try:
            imported = ir.read_text(path, "imported file")
        except TemplateError as err:
            raise TemplateError(f"{source}:{number}: {err}") from None
        tokens += _load(imported, path.name, path.parent, seen | {path})
    tokens += _tokenize("\n" * (chunk_start - 1) + "".join(chunk), source)
    return tokens


class _Parser:
    def __init__(self, tokens: list[Token]):
        self.tokens = tokens
        self.pos = 0

    def peek(self, offset: int = 0) -> Token | None:
        i = self.pos + offset
        return self.tokens[i] if i < len(self.tokens) else None

    def at(self, text: str, offset: int = 0) -> bool:
        token = self.peek(offset)
        return token is not None and token.kind != "string" and token.text == text

    def take(self, text: str | None = None, kind: str | None = None) -> Token:
        token = self.peek()
        if token is None:
            where = self.tokens[-1].where if self.tokens else "template"
            raise TemplateError(f"{where}: the template ends early; expected {text or kind}")
        if (text is not None and token.text != text) or (kind is not None and token.kind != kind):
            raise TemplateError(f"{token.where}: expected {text or kind}, found {token.text!r}")
        self.pos += 1
        return token

    def error(self, message: str) -> TemplateError:
        token = self.peek() or (self.tokens[-1] if self.tokens else None)
        where = token.where if token else "template"
        found = f", found {token.text!r}" if self.peek() is not None else ""
        return TemplateError(f"{where}: {message}{found}")

    # weights -------------------------------------------------------------------------
    def starts_weight(self) -> bool:
        token = self.peek()
        if token is None:
            return False
        if token.kind == "number" or token.text in ("{", "<", "$"):
            return True
        if token.text == "-" and self.peek(1) is not None and self.peek(1).kind == "number":
            return True
        return token.text == "[" and not (self.peek(1) is not None and self.peek(1).kind == "name" and self.at("=", 2))

    def number(self) -> float:
        sign = -1.0 if self.at("-") else 1.0
        if sign < 0:
            self.take("-")
        token = self.take(kind="number")
        value = sign * float(token.text)
        if not math.isfinite(value):
            raise TemplateError(f"{token.where}: the number {token.text[:40]} is too large; weight values must be finite")
        return value

    def array(self) -> list:
        """A vector `[1, 2]` or a matrix `[[1, 2], [3, 4]]`: at most two levels, never ragged."""
        start = self.take("[")
        rows: list = []
        while not self.at("]"):
            if self.at("["):
                inner = self.take("[")
                row: list[float] = []
                while not self.at("]"):
                    if self.at("["):
                        raise TemplateError(f"{inner.where}: a weight value has at most 2 dimensions (a vector "
                                            "[1, 2] or a matrix [[1, 2], [3, 4]])")
                    row.append(self.number())
                    if not self.at("]"):
                        self.take(",")
                self.take("]")
                rows.append(row)
            else:
                rows.append(self.number())
            if not self.at("]"):
                self.take(",")
        self.take("]")
        if not rows or any(isinstance(r, list) and not r for r in rows):
            raise TemplateError(f"{start.where}: a weight value cannot be empty; write its numbers, e.g. [1, 2]")
        nested = [isinstance(r, list) for r in rows]
        if (any(nested) and not all(nested)) or (all(nested) and len({len(r) for r in rows}) > 1):
            raise TemplateError(f"{start.where}: a ragged matrix value: every row must be a list of the same length, "
                                "e.g. [[1, 2], [3, 4]]")
        ir.check_shape((len(rows), len(rows[0])) if nested[0] else (len(rows),), start.where)
        return rows

    def dimension(self) -> int:
        token = self.peek()
        if token is not None and token.text == "-":
            raise self.error("weight dimensions must be positive integers")
        token = self.take(kind="number")
        if not token.text.isdigit():
            raise TemplateError(f"{token.where}: weight dimensions must be positive integers, got {token.text[:40]}")
        if len(token.text) > 12:
            raise TemplateError(f"{token.where}: weight dimension {token.text[:40]} is larger than relsql's limit of "
                                f"{ir.MAX_WIDTH} (2**24) per dimension; use a smaller width")
        return int(token.text)

    def weight(self) -> WeightRef:
        if self.at("$"):
            self.take("$")
            name = self.take(kind="name").text
            if self.at("="):
                self.take("=")
                inner = self.weight()
                inner.name = name
                return inner
            return WeightRef(name=name)
        if self.at("<"):
            self.take("<")
            value = self.array() if self.at("[") else self.number()
            self.take(">")
            return WeightRef(value=value, fixed=True)
        if self.at("{"):
            start = self.take("{")
            dims = [self.dimension()]
            while self.at(","):
                self.take(",")
                dims.append(self.dimension())
            self.take("}")
            ir.check_shape(tuple(dims), start.where)
            return WeightRef(shape=tuple(dims))
        if self.at("["):
            return WeightRef(value=self.array())
        return WeightRef(value=self.number())

    # atoms and statements -----------------------------------------------------------
    def atom(self) -> Atom:
        token = self.peek()
        negated = hidden = False
        if self.at("~"):
            self.take("~")
            negated = True
        if self.at("*"):
            self.take("*")
            hidden = True
        if self.at("@"):
            raise self.error("special predicates (@...) are not supported")
        name = self.take(kind="name").text
        if name.startswith("_") and len(name) > 1:
            hidden, name = True, name[1:]
        terms: list[str] = []
        if self.at("("):
            self.take("(")
            while True:
                term = self.peek()
                if term is None or term.kind not in ("name", "number", "string") and term.text != "-":
                    raise self.error("expected a variable or constant")
                if term.text == "-":
                    self.take("-")
                    terms.append("-" + self.take(kind="number").text)
                else:
                    self.pos += 1
                    terms.append(term.text)
                if self.at(")"):
                    break
                self.take(",")
            self.take(")")
        return Atom(name, terms, hidden=hidden, negated=negated, where=token.where if token else "")

    def metadata(self) -> dict[str, str]:
        self.take("[")
        meta: dict[str, str] = {}
        while True:
            key = self.take(kind="name").text.lower()
            self.take("=")
            sign = self.take().text if self.at("-") or self.at("+") else ""  # a signed number: offset=-0.5
            parts = [sign + self.take().text]
            while self.at("-") and self.peek(1) is not None and self.peek(1).kind == "name":
                self.take("-")
                parts.append(self.take().text)
            meta[key] = "-".join(parts).lower()
            if self.at("]"):
                break
            self.take(",")
        self.take("]")
        return meta

    def statements(self) -> tuple[list[RuleAst], list[PredicateMeta]]:
        rules: list[RuleAst] = []
        metas: list[PredicateMeta] = []
        while self.peek() is not None:
            start = self.peek()
            if start.kind == "name" and self.at("/", 1):
                name = self.take().text
                self.take("/")
                arity_token = self.take(kind="number")
                digits = arity_token.text[:-1] if arity_token.text.endswith(".") else arity_token.text  # `h/1.`
                if not digits.isdigit() or len(digits) > 6:
                    raise TemplateError(f"{arity_token.where}: the arity in {name}/{arity_token.text[:20]} must be a "
                                        "whole number of arguments, e.g. h/1")
                arity = int(digits)
                pm = PredicateMeta(name, arity)
                line = start.where
                while (self.peek() is not None and self.peek().where == line
                        and (self.at("[") or self.at("{") or self.at("<") or self.at("$"))):
                    if self.at("[") and self.peek(1) is not None and self.peek(1).kind == "name" and self.at("=", 2):
                        pm.meta.update(self.metadata())
                    else:
                        pm.offset = self.weight()
                if self.at("."):
                    self.take(".")
                metas.append(pm)
                continue
            weight = self.weight() if self.starts_weight() else None
            head = self.atom()
            head.weight = weight
            body: list[Atom | WeightRef] = []
            if self.at(":-") or self.at("<="):
                self.pos += 1
                while True:
                    if self.starts_weight():
                        w = self.weight()
                        if self.at(",") or self.at("."):
                            body.append(w)
                        else:
                            lit = self.atom()
                            lit.weight = w
                            body.append(lit)
                    else:
                        body.append(self.atom())
                    if self.at("."):
                        break
                    self.take(",")
            self.take(".")
            meta = self.metadata() if self.at("[") else {}
            rules.append(RuleAst(head, body, meta, start.where))
        return rules, metas


def parse_datalog_template(text: str, base_dir: str | None = None, source: str = "template",
                           depth: int | None = None) -> ir.Template:
    ir.check_text(text, "Datalog template")
    tokens = _load(text, source, Path(base_dir) if base_dir else None, set())
    try:
        rules, metas = _Parser(tokens).statements()
    except RecursionError:  # the parser does not recurse per nesting level; only a stack used up by the caller
        raise TemplateError(f"{source}: the template could not be parsed: the call stack is exhausted") from None
    if not rules:
        raise TemplateError(f"{source}: the template has no rules")
    # The template's source is kept self-contained (imports inlined) so a saved model reloads.
    template = _Translator(rules, metas, _inline_imports(text, Path(base_dir) if base_dir else None)).template
    ir.check_names(template)
    recursion.unroll(template, depth, comment="%")
    return template


def _inline_imports(text: str, base_dir: Path | None) -> str:
    lines = []
    for line in text.splitlines():
        m = _IMPORT.match(line)
        if m is None or base_dir is None:
            lines.append(line)
        else:
            path = (base_dir / m.group(1)).resolve()
            lines.append(_inline_imports(ir.read_text(path, "imported file"), path.parent))
    return "\n".join(lines)


class _Translator:
    """Builds IR relations and rules; body queries are built lazily, once the schema is known."""

    # C901: the rule checks of NeuraLogic's grammar in order (a dispatch; split, one table of cases would scatter)
    def __init__(self, rules: list[RuleAst], metas: list[PredicateMeta], text: str):  # noqa: C901
        self.template = ir.Template(language="datalog", source=text)
        # NeuraLogic identifies a predicate by name/arity; a name used with one arity keeps its
        # plain name, otherwise the relation is called "name/arity" (as the importer's tables).
        used: dict[str, set[int]] = {}
        facts = [rule for rule in rules if not rule.body]
        rules = [rule for rule in rules if rule.body]
        for rule in [*rules, *facts]:
            for atom in [rule.head, *[a for a in rule.body if isinstance(a, Atom)]]:
                used.setdefault(atom.name, set()).add(len(atom.terms))
        for pm in metas:
            used.setdefault(pm.name, set()).add(pm.arity)
        self.heads: dict[tuple[str, int], str] = {}
        for rule in rules:
            key = (rule.head.name, len(rule.head.terms))
            if key not in self.heads:
                name = key[0] if len(used[key[0]]) == 1 else f"{key[0]}/{key[1]}"
                self.heads[key] = name
                self.template.relations[name] = ir.Relation(
                    name, ["sample", *[f"a{i}" for i in range(key[1])]], activation=DEFAULT_RELATION_ACTIVATION)
        self.sampleless: set[str] = set()  # relations of template facts: one value shared by every sample
        for fact in facts:
            key = (fact.head.name, len(fact.head.terms))
            if key in self.heads and self.heads[key] not in self.sampleless:
                raise TemplateError(f"{fact.where}: {key[0]}/{key[1]} has both template facts and rules; relsql keeps "
                                    "them apart: give the facts another predicate name and add a rule reading them")
            if key not in self.heads:
                name = key[0] if len(used[key[0]]) == 1 else f"{key[0]}/{key[1]}"
                self.heads[key] = name
                self.sampleless.add(name)
                self.template.relations[name] = ir.Relation(name, [f"a{i}" for i in range(key[1])], activation=None)
        for number, rule in enumerate(rules):
            self._rule(rule, number)
        # NeuraLogic numbers the facts' weights after all rules' weights: translated last, they are.
        for number, fact in enumerate(facts):
            self._fact(fact, len(rules) + number)
        for pm in metas:
            where = f"{pm.name}/{pm.arity}"
            name = self.heads.get((pm.name, pm.arity))
            if name is None:
                raise TemplateError(f"metadata for {where}: no rule derives {where}; declare a rule for it or remove the line")
            relation = self.template.relations[name]
            if name in self.sampleless:
                raise TemplateError(f"metadata for {where}: {where} has only template facts, whose values NeuraLogic "
                                    "uses as they are (no transformation, no offset); remove the line")
            for key, value in pm.meta.items():
                if key in ("activation", "transformation"):
                    relation.activation = _lookup(_ACTIVATION_NAMES, value, where, "transformation")
                elif key == "offset":  # a constant NeuraLogic adds as the offset (not a learnable weight)
                    try:
                        number = float(value)
                    except ValueError:
                        raise TemplateError(f"metadata for {where}: offset must be a number, got `{value}`") from None
                    if not math.isfinite(number):
                        raise TemplateError(f"metadata for {where}: offset must be finite, got `{value}`")
                    if relation.offset is not None:
                        raise TemplateError(f"metadata for {where}: the offset is given twice; keep one")
                    if any(rule.offset_applies for rule in relation.rules):  # as NeuraLogic: head-weighted rules only
                        relation.offset = self._weight(WeightRef(value=number, fixed=True), f"{name}.offset", where)
                else:
                    raise TemplateError(f"metadata for {where}: unknown key `{key}`; use transformation=... or offset=<number>")
            if pm.offset is not None:
                # NeuraLogic adds the offset to the atoms that a head-weighted rule grounds.
                offset = self._weight(pm.offset, f"{pm.name}.offset", where)
                if any(rule.offset_applies for rule in relation.rules):
                    relation.offset = offset

    def _weight(self, ref: WeightRef, default_name: str, origin: str) -> str:
        name = ref.name or default_name
        spec = self.template.weights.get(name)
        if ref.shape is None and ref.value is None:
            if spec is None:
                raise TemplateError(f"{origin}: weight ${name} is used before it is given a value or dimensions")
            return name
        if ref.shape is not None:
            shape: tuple[int | None, ...] = ref.shape
        else:
            shape = _shape_of(ref.value)
        if spec is not None:
            if tuple(spec.shape) != tuple(shape):
                raise TemplateError(f"{origin}: weight ${name} was declared with shape {spec.shape} at {spec.origin}, "
                                    f"here {shape}")
            return name
        self.template.weights[name] = ir.WeightSpec(name, shape, init=ref.value, fixed=ref.fixed, kind="datalog", origin=origin)
        return name

    def _fact(self, fact: RuleAst, number: int) -> None:
        """A template fact `{3} f(a).`: its value is its weight (learnable, or fixed as `<[1, 2]>`),
        1.0 without one; it holds in every sample, and NeuraLogic applies no transformation to it."""
        origin = f"fact {number + 1} ({fact.where})"
        atom = fact.head
        if atom.negated or fact.meta or (atom.hidden and atom.weight is not None):
            raise TemplateError(f"{origin}: a template fact cannot be negated or carry metadata, nor a weight when "
                                "hidden (`*f(a).` only states that it holds)")
        variables = [t for t in atom.terms if _is_var(t)]
        if variables:
            raise TemplateError(f"{origin}: a template fact's arguments must be constants; {variables[0]} is a variable "
                                "(a rule needs a body to bind it)")
        value: ir.Expr = (ir.Param(self._weight(atom.weight, f"fact{number + 1}.value", origin))
                          if atom.weight is not None else ir.Const(1.0))
        head = self.heads[(atom.name, len(atom.terms))]
        self.template.relations[head].rules.append(ir.Rule(
            head=head, query=_FactQuery(atom.terms), refs=[], expr=ir.Agg("sum", value), grouped=True, origin=origin))

    def _rule(self, rule: RuleAst, number: int) -> None:
        origin = f"rule {number + 1} ({rule.where})"
        atoms = [a for a in rule.body if isinstance(a, Atom)]
        if atoms and all(self.heads.get((a.name, len(a.terms))) in self.sampleless for a in atoms):
            raise TemplateError(f"{origin}: the body reads only template facts, which hold in every sample; NeuraLogic "
                                "derives the head in every sample, relsql would only in sample 0: add a literal of the "
                                "dataset to the body")
        n_literals = sum(1 for item in rule.body if isinstance(item, Atom))
        if n_literals > ir.MAX_BODY_LITERALS:
            raise TemplateError(
                f"{origin}: the rule has {n_literals} body literals, more than relsql's limit of {ir.MAX_BODY_LITERALS} "
                "(the database's join planning time grows steeply with the literal count); split the rule: derive "
                "parts of the body in helper rules and use their heads in this one")
        combination, activation, aggregation = DEFAULT_COMBINATION, DEFAULT_RULE_ACTIVATION, DEFAULT_AGGREGATION
        for key, value in rule.meta.items():
            if key in ("activation", "transformation"):
                if "-" in value:
                    comb, act = value.split("-", 1)
                    combination = _lookup(_COMBINATION_NAMES, comb, origin, "combination")
                    activation = _lookup(_ACTIVATION_NAMES, act, origin, "transformation")
                else:
                    activation = _lookup(_ACTIVATION_NAMES, value, origin, "transformation")
            elif key == "aggregation":
                aggregation = _lookup(_AGGREGATION_NAMES, value, origin, "aggregation")
            elif key == "combination":
                combination = _lookup(_COMBINATION_NAMES, value, origin, "combination")
            else:
                raise TemplateError(f"{origin}: unknown rule metadata `{key}`; use transformation=, aggregation= or combination=")
        if rule.head.hidden or rule.head.negated:
            raise TemplateError(f"{origin}: a rule head cannot be hidden or negated")
        literals = [lit for lit in rule.body if isinstance(lit, Atom)]
        body_vars = {t for lit in literals for t in lit.terms if _is_var(t)}
        for term in rule.head.terms:
            if _is_var(term) and term not in body_vars:
                raise TemplateError(f"{origin}: head variable {term} does not occur in the body; every head variable "
                                    "must be bound by a body literal")
        prefix = f"rule{number + 1}"
        head_weight = self._weight(rule.head.weight, f"{prefix}.head", origin) if rule.head.weight is not None else None
        values: list[ir.Expr] = []
        neural: list[tuple[int, str]] = []  # (literal position, relation)
        facts: list[int] = []  # literal positions whose value column is used
        for position, item in enumerate(rule.body):
            if isinstance(item, WeightRef):
                values.append(ir.Param(self._weight(item, f"{prefix}.const{position}", origin)))
                continue
            if item.hidden:
                continue
            relation = self.heads.get((item.name, len(item.terms)))
            if relation is not None:
                value: ir.Expr = ir.Ref(len(neural))
                neural.append((position, relation))
            else:
                value = ir.Column(len(facts))
                facts.append(position)
            if item.negated:
                value = ir.Binary("-", ir.Const(1.0), value)
            if item.weight is not None:
                value = ir.Apply(self._weight(item.weight, f"{prefix}.w{position}", origin), value)
            values.append(value)
        if not values:
            raise TemplateError(f"{origin}: the body contributes no value (all literals hidden); add a visible literal "
                                "or a weight")
        if len(values) == 1 and combination in ("sum", "avg", "argmax", "argmin", "product", "elementproduct"):
            combined = values[0]
        else:
            combined = ir.Combine(combination, tuple(values))
        expr: ir.Expr = ir.Agg(aggregation, ir.Act(activation, combined) if activation != "identity" else combined)
        if head_weight is not None:
            expr = ir.Apply(head_weight, expr)
        body_atoms = [item if isinstance(item, Atom) else None for item in rule.body]
        builder = _QueryBuilder(rule.head, body_atoms, self.heads, origin, [p for p, _ in neural], facts,
                                self.sampleless)
        head = self.heads[(rule.head.name, len(rule.head.terms))]
        hidden = sorted({self.heads[(a.name, len(a.terms))] for a in rule.body if isinstance(a, Atom) and a.hidden
                         and (a.name, len(a.terms)) in self.heads})  # relations joined for their keys only
        self.template.relations[head].rules.append(ir.Rule(
            head=head, query=builder, refs=[r for _, r in neural], expr=expr, grouped=True,
            distinct=builder.merges_hidden, origin=origin, n_columns=len(facts), offset_applies=head_weight is not None,
            depends=hidden,
        ))


def _lookup(table: dict[str, str], value: str, origin: str, what: str) -> str:
    if value not in table:
        raise TemplateError(f"{origin}: unknown {what} `{value}`; known: {', '.join(sorted(set(table)))}")
    return table[value]


def _shape_of(value) -> tuple[int, ...]:
    if isinstance(value, list):
        if value and isinstance(value[0], list):
            return (len(value), len(value[0]))
        return (len(value),)
    return ()


def _is_var(term: str) -> bool:
    return term[0].isupper() or (term[0] == "_" and len(term) > 1)


def _constant(term: str) -> exp.Expression:
    if term[0] in "\"'":
        term = term[1:-1]
    return exp.Literal.string(term)


def _text(column: exp.Expression) -> exp.Cast:
    """CAST(column AS VARCHAR), built without sqlglot's type-string parser."""
    return exp.Cast(this=column, to=exp.DataType(this=exp.DataType.Type.VARCHAR))


class _QueryBuilder:
    """Builds a rule's body query once the database's table layout is known."""

    def __init__(self, head: Atom, body: list[Atom | None], heads: dict[tuple[str, int], str], origin: str,
                 neural: list[int], facts: list[int], sampleless: set[str] = frozenset()):
        self.head, self.body, self.heads, self.origin = head, body, heads, origin
        self.sampleless = sampleless  # relations of template facts: no sample key, shared by all samples
        self.neural, self.facts = neural, facts  # literal positions of neural refs / valued facts
        # Groundings are distinct substitutions. With every literal visible, reading each table as
        # a set (DISTINCT over the columns a literal uses) already makes every joined row a distinct
        # substitution: DuckDB dedups thousands of facts instead of the tens of thousands of joined
        # rows. Hidden literals' matches are merged by a DISTINCT over the visible variables instead.
        self.merges_hidden = any(a is not None and a.hidden for a in body)

    def __call__(self, db) -> exp.Select | None:
        from relsql.sql import alias, col, ident

        bindings: dict[str, exp.Expression] = {}
        conditions: list[exp.Expression] = []
        sample: exp.Expression | None = None
        tables: list[exp.Expression] = []
        value_columns: dict[int, exp.Expression] = {}
        for position, atom in enumerate(self.body):
            if atom is None:
                continue
            name = f"t{position}"
            relation = self.heads.get((atom.name, len(atom.terms)))
            if relation is not None:
                table_name = relation
                arg_columns = [f"a{i}" for i in range(len(atom.terms))]
                has_sample = relation not in self.sampleless
                if not has_sample and (db.has_table(atom.name) or db.has_table(f"{atom.name}/{len(atom.terms)}")):
                    from relsql.errors import SchemaError

                    raise SchemaError(f"{atom.where}: {atom.name}/{len(atom.terms)} has template facts and also a table "
                                      "of dataset facts; relsql reads one source per predicate: rename one of them")
            else:
                table_name = atom.name
                if not db.has_table(table_name):
                    table_name = f"{atom.name}/{len(atom.terms)}"  # the importer's name when arities clash
                    if not db.has_table(table_name):
                        return None
                names = [c for c, _ in db.columns(table_name)]
                has_sample = "sample" in names
                plain = [c for c in names if c not in ("sample", "value")]
                if len(plain) < len(atom.terms):
                    from relsql.errors import SchemaError

                    raise SchemaError(f"{atom.where}: {atom.name} has {len(atom.terms)} arguments but table `{atom.name}` "
                                      f"has only {len(plain)} argument columns ({plain})")
                arg_columns = plain[: len(atom.terms)]
                value_columns[position] = col("value", name) if "value" in names else exp.Literal.number(1)
            source: exp.Expression = exp.Table(this=ident(table_name))
            if relation is None and not self.merges_hidden:
                used = [*(["sample"] if has_sample else []), *arg_columns, *(["value"] if "value" in names else [])]
                source = exp.Subquery(this=exp.select(*[col(c) for c in dict.fromkeys(used)]).distinct(copy=False)
                                      .from_(source, copy=False))
            tables.append(alias(source, name, table=True))
            if has_sample:
                here = col("sample", name)
                if sample is None:
                    sample = here
                else:
                    conditions.append(exp.EQ(this=here, expression=sample.copy()))
            for term, column in zip(atom.terms, arg_columns):
                reference = col(column, name)
                if _is_var(term):
                    if term in bindings:
                        conditions.append(exp.EQ(this=reference, expression=bindings[term].copy()))
                    else:
                        bindings[term] = reference
                else:
                    conditions.append(exp.EQ(this=_text(reference), expression=_constant(term)))
        # NeuraLogic merges substitutions whose visible (non-hidden) ground body is identical.
        visible = sorted({t for a in self.body if a is not None and not a.hidden for t in a.terms if _is_var(t)}
                         ) if self.merges_hidden else []
        head_keys = [sample.copy() if sample is not None else exp.Literal.number(0)]
        for term in self.head.terms:
            head_keys.append(_text(bindings[term].copy()) if _is_var(term) else _constant(term))
        select = exp.select(
            *[alias(k, f"_h{i}") for i, k in enumerate(head_keys)],
            *[alias(col("_rid", f"t{pos}"), f"_r{j}") for j, pos in enumerate(self.neural)],
            *[alias(value_columns[pos], f"_c{k}") for k, pos in enumerate(self.facts)],
            *[alias(bindings[var].copy(), f"_v_{var}") for var in visible],
        )
        select = select.from_(tables[0], copy=False)
        for table in tables[1:]:
            select.append("joins", exp.Join(this=table, kind="CROSS"))
        if conditions:
            select = select.where(exp.and_(*conditions, copy=False), copy=False)
        return select


class _FactQuery:
    """The one grounding of a template fact: its constant arguments as the head keys."""

    def __init__(self, terms: list[str]):
        self.terms = terms

    def __call__(self, db) -> exp.Select:
        from relsql.sql import alias

        if not self.terms:
            return exp.select(alias(exp.Literal.number(0), "_f"))
        return exp.select(*[alias(_constant(t), f"_h{i}") for i, t in enumerate(self.terms)])
