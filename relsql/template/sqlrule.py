"""The SQL-declared template frontend: `CREATE TABLE name AS SELECT keys, <neural expr> ...`.

The FROM/JOIN/WHERE part stays ordinary SQL for the database to run; the last SELECT item is
translated into the IR's neural expression. Every error names the statement and its line.

A template is input too (a saved model carries one, a shared file is one), and its SQL runs on
the user's database each time it is grounded. So it may only read the database's tables:
`_check_reads_only` refuses, at parse time, functions that change the database or the session
(nextval, currval, setval, setseed, ...), that read files, the network or the engine's state
(read_csv, read_parquet, read_text, glob, *_scan, query, pragma_*, duckdb_*, getenv, ...), and a
table "name" that is a file path or URL (DuckDB would read the file: `FROM '/data/x.csv'`). In FROM, only
the row generators range, generate_series and unnest are table functions a template may call.
A table name with a file suffix (`FROM "data.parquet"`) is a real table's name on some databases
(`grp.x`): grounding refuses it, before any statement runs, where the database has no such table
(`file_like`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator

import sqlglot
import sqlglot.expressions as exp
from sqlglot.dialects.dialect import Dialect
from sqlglot.errors import ParseError, TokenError
from sqlglot.tokens import Token, Tokenizer, TokenType

from relsql import collector
from relsql.errors import TemplateError
from relsql.template import ir, recursion

_ACTIVATION_FUNCS = {"relu", "sigmoid", "leaky_relu", "identity", "softmax", "tanh", "exp", "log", "gelu"}
_TYPED_ACTIVATIONS = {exp.Tanh: "tanh", exp.Exp: "exp", exp.Ln: "log", exp.Log: "log"}
_AGGREGATES = {exp.Sum: "sum", exp.Avg: "avg", exp.Max: "max", exp.Min: "min", exp.Count: "count"}
_BINARY = {exp.Add: "+", exp.Sub: "-", exp.Mul: "*"}
TEXT_BUCKETS = 2**16  # text(...)'s default number of hash buckets (rows of its table, plus a padding row)
TEXT_TOKENS = 128  # text(...)'s default most tokens per value: its words first, then their 3-grams
_OPEN = {TokenType.L_PAREN, TokenType.L_BRACKET, TokenType.L_BRACE}
_CLOSE = {TokenType.R_PAREN, TokenType.R_BRACKET, TokenType.R_BRACE}
# a JOIN keyword's join ends at one of these (at its own depth of parentheses) without ON or USING
_JOIN_ENDS = {TokenType.JOIN, TokenType.WHERE, TokenType.GROUP_BY, TokenType.ORDER_BY, TokenType.HAVING,
              TokenType.QUALIFY, TokenType.LIMIT, TokenType.WINDOW, TokenType.UNION, TokenType.EXCEPT,
              TokenType.INTERSECT, TokenType.SEMICOLON, TokenType.COMMA}
_NO_ON_NEEDED = {TokenType.CROSS, TokenType.NATURAL, TokenType.POSITIONAL, TokenType.ASOF}  # before JOIN
# what a template may not call (see the module docstring): by name, by prefix, by suffix
_DENIED = {"nextval", "currval", "setval", "lastval", "setseed", "sleep_ms", "write_log", "getenv", "current_setting",
           "glob", "query", "query_table", "sniff_csv", "which_secret", "checkpoint", "force_checkpoint",
           "load_extension", "install_extension", "json_execute_serialized_sql", "summary", "to_file", "seq_scan",
           "truncate_duckdb_logs", "current_query", "stats"}
_DENIED_PREFIXES = ("read_", "pragma_", "duckdb_", "parquet_", "sqlite_", "postgres_", "mysql_", "iceberg_", "delta_",
                    "enable_", "disable_", "http", "s3_", "ducklake_", "arrow_", "pandas_", "python_", "st_read")
_DENIED_SUFFIXES = ("_scan", "_attach", "_execute", "_query")
_TABLE_FUNCTIONS = {"range", "generate_series", "unnest"}  # row generators, in FROM
_PATH_LIKE = re.compile(r"[/\\:]")  # a path or a URL: refused as it is parsed
_FILE_LIKE = re.compile(r"\.[A-Za-z0-9]{1,8}$")  # a name with a file suffix: a table of that name, or refused (`file_like`)


def _joins_without_on(tokens: list[Token]) -> dict[int, str]:
    """Statement number -> the table a JOIN keyword joins without ON or USING (the first such).
    sqlglot parses `a JOIN b` without ON like the comma join `a, b`, which would silently be a
    cross product: only the tokens tell them apart. CROSS, NATURAL, POSITIONAL and ASOF joins and
    joins of LATERAL or UNNEST need no condition."""
    found: dict[int, str] = {}
    statement, seen = 1, False
    for i, token in enumerate(tokens):
        if token.token_type == TokenType.SEMICOLON:
            statement, seen = statement + (1 if seen else 0), False
            continue
        seen = True
        if token.token_type != TokenType.JOIN or statement in found or i + 1 == len(tokens):
            continue
        after = tokens[i + 1]
        if (i and tokens[i - 1].token_type in _NO_ON_NEEDED) or after.token_type in (TokenType.LATERAL, TokenType.UNNEST):
            continue
        if not _has_condition(tokens, i + 1):
            found[statement] = "(subquery)" if after.token_type == TokenType.L_PAREN else after.text
    return found


def _has_condition(tokens: list[Token], start: int) -> bool:
    """Whether the join whose table starts at `start` has ON or USING at its own depth before it
    ends (at a join-ending token of that depth, a parenthesis closing around it, or the end)."""
    level = 0
    for token in tokens[start:]:
        if token.token_type in _OPEN:
            level += 1
        elif token.token_type in _CLOSE:
            level -= 1
            if level < 0:
                return False
        elif level == 0 and token.token_type in (TokenType.ON, TokenType.USING):
            return True
        elif level == 0 and token.token_type in _JOIN_ENDS:
            return False
    return False


def statement_spans(text: str, tokens: list[Token] | None = None) -> list[tuple[int, int, int]]:
    """(first line, first character, end character) of every non-empty statement."""
    spans: list[tuple[int, int, int]] = []
    start = None
    for token in Tokenizer().tokenize(text) if tokens is None else tokens:
        if token.token_type == TokenType.SEMICOLON:
            if start is not None:
                spans.append((start.line, start.start, token.end + 1))
            start = None
        elif start is None:
            start = token
    if start is not None:
        spans.append((start.line, start.start, len(text)))
    return spans


def _check_nesting(tokens: list[Token]) -> None:
    """Refuse brackets nested deeper than sqlglot's recursive parser can follow, before it tries."""
    depth, statement = 0, 1
    seen = False
    for token in tokens:
        if token.token_type == TokenType.SEMICOLON:
            depth, statement, seen = 0, statement + (1 if seen else 0), False
            continue
        seen = True
        if token.token_type in _OPEN:
            depth += 1
            if depth > ir.MAX_NESTING:
                raise TemplateError(
                    f"statement {statement} (line {token.line}): parentheses nest too deeply (more than "
                    f"{ir.MAX_NESTING} levels); compute inner parts in intermediate relations")
        elif token.token_type in _CLOSE:
            depth = max(depth - 1, 0)


