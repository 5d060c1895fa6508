"""A deliberately naive reference evaluator for SQL-declared templates.

It shares no code with relsql. Per statement (parsed with sqlglot):

1. every neural relation computed so far is materialized as a real DuckDB temp table holding
   its key columns plus a row index `__ref_idx`;
2. the statement's FROM/JOIN/WHERE runs in DuckDB, selecting the head keys and every column the
   neural expression reads (a joined neural relation contributes its `__ref_idx`);
3. the neural expression is evaluated one grounding row at a time in plain Python, on numpy
   arrays (`backend="numpy"`) or on torch tensors (`backend="torch"`, so autograd can give the
   reference's own gradients); aggregates loop over each head's rows, collected in a dict.

max/min are elementwise by default (relsql's SQL semantics); `max_mode="argmax"` gives
NeuraLogic's whole-value pick instead. Statements with the same name are summed per head key. Weights come in as {name: array}
(linear: (out, in), applied as W @ x; embed: (vocab, d); bias: (d,)). Every weight must be
named in the template, so that the mapping to relsql's weights is unambiguous.

`evaluate` returns {relation: {key tuple: value array}}.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import sqlglot
import sqlglot.expressions as exp

_counter = itertools.count()

_AGGREGATES = {"sum", "avg", "max", "min", "count"}
_ACTIVATIONS = {"relu", "tanh", "sigmoid", "identity", "leaky_relu", "exp", "log", "softmax"}


class UnsupportedTemplate(Exception):
    """The template uses something the reference does not understand."""


# ---------------------------------------------------------------------------- backends ------
class NumpyBackend:
    name = "numpy"

    def vector(self, values) -> np.ndarray:
        return np.asarray(values, dtype=np.float64).reshape(-1)

    def weight(self, w):
        return np.asarray(w, dtype=np.float64)

    def activation(self, fn: str, x):
        if fn == "identity":
            return x
        if fn == "relu":
            return np.where(x > 0, x, 0.0)
        if fn == "leaky_relu":
            return np.where(x >= 0, x, 0.01 * x)
        if fn == "tanh":
            return np.array([math.tanh(v) for v in x])
        if fn == "sigmoid":
            return np.array([1.0 / (1.0 + math.exp(-v)) if v >= 0 else math.exp(v) / (1.0 + math.exp(v)) for v in x])
        if fn == "exp":
            return np.array([math.exp(v) for v in x])
        if fn == "log":
            return np.array([math.log(v) for v in x])
        if fn == "softmax":
            top = max(x)
            e = np.array([math.exp(v - top) for v in x])
            return e / e.sum()
        raise UnsupportedTemplate(f"unknown activation {fn}")

    def matvec(self, w, x):
        out = np.zeros(w.shape[0])
        for i in range(w.shape[0]):
            out[i] = sum(w[i, j] * x[j] for j in range(w.shape[1]))
        return out

    def concat(self, parts):
        return np.concatenate([np.reshape(p, -1) for p in parts])

    def total(self, x) -> float:
        return float(sum(float(v) for v in x))

    def elementwise(self, fn: str, values):
        pick = max if fn == "max" else min
        return np.array([pick(float(v[i]) for v in values) for i in range(len(values[0]))])


class TorchBackend:
    """The same per-row evaluation on torch tensors, for autograd gradients."""

    name = "torch"

    def __init__(self):
        import torch

        self.torch = torch

    def vector(self, values):
        return self.torch.as_tensor(np.asarray(values, dtype=np.float64).reshape(-1))

    def weight(self, w):
        return w if isinstance(w, self.torch.Tensor) else self.torch.as_tensor(np.asarray(w, dtype=np.float64))

    def activation(self, fn: str, x):
        t = self.torch
        if fn == "identity":
            return x
        if fn == "relu":
            return t.where(x > 0, x, t.zeros_like(x))
        if fn == "leaky_relu":
            return t.where(x >= 0, x, 0.01 * x)
        if fn == "tanh":
            return t.tanh(x)
        if fn == "sigmoid":
            return 1.0 / (1.0 + t.exp(-x))
        if fn == "exp":
            return t.exp(x)
        if fn == "log":
            return t.log(x)
        if fn == "softmax":
            e = t.exp(x - x.detach().max())
            return e / e.sum()
        raise UnsupportedTemplate(f"unknown activation {fn}")

    def matvec(self, w, x):
        return (w * x.reshape(1, -1)).sum(dim=1)

    def concat(self, parts):
        return self.torch.cat([p.reshape(-1) for p in parts])

    def total(self, x) -> float:
        return float(x.detach().sum())

    def elementwise(self, fn: str, values):
        # amax/amin split the gradient evenly among tied groundings, like scatter_reduce
        stacked = self.torch.stack(values)
        return stacked.amax(0) if fn == "max" else stacked.amin(0)


# ---------------------------------------------------------------------------- helpers -------
def _fn_name(node: exp.Expression) -> str | None:
    if isinstance(node, exp.Anonymous):
        return node.name.lower()
    table = {
        exp.Tanh: "tanh", exp.Exp: "exp", exp.Ln: "log", exp.Log: "log", exp.Sum: "sum",
        exp.Avg: "avg", exp.Max: "max", exp.Min: "min", exp.Count: "count", exp.Concat: "concat",
    }
    for cls, name in table.items():
        if type(node) is cls:
            return name
    return None


def _args(node: exp.Expression) -> list[exp.Expression]:
    if isinstance(node, (exp.Anonymous, exp.Concat)):
        return list(node.expressions)
    return [node.this]


def _literal_int(node: exp.Expression) -> int:
    if not (isinstance(node, exp.Literal) and not node.is_string):
        raise UnsupportedTemplate(f"expected an integer literal, got {node.sql()}")
    return int(node.this)


def _literal_name(args: list[exp.Expression], position: int, fn: str) -> str:
    if len(args) <= position or not (isinstance(args[position], exp.Literal) and args[position].is_string):
        raise UnsupportedTemplate(f"{fn}(...) must name its weight in reference tests")
    return args[position].this


def _source_tables(select: exp.Select) -> list[exp.Table]:
    out = []
    if select.args.get("from_") is not None:
        out.append(select.args["from_"].this)
    for join in select.args.get("joins") or []:
        out.append(join.this)
    return [t for t in out if isinstance(t, exp.Table)]


class _Statement:
    def __init__(self, node: exp.Create):
        if not (isinstance(node, exp.Create) and isinstance(node.expression, exp.Select)):
            raise UnsupportedTemplate("only CREATE TABLE name AS SELECT ... statements")
        target = node.this
        self.name = target.name if isinstance(target, exp.Table) else target.this.name
        self.select: exp.Select = node.expression
        items = self.select.expressions
        self.key_items = items[:-1]
        self.key_names = [i.alias_or_name for i in self.key_items]
        last = items[-1]
        self.body = last.this if isinstance(last, exp.Alias) else last
        self.grouped = self.select.args.get("group") is not None

    def dependencies(self, relations: set[str]) -> set[str]:
        local = {cte.alias for cte in self.select.find_all(exp.CTE)}
        return {t.name for t in self.select.find_all(exp.Table) if t.name in relations and not t.db and t.name not in local}


# ---------------------------------------------------------------------------- evaluator -----
class _Evaluator:
    def __init__(self, con: duckdb.DuckDBPyConnection, weights: Mapping[str, Any],
                 dictionaries: Mapping[str, Mapping[Any, int]], backend, max_mode: str):
        self.con = con
        self.max_mode = max_mode
        self.weights = weights
        self.dictionaries = dictionaries
        self.ops = backend
        self.values: dict[str, dict[tuple, Any]] = {}
        self.ordered: dict[str, list[tuple]] = {}  # relation -> keys in row-index order
        self.tables: dict[str, str] = {}
        self.key_names: dict[str, list[str]] = {}
        self.tag = f"__ref_{next(_counter)}"

    # -- materialization -----------------------------------------------------------------
    def _materialize(self, relation: str) -> None:
        keys = self.ordered[relation]
        names = self.key_names[relation]
        columns = {name: [k[i] for k in keys] for i, name in enumerate(names)}
        columns["__ref_idx"] = list(range(len(keys)))
        table = pa.table(columns)
        view = f"{self.tag}_src_{relation}"
        name = f"{self.tag}_{relation}"
        self.con.register(view, table)
        self.con.execute(f'CREATE OR REPLACE TEMP TABLE "{name}" AS SELECT * FROM "{view}"')
        self.con.unregister(view)
        self.tables[relation] = name

    def cleanup(self) -> None:
        for name in self.tables.values():
            self.con.execute(f'DROP TABLE IF EXISTS temp.main."{name}"')

    # -- one statement -------------------------------------------------------------------
    def statement(self, st: _Statement) -> dict[tuple, Any]:
        local = {cte.alias for cte in st.select.find_all(exp.CTE)}  # a CTE shadows a relation
        neural_aliases: dict[str, str] = {}
        for table in _source_tables(st.select):
            if table.name in self.values and not table.db and table.name not in local:
                neural_aliases[table.alias_or_name] = table.name

        def swap(node):
            if isinstance(node, exp.Table) and not node.db and node.name in self.tables and node.name not in local:
                alias = node.alias_or_name
                return exp.to_table(f'"{self.tables[node.name]}"').as_(alias)
            return node

        # every column the neural expression reads
        needed: dict[str, exp.Expression] = {}
        for node in st.body.walk():
            if isinstance(node, exp.Column):
                if node.table in neural_aliases and node.name == "h":
                    ref = exp.column("__ref_idx", table=node.table)
                    needed.setdefault(f"h:{node.table}", ref)
                else:
                    needed.setdefault(node.sql("duckdb"), node)
        labels = list(needed)
        projections = [
            *[(i.this if isinstance(i, exp.Alias) else i).copy().as_(f"__k{n}", quoted=True) for n, i in enumerate(st.key_items)],
            *[needed[label].copy().as_(f"__v{n}", quoted=True) for n, label in enumerate(labels)],
        ]
        query = exp.Select(expressions=projections)
        for arg in ("with_", "from_", "joins", "where"):
            value = st.select.args.get(arg)
            if value is not None:
                query.set(arg, [v.copy() for v in value] if isinstance(value, list) else value.copy())
        query = query.transform(swap)
        result = self.con.execute(query.sql("duckdb"))
        rows = result.fetchall()
        nk = len(st.key_items)
        grounding = []
        for row in rows:
            key = tuple(row[:nk])
            env = {}
            for n, label in enumerate(labels):
                raw = row[nk + n]
                if label.startswith("h:"):
                    alias = label[2:]
                    relation = neural_aliases[alias]
                    env[label] = self.values[relation][self.ordered[relation][raw]]
                else:
                    env[label] = raw
            grounding.append((key, env))
        features = self._features(st.body, labels, grounding)

        out: dict[tuple, Any] = {}
        if st.grouped:
            groups: dict[tuple, list[int]] = {}
            for index, (key, _) in enumerate(grounding):
                groups.setdefault(key, []).append(index)
            for key, indices in groups.items():
                out[key] = self._eval(st.body, None, indices, grounding, features, neural_aliases)
        else:
            for index, (key, _) in enumerate(grounding):
                if key in out:
                    raise UnsupportedTemplate(f"{st.name}: head key {key} repeats without GROUP BY")
                out[key] = self._eval(st.body, index, None, grounding, features, neural_aliases)
        return out

    def _features(self, body, labels, grounding) -> dict[int, list]:
        """Per features() call: every grounding row's encoded vector.

        Per column: booleans as 0/1; numbers (dates as epoch seconds) standardized with the mean
        and population std of the statement's non-NULL values (std 0 → 1); NULL → 0, and when
        the column has a NULL in these groundings, a 0/1 NULL indicator follows its value.
        """
        out: dict[int, list] = {}
        for node in body.walk():
            if _fn_name(node) != "features":
                continue
            columns = []
            for arg in _args(node):
                raw = [env[arg.sql("duckdb")] for _, env in grounding]
                boolean = all(v is None or isinstance(v, bool) for v in raw)
                values = [None if v is None else _number(v) for v in raw]
                present = [v for v in values if v is not None]
                if boolean or not present:
                    mean, std = 0.0, 1.0
                else:
                    mean = sum(present) / len(present)
                    std = math.sqrt(sum((v - mean) ** 2 for v in present) / len(present)) or 1.0
                columns.append([0.0 if v is None else (v - mean) / std for v in values])
                if any(v is None for v in values):
                    columns.append([1.0 if v is None else 0.0 for v in values])
            out[id(node)] = [[c[r] for c in columns] for r in range(len(grounding))]
        return out

    def _column_value(self, raw):
        if raw is None:
            return self.ops.vector([0.0])
        if isinstance(raw, (list, tuple)):
            return self.ops.vector([float(v) for v in raw])
        return self.ops.vector([float(raw)])

    def _eval(self, node, row, group, grounding, features, aliases):  # noqa: C901 - one branch per SQL node kind
        """Value of `node` for one grounding row (`row`) or one head's rows (`group`)."""
        ops = self.ops
        recur = lambda n: self._eval(n, row, group, grounding, features, aliases)  # noqa: E731
        if isinstance(node, (exp.Paren, exp.Alias)):
            return recur(node.this)
        if isinstance(node, exp.Literal) and not node.is_string:
            return ops.vector([float(node.this)])
        if isinstance(node, exp.Neg):
            return ops.vector([-1.0]) * recur(node.this)
        if isinstance(node, exp.Add):
            return recur(node.left) + recur(node.right)
        if isinstance(node, exp.Sub):
            return recur(node.left) - recur(node.right)
        if isinstance(node, exp.Mul):
            return recur(node.left) * recur(node.right)
        if isinstance(node, exp.Column):
            if row is None:
                raise UnsupportedTemplate(f"column {node.sql()} outside an aggregate in a grouped statement")
            env = grounding[row][1]
            if node.table in aliases and node.name == "h":
                return env[f"h:{node.table}"]
            return self._column_value(env[node.sql("duckdb")])
        fn = _fn_name(node)
        if fn is None:
            raise UnsupportedTemplate(f"unsupported expression {node.sql()}")
        args = _args(node)
        if fn in _AGGREGATES:
            if group is None:
                raise UnsupportedTemplate(f"aggregate {node.sql()} needs GROUP BY")
            if fn == "count":
                return ops.vector([float(len(group))])
            values = [self._eval(node.this, r, None, grounding, features, aliases) for r in group]
            if fn in ("sum", "avg"):
                acc = values[0]
                for v in values[1:]:
                    acc = acc + v
                return acc * (1.0 / len(values)) if fn == "avg" else acc
            if self.max_mode == "elementwise":
                return ops.elementwise(fn, values)
            best, best_total = values[0], ops.total(values[0])
            for v in values[1:]:
                total = ops.total(v)
                if (fn == "max" and total > best_total) or (fn == "min" and total < best_total):
                    best, best_total = v, total
            return best
        if fn in _ACTIVATIONS:
            return ops.activation(fn, recur(args[0]))
        if fn == "linear":
            w = ops.weight(self.weights[_literal_name(args, 2, fn)])
            x = recur(args[0])
            if w.shape[0] != _literal_int(args[1]):
                raise UnsupportedTemplate(f"weight for {node.sql()} has shape {tuple(w.shape)}")
            return ops.matvec(w, x)
        if fn == "bias":
            w = ops.weight(self.weights[_literal_name(args, 1, fn)])
            return w.reshape(-1)
        if fn == "embed":
            name = _literal_name(args, 2, fn)
            raw = grounding[row][1][args[0].sql("duckdb")]
            return ops.weight(self.weights[name])[self.dictionaries[name][raw]]
        if fn == "features":
            return ops.vector(features[id(node)][row])
        if fn == "concat":
            return ops.concat([recur(a) for a in args])
        raise UnsupportedTemplate(f"unsupported function {fn}")


