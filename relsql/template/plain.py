"""A parsed SQL template as checked plain data (JSON text), so that a saved model loads without
parsing its template again (parsing Lahman's 51 KB auto template was half of `Model.load`).

`dumps` writes the IR: relations, rules, weights, neural expressions (ir.py's dataclasses) and
each rule's body query (a sqlglot tree: class names, argument keys, strings and flags). `loads`
rebuilds it and checks it as a parse would, since a model file may be damaged or crafted: only
sqlglot expression classes, each with the arguments sqlglot declares for it; only the IR's node
kinds, each field of its type and within the parser's limits; every column, reference and
weight a rule names exists; the body query selects exactly the head keys, references and
columns the rule declares; and the query passes the parser's own check that a template only
reads the database's tables (relsql/template/sqlrule.py). Nothing in the data is run or
imported: class names are looked up in a fixed table.

What has no plain form gives None (the text is parsed instead): Datalog templates (their body
queries are built from the database's schema when grounded), and files written by another
version of this format or of sqlglot (whose classes may differ).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re

import sqlglot
import sqlglot.expressions as exp

from relsql import collector
from relsql.errors import RelsqlError
from relsql.template import ir, sqlrule

VERSION = 1
MAX_DEPTH = 200  # levels of one body query's tree (parsed templates: about 10)
MAX_NODES = 2_000_000  # nodes of all body queries together (Lahman's auto template: 7,389)
_SQL_CLASSES = {c.__name__: c for c in vars(exp).values() if isinstance(c, type) and issubclass(c, exp.Expression)}
_DTYPE = "@type"  # a sqlglot data type's name (exp.DataType.Type), the one argument value that is not a node or a scalar
# Where a body query holds text, and what text: sqlglot prints an unquoted name, a number literal,
# a function's or a keyword's name as they are, so there they must read as the parser reads them
# (else a crafted file could splice SQL text past the reads-only check). Flags (bool) are printed
# as keywords or not at all; other values have no place in a parsed body query.
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_$]*")
_NUMBER = re.compile(r"(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")
_JOIN_WORDS = {"LEFT", "RIGHT", "FULL", "INNER", "OUTER", "CROSS", "SEMI", "ANTI", "ASOF", "POSITIONAL", "NATURAL"}
_WEIGHT_KINDS = {"bias", "embed", "gain", "linear", "text", "typed"}  # what the SQL frontend declares
_ACTIVATIONS = {"relu", "sigmoid", "leaky_relu", "identity", "softmax", "tanh", "exp", "log", "gelu", "sum_per_head"}
_AGGREGATES = {"sum", "avg", "max", "min", "count"}


class PlainError(RelsqlError):
    """The plain IR is damaged; the caller names the file it came from."""


class _NoPlain(Exception):
    """A template holds something the plain form does not carry: it is parsed from its text instead."""


def dumps(template: ir.Template) -> str | None:
    """The template's IR as JSON text, or None where it has no plain form (see the module docstring)."""
    if template.language != "sql":
        return None
    try:
        data = {"version": VERSION, "sqlglot": sqlglot.__version__, "source": digest(template.source),
                "weights": [_weight_plain(w) for w in template.weights.values()],
                "relations": [_relation_plain(r) for r in template.relations.values()]}
        return json.dumps(data, separators=(",", ":"), allow_nan=False)
    except (_NoPlain, ValueError, RecursionError):  # ValueError: a non-finite number, which JSON does not hold
        return None


def _weight_plain(spec: ir.WeightSpec) -> dict:
    if spec.init is not None:
        raise _NoPlain
    return {"name": spec.name, "shape": list(spec.shape), "fixed": spec.fixed, "kind": spec.kind, "origin": spec.origin,
            "storage": spec.storage, "min_count": spec.min_count, "blocks": spec.blocks}