_TOKEN_DUMP = re.compile(r"<Token token_type: [^,]*, text: (.*?), line: \d+, col: \d+, start: \d+, end: \d+, comments: \[.*?\]>")
_MISSING = re.compile(r"Required keyword: '(\w+)' missing for <class '(?:\w+\.)*(\w+)'>")
_CLASS = re.compile(r"<class '(?:\w+\.)*(\w+)'>")
_ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def _parse_message(err: ParseError) -> str:
    """A parse error in a line: where, near what, and sqlglot's description without its internals."""
    detail = err.errors[0] if err.errors else {}
    description = detail.get("description") or "invalid syntax"
    description = _TOKEN_DUMP.sub(lambda m: f"`{m.group(1)}`", description)
    description = _MISSING.sub(lambda m: f"incomplete {m.group(2).upper()}", description)
    description = _ESCAPE.sub("", _CLASS.sub(lambda m: m.group(1), description))
    near = _ESCAPE.sub("", str(detail.get("highlight") or "")).strip()
    near = f", near `{near[:40]}`" if near else ""
    where = f" at line {detail['line']}, column {detail.get('col')}" if detail.get("line") else ""
    return f"SQL template does not parse{where}{near}: {description[:200]}"


def _token_message(text: str) -> str:
    """The tokenizer stops at an unterminated string, quoted name or comment: find its start."""
    i, line, n = 0, 1, len(text)
    while i < n:
        c = text[i]
        if c == "\n":
            line += 1
        if c in "'\"":
            end = text.find(c, i + 1)
            while end != -1 and text[end + 1: end + 2] == c:  # a doubled quote escapes itself
                end = text.find(c, end + 2)
            if end == -1:
                what = "string" if c == "'" else "quoted name"
                return f"SQL template does not parse at line {line}: unterminated {what} (a {c} without its closing {c})"
            line += text.count("\n", i + 1, end)
            i = end + 1
            continue
        if text.startswith("--", i):
            end = text.find("\n", i)
            i = n if end == -1 else end
            continue
        if text.startswith("/*", i):
            end = text.find("*/", i + 2)
            if end == -1:
                return f"SQL template does not parse at line {line}: unterminated comment (a /* without */)"
            line += text.count("\n", i, end)
            i = end + 2
            continue
        i += 1
    return "SQL template does not parse: a string, quoted name or comment is not closed"


