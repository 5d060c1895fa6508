"""Runs the grounding queries in dependency order and hands index tensors to the compiler.

Per relation: each rule's groundings are materialized as a temp table, the relation's key
table numbers the distinct heads 0..n-1, and each rule's head/body row ids and CSR offsets
come back as Arrow columns that become torch tensors without copies.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import sqlglot.expressions as exp
import torch

from relsql.db import Database, to_tensor
from relsql.errors import GroundingError, SchemaError, TemplateError
from relsql.ground import query as q
from relsql.template import ir


class GroundingWarning(UserWarning):
    """A Datalog rule that has no groundings in this database (NeuraLogic ignores those)."""


@dataclass
class RuleGrounding:
    rule: ir.Rule
    head: torch.Tensor  # (G,) int64, sorted: the head row id of every grounding
    refs: list[torch.Tensor]  # (G,) int64 row ids into each referenced relation
    columns: dict[int, torch.Tensor]  # raw columns (G, d) float64, or (G,) int64 codes for embed
    segment_heads: torch.Tensor  # (S,) distinct grounded heads, ascending
    offsets: torch.Tensor  # (S + 1,) CSR offsets of each head's groundings

    @property
    def size(self) -> int:
        return int(self.head.shape[0])


@dataclass
class RelationGrounding:
    name: str
    keys: pa.Table  # key columns and `_rid`, in row-id order
    rules: list[RuleGrounding] = field(default_factory=list)

    @property
    def size(self) -> int:
        return self.keys.num_rows


@dataclass
class Grounding:
    relations: dict[str, RelationGrounding]
    dictionaries: dict[str, pa.Table]  # embedding weight -> (value, code) in code order

    @property
    def vocab_sizes(self) -> dict[str, int]:
        return {w: t.num_rows for w, t in self.dictionaries.items()}


def ground(template: ir.Template, db: Database, *, only: set[str] | None = None) -> Grounding:
    """Ground every relation of `template` (or those in `only`) in dependency order."""
    relations: dict[str, RelationGrounding] = {}
    key_tables: dict[str, exp.Table] = {}
    dictionaries: dict[str, exp.Table] = {}
    for name in template.order():
        if only is not None and name not in only:
            continue
        relation = template.relations[name]
        relations[name] = _ground_relation(template, relation, db, key_tables, dictionaries)
        key_tables[name] = db.temp_table("k", name)
    vocab = {w: db.arrow(exp.select(exp.Star()).from_(t.copy()).order_by(q.col("code"))) for w, t in dictionaries.items()}
    return Grounding(relations, vocab)


def _run(db: Database, statement: exp.Expression, rule: ir.Rule) -> pa.Table | None:
    try:
        if isinstance(statement, exp.Select):
            return db.arrow(statement)
        db.execute(statement)
        return None
    except duckdb.CatalogException as err:
        raise SchemaError(f"{rule.head}, {rule.origin}: {_first_line(err)}. Check the table and column names against the database ({db.description}).") from None
    except duckdb.BinderException as err:
        raise SchemaError(f"{rule.head}, {rule.origin}: {_first_line(err)}. Check the column names and join conditions.") from None
    except duckdb.Error as err:
        raise GroundingError(f"{rule.head}, {rule.origin}: the database could not enumerate the groundings: {_first_line(err)}") from None


def _first_line(err: Exception) -> str:
    return str(err).strip().splitlines()[0]


def _ground_relation(
    template: ir.Template, relation: ir.Relation, db: Database,
    key_tables: dict[str, exp.Table], dictionaries: dict[str, exp.Table],
) -> RelationGrounding:
    grounded: list[tuple[ir.Rule, exp.Table]] = []
    for index, rule in enumerate(relation.rules):
        select = rule.query(db) if callable(rule.query) else rule.query
        if select is None:
            warnings.warn(f"{relation.name}, {rule.origin}: a body predicate has no table; the rule has no groundings", GroundingWarning, stacklevel=3)
            continue
        missing = [r for r in rule.refs if r in template.relations and r not in key_tables]
        if missing:
            raise TemplateError(f"{relation.name}, {rule.origin}: refers to {missing} before they are grounded")
        select = q.substitute_relations(select, key_tables)
        if rule.distinct:
            select = select.distinct()
        table = db.temp_table(f"g{index}", relation.name)
        _run(db, q.create_temp(table, select), rule)
        grounded.append((rule, table))
    keys_table = db.temp_table("k", relation.name)
    if grounded:
        key_query = q.key_table_query([t for _, t in grounded], relation.keys)
        _run(db, q.create_temp(keys_table, key_query), grounded[0][0])
    else:
        empty = exp.select(*[exp.alias_(exp.Null(), q.ident(k)) for k in relation.keys], exp.alias_(exp.Literal.number(0), q.ident("_rid"))).where(exp.false())
        db.execute(q.create_temp(keys_table, empty))
    keys = db.arrow(exp.select(exp.Star()).from_(keys_table.copy()).order_by(q.col("_rid")))
    result = RelationGrounding(relation.name, keys)
    for rule, table in grounded:
        rule_grounding = _index_rule(rule, table, keys_table, relation, db, dictionaries)
        if rule_grounding.size == 0:
            if template.language == "sql":
                raise GroundingError(
                    f"{relation.name}, {rule.origin}: the statement has no groundings (its FROM/JOIN/WHERE "
                    "returns no rows). Check the join conditions and that the tables hold data.")
            warnings.warn(f"{relation.name}, {rule.origin}: the rule has no groundings", GroundingWarning, stacklevel=3)
            continue
        result.rules.append(rule_grounding)
    if result.size == 0 and template.language == "sql":
        raise GroundingError(f"relation {relation.name} has no rows: none of its statements has groundings")
    return result


def _index_rule(
    rule: ir.Rule, grounding: exp.Table, keys_table: exp.Table, relation: ir.Relation,
    db: Database, dictionaries: dict[str, exp.Table],
) -> RuleGrounding:
    embeds = {e.column: e.weight for e in ir.walk(rule.expr) if isinstance(e, ir.Embed)}
    columns: list[exp.Expression] = []
    for k in range(rule.n_columns):
        if k in embeds:
            dictionary = _dictionary(db, dictionaries, embeds[k], grounding, f"_c{k}", rule)
            lookup = exp.select(q.col("code", "d")).from_(exp.alias_(dictionary.copy(), q.ident("d"), table=True)).where(
                exp.NullSafeEQ(this=q.col("value", "d"), expression=q.col(f"_c{k}", "g")))
            columns.append(exp.Subquery(this=lookup))
        else:
            columns.append(q.col(f"_c{k}", "g"))
    indexed = db.temp_table(f"i{relation.rules.index(rule)}", relation.name)
    _run(db, q.create_temp(indexed, q.rule_index_query(grounding, keys_table, relation.keys, len(rule.refs), columns)), rule)
    table = db.arrow(exp.select(exp.Star()).from_(indexed.copy()).order_by(q.col("_head")))
    segments = db.arrow(q.segment_query(indexed))
    for j, ref in enumerate(rule.refs):
        if table.column(f"_r{j}").null_count:
            raise GroundingError(
                f"{relation.name}, {rule.origin}: some groundings have no row of `{ref}` (an outer join?); "
                f"join `{ref}` with an inner JOIN so every grounding has its value")
    head = to_tensor(table.column("_head"), torch.int64)
    refs = [to_tensor(table.column(f"_r{j}"), torch.int64) for j in range(len(rule.refs))]
    values = {k: _column_tensor(table.column(f"_c{k}"), rule, k, embedded=k in embeds) for k in range(rule.n_columns)}
    segment_heads = to_tensor(segments.column("_head"), torch.int64)
    ends = to_tensor(segments.column("_end"), torch.int64)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), ends])
    if not rule.grouped and segment_heads.shape[0] != head.shape[0]:
        raise GroundingError(
            f"{relation.name}, {rule.origin}: several rows share one head key {relation.keys}; "
            "add GROUP BY with an aggregate, or select a unique key")
    return RuleGrounding(rule, head, refs, values, segment_heads, offsets)


def _dictionary(db: Database, dictionaries: dict[str, exp.Table], weight: str, source: exp.Table, column: str, rule: ir.Rule) -> exp.Table:
    table = dictionaries.get(weight)
    if table is None:
        table = db.temp_table("d", weight.replace(".", "_"))
        first = exp.select(exp.alias_(q.col(column), q.ident("value")), exp.alias_(exp.Literal.number(0), q.ident("code"))).from_(source.copy()).where(exp.false())
        _run(db, q.create_temp(table, first), rule)
        dictionaries[weight] = table
    _run(db, q.dictionary_insert(table, source, column), rule)
    return table


def _column_tensor(column: pa.ChunkedArray, rule: ir.Rule, k: int, embedded: bool) -> torch.Tensor:
    """A grounding column as a (G, d) float64 tensor (or (G,) codes); lists become vectors."""
    if embedded:
        return to_tensor(column, torch.int64)
    kind = column.type
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        array = column.combine_chunks()
        lengths = pc.list_value_length(array).to_numpy(zero_copy_only=False)
        if array.null_count or (len(lengths) and (lengths.min() != lengths.max())):
            raise SchemaError(f"{rule.head}, {rule.origin}: the list column `_c{k}` must hold vectors of one length without NULLs")
        flat = to_tensor(pc.list_flatten(array), torch.float64)
        width = int(lengths[0]) if len(lengths) else 0
        return flat.reshape(-1, width)
    if pa.types.is_boolean(kind) or pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_decimal(kind):
        if column.null_count:
            column = pc.fill_null(column, 0)
        return to_tensor(pc.cast(column, pa.float64()), torch.float64).reshape(-1, 1)
    raise SchemaError(
        f"{rule.head}, {rule.origin}: a column used as a neural value has type {kind}; "
        "use numeric or list-of-number columns, or embed(...) for categorical ones")
