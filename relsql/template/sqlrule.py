"""The SQL-declared template frontend: `CREATE TABLE name AS SELECT keys, <neural expr> ...`.

The FROM/JOIN/WHERE part stays ordinary SQL for the database to run; the last SELECT item is
translated into the IR's neural expression. Every error names the statement and its line.
"""

from __future__ import annotations

import sqlglot
import sqlglot.expressions as exp
from sqlglot.errors import ParseError, TokenError
from sqlglot.tokens import Tokenizer, TokenType

from relsql.errors import TemplateError
from relsql.template import ir

_ACTIVATION_FUNCS = {"relu", "sigmoid", "leaky_relu", "identity", "softmax", "tanh", "exp", "log"}
_TYPED_ACTIVATIONS = {exp.Tanh: "tanh", exp.Exp: "exp", exp.Ln: "log", exp.Log: "log"}
_AGGREGATES = {exp.Sum: "sum", exp.Avg: "avg", exp.Max: "max", exp.Min: "min", exp.Count: "count"}
_BINARY = {exp.Add: "+", exp.Sub: "-", exp.Mul: "*"}


def _statement_lines(text: str) -> list[int]:
    """First line of every non-empty statement, so errors can point into the file."""
    lines: list[int] = []
    start: int | None = None
    for token in Tokenizer().tokenize(text):
        if token.token_type == TokenType.SEMICOLON:
            if start is not None:
                lines.append(start)
            start = None
        elif start is None:
            start = token.line
    if start is not None:
        lines.append(start)
    return lines


def parse_sql_template(text: str) -> ir.Template:
    """Parse a file of `CREATE TABLE ... AS SELECT` statements into the IR."""
    try:
        statements = [s for s in sqlglot.parse(text, read="duckdb") if s is not None]
        lines = _statement_lines(text)
    except (ParseError, TokenError) as err:
        detail = err.errors[0] if isinstance(err, ParseError) and err.errors else {}
        where = f" at line {detail.get('line')}, column {detail.get('col')}" if detail else ""
        raise TemplateError(f"SQL template does not parse{where}: {err}") from None
    if not statements:
        raise TemplateError("SQL template is empty: write at least one CREATE TABLE name AS SELECT ...")
    template = ir.Template(language="sql", source=text)
    for number, statement in enumerate(statements, start=1):
        line = lines[number - 1] if number - 1 < len(lines) else "?"
        _Statement(template, statement, f"statement {number} (line {line})").translate()
    return template