def parse_sql_template(text: str, depth: int | None = None) -> ir.Template:
    """Parse a file of `CREATE TABLE ... AS SELECT` statements into the IR; recursive relations
    are unrolled to `depth` (or the text's `-- relsql: depth N` line)."""
    with collector.paused():  # a parse allocates tens of thousands of nodes that stay alive
        return _parse_sql_template(text, depth)


def _parse_sql_template(text: str, depth: int | None) -> ir.Template:
    ir.check_text(text, "SQL template")
    spans: list[tuple[int, int, int]] = []
    try:  # tokenized once: the nesting check, the statements' lines and the parser read the same tokens
        dialect = Dialect.get_or_raise("duckdb")
        tokens = dialect.tokenize(text)
        _check_nesting(tokens)
        spans = statement_spans(text, tokens)
        # a comment after the last `;` comes back as an empty Semicolon statement that carries it
        statements = [s for s in dialect.parser().parse(tokens, text) if s is not None and not isinstance(s, exp.Semicolon)]
    except TokenError:
        raise TemplateError(_token_message(text)) from None
    except ParseError as err:
        raise TemplateError(_parse_message(err)) from None
    except RecursionError:
        raise TemplateError(_too_deep(text, spans)) from None
    if not statements:
        raise TemplateError("SQL template is empty: write at least one CREATE TABLE name AS SELECT ...")
    template = ir.Template(language="sql", source=text)
    declared = _declared(statements)
    unjoined = _joins_without_on(tokens)
    for number, statement in enumerate(statements, start=1):
        line = spans[number - 1][0] if number - 1 < len(spans) else "?"
        origin = f"statement {number} (line {line})"
        try:
            _Statement(template, statement, origin, declared, unjoined.get(number)).translate()
        except RecursionError:
            raise TemplateError(f"{origin}: the statement nests too deeply for relsql to read; split it into "
                                "intermediate relations") from None
    ir.check_names(template)
    recursion.unroll(template, depth, comment="--")
    return template


def _declared(statements: list[exp.Expression]) -> dict[str, str]:
    """Every relation the template declares (case-folded -> as first written): a statement may
    read one declared further down (a recursive relation's own statement, a cycle of them)."""
    found: dict[str, str] = {}
    for statement in statements:
        if isinstance(statement, exp.Create) and statement.kind == "TABLE":
            target = statement.this if isinstance(statement.this, exp.Table) else statement.this.this
            if isinstance(target, exp.Table | exp.Identifier) and target.name:
                found.setdefault(target.name.casefold(), target.name)
    return found


def _too_deep(text: str, spans: list[tuple[int, int, int]]) -> str:
    """The statement the parser's recursion gave up on (the stack was already deep when called)."""
    for number, (line, start, end) in enumerate(spans, start=1):
        try:
            sqlglot.parse(text[start:end], read="duckdb")
        except RecursionError:
            return (f"statement {number} (line {line}): the statement nests too deeply for the SQL parser; keep "
                    f"within {ir.MAX_NESTING} levels of parentheses and split it into intermediate relations")
        except (ParseError, TokenError):
            continue
    return "SQL template nests too deeply for the SQL parser; split it into intermediate relations"