def _relation_plain(relation: ir.Relation) -> dict:
    return {"name": relation.name, "keys": list(relation.keys), "activation": relation.activation,
            "offset": relation.offset, "rules": [_rule_plain(r) for r in relation.rules]}


def _rule_plain(rule: ir.Rule) -> dict:
    if not isinstance(rule.query, exp.Select):
        raise _NoPlain
    return {"head": rule.head, "query": _sql_plain(rule.query, 1), "refs": list(rule.refs), "expr": _expr_plain(rule.expr),
            "grouped": rule.grouped, "distinct": rule.distinct, "origin": rule.origin, "n_columns": rule.n_columns,
            "depends": list(rule.depends), "offset_applies": rule.offset_applies}


def _sql_plain(node: exp.Expression, depth: int) -> dict:
    if depth > MAX_DEPTH or type(node).__name__ not in _SQL_CLASSES:
        raise _NoPlain
    out: dict = {"@": type(node).__name__}
    for key, value in node.args.items():
        if value is None:
            continue
        if isinstance(value, list):
            out[key] = [_sql_value(v, depth) for v in value]
        else:
            out[key] = _sql_value(value, depth)
    if _text_problem(type(node), node.args) is not None:
        raise _NoPlain
    if node.comments:
        out["@comments"] = [str(c) for c in node.comments]
    return out


def _text_problem(cls: type, args: dict) -> str | None:
    """What is wrong with a node's text and flag arguments (see _NAME), None when nothing is."""
    for key, value in args.items():
        if isinstance(value, list):
            if any(not isinstance(v, exp.Expression) for v in value):
                return f"its {key!r} holds a value that is not a node"
            continue
        if value is None or isinstance(value, exp.Expression) or type(value) is bool:
            continue
        if isinstance(value, exp.DataType.Type):
            if (cls, key) != (exp.DataType, "this"):
                return f"its {key!r} is a data type"
            continue
        if type(value) is not str:
            return f"its {key!r} is a {type(value).__name__}"
        if cls is exp.Identifier and key == "this":
            ok = args.get("quoted") is True or _NAME.fullmatch(value) is not None
        elif cls is exp.Literal and key == "this":
            ok = args.get("is_string") is True or _NUMBER.fullmatch(value) is not None
        elif cls in (exp.Anonymous, exp.Var) and key == "this":
            ok = _NAME.fullmatch(value) is not None
        elif cls is exp.Join and key in ("kind", "side", "method"):
            ok = value.upper() in _JOIN_WORDS
        else:
            ok = False
        if not ok:
            return f"its {key!r} is text {_shown(value)}, which the parser would not have put there"
    return None


def _sql_value(value: object, depth: int) -> object:
    if isinstance(value, exp.Expression):
        return _sql_plain(value, depth + 1)
    if isinstance(value, exp.DataType.Type):
        return {_DTYPE: value.name}
    if type(value) in (str, bool, int):
        return value
    raise _NoPlain


def _expr_plain(expr: ir.Expr) -> dict:
    out: dict = {"@": type(expr).__name__}
    for f in dataclasses.fields(expr):
        value = getattr(expr, f.name)
        if isinstance(value, ir.Expr):
            value = _expr_plain(value)
        elif isinstance(value, tuple):
            value = [_expr_plain(v) if isinstance(v, ir.Expr) else v for v in value]
        out[f.name] = value
    return out


def digest(source: str) -> str:
    """The text a plain IR was made from, as a hash: a text edited since no longer matches its IR."""
    return hashlib.sha256(source.encode("utf-8", "surrogatepass")).hexdigest()