def evaluate(con: duckdb.DuckDBPyConnection, sql_text: str, weights: Mapping[str, Any],
             dictionaries: Mapping[str, Mapping[Any, int]] | None = None,
             backend: str = "numpy", max_mode: str = "elementwise") -> dict[str, dict[tuple, Any]]:
    """Evaluate every relation of a SQL template; {relation: {key tuple: value}}.

    `max_mode`: "elementwise" (SQL/PyG: each element's max/min over the head's groundings,
    relsql's SQL semantics since c3d237e) or "argmax" (NeuraLogic: the whole value whose
    elements sum highest/lowest, the first on ties).
    """
    if max_mode not in ("elementwise", "argmax"):
        raise UnsupportedTemplate(f"max_mode must be 'elementwise' or 'argmax', got {max_mode!r}")
    statements = [_Statement(s) for s in sqlglot.parse(sql_text, read="duckdb") if s is not None]
    ops = NumpyBackend() if backend == "numpy" else TorchBackend()
    ev = _Evaluator(con, weights, dictionaries or {}, ops, max_mode)
    names = list(dict.fromkeys(s.name for s in statements))
    pending = list(names)
    try:
        while pending:
            for name in pending:
                mine = [s for s in statements if s.name == name]
                deps = set().union(*(s.dependencies(set(names)) for s in mine))
                if name in deps:
                    raise UnsupportedTemplate(f"{name} is recursive")
                if deps <= set(ev.values):
                    break
            else:
                raise UnsupportedTemplate(f"cyclic dependencies among {pending}")
            pending.remove(name)
            ev.key_names[name] = mine[0].key_names
            total: dict[tuple, Any] = {}
            for st in mine:
                for key, value in ev.statement(st).items():
                    total[key] = value if key not in total else total[key] + value
            ev.values[name] = total
            ev.ordered[name] = list(total)
            ev._materialize(name)
    finally:
        ev.cleanup()
    return ev.values


def _number(value) -> float:
    """A feature value as a number: dates and timestamps as seconds since the epoch."""
    import datetime as dt

    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=dt.UTC)
        return value.timestamp()
    if isinstance(value, dt.date):
        return float((value - dt.date(1970, 1, 1)).days * 86400)
    return float(value)