class _Statement:
    """Translation state of one statement: its neural aliases, columns and weights."""

    def __init__(self, template: ir.Template, statement: exp.Expression, origin: str,
                 declared: dict[str, str] | None = None, unjoined: str | None = None):
        self.template = template
        self.unjoined = unjoined  # a table a JOIN keyword joins without ON or USING (`_joins_without_on`)
        self.declared = declared or {}
        self.statement = statement
        self.origin = origin
        self.neural: dict[str, str] = {}  # alias -> relation name
        self.refs: list[str] = []  # alias per ref index
        self.columns: list[exp.Expression] = []
        self.column_keys: dict[str, int] = {}

    def _relation(self, name: str) -> str | None:
        """The relation a table name means: one declared so far, or further down the template."""
        return self.template.relation_named(name) or self.declared.get(name.casefold())

    def fail(self, message: str, node: exp.Expression | None = None) -> TemplateError:
        at = f" in `{node.sql('duckdb')}`" if node is not None else ""
        return TemplateError(f"{self.origin}{at}: {message}")

    def translate(self) -> None:  # noqa: C901 - the checks of one CREATE TABLE statement, in order
        st = self.statement
        if not (isinstance(st, exp.Create) and st.kind == "TABLE" and isinstance(st.expression, exp.Select)):
            raise self.fail("expected `CREATE TABLE <name> AS SELECT <keys>, <neural expression> FROM ...`")
        self._check_reads_only(st.expression)
        name = st.this.name if isinstance(st.this, exp.Table) else st.this.this.name
        select: exp.Select = st.expression
        for arg in ("having", "qualify", "windows", "distinct", "order", "limit", "offset"):
            if select.args.get(arg):
                raise self.fail(f"{arg.upper()} is not supported in a template statement; move it into a subquery in FROM")
        items = select.expressions
        if not items:
            raise self.fail("SELECT has no columns")
        if self.unjoined is not None:
            raise self.fail(f"JOIN without ON (joining `{self.unjoined[:60]}`): add an ON condition "
                            "(or USING (...)); write CROSS JOIN if every pair of rows is meant")
        self._collect_neural_tables(select)
        keys, key_names = [], []
        for item in items[:-1]:
            key_name = item.alias_or_name
            if not key_name or key_name == "*":
                raise self.fail("every head key needs a name: write `expr AS key_name`", item)
            if ir.reserved(key_name):
                raise self.fail(f"the head key name `{key_name}` is reserved for relsql's own columns; "
                                f"rename it with `AS other_name`", item)
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
        ir.check_expression_depth(body, self.origin)
        expr = self._neural(body, inside_agg=False)
        has_agg = any(isinstance(e, ir.Agg) for e in ir.walk(expr))
        if has_agg and not grouped:
            raise self.fail("an aggregate needs GROUP BY <head keys>", body)
        if grouped:
            _check_aggregated(expr, self)
        relation = self.template.relations.get(name)
        if relation is None:
            relation = self.template.relations[name] = ir.Relation(name=name, keys=key_names)
        elif relation.keys != key_names:
            raise self.fail(f"`{name}` was declared with keys {relation.keys}; every statement for it must select the same "
                            f"key names, got {key_names}")
        # The query takes the parsed statement's nodes over, not copies: the statement was parsed
        # for this template alone and is dropped after, and keys, grounding columns and the
        # FROM/JOIN/WHERE parts are disjoint subtrees of it (copying them was half a large
        # template's parse). Whoever changes a rule's query copies it first (ground/execute.py).
        query = exp.Select(
            expressions=[
                *[exp.alias_(k, f"_h{i}", quoted=True, copy=False) for i, k in enumerate(keys)],
                *[exp.alias_(exp.column("_rid", table=exp.to_identifier(a, quoted=True)), f"_r{j}", quoted=True, copy=False)
                  for j, a in enumerate(self.refs)],
                *[exp.alias_(c, f"_c{k}", quoted=True, copy=False) for k, c in enumerate(self.columns)],
            ]
        )
        depends = sorted({self._relation(t.name) for t in select.find_all(exp.Table)
                          if not t.db and self._relation(t.name) is not None})  # itself too: a recursive read
        for arg in ("from_", "joins", "where", "with_"):
            if select.args.get(arg) is not None:
                query.set(arg, select.args[arg])
        relation.rules.append(ir.Rule(
            head=name, query=query, refs=[self.neural[a] for a in self.refs], expr=expr,
            grouped=grouped, origin=self.origin, n_columns=len(self.columns), depends=depends,
        ))

    def _check_reads_only(self, select: exp.Select) -> None:
        """Refuse what would do more than read the database's tables (see the module docstring)."""
        fix = ("a template may only read the database's tables (and compute on their values); "
               "load the data into a table first and read that")
        for node in select.walk():
            if isinstance(node, exp.Table):
                source = node.this
                if isinstance(source, exp.Identifier) and _PATH_LIKE.search(source.name):
                    raise self.fail(f"table `{source.name}` reads like a file path or URL, which DuckDB would open and "
                                    f"read; {fix}", node)
                if isinstance(source, exp.Func) and _function_name(source) not in _TABLE_FUNCTIONS:
                    raise self.fail(f"table function {_function_name(source)}() reads from outside the database's "
                                    f"tables (only {', '.join(sorted(_TABLE_FUNCTIONS))} generate rows in FROM); {fix}",
                                    node)
            elif isinstance(node, exp.NextValueFor | exp.ReadCSV | exp.ReadParquet | exp.ToFile) or (
                    isinstance(node, exp.Func) and _denied(_function_name(node))):
                name = _function_name(node)
                what = ("changes the database or the session (a sequence, the random seed, the log)"
                        if name in ("nextval", "currval", "setval", "lastval", "setseed", "write_log", "next_value_for")
                        else "reads files, the network, settings or the engine's state")
                raise self.fail(f"function {name}() {what}; {fix}", node)

    def _collect_neural_tables(self, select: exp.Select) -> None:
        sources = [select.args.get("from_")] + list(select.args.get("joins") or [])
        for source in sources:
            if source is None:
                continue
            table = source.this
            if isinstance(table, exp.Table) and not table.db:
                relation = self._relation(table.name)  # as the database reads names: ignoring case
                if relation is not None:
                    self.neural[table.alias_or_name] = relation

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

    def _weight(self, kind: str, shape: tuple, name: str | None, node: exp.Expression, blocks: int = 1) -> str:
        relation = self.statement.this.name
        if name is None:
            count = sum(1 for w in self.template.weights if w.startswith(f"{relation}.{kind}"))
            name = f"{relation}.{kind}{count}"
        spec = self.template.weights.get(name)
        if spec is None:
            self.template.weights[name] = ir.WeightSpec(name, shape, kind=kind, origin=self.origin, blocks=blocks)
        elif spec.kind != kind or tuple(spec.shape) != tuple(shape) or spec.blocks != blocks:
            raise self.fail(f"weight '{name}' was declared as {spec.kind} {ir.shape_text(spec.shape)}"
                            f"{f' in {spec.blocks} blocks' if spec.blocks > 1 else ''} in {spec.origin}, here as {kind} "
                            f"{ir.shape_text(shape)}{f' in {blocks} blocks' if blocks > 1 else ''}; a shared name must "
                            "keep its kind and size", node)
        return name

    def _int_arg(self, node: exp.Expression, args: list, position: int, what: str) -> int:
        if len(args) <= position or not (isinstance(args[position], exp.Literal) and not args[position].is_string):
            raise self.fail(f"{what} must be a positive integer literal", node)
        value = args[position].this
        if not (value.isascii() and value.isdigit()) or int(value) <= 0:
            raise self.fail(f"{what} must be a positive integer literal, got {value[:40]}", node)
        if len(value) > 12 or int(value) > ir.MAX_WIDTH:
            raise self.fail(f"{what} {value[:40]} is larger than relsql's limit of {ir.MAX_WIDTH} (2**24); "
                            "use a smaller width", node)
        return int(value)

    def _number_arg(self, node: exp.Expression, arg: exp.Expression, what: str) -> float:
        """A number written as a literal (a leading minus allowed)."""
        sign = 1.0
        if isinstance(arg, exp.Neg):
            sign, arg = -1.0, arg.this
        if not (isinstance(arg, exp.Literal) and not arg.is_string):
            raise self.fail(f"{what} must be a number, got {arg.sql('duckdb')}", node)
        value = sign * float(arg.this)
        if not math.isfinite(value):
            raise self.fail(f"{what} must be a finite number, got {arg.sql('duckdb')}", node)
        return value

    def _name_arg(self, node: exp.Expression, args: list, position: int, last: bool = True) -> str | None:
        """The weight name at `position` (None if absent); `last`: no argument may follow it."""
        if len(args) <= position:
            return None
        if not (isinstance(args[position], exp.Literal) and args[position].is_string):
            raise self.fail("a weight name must be a string literal such as 'w_nb'", node)
        if last and len(args) > position + 1:
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
                    raise self.fail("aggregates cannot be nested inside another aggregate; declare an intermediate "
                                    "relation", node)
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
            "not a neural expression: use linear, embed, features, ple, calendar, text, bag, bias, layer_norm, dropout, + - *, "
            "numbers, activations (relu tanh sigmoid identity leaky_relu gelu exp log softmax), sum_per_head, "
            "aggregates (sum avg max min count attention) or concat", node)

    def _keywords(self, node: exp.Expression, args: list) -> tuple[dict[str, exp.Expression], list]:
        """embed's keywords `name=value` (also `name := value`, `name => value`) and the other arguments."""
        keywords, rest = _split_keywords(args)
        unknown = set(keywords) - {"storage", "min_count"}
        if unknown:
            raise self.fail(f"embed has no keyword {sorted(unknown)[0]}; its keywords are storage='memory' or "
                            "storage='database', and min_count=<positive integer>", node)
        return keywords, rest

    def _storage(self, node: exp.Expression, keywords: dict[str, exp.Expression]) -> str:
        """embed's `storage='memory'|'database'` keyword."""
        value = keywords.get("storage")
        if value is None:
            return "memory"
        if not isinstance(value, exp.Literal) or not value.is_string or value.this not in ("memory", "database"):
            raise self.fail("embed's storage is storage='memory' or storage='database'", node)
        return value.this

    def _min_count(self, node: exp.Expression, keywords: dict[str, exp.Expression], storage: str) -> int | None:
        """embed's `min_count=k`: values in fewer than k groundings share the rare row."""
        value = keywords.get("min_count")
        if value is None:
            return None
        if storage == "database":
            raise self.fail("min_count= is for embeddings kept in memory; leave out storage='database' or min_count", node)
        return self._int_arg(node, [value], 0, "embed's min_count")

    def _text(self, node: exp.Expression, fn: str, args: list) -> ir.Expr:
        """text(t.c, d [, 'name'] [, buckets=N] [, tokens=L]): hashed words and character 3-grams;
        bag(t.list, d, ...): a list column's hashed elements (codes)."""
        keywords, rest = _split_keywords(args)
        usage = (f"{fn}(table.column, width [, 'name'] [, buckets=N] [, tokens=L]) averages learnable vectors of "
                 + ("a text column's hashed words and character 3-grams" if fn == "text" else "a list column's hashed elements"))
        if set(keywords) - {"buckets", "tokens"} or len(rest) < 2 or not isinstance(rest[0], exp.Column) \
                or rest[0].table in self.neural:
            raise self.fail(usage, node)
        width = self._int_arg(node, rest, 1, f"{fn}'s width")
        buckets = self._int_arg(node, [keywords["buckets"]], 0, f"{fn}'s buckets") if "buckets" in keywords else TEXT_BUCKETS
        tokens = self._int_arg(node, [keywords["tokens"]], 0, f"{fn}'s tokens") if "tokens" in keywords else TEXT_TOKENS
        if tokens > 4096:
            raise self.fail(f"{fn}'s tokens must be at most 4096, got {tokens}", node)
        name = self._weight("text", (buckets + 1, width), self._name_arg(node, rest, 2), node)
        kind = "text" if fn == "text" else "codes"
        return ir.Text(name, self._column(rest[0], role=f"{fn} {name} {tokens}"), buckets, tokens, kind)

    def _layer_norm(self, node: exp.Expression, args: list, inside_agg: bool) -> ir.Expr:
        """layer_norm(x [, 'name']): weights '<name>.gain' (ones) and '<name>.bias' (zeros)."""
        if not 1 <= len(args) <= 2:
            raise self.fail("layer_norm(x [, 'name']) normalizes each row's vector, with a learnable gain and bias", node)
        name = self._name_arg(node, args, 1)
        if name is None:
            relation = self.statement.this.name
            count = sum(1 for w in self.template.weights if w.startswith(f"{relation}.layer_norm") and w.endswith(".gain"))
            name = f"{relation}.layer_norm{count}"
        gain = self._weight("gain", (None,), f"{name}.gain", node)
        bias = self._weight("bias", (None,), f"{name}.bias", node)
        return ir.LayerNorm(gain, bias, self._neural(args[0], inside_agg))

    def _dropout(self, node: exp.Expression, args: list, inside_agg: bool) -> ir.Expr:
        """dropout(x, p) with 0 <= p < 1."""
        if len(args) != 2:
            raise self.fail("dropout(x, p) zeroes each element with probability p (0 <= p < 1) while training", node)
        p = self._number_arg(node, args[1], "dropout's probability")
        if not 0.0 <= p < 1.0:
            raise self.fail(f"dropout's probability must be at least 0 and below 1, got {p:g}", node)
        return ir.Dropout(p, self._neural(args[0], inside_agg))

    def _encoded(self, node: exp.Expression, fn: str, args: list) -> ir.Expr:
        """ple(t.a [, t.b ...], bins) and calendar(t.d [, ...]): columns encoded in SQL."""
        if fn == "ple":
            if len(args) < 2:
                raise self.fail("ple(t.col [, t.col2 ...], bins) encodes numeric columns piecewise-linearly over "
                                "`bins` quantile bins", node)
            bins, args = self._int_arg(node, args, len(args) - 1, "ple's number of bins"), args[:-1]
            if bins > 1024:
                raise self.fail(f"ple's number of bins must be at most 1024, got {bins}", node)
        else:
            bins = 0
            if not args:
                raise self.fail("calendar(t.date_col [, ...]) encodes date or timestamp columns", node)
        for arg in args:
            self._check_value_expression(node, arg, fn)
        return ir.Encode(fn, tuple(self._column(a, role=fn) for a in args), bins)

    def _check_value_expression(self, node: exp.Expression, arg: exp.Expression, fn: str) -> None:
        """A database value per grounding: a column or an expression over columns, without neural values,
        aggregates or windows (the database computes it per grounding row)."""
        if arg.find(exp.Column) is None or any(c.table in self.neural for c in arg.find_all(exp.Column)) \
                or arg.find(exp.AggFunc, exp.Window, exp.Subquery, exp.Star) is not None:
            raise self.fail(f"{fn}(...) takes database columns or expressions over them (such as "
                            "epoch(a.t) - epoch(b.t)), not neural values, constants, aggregates or subqueries", node)

    # C901: one branch per template function (a dispatch; split, one table of cases would scatter)
    def _function(self, node: exp.Expression, fn: str, args: list, inside_agg: bool) -> ir.Expr:  # noqa: C901
        if fn == "leaky_relu" and len(args) == 2:
            return ir.Act(fn, self._neural(args[0], inside_agg),
                          param=self._number_arg(node, args[1], "leaky_relu's negative slope"))
        if fn == "sum_per_head":  # multi-head dot products: sum_per_head(q * k, heads)
            if len(args) != 2:
                raise self.fail("sum_per_head(x, heads) sums each of `heads` equal consecutive parts of x", node)
            heads = self._int_arg(node, args, 1, "sum_per_head's number of heads")
            return ir.Act(fn, self._neural(args[0], inside_agg), param=float(heads))
        if fn in _ACTIVATION_FUNCS:
            if len(args) != 1:
                raise self.fail(f"{fn} takes exactly one argument" + (" (and leaky_relu an optional negative slope)"
                                                                      if fn == "leaky_relu" else ""), node)
            return ir.Act(fn, self._neural(args[0], inside_agg))
        if fn == "attention":
            if inside_agg:
                raise self.fail("aggregates cannot be nested inside another aggregate; declare an intermediate relation", node)
            mode = "concat"
            if len(args) == 3 and isinstance(args[2], exp.Literal) and args[2].is_string and args[2].this in ("concat", "mean"):
                mode, args = args[2].this, args[:2]
            if len(args) != 2:
                raise self.fail("attention(score, value [, 'concat' | 'mean']) takes a score (one column per head) and a "
                                "value (heads x width) per grounding", node)
            return ir.Attention("attention", self._neural(args[0], True), self._neural(args[1], True), mode)
        if fn == "linear":
            keywords, args = _split_keywords(args)
            if set(keywords) - {"blocks"}:
                raise self.fail(f"linear has no keyword {sorted(set(keywords) - {'blocks'})[0]}; its one keyword is "
                                "blocks=<positive integer> (a block-diagonal matrix)", node)
            if len(args) < 2 or len(args) > 4:
                raise self.fail("linear(x, out_width [, 'name' [, t.type_column]] [, blocks=k]) needs an input and an "
                                "output width", node)
            width = self._int_arg(node, args, 1, "linear's output width")
            blocks = self._int_arg(node, [keywords["blocks"]], 0, "linear's blocks") if "blocks" in keywords else 1
            if width % blocks:
                raise self.fail(f"linear's output width {width} is not a multiple of its {blocks} blocks", node)
            if len(args) == 4:  # one matrix per value of a categorical column: typed weights
                if not isinstance(args[3], exp.Column) or args[3].table in self.neural:
                    raise self.fail("a typed linear is linear(x, out_width, 'name', t.type_column): a name, then a "
                                    "categorical database column choosing the matrix per grounding", node)
                name = self._weight("typed", (width, None), self._name_arg(node, args, 2, last=False), node)
                return ir.Apply(name, self._neural(args[0], inside_agg), self._column(args[3], role=f"types {name}"))
            if blocks > 1 and len(args) == 4:
                raise self.fail("a typed linear (one matrix per type) takes no blocks=", node)
            name = self._weight("linear", (width, None), self._name_arg(node, args, 2), node, blocks)
            return ir.Apply(name, self._neural(args[0], inside_agg))
        if fn == "embed":
            keywords, args = self._keywords(node, args)
            storage = self._storage(node, keywords)
            min_count = self._min_count(node, keywords, storage)
            if len(args) < 2 or not isinstance(args[0], exp.Column) or args[0].table in self.neural:
                raise self.fail("embed(table.column, width [, 'name'] [, storage='database'] [, min_count=k]) embeds a "
                                "categorical database column", node)
            width = self._int_arg(node, args, 1, "embed's width")
            existed = self._name_arg(node, args, 2) in self.template.weights
            name = self._weight("embed", (None, width), self._name_arg(node, args, 2), node)
            spec = self.template.weights[name]
            if existed and spec.storage != storage:
                raise self.fail(f"embedding '{name}' is used with storage '{spec.storage}' elsewhere; use one storage "
                                "per name", node)
            if existed and spec.min_count != min_count:
                raise self.fail(f"embedding '{name}' is used with min_count={spec.min_count} elsewhere; use one min_count "
                                "per name", node)
            spec.kind, spec.storage, spec.min_count = "embed", storage, min_count
            return ir.Embed(name, self._column(args[0], role=f"embed {name}"))
        if fn == "features":
            if not args:
                raise self.fail("features(t.col, ...) takes numeric database columns or expressions over them", node)
            for arg in args:
                self._check_value_expression(node, arg, fn)
            return ir.Features(tuple(self._column(a, role="features") for a in args))
        if fn in ("ple", "calendar"):
            return self._encoded(node, fn, args)
        if fn in ("text", "bag"):
            return self._text(node, fn, args)
        if fn == "layer_norm":
            return self._layer_norm(node, args, inside_agg)
        if fn == "dropout":
            return self._dropout(node, args, inside_agg)
        if fn == "bias":
            width = self._int_arg(node, args, 0, "bias's width")
            return ir.Param(self._weight("bias", (width,), self._name_arg(node, args, 1), node))
        raise self.fail(f"unknown function {fn}()", node)