def loads(text: str, *, source: str, language: str) -> ir.Template | None:
    """The template `dumps` wrote, checked (a PlainError naming what is wrong otherwise); None for
    a plain form of another version or another sqlglot, or made from a text other than `source`
    (edited since): the caller parses `source` then."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        raise PlainError("it is not JSON text (or nests too deeply)") from None
    if not isinstance(data, dict):
        raise PlainError("it is not a mapping")
    if data.get("version") != VERSION or data.get("sqlglot") != sqlglot.__version__ or data.get("source") != digest(source):
        return None
    if language != "sql":
        raise PlainError(f"it is for an SQL template, but the file's template is in {language}")
    with collector.paused():  # as the parser does: the cyclic collector would walk torch's objects for every few nodes
        return _Reader(source).template(data)


class _Reader:
    """Rebuilds and checks one template's IR."""

    def __init__(self, source: str):
        self.out = ir.Template(language="sql", source=source)
        self.nodes = 0

    def template(self, data: dict) -> ir.Template:
        out = self.out
        for item in _get(data, "weights", list, "the template"):
            spec = self.weight(item)
            if spec.name in out.weights:
                raise PlainError(f"weight {spec.name!r} is declared twice")
            out.weights[spec.name] = spec
        relations = _get(data, "relations", list, "the template")
        if not relations:
            raise PlainError("it has no relations")
        for item in relations:  # declared first: a rule may read a relation declared further down
            name = _get(item, "name", str, "a relation") if isinstance(item, dict) else None
            if name is None or name in out.relations:
                raise PlainError(f"a relation is not a mapping with a name, or is declared twice ({_shown(name)})")
            out.relations[name] = ir.Relation(name=name, keys=[])
        for item in relations:
            self.relation(item)
        try:
            ir.check_names(out)
            out.order()
        except RelsqlError as err:
            raise PlainError(str(err)) from None
        return out

    def weight(self, item: object) -> ir.WeightSpec:
        where = "a weight"
        name = _get(item, "name", str, where)
        where = f"weight {name!r}"
        shape = tuple(_get(item, "shape", list, where))
        if any(d is not None and (type(d) is not int) for d in shape):
            raise PlainError(f"{where}: its shape holds a value that is not a width")
        try:
            ir.check_shape(shape, where)
        except RelsqlError as err:
            raise PlainError(str(err)) from None
        kind = _choice(item, "kind", _WEIGHT_KINDS, where)
        storage = _choice(item, "storage", {"memory", "database"}, where)
        min_count = _get(item, "min_count", (int, type(None)), where)
        if min_count is not None and min_count <= 0:
            raise PlainError(f"{where}: min_count {min_count} is not positive")
        blocks = item.get("blocks", 1) if isinstance(item, dict) else 1  # a plain form written before blocks: 1
        if type(blocks) is not int or blocks <= 0 or (blocks > 1 and kind != "linear"):
            raise PlainError(f"{where}: blocks {blocks!r} is not a positive count of a linear weight's blocks")
        return ir.WeightSpec(name, shape, fixed=_get(item, "fixed", bool, where), kind=kind,
                             origin=_get(item, "origin", str, where), storage=storage, min_count=min_count, blocks=blocks)

    def relation(self, item: dict) -> None:
        name = item["name"]
        where = f"relation {name!r}"
        relation = self.out.relations[name]
        relation.keys = _strings(item, "keys", where)
        if any(ir.reserved(k) for k in relation.keys):
            raise PlainError(f"{where}: a key name is one relsql reserves for its own columns")
        relation.activation = _get(item, "activation", (str, type(None)), where)
        if relation.activation is not None and relation.activation not in _ACTIVATIONS:
            raise PlainError(f"{where}: unknown activation {_shown(relation.activation)}")
        relation.offset = _get(item, "offset", (str, type(None)), where)
        if relation.offset is not None and relation.offset not in self.out.weights:
            raise PlainError(f"{where}: its offset {_shown(relation.offset)} is not a declared weight")
        relation.rules = [self.rule(rule, relation) for rule in _get(item, "rules", list, where)]

    def rule(self, item: object, relation: ir.Relation) -> ir.Rule:
        origin = _get(item, "origin", str, f"a rule of {relation.name!r}")
        where = f"{relation.name!r}, {origin}"
        if _get(item, "head", str, where) != relation.name:
            raise PlainError(f"{where}: its head is not its relation")
        refs, depends = _strings(item, "refs", where), _strings(item, "depends", where)
        unknown = [r for r in [*refs, *depends] if r not in self.out.relations]
        if unknown:
            raise PlainError(f"{where}: it reads {_shown(unknown[0])}, which is not a relation of the template")
        n_columns = _get(item, "n_columns", int, where)
        if n_columns < 0:
            raise PlainError(f"{where}: n_columns is not a count")
        expr = _Expr(self.out, len(refs), n_columns, where).read(_get(item, "expr", dict, where), 1)
        grouped = _get(item, "grouped", bool, where)
        if not grouped and any(isinstance(e, ir.Agg) for e in ir.walk(expr)):
            raise PlainError(f"{where}: its neural expression aggregates, but the rule is not grouped")
        query = self.query(_get(item, "query", dict, where), where)
        _check_selects(query, len(relation.keys), len(refs), n_columns, where)
        try:
            sqlrule.check_reads_only(query, f"{relation.name}, {origin}")
        except RelsqlError as err:
            raise PlainError(str(err)) from None
        return ir.Rule(head=relation.name, query=query, refs=refs, expr=expr, grouped=grouped,
                       distinct=_get(item, "distinct", bool, where), origin=origin, n_columns=n_columns, depends=depends,
                       offset_applies=_get(item, "offset_applies", bool, where))

    def query(self, data: dict, where: str) -> exp.Select:
        node = self.sql(data, 1, where)
        if not isinstance(node, exp.Select):
            raise PlainError(f"{where}: its body query is not a SELECT")
        return node

    def sql(self, data: object, depth: int, where: str) -> exp.Expression:
        """One sqlglot node and its subtree (recursive, at most MAX_DEPTH levels)."""
        self.nodes += 1
        if depth > MAX_DEPTH or self.nodes > MAX_NODES:
            raise PlainError(f"{where}: its body query nests deeper than {MAX_DEPTH} levels, or the queries hold more than "
                             f"{MAX_NODES:,} nodes")
        if not isinstance(data, dict):
            raise PlainError(f"{where}: its body query holds {_shown(data)} where a node belongs")
        cls = _SQL_CLASSES.get(data.get("@"))  # type: ignore[arg-type]
        if cls is None:
            raise PlainError(f"{where}: its body query holds an unknown node kind {_shown(data.get('@'))}")
        args = {}
        for key, value in data.items():
            if key == "@" or key == "@comments":
                continue
            if key not in cls.arg_types:
                raise PlainError(f"{where}: a {cls.__name__} of its body query has no argument {_shown(key)}")
            if isinstance(value, list):
                args[key] = [self.sql_value(v, depth, where) for v in value]
            else:
                args[key] = self.sql_value(value, depth, where)
        problem = _text_problem(cls, args)
        if problem is not None:
            raise PlainError(f"{where}: a {cls.__name__} of its body query: {problem}")
        node = cls(**args)
        comments = data.get("@comments")
        if comments is not None:
            if not isinstance(comments, list) or not all(isinstance(c, str) for c in comments):
                raise PlainError(f"{where}: a comment of its body query is not text")
            node.comments = comments
        return node

    def sql_value(self, value: object, depth: int, where: str) -> object:
        if type(value) in (str, bool, int):
            return value
        if isinstance(value, dict) and _DTYPE in value:
            kind = exp.DataType.Type.__members__.get(value[_DTYPE]) if isinstance(value[_DTYPE], str) else None
            if kind is None or len(value) != 1:
                raise PlainError(f"{where}: its body query names an unknown data type {_shown(value[_DTYPE])}")
            return kind
        return self.sql(value, depth + 1, where)