class _Statement:
    """Translation state of one statement: its neural aliases, columns and weights."""

    def __init__(self, template: ir.Template, statement: exp.Expression, origin: str):
        self.template = template
        self.statement = statement
        self.origin = origin
        self.neural: dict[str, str] = {}  # alias -> relation name
        self.refs: list[str] = []  # alias per ref index
        self.columns: list[exp.Expression] = []
        self.column_keys: dict[str, int] = {}

    def fail(self, message: str, node: exp.Expression | None = None) -> TemplateError:
        at = f" in `{node.sql('duckdb')}`" if node is not None else ""
        return TemplateError(f"{self.origin}{at}: {message}")

    def translate(self) -> None:
        st = self.statement
        if not (isinstance(st, exp.Create) and st.kind == "TABLE" and isinstance(st.expression, exp.Select)):
            raise self.fail("expected `CREATE TABLE <name> AS SELECT <keys>, <neural expression> FROM ...`")
        name = st.this.name if isinstance(st.this, exp.Table) else st.this.this.name
        select: exp.Select = st.expression
        for arg in ("having", "qualify", "windows", "distinct", "order", "limit", "offset"):
            if select.args.get(arg):
                raise self.fail(f"{arg.upper()} is not supported in a template statement; move it into a subquery in FROM")
        items = select.expressions
        if not items:
            raise self.fail("SELECT has no columns")
        self._collect_neural_tables(select)
        keys, key_names = [], []
        for item in items[:-1]:
            key_name = item.alias_or_name
            if not key_name or key_name == "*":
                raise self.fail("every head key needs a name: write `expr AS key_name`", item)
            if self._mentions_neural_value(item):
                raise self.fail("head keys must be plain SQL columns; only the last SELECT item is the neural expression", item)
            keys.append(item.unalias() if isinstance(item, exp.Alias) else item)
            key_names.append(key_name)
        if len(set(key_names)) != len(key_names):
            raise self.fail(f"head key names repeat: {key_names}; give each a distinct alias")
        group = select.args.get("group")
        grouped = group is not None
        if grouped:
            group_sql = sorted(g.sql("duckdb") for g in group.expressions)
            if group_sql != sorted(k.sql("duckdb") for k in keys):
                raise self.fail(
                    "GROUP BY must list exactly the head key expressions "
                    f"({', '.join(k.sql('duckdb') for k in keys) or 'none'})", group)
        for clause in ("where", "joins"):
            for node in _nodes(select.args.get(clause)):
                if self._is_value_column(node):
                    raise self.fail("a neural value `h` cannot be used in a join or filter condition", node)
        body = items[-1].unalias() if isinstance(items[-1], exp.Alias) else items[-1]
        expr = self._neural(body, inside_agg=False)
        has_agg = any(isinstance(e, ir.Agg) for e in ir.walk(expr))
        if has_agg and not grouped:
            raise self.fail("an aggregate needs GROUP BY <head keys>", body)
        if grouped:
            _check_aggregated(expr, self)
        relation = self.template.relations.get(name)
        if relation is None:
            if name in self.neural.values():
                raise self.fail(f"`{name}` refers to itself; relsql does not ground recursive rules yet")
            relation = self.template.relations[name] = ir.Relation(name=name, keys=key_names)
        elif relation.keys != key_names:
            raise self.fail(f"`{name}` was declared with keys {relation.keys}; every statement for it must select the same key names, got {key_names}")
        query = exp.Select(
            expressions=[
                *[exp.alias_(k.copy(), f"_h{i}", quoted=True) for i, k in enumerate(keys)],
                *[exp.alias_(exp.column("_rid", table=exp.to_identifier(a, quoted=True)), f"_r{j}", quoted=True)
                  for j, a in enumerate(self.refs)],
                *[exp.alias_(c.copy(), f"_c{k}", quoted=True) for k, c in enumerate(self.columns)],
            ]
        )
        for arg in ("from_", "joins", "where", "with_"):
            if select.args.get(arg) is not None:
                query.set(arg, select.args[arg].copy() if not isinstance(select.args[arg], list)
                          else [j.copy() for j in select.args[arg]])
        depends = sorted({t.name for t in select.find_all(exp.Table)
                          if t.name in self.template.relations and not t.db and t.name != name})
        relation.rules.append(ir.Rule(
            head=name, query=query, refs=[self.neural[a] for a in self.refs], expr=expr,
            grouped=grouped, origin=self.origin, n_columns=len(self.columns), depends=depends,
        ))

    def _collect_neural_tables(self, select: exp.Select) -> None:
        sources = [select.args.get("from_")] + list(select.args.get("joins") or [])
        for source in sources:
            if source is None:
                continue
            table = source.this
            if isinstance(table, exp.Table) and table.name in self.template.relations and not table.db:
                alias = table.alias_or_name
                self.neural[alias] = table.name

    def _is_value_column(self, node: exp.Expression) -> bool:
        return isinstance(node, exp.Column) and node.table in self.neural and node.name == "h"

    def _mentions_neural_value(self, node: exp.Expression) -> bool:
        return any(self._is_value_column(n) for n in node.walk())

    def _column(self, node: exp.Expression, role: str | None = None) -> int:
        """A grounding column; embedded and feature columns get their own (they are encoded in SQL)."""
        key = node.sql("duckdb") if role is None else f"{role}: {node.sql('duckdb')}"
        if key not in self.column_keys:
            self.column_keys[key] = len(self.columns)
            self.columns.append(node)
        return self.column_keys[key]

    def _weight(self, kind: str, shape: tuple, name: str | None, node: exp.Expression) -> str:
        relation = self.statement.this.name
        if name is None:
            count = sum(1 for w in self.template.weights if w.startswith(f"{relation}.{kind}"))
            name = f"{relation}.{kind}{count}"
        spec = self.template.weights.get(name)
        if spec is None:
            self.template.weights[name] = ir.WeightSpec(name, shape, kind=kind, origin=self.origin)
        elif spec.kind != kind or spec.shape[0] != shape[0]:
            raise self.fail(f"weight '{name}' was declared as {spec.kind} {spec.shape} in {spec.origin}; a shared name must keep its kind and size", node)
        return name

    def _int_arg(self, node: exp.Expression, args: list, position: int, what: str) -> int:
        if len(args) <= position or not (isinstance(args[position], exp.Literal) and not args[position].is_string):
            raise self.fail(f"{what} must be a positive integer literal", node)
        value = args[position].this
        if not value.isdigit() or int(value) <= 0:
            raise self.fail(f"{what} must be a positive integer literal, got {value}", node)
        return int(value)

    def _name_arg(self, node: exp.Expression, args: list, position: int) -> str | None:
        if len(args) <= position:
            return None
        if not (isinstance(args[position], exp.Literal) and args[position].is_string):
            raise self.fail("a weight name must be a string literal such as 'w_nb'", node)
        if len(args) > position + 1:
            raise self.fail("too many arguments", node)
        return args[position].this

    def _neural(self, node: exp.Expression, inside_agg: bool) -> ir.Expr:
        if isinstance(node, exp.Paren):
            return self._neural(node.this, inside_agg)
        if isinstance(node, exp.Column):
            if node.table in self.neural:
                if node.name != "h":
                    return ir.Column(self._column(node))
                if node.table not in self.refs:
                    self.refs.append(node.table)
                return ir.Ref(self.refs.index(node.table))
            return ir.Column(self._column(node))
        if isinstance(node, exp.Literal) and not node.is_string:
            return ir.Const(float(node.this))
        if isinstance(node, exp.Neg):
            return ir.Binary("*", ir.Const(-1.0), self._neural(node.this, inside_agg))
        for cls, op in _BINARY.items():
            if isinstance(node, cls):
                return ir.Binary(op, self._neural(node.left, inside_agg), self._neural(node.right, inside_agg))
        for cls, kind in _AGGREGATES.items():
            if isinstance(node, cls):
                if inside_agg:
                    raise self.fail("aggregates cannot be nested inside another aggregate; declare an intermediate relation", node)
                if kind == "count":
                    return ir.Agg("count", ir.Const(1.0))
                if isinstance(node.this, exp.Distinct) or node.args.get("distinct"):
                    raise self.fail("DISTINCT inside an aggregate is not supported", node)
                return ir.Agg(kind, self._neural(node.this, inside_agg=True))
        for cls, act in _TYPED_ACTIVATIONS.items():
            if isinstance(node, cls):
                if isinstance(node, exp.Log) and node.expression is not None:
                    raise self.fail("log takes one argument (the natural logarithm)", node)
                return ir.Act(act, self._neural(node.this, inside_agg))
        if isinstance(node, exp.Concat):
            return ir.Combine("concat", tuple(self._neural(a, inside_agg) for a in node.expressions))
        if isinstance(node, exp.Anonymous):
            return self._function(node, node.name.lower(), list(node.expressions), inside_agg)
        raise self.fail(
            "not a neural expression: use linear, embed, features, bias, + - *, numbers, "
            "activations (relu tanh sigmoid identity leaky_relu exp log softmax), "
            "aggregates (sum avg max min count) or concat", node)

    def _storage(self, node: exp.Expression, args: list) -> tuple[str, list]:
        """embed's `storage='memory'|'database'` keyword (also `storage := ...`, `storage => ...`)."""
        storage, rest = "memory", []
        for arg in args:
            key = value = None
            if isinstance(arg, exp.EQ) and isinstance(arg.this, exp.Column) and not arg.this.table:
                key, value = arg.this.name, arg.expression
            elif isinstance(arg, exp.PropertyEQ | exp.Kwarg):
                key, value = arg.this.name, arg.expression
            if key is None:
                rest.append(arg)
                continue
            if key.lower() != "storage" or not isinstance(value, exp.Literal) or not value.is_string \
                    or value.this not in ("memory", "database"):
                raise self.fail("embed's only keyword is storage='memory' or storage='database'", node)
            storage = value.this
        return storage, rest

    def _function(self, node: exp.Expression, fn: str, args: list, inside_agg: bool) -> ir.Expr:
        if fn in _ACTIVATION_FUNCS:
            if len(args) != 1:
                raise self.fail(f"{fn} takes exactly one argument", node)
            return ir.Act(fn, self._neural(args[0], inside_agg))
        if fn == "linear":
            if len(args) < 2:
                raise self.fail("linear(x, out_width [, 'name']) needs an input and an output width", node)
            width = self._int_arg(node, args, 1, "linear's output width")
            name = self._weight("linear", (width, None), self._name_arg(node, args, 2), node)
            return ir.Apply(name, self._neural(args[0], inside_agg))
        if fn == "embed":
            storage, args = self._storage(node, args)
            if len(args) < 2 or not isinstance(args[0], exp.Column) or args[0].table in self.neural:
                raise self.fail("embed(table.column, width [, 'name'] [, storage='database']) embeds a categorical database column", node)
            width = self._int_arg(node, args, 1, "embed's width")
            existed = self._name_arg(node, args, 2) in self.template.weights
            name = self._weight("embed", (None, width), self._name_arg(node, args, 2), node)
            spec = self.template.weights[name]
            if existed and spec.storage != storage:
                raise self.fail(f"embedding '{name}' is used with storage '{spec.storage}' elsewhere; use one storage per name", node)
            spec.kind, spec.storage = "embed", storage
            return ir.Embed(name, self._column(args[0], role=f"embed {name}"))
        if fn == "features":
            if not args or not all(isinstance(a, exp.Column) and a.table not in self.neural for a in args):
                raise self.fail("features(t.col, ...) takes numeric database columns", node)
            return ir.Features(tuple(self._column(a, role="features") for a in args))
        if fn == "bias":
            width = self._int_arg(node, args, 0, "bias's width")
            return ir.Param(self._weight("bias", (width,), self._name_arg(node, args, 1), node))
        raise self.fail(f"unknown function {fn}()", node)


def _nodes(value) -> list[exp.Expression]:
    if value is None:
        return []
    items = value if isinstance(value, list) else [value]
    return [n for item in items for n in item.walk()]


def _check_aggregated(expr: ir.Expr, statement: _Statement) -> None:
    """In a grouped statement every per-grounding leaf must sit under an aggregate."""
    if isinstance(expr, ir.Agg):
        return
    if isinstance(expr, (ir.Ref, ir.Column, ir.Features, ir.Embed)):
        raise statement.fail(
            "in a GROUP BY statement every neural value and column must be inside an aggregate "
            "(sum, avg, max, min); wrap it, or compute it in a separate relation")
    for child in expr.children():
        _check_aggregated(child, statement)