def _function_name(node: exp.Func) -> str:
    """A function's name as DuckDB receives it: an unknown one's own, else sqlglot's (READ_CSV -> read_csv)."""
    return (node.name if isinstance(node, exp.Anonymous) else node.sql_name()).lower()


def _denied(name: str) -> bool:
    return name in _DENIED or name.startswith(_DENIED_PREFIXES) or name.endswith(_DENIED_SUFFIXES)


def _nodes(value) -> list[exp.Expression]:
    if value is None:
        return []
    items = value if isinstance(value, list) else [value]
    return [n for item in items for n in item.walk()]


def _check_aggregated(expr: ir.Expr, statement: _Statement) -> None:
    """In a grouped statement every per-grounding leaf must sit under an aggregate."""
    if isinstance(expr, ir.Agg):
        return
    if isinstance(expr, (ir.Ref, ir.Column, ir.Features, ir.Encode, ir.Embed, ir.Text)):
        raise statement.fail(
            "in a GROUP BY statement every neural value and column must be inside an aggregate "
            "(sum, avg, max, min); wrap it, or compute it in a separate relation")
    for child in expr.children():
        _check_aggregated(child, statement)


def _split_keywords(args: list) -> tuple[dict[str, exp.Expression], list]:
    """A function's keyword arguments `name=value` (also `name := value`, `name => value`), by
    lower-cased name, and its other arguments in order."""
    keywords, rest = {}, []
    for arg in args:
        if isinstance(arg, exp.EQ) and isinstance(arg.this, exp.Column) and not arg.this.table:
            keywords[arg.this.name.lower()] = arg.expression
        elif isinstance(arg, exp.PropertyEQ | exp.Kwarg):
            keywords[arg.this.name.lower()] = arg.expression
        else:
            rest.append(arg)
    return keywords, rest


def check_reads_only(select: exp.Select, origin: str) -> None:
    """The parser's check that a body query only reads the database's tables, for a query that
    comes from elsewhere (a saved model's plain IR, relsql/template/plain.py)."""
    _Statement(ir.Template(), select, origin)._check_reads_only(select)


def file_like(template: ir.Template) -> Iterator[tuple[str, str]]:
    """(name, statement) for each table a statement reads whose name ends like a file's
    (`FROM "data.csv"`): DuckDB opens and reads such a file unless a table has the name. Whether
    one does is known only on the database, so grounding refuses the others before any statement
    runs (relsql/ground/execute.py); a table named `grp.x` stays readable. Paths and URLs are
    refused as the template is parsed (`_check_reads_only`)."""
    for relation in template.relations.values():
        for rule in relation.rules:
            if not isinstance(rule.query, exp.Expression):
                continue
            for table in rule.query.find_all(exp.Table):
                name = table.this.name if isinstance(table.this, exp.Identifier) else None
                if name and not table.db and _FILE_LIKE.search(name) and name not in template.relations:
                    yield name, rule.origin