class _Expr:
    """Reads one rule's neural expression: node kinds, field types, and what they refer to."""

    def __init__(self, template: ir.Template, refs: int, columns: int, where: str):
        self.template, self.refs, self.columns, self.where = template, refs, columns, where

    def fail(self, message: str) -> PlainError:
        return PlainError(f"{self.where}: its neural expression {message}")

    def read(self, data: object, depth: int, inside_agg: bool = False) -> ir.Expr:  # noqa: C901 - one check per field kind
        """A node and its subtree; `inside_agg`: below an aggregate, where none may nest (as the parser says)."""
        if depth > ir.MAX_EXPRESSION_DEPTH:
            raise self.fail(f"nests deeper than {ir.MAX_EXPRESSION_DEPTH} levels")
        if not isinstance(data, dict):
            raise self.fail(f"holds {_shown(data)} where a node belongs")
        cls = _EXPRESSIONS.get(data.get("@"))  # type: ignore[arg-type]
        if cls is None:
            raise self.fail(f"holds an unknown node kind {_shown(data.get('@'))}")
        if issubclass(cls, ir.Agg):
            if inside_agg:
                raise self.fail("nests an aggregate inside another")
            inside_agg = True
        names = {f.name for f in dataclasses.fields(cls)}
        if set(data) - {"@"} != names:
            raise self.fail(f"has a {cls.__name__} with fields {sorted(set(data) - {'@'})}, not {sorted(names)}")
        fields = {}
        for name in names:
            kind = "expr" if (cls, name) == (ir.Attention, "value") else _FIELDS[name]
            value = data[name]
            if kind == "expr":
                value = self.read(value, depth + 1, inside_agg)
            elif kind == "exprs":
                if not isinstance(value, list) or not value:
                    raise self.fail(f"has a {cls.__name__} whose {name} is not a list of nodes")
                value = tuple(self.read(v, depth + 1, inside_agg) for v in value)
            else:
                value = self.scalar(cls, name, kind, value)
            fields[name] = value
        node = cls(**fields)
        self.check(node)
        return node

    def scalar(self, cls: type, name: str, kind: str, value: object) -> object:
        types = {"int": (int,), "int?": (int, type(None)), "str": (str,), "num": (int, float),
                 "num?": (int, float, type(None)), "ints": (list,)}[kind]
        if isinstance(value, bool) or not isinstance(value, types) or (
                kind == "ints" and not all(type(v) is int and v >= 0 for v in value)) or (
                kind.startswith("int") and isinstance(value, int) and value < 0) or (
                kind.startswith("num") and value is not None and not math.isfinite(value)):
            raise self.fail(f"has a {cls.__name__} whose {name} is {_shown(value)}")
        if kind == "ints":
            return tuple(value)
        return float(value) if kind.startswith("num") and value is not None else value

    def check(self, node: ir.Expr) -> None:  # noqa: C901 - the parser's limits, one line per node kind
        bad = None
        columns = [*getattr(node, "columns", ()), *[getattr(node, a) for a in ("column", "types")
                                                      if isinstance(getattr(node, a, None), int)]]
        if any(c >= self.columns for c in columns):
            bad = f"reads grounding column {max(columns)}, but the rule has {self.columns}"
        elif isinstance(node, ir.Ref) and node.index >= self.refs:
            bad = f"reads reference {node.index}, but the rule has {self.refs}"
        elif isinstance(node, ir.Column) and node.index >= self.columns:
            bad = f"reads grounding column {node.index}, but the rule has {self.columns}"
        elif any(getattr(node, a, None) is not None and getattr(node, a) not in self.template.weights
                 for a in ("weight", "gain", "bias")):
            bad = "uses a weight the template does not declare"
        elif isinstance(node, ir.Binary) and node.op not in ("+", "-", "*"):
            bad = f"has an unknown operator {_shown(node.op)}"
        elif isinstance(node, ir.Act) and node.name not in _ACTIVATIONS:
            bad = f"has an unknown activation {_shown(node.name)}"
        elif isinstance(node, ir.Attention) and (node.kind != "attention" or node.mode not in ("concat", "mean")):
            bad = "has an attention of an unknown kind or mode"
        elif isinstance(node, ir.Agg) and not isinstance(node, ir.Attention) and node.kind not in _AGGREGATES:
            bad = f"has an unknown aggregate {_shown(node.kind)}"
        elif isinstance(node, ir.Combine) and node.kind != "concat":
            bad = f"has an unknown combination {_shown(node.kind)}"
        elif isinstance(node, ir.Dropout) and not 0.0 <= node.p < 1.0:
            bad = f"has a dropout probability {node.p} outside [0, 1)"
        elif isinstance(node, ir.Encode) and (node.kind not in ("ple", "calendar") or not node.columns or node.bins > 1024
                                              or (node.kind == "ple") != (node.bins > 0)):
            bad = "has an encoding of an unknown kind, no columns, or bins out of range"
        elif isinstance(node, ir.Features) and not node.columns:
            bad = "has features of no columns"
        elif isinstance(node, ir.Text) and (node.kind not in ("text", "codes") or not 0 < node.buckets <= ir.MAX_WIDTH
                                            or not 0 < node.tokens <= 4096):
            bad = "has a text encoding of an unknown kind, or buckets or tokens out of range"
        if bad:
            raise self.fail(bad)


_EXPRESSIONS = {c.__name__: c for c in (ir.Ref, ir.Column, ir.Features, ir.Encode, ir.Text, ir.LayerNorm, ir.Dropout,
                                        ir.Embed, ir.Param, ir.Const, ir.Apply, ir.Binary, ir.Act, ir.Combine, ir.Agg,
                                        ir.Attention)}
# every field of the IR's expression nodes, by name: what its value is (one meaning per name, but Attention's value: a node)
_FIELDS = {"index": "int", "columns": "ints", "kind": "str", "bins": "int", "weight": "str", "column": "int",
           "buckets": "int", "tokens": "int", "gain": "str", "bias": "str", "arg": "expr", "p": "num", "value": "num",
           "types": "int?", "op": "str", "left": "expr", "right": "expr", "name": "str", "param": "num?", "args": "exprs",
           "mode": "str"}


def _check_selects(query: exp.Select, keys: int, refs: int, columns: int, where: str) -> None:
    """The body query selects `_h0..`, `_r0..`, `_c0..` (the parser's names), as many as the rule has
    head keys, references and grounding columns: what grounding reads by position."""
    expected = [*(f"_h{i}" for i in range(keys)), *(f"_r{j}" for j in range(refs)), *(f"_c{k}" for k in range(columns))]
    got = [e.alias if isinstance(e, exp.Alias) else None for e in query.expressions]
    if got != expected:
        raise PlainError(f"{where}: its body query selects {_shown(got)}, not the rule's {len(expected)} columns "
                         f"{_shown(expected)}")


def _get(data: object, name: str, types: type | tuple[type, ...], where: str) -> object:
    if not isinstance(data, dict):
        raise PlainError(f"{where} is {_shown(data)}, not a mapping")
    if name not in data:
        raise PlainError(f"{where} has no {name!r}")
    value = data[name]
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in (types if isinstance(types, tuple)
                                                                                  else (types,))):
        raise PlainError(f"{where}: its {name!r} is {_shown(value)}, of the wrong type")
    return value


def _strings(data: object, name: str, where: str) -> list[str]:
    value = _get(data, name, list, where)
    if not all(isinstance(v, str) for v in value):
        raise PlainError(f"{where}: its {name!r} is not a list of names")
    return list(value)


def _choice(data: object, name: str, allowed: set[str], where: str) -> str:
    value = _get(data, name, str, where)
    if value not in allowed:
        raise PlainError(f"{where}: its {name!r} is {_shown(value)}, not one of {sorted(allowed)}")
    return value


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
