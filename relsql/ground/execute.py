"""Runs the grounding queries in dependency order and hands index tensors to the compiler.

Per relation: all its rules' groundings are materialized as one temp table, the relation's key
table numbers the distinct heads 0..n-1, and every rule's head/body row ids come back in one
Arrow table (a slice per rule) whose columns become torch tensors without copies.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import signal
import socket
import threading
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import sqlglot.expressions as exp
import torch

from relsql import arguments
from relsql import sql as q
from relsql.data.duckdb import interrupted_query, lost_connection
from relsql.data.engine import Database
from relsql.errors import GroundingError, RelsqlError, SchemaError, TemplateError
from relsql.ground import bound, domains
from relsql.ground import encoders as encoders_sql
from relsql.ground.parts import check_refs, column_label, column_values
from relsql.ground.tensors import to_tensor
from relsql.progress import relations
from relsql.template import ir, sqlrule

PADDING_CELLS = 1 << 24  # at most this many empty cells (other rules' columns) in one index query's result

# A rule whose estimated groundings exceed this is refused before it runs (`max_groundings=` raises
# it). 10^8 groundings are ~3 GB of index columns alone in a full batch (head and one body row id,
# 8 bytes each, in DuckDB's table and in Arrow) and 25 GB more for one width-64 float32 message per
# grounding; DuckDB materializes them in seconds to a minute. Past that, a rule is far more often
# a join missing its condition (a cross join: 10^10 groundings for two 100k-row tables) than meant.
MAX_GROUNDINGS = 10**8
# Arrow types of key columns that name one DuckDB type whose equality is plain value equality
# (no collation, no -0.0 against 0.0): only these let a key table's key bound a join (`note_key_source`)
_EXACT_TYPES = {"int8": "TINYINT", "int16": "SMALLINT", "int32": "INTEGER", "int64": "BIGINT", "uint8": "UTINYINT",
                "uint16": "USMALLINT", "uint32": "UINTEGER", "uint64": "UBIGINT", "bool": "BOOLEAN",
                "date32[day]": "DATE", "timestamp[us]": "TIMESTAMP"}

log = logging.getLogger("relsql")


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
    feature_stats: dict[str, dict]  # "relation#rule:column" -> {"mean", "std", "nulls", "kind"}
    seconds: dict[str, float] = field(default_factory=dict)  # relation -> wall time spent grounding it

    @property
    def vocab_sizes(self) -> dict[str, int]:
        return {w: t.num_rows for w, t in self.dictionaries.items()}


@dataclass
class Presets:
    """Encodings fixed by an earlier grounding (a trained model): dictionaries and statistics."""

    dictionaries: dict[str, pa.Table] = field(default_factory=dict)
    feature_stats: dict[str, dict] = field(default_factory=dict)


def ground(template: ir.Template, db: Database, *, presets: Presets | None = None,
           progress: bool | None = None, max_groundings: int | None = None, outputs: tuple[str, ...] = ()) -> Grounding:
    """Ground every relation of `template` in dependency order (a progress bar on a terminal, log
    lines otherwise). A rule estimated at more than `max_groundings` groundings is refused before it
    runs; on an error or Ctrl-C the temp tables made so far are dropped. `outputs`: relations whose key
    tables training reads by name (`db.temp_table("k", output)`), so they keep their own (`shared_keys`)."""
    grounder = Grounder(template, db, presets or Presets(), max_groundings, outputs)
    order = template.order()
    seconds = {}
    with interruptible(db), grounder.cleanup_on_error(), db.frozen_schema():  # relsql only adds temp tables
        bar = relations(order, progress)
        for name in bar:
            bar.set_postfix_str(name)
            started = time.perf_counter()
            grounder.relation(template.relations[name])
            seconds[name] = time.perf_counter() - started
            if seconds[name] >= 1.0:
                log.info("grounding: %s, %d rows, %d groundings in %.1fs", name, grounder.relations[name].size,
                         sum(r.size for r in grounder.relations[name].rules), seconds[name])
        dictionaries = {weight: grounder.built[weight] if weight in grounder.built else
                        db.arrow(exp.select(exp.Star()).from_(grounder.dictionaries[weight].copy()).order_by(q.col("code")))
                        for weight in grounder.first_use}  # a read each: one statement of scalar
        # subqueries over 11 tiny tables cost DuckDB 50 ms, the 11 reads 6-14 ms
    return Grounding(grounder.relations, dictionaries, grounder.feature_stats, seconds)


class _CtrlC:
    """Interrupts `db`'s running query the moment SIGINT arrives (`Database.interrupt`). DuckDB's
    Python client looks for Ctrl-C only between the tasks that the main thread itself runs, and one
    task of a large join took it minutes; the signal's byte on Python's wakeup fd reaches this
    thread at once."""

    def __init__(self, db: Database, reader: socket.socket, writer: socket.socket, previous: int):
        self.db, self.reader, self.writer, self.previous = db, reader, writer, previous
        self.thread = threading.Thread(target=self._watch, name="relsql-ctrl-c", daemon=True)
        self.thread.start()

    @classmethod
    def start(cls, db: Database | None) -> _CtrlC | None:
        """A watcher for `db`; None where another one (or an event loop) holds the wakeup fd, off
        the main thread, or for an engine whose client stops its work on SIGINT itself
        (`Database.watch_interrupts`: pyspark cancels its jobs)."""
        if db is None or not db.watch_interrupts or threading.current_thread() is not threading.main_thread():
            return None
        reader, writer = socket.socketpair()
        writer.setblocking(False)
        try:
            previous = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
        except ValueError:
            previous = None
        if previous != -1:  # not ours to take: put it back, DuckDB's own check still stops the query
            if previous is not None:
                signal.set_wakeup_fd(previous)
            reader.close()
            writer.close()
            return None
        return cls(db, reader, writer, previous)

    def _watch(self) -> None:
        while True:
            try:
                received = self.reader.recv(64)
            except OSError:
                return
            if not received:  # closed by stop()
                return
            if signal.SIGINT in received:
                self.db.interrupt()

    def stop(self) -> None:
        signal.set_wakeup_fd(self.previous)
        self.writer.close()
        self.thread.join()
        self.reader.close()


@contextlib.contextmanager
def interruptible(db: Database | None = None, what: str = "grounding") -> Iterator[None]:
    """Ctrl-C stops `db`'s running query at once (see `_CtrlC`) and reaches the caller as
    KeyboardInterrupt (DuckDB's RuntimeError or InterruptException would otherwise look like an
    internal or a grounding error)."""
    watcher = _CtrlC.start(db)
    try:
        yield
    except KeyboardInterrupt as err:
        if err.args:
            raise
        raise KeyboardInterrupt(f"{what} interrupted") from None
    except (duckdb.Error, RuntimeError) as err:
        if interrupted_query(err):
            raise KeyboardInterrupt(f"{what} interrupted") from None
        raise
    finally:
        if watcher is not None:
            watcher.stop()


def groundings_limit(value: object) -> int:
    """The `max_groundings=` argument, checked; None is the default (MAX_GROUNDINGS)."""
    return MAX_GROUNDINGS if value is None else arguments.integer("max_groundings", value)


def _run(db: Database, statement: exp.Expression, rule: ir.Rule) -> pa.Table | int | None:
    with reported_as(db, rule):
        return db.run(statement)


@contextlib.contextmanager
def reported_as(db: Database, rule: ir.Rule) -> Iterator[None]:
    """The database's errors within the block as relsql's, naming the rule they are reported for."""
    try:
        yield
    except duckdb.InterruptException:
        raise KeyboardInterrupt("grounding interrupted") from None
    except duckdb.CatalogException as err:
        raise SchemaError(f"{rule.head}, {rule.origin}: {_first_line(err)}. "
                          f"Check the table and column names against the database ({db.description}).") from None
    except duckdb.BinderException as err:
        raise SchemaError(f"{rule.head}, {rule.origin}: {_first_line(err)}. "
                          "Check the column names and join conditions.") from None
    except duckdb.Error as err:
        raise lost_connection(db.description, err) or GroundingError(
            f"{rule.head}, {rule.origin}: the database could not enumerate the groundings: {_first_line(err)}") from None


def _run_rules(db: Database, statement: exp.Expression, relation: str,
               rules: list[tuple[ir.Rule, exp.Expression]]) -> pa.Table | int | None:
    """Run a statement made of several rules' queries; on an error, name the rule that causes it."""
    try:
        return db.run(statement)
    except duckdb.Error as err:
        if interrupted_query(err):
            raise KeyboardInterrupt("grounding interrupted") from None
        for rule, select in rules:  # the first rule whose query fails alone raises its own message
            _run(db, exp.select(exp.Count(this=exp.Star())).from_(q.alias(exp.Subquery(this=select.copy()), "s", table=True)),
                 rule)
        raise GroundingError(f"relation {relation}: the database could not enumerate the groundings: "
                             f"{_first_line(err)}") from None


def _first_line(err: Exception) -> str:
    return str(err).strip().splitlines()[0]


def _refuse_shadowing(template: ir.Template, db: Database) -> None:
    """A relation named like a user table hides that table from every statement that reads the
    name: refuse it rather than silently ground with the relation where the table was meant."""
    tables = {t.casefold(): t for t in db.tables()}
    for name in template.relations:
        if name.casefold() not in tables:
            continue
        readers = [rule.origin for relation in template.relations.values() for rule in relation.rules
                   if name in rule.refs or name in rule.depends]
        if readers:
            raise SchemaError(f"relation `{name}` has the name of table `{tables[name.casefold()]}` of {db.description}, "
                              f"so {readers[0]} reads the relation, not the table; rename the relation "
                              f"(e.g. `{name}_h`) so that both can be used")


def _refuse_files(template: ir.Template, db: Database) -> None:
    """A statement may read a table named like a file (`grp.x`) only where the database has that
    table: otherwise DuckDB would open and read the file of that name (the template's SQL may only
    read the database's tables; relsql/template/sqlrule.py)."""
    found = list(sqlrule.file_like(template))
    if not found:
        return
    tables = {t.casefold() for t in db.tables()}
    for name, origin in found:
        if name.casefold() not in tables:
            raise TemplateError(f"{origin}: table `{name}` reads like a file path or URL and {db.description} has no "
                                "table of that name, so DuckDB would open and read the file; a template may only read "
                                "the database's tables (and compute on their values); load the data into a table "
                                "first and read that")


class Grounder:
    """What grounding a template on one database shares, in bulk (`ground`) and per batch (its subclass
    relsql/ground/demand.py `BatchGrounder`): the relations' key tables, embedding dictionaries, feature
    statistics and the temp tables to drop if it fails."""

    def __init__(self, template: ir.Template, db: Database, presets: Presets, limit: int | None = None,
                 outputs: tuple[str, ...] = ()):
        self.template, self.db, self.presets = template, db, presets
        self.outputs = {name.casefold() for name in outputs}  # their key tables are read by name: never shared
        self.max_groundings = groundings_limit(limit)
        self.relations: dict[str, RelationGrounding] = {}
        self.key_tables: dict[str, exp.Table] = {}
        self.dictionaries: dict[str, exp.Table] = {}
        self.built: dict[str, pa.Table] = {}  # dictionaries numbered here from the values one rule read (`code_here`)
        self.first_use: list[str] = []  # every dictionary's weight, SQL's or built here, in the order of first use
        self._bytewise: bool | None = None  # the engine compares and sorts text by its bytes (`code_here`)
        self._schema: tuple[exp.Expression, pa.Schema] | None = None  # a body's column types (`body_types`)
        self._readers: collections.Counter | None = None  # columns reading each dictionary (`code_here`)
        self.feature_stats: dict[str, dict] = {}
        self.measured: dict[str, tuple] = {}  # statistics of a rule's columns from one query (`measure`, `measure_ple`)
        self.coded: dict[tuple[str, int], dict[int, str]] = {}  # (relation, rule index) -> {column: weight} coded here
        self.temps: list[exp.Table] = []  # every temp table this grounder names, dropped if it fails
        self.base_rows: dict[str, int | None] = {}  # user tables' row counts (None: not countable), for `bounded`
        self.base_sources: dict[str, bound.Source] = {}  # user tables' counts and column types, read once per table
        self.key_sources: dict[tuple[str, str, str], bound.Source] = {}  # key tables' rows, keys and types, for `bounded`
        # per case-folded relation name: (keys, the domain of its heads) once grounded (`shared_keys`)
        self.domains: dict[str, tuple[list[str], domains.Domain] | None] = {n.casefold(): None for n in template.relations}
        self.owners: dict[tuple, str] = {}  # (domain, keys) -> the relation whose key table holds those heads
        if template.language == "sql":
            _refuse_shadowing(template, db)
            _refuse_files(template, db)

    def temp_table(self, kind: str, name: str) -> exp.Table:
        """A temp table of the database's, remembered so that a failed grounding can drop it."""
        table = self.db.temp_table(kind, name)
        self.temps.append(table)
        return table

    def drop_temps(self) -> None:
        """Drop the temp tables made so far (best effort: the database may refuse after an error,
        e.g. in the user's aborted transaction; they are temporary and go with the connection)."""
        for table in reversed(self.temps):
            try:
                self.db.execute(exp.Drop(tables=[table.copy()], kind="TABLE", exists=True))
            except (duckdb.Error, RuntimeError, RelsqlError):
                pass
        self.temps.clear()

    @contextlib.contextmanager
    def cleanup_on_error(self) -> Iterator[None]:
        """On any error or interrupt within the block, no temp table of this grounding stays."""
        try:
            yield
        except BaseException:
            self.drop_temps()
            raise

    def rule_select(self, relation: ir.Relation, rule: ir.Rule) -> exp.Select | None:
        """A rule's body query, neural relations read through their key tables (None: no groundings);
        refused if the database estimates more groundings than `max_groundings`."""
        select = rule.query(self.db) if callable(rule.query) else rule.query.copy()
        if select is None:
            warnings.warn(f"{relation.name}, {rule.origin}: a body predicate has no table; the rule has no groundings",
                          GroundingWarning, stacklevel=5)
            return None
        select = q.substitute_relations(select, self.key_tables)
        if isinstance(select, exp.Select):
            select = q.inline_laterals(select)
        select = select.distinct(copy=False) if rule.distinct else select
        self.check_size(relation, rule, select)
        return select

    def check_size(self, relation: ir.Relation, rule: ir.Rule, select: exp.Select) -> None:
        """Refuse a rule whose grounding the database estimates beyond `max_groundings`, before it
        runs: a join without its condition would otherwise run for hours and fill memory or disk."""
        if self.bounded(select):
            return
        estimate = self.db.estimate_rows(select)
        if estimate is None or estimate <= self.max_groundings or self.counted_within(select):
            return
        raise GroundingError(
            f"{relation.name}, {rule.origin}: the database estimates about {estimate:,} groundings for this rule "
            f"(its largest join step), more than max_groundings={self.max_groundings:,}. A join without an "
            "equality condition (a cross join, or only <, >, <> between tables) pairs every row with every row: add "
            "the join condition (JOIN ... ON a.key = b.key, or a shared variable in Datalog). If the rule is meant "
            "to be this large, pass a larger max_groundings= (relsql.Model(..., max_groundings=...), relsql.compile(...))")

    def bounded(self, select: exp.Select) -> bool:
        """Whether the rule provably has at most `max_groundings` groundings (relsql/ground/bound.py,
        from the tables' row counts and the key tables' unique keys): no estimate could refuse it,
        so the database is not asked for one (an EXPLAIN per rule was a fifth of a small database's
        statements). The run-time bound (`check_ran`) holds either way."""
        missing = [t.name for t in select.find_all(exp.Table) if self._base_name(t) and t.name.lower() not in self.base_rows]
        if missing:  # one count query for the tables this rule is the first to read
            counts = self.db.table_rows(missing)
            self.base_rows.update({name.lower(): counts.get(name.lower()) for name in missing})
        found = bound.row_bound(select, self.bound_source)
        return found is not None and found <= self.max_groundings

    def _base_name(self, table: exp.Table) -> bool:
        """An unqualified name that is not relsql's: a user table (or a view, a CTE)."""
        return isinstance(table.this, exp.Identifier) and not table.args.get("db") and not table.args.get("catalog")

    def bound_source(self, table: exp.Table) -> bound.Source | None:
        """What the bound knows of a table: a grounded relation's key table (its rows, its keys
        and `_rid` each unique), or a user table counted by `bounded` (no unique keys: a declared
        key may not be enforced); None for anything else."""
        if (table.catalog, table.db, table.name) in self.key_sources:
            return self.key_sources[table.catalog, table.db, table.name]
        name = table.name.lower()
        if not self._base_name(table) or self.base_rows.get(name) is None:
            return None
        if name not in self.base_sources:  # its column types once, not per rule that reads it
            try:
                columns = self.db.columns(table.name)
            except RelsqlError:
                columns = []
            self.base_sources[name] = bound.Source(self.base_rows[name], types={c.lower(): t.upper() for c, t in columns})
        return self.base_sources[name]

    def note_key_source(self, relation: ir.Relation, table: exp.Table, keys: pa.Table) -> None:
        """Remember a key table for the bound: its rows, its keys and `_rid` unique (DISTINCT heads
        numbered by row_number()), its columns' types where the Arrow type names one engine type."""
        unique = [tuple(k.lower() for k in relation.keys), ("_rid",)] if relation.keys else [("_rid",)]
        types = {f.name.lower(): _EXACT_TYPES[str(f.type)] for f in keys.schema if str(f.type) in _EXACT_TYPES}
        self.key_sources[table.catalog, table.db, table.name] = bound.Source(keys.num_rows, unique, types)

    def check_ran(self, relation: ir.Relation, grounded: list, groundings: exp.Table) -> None:
        """The run-time bound: each rule's groundings stop at max_groundings + 1 rows; a rule that
        reached it is refused (the planner's estimate can be far too low: an airport's weather rows
        joined to every earlier flight, estimated at 0.8 M, were 443 M)."""
        table = self.db.arrow(exp.select(q.alias(q.col("_rule"), "r"), q.alias(exp.Count(this=exp.Star()), "n"))
                              .from_(groundings.copy()).group_by(q.col("_rule")))
        counts = dict(zip(table.column("r").to_pylist(), table.column("n").to_pylist()))
        for index, rule, _ in grounded:
            if counts.get(index, 0) > self.max_groundings:
                raise GroundingError(
                    f"{relation.name}, {rule.origin}: the rule has more than max_groundings={self.max_groundings:,} "
                    "groundings (counted while it ran; the database's estimate was lower). A join through a hub row "
                    "(a parent with very many children) multiplies rows: add a condition that narrows it, leave the "
                    "statement out, or pass a larger max_groundings= "
                    "(relsql.Model(..., max_groundings=...), relsql.compile(...))")

    def counted_within(self, select: exp.Select) -> bool:
        """Whether a rule estimated over the limit has in fact at most `max_groundings` groundings.

        A planner's estimate of a join on several equalities can be far too high (DuckDB: 253,788,036
        for TPC-H sf 1's 6,001,215 line items joined with their part on two keys in Template.auto's
        tree), so such a rule is counted, up to max_groundings + 1 rows (never more work than
        grounding it). A rule with tables that no equality joins (a cross or inequality join), or
        whose shape the AST cannot tell, is not counted: its estimate decides, as counting would
        enumerate the product."""
        if not isinstance(select, exp.Select) or any(select.args.get(k) for k in ("group", "having", "limit", "qualify")):
            return False
        groups = q.unjoined_tables(select)
        if groups is None or len(groups) > 1:
            return False
        limited = select.copy().limit(q.integer(self.max_groundings + 1))
        count = exp.select(exp.Count(this=exp.Star())).from_(limited.subquery(q.ident("_groundings")))
        try:
            return int(self.db.scalar(count)[0]) <= self.max_groundings
        except (duckdb.Error, RelsqlError) as err:
            if interrupted_query(err):
                raise
            return False

    def key_table(self, relation: ir.Relation, sources: list[tuple[ir.Rule, exp.Expression]]) -> exp.Table:
        """The relation's distinct heads over its groundings (`sources`: tables with `_h*` head
        columns, each with the rule an error is reported for), numbered 0..n-1 (`_rid`), as a temp table."""
        keys_table = self.temp_table("k", relation.name)
        if sources and relation.keys:
            with reported_as(self.db, sources[0][0]):
                distinct = q.distinct_keys([t for _, t in sources], relation.keys)
                self.db.create_key_table(keys_table.copy(), distinct, relation.keys)
        else:
            self.db.execute(q.create_temp(keys_table, q.keyless_table(relation.keys, bool(sources))))
        return keys_table

    def relation(self, relation: ir.Relation) -> None:
        """Ground one relation in four statements whatever its rule count (a large one with several
        rules takes one index query per rule): all rules' groundings into one temp table, its key
        table (none where an earlier relation's holds the same heads: `shared_keys`), every rule's
        index rows (ordered by rule), the keys. (The heads' row ids are joined
        in, not ranked with the groundings: a dense_rank over 10M groundings is a full sort and
        took 1.5x as long as the hash join.)"""
        template, db = self.template, self.db
        n_keys = len(relation.keys)
        grounded = []
        for index, rule in enumerate(relation.rules):
            select = self.rule_select(relation, rule)
            if select is not None:
                grounded.append((index, rule, select))
        groundings, rows = self.temp_table("g", relation.name), 0
        if grounded:
            statement = q.create_temp(groundings, q.relation_groundings(
                [(index, select, n_keys, len(rule.refs), rule.n_columns) for index, rule, select in grounded],
                limit=self.max_groundings + 1))
            rows = _run_rules(db, statement, relation.name, [(rule, select) for _, rule, select in grounded]) or 0
            if rows > self.max_groundings:
                self.check_ran(relation, grounded, groundings)
        slices = [(index, rule, q.rule_slice(groundings, index, n_keys, len(rule.refs), rule.n_columns))
                  for index, rule, _ in grounded]
        keys_table, keys = self.shared_keys(relation, grounded)
        if keys_table is None:
            keys_table = self.key_table(relation, [(grounded[0][1], groundings)] if grounded else [])
            keys = db.arrow(exp.select(exp.Star()).from_(keys_table.copy()).order_by(q.col("_rid")))
            self.owners.setdefault((self.domains[relation.name.casefold()][1], tuple(relation.keys)), relation.name)
        self.note_key_source(relation, keys_table, keys)
        result = RelationGrounding(relation.name, keys)
        edges: dict[int, dict[int, list[float]]] = {}  # per rule, its ple columns' edges (read as numbers)
        tables = self.index_tables(relation, slices, groundings, keys_table, rows, edges)
        if grounded:
            db.execute(exp.Drop(tables=[groundings.copy()], kind="TABLE", exists=True))
        for index, rule, _ in grounded:
            coded = self.coded.pop((relation.name, index), None)
            if coded and index in tables:
                tables[index] = self.number_here(tables[index], coded)
            rule_grounding = self.index_rule(relation, rule, tables.get(index), edges.get(index))
            if rule_grounding.size == 0:
                # an empty statement is an empty aggregate: its rows get nothing from it (a time cut or a
                # filter can leave a statement empty in one database and not in another)
                what = "statement" if template.language == "sql" else "rule"
                warnings.warn(f"{relation.name}, {rule.origin}: the {what} has no groundings (its FROM/JOIN/WHERE "
                              "returns no rows); it adds nothing", GroundingWarning, stacklevel=4)
                continue
            result.rules.append(rule_grounding)
        self.relations[relation.name] = result
        self.key_tables[relation.name] = keys_table

    def shared_keys(self, relation: ir.Relation, grounded: list) -> tuple[exp.Table | None, pa.Table | None]:
        """The key table (and its rows) of an earlier relation with exactly this relation's heads,
        known from the rules' SQL (relsql/ground/domains.py), under the same key names; (None,
        None) where there is none and the relation builds its own. Records the relation's domain."""
        domain = None
        if relation.keys and grounded:
            domain = domains.relation_domain([domains.rule_domain(rule.query, len(relation.keys), self.domains)
                                              for _, rule, _ in grounded])
        self.domains[relation.name.casefold()] = (relation.keys, domain or ("relation", relation.name.casefold()))
        owner = self.owners.get((domain, tuple(relation.keys))) if domain is not None else None
        if owner is None or relation.name.casefold() in self.outputs or self.relations[owner].size == 0:
            return None, None
        return self.key_tables[owner], self.relations[owner].keys

    def index_tables(self, relation: ir.Relation, slices: list[tuple[int, ir.Rule, exp.Expression]],
                     groundings: exp.Table, keys_table: exp.Table, rows: int,
                     edges: dict[int, dict[int, list[float]]] | None = None) -> dict[int, pa.Table]:
        """Each rule's index rows (head and body row ids, encoded columns): one query for the
        relation, or one per rule where the other rules' empty columns would take much memory
        (every row of the combined result has every rule's columns). `edges`, where given, gains
        per rule the bin edges of its ple columns (or what `index_rule` measures them from), which
        are then read as their numbers and encoded in `index_rule` (one DOUBLE per value from the
        database, not bins + 1 CASE expressions; and no statistics query for them)."""
        if not slices:
            return {}
        rules = [(index, len(rule.refs), self.encoded_columns(
            relation, index, rule, source, ple_edges=None if edges is None else edges.setdefault(index, {}),
            coded=self.coded.setdefault((relation.name, index), {})))
            for index, rule, source in slices]
        width = sum(len(columns) for *_, columns in rules) + max(n for _, n, _ in rules)
        narrowest = min(n + len(columns) for _, n, columns in rules)
        groups = [rules] if rows * (width - narrowest) <= PADDING_CELLS else [[rule] for rule in rules]
        tables = {}
        for group in groups:
            tables.update(self._index_group(relation, slices, group, groundings, keys_table))
        return tables

    def _index_group(self, relation: ir.Relation, slices: list[tuple[int, ir.Rule, exp.Expression]],
                     group: list[tuple[int, int, list[exp.Expression]]], groundings: exp.Table,
                     keys_table: exp.Table) -> dict[int, pa.Table]:
        only = group[0][0] if len(group) == 1 else None
        wanted = [s for s in slices if s[0] in {index for index, *_ in group}]
        single = not any(rule.grouped for _, rule, _ in wanted)  # a head's second grounding is refused (`index_rule`)
        table = _run_rules(self.db, q.relation_index_query(groundings, keys_table, relation.keys, group, only=only,
                                                           one_per_head=single),
                           relation.name, [(rule, source) for _, rule, source in wanted])
        tags = table.column("_rule").to_numpy()
        tables = {}
        for index, rule, _ in wanted:
            start, stop = np.searchsorted(tags, index, "left"), np.searchsorted(tags, index, "right")
            ids = ["_head", *[f"_r{j}" for j in range(len(rule.refs))]]
            part = table.slice(start, stop - start).select([*ids, *[q.rule_column(index, k) for k in range(rule.n_columns)]])
            tables[index] = part.rename_columns([*ids, *[f"_c{k}" for k in range(rule.n_columns)]])
        return tables

    def encoded_columns(self, relation: ir.Relation, index: int, rule: ir.Rule, source: exp.Expression,
                        skip: set[int] = frozenset(), ple_edges: dict[int, list[float]] | None = None,
                        coded: dict[int, str] | None = None) -> list[exp.Expression]:
        """The rule's grounding columns as SQL over alias `g`: embedded columns as dictionary codes,
        features standardized (statistics from `source`), others raw; columns in `skip` stay raw.
        With `ple_edges` (a dict, filled here) a ple column is selected as its number (a DOUBLE)
        and its edges are put in `ple_edges[k]` (or, not yet measured, a `_PendingEdges` that
        `index_rule` measures from the numbers read): the reader encodes it (`column_values(...,
        edges=...)`); without it, the database encodes it (a list of bins + 1 numbers)."""
        embeds = ir.coded_columns(rule)
        features = {c for e in ir.walk(rule.expr) if isinstance(e, ir.Features) for c in e.columns}
        encoders = {c: e for e in ir.walk(rule.expr) if isinstance(e, ir.Encode) for c in e.columns}
        types = None
        if features or encoders:
            types = self.body_types(source)
        if types is not None:
            self.measure(relation, index, rule, source, types, features, encoders)
            if ple_edges is None:  # read in bulk, a ple column's edges come from the numbers read (`index_rule`)
                self.measure_ple(relation, index, rule, source, types, encoders)
        columns: list[exp.Expression] = []
        for k in range(rule.n_columns):
            if k in embeds and k not in skip and coded is not None and self.code_here(rule, embeds[k], k, source, types):
                coded[k] = embeds[k]  # read raw, numbered by `number_here` once read
                self.first_use.append(embeds[k])
                columns.append(q.col(f"_c{k}", "g"))
            elif k in embeds and k not in skip:
                dictionary = self.dictionary(embeds[k], source, f"_c{k}", rule)
                lookup = exp.select(q.col("code", "d")).from_(q.alias(dictionary.copy(), "d", table=True)).where(
                    exp.NullSafeEQ(this=q.col("value", "d"), expression=q.col(f"_c{k}", "g")))
                spec = self.template.weights.get(embeds[k])
                columns.append(encoders_sql.rare_lookup(lookup) if spec is not None and spec.min_count
                               else exp.Subquery(this=lookup))
            elif k in features:
                key = f"{relation.name}#{index}:{k}"
                columns.append(self.feature(key, types.field(f"_c{k}").type, source, k, rule))
            elif k in encoders:
                key = f"{relation.name}#{index}:{k}"
                columns.append(self.encoded(key, encoders[k], types.field(f"_c{k}").type, source, k, rule, ple_edges))
            else:
                columns.append(q.col(f"_c{k}", "g"))
        return columns

    def index_rule(self, relation: ir.Relation, rule: ir.Rule, table: pa.Table,
                   edges: dict[int, list[float]] | None = None) -> RuleGrounding:
        """A rule's index rows as tensors; `edges`: its ple columns read as numbers (see `index_tables`);
        where they are still to be measured, from those numbers."""
        embeds = set(ir.coded_columns(rule))
        edges = dict(edges or {})
        for k, pending in edges.items():
            if isinstance(pending, _PendingEdges):
                edges[k] = self.ple_stats_of(pending.key, table.column(f"_c{k}"), pending.bins, pending.label)
        check_refs(relation, rule, table)
        head = to_tensor(table.column("_head"), torch.int64)
        refs = [to_tensor(table.column(f"_r{j}"), torch.int64) for j in range(len(rule.refs))]
        values = {k: column_tensor(table.column(f"_c{k}"), rule, k, embedded=k in embeds, edges=edges.get(k))
                  for k in range(rule.n_columns)}
        segment_heads, counts = torch.unique_consecutive(head, return_counts=True)
        offsets = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(counts, 0)])
        if not rule.grouped and segment_heads.shape[0] != head.shape[0]:
            raise GroundingError(
                f"{relation.name}, {rule.origin}: several rows share one head key {relation.keys}; "
                "add GROUP BY with an aggregate, or select a unique key")
        return RuleGrounding(rule, head, refs, values, segment_heads, offsets)

    def code_here(self, rule: ir.Rule, weight: str, k: int, source: exp.Expression, types: pa.Schema | None) -> bool:
        """Whether rule column `k` is read raw and numbered in Python (`number_here`) instead of
        through a dictionary table built and looked up in SQL (two statements and a correlated
        lookup per column: on a small database a sixth of the grounding statements' time). Only
        where Python numbers it as the SQL would, exactly: a new `embed(..., min_count=k)` no saved
        model fixed, that no other column of the template reads (its dictionary is this column's
        alone), in a rule of one grounding per head (the order of groundings never reads the codes),
        of text, integer or boolean values on an engine that compares and sorts text by its bytes."""
        spec = self.template.weights.get(weight)
        if (spec is None or spec.kind != "embed" or not spec.min_count or rule.grouped or weight in self.presets.dictionaries
                or weight in self.dictionaries or weight in self.first_use):
            return False
        if self._readers is None:  # how many columns of the template read each dictionary, counted once
            self._readers = collections.Counter(w for r in self.template.relations.values() for x in r.rules
                                                for w in ir.coded_columns(x).values())
        if self._readers[weight] != 1:
            return False
        kind = (types or self.body_types(source)).field(f"_c{k}").type
        if not (pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_boolean(kind)
                or pa.types.is_integer(kind)):
            return False
        if self._bytewise is None:
            self._bytewise = self.db.bytewise_text()
        return self._bytewise

    def body_types(self, source: exp.Expression) -> pa.Schema:
        """The Arrow types of a rule body's columns (a LIMIT 0 query), read once per body."""
        if self._schema is None or self._schema[0] is not source:
            self._schema = (source, self.db.arrow(exp.select(exp.Star()).from_(source.copy(), copy=False).limit(
                0, copy=False)).schema)
        return self._schema[1]

    def number_here(self, table: pa.Table, coded: dict[int, str]) -> pa.Table:
        """`table` with each raw column of `coded` replaced by its codes in a dictionary numbered here
        from those values, as `encoders.frequent_dictionary` and `rare_lookup` would: code 0 for NULL,
        rare and unseen values (the dictionary's row (NULL, 0)), 1, 2, ... for the values on at least
        min_count groundings, in value order."""
        for k, weight in coded.items():
            values = table.column(f"_c{k}")
            counted = pc.value_counts(values)
            found, counts = counted.field("values"), counted.field("counts")
            frequent = pc.filter(found, pc.and_(pc.is_valid(found),
                                                pc.greater_equal(counts, self.template.weights[weight].min_count)))
            frequent = pc.take(frequent, pc.sort_indices(frequent))
            self.built[weight] = pa.table({"value": pa.concat_arrays([pa.nulls(1, found.type), frequent]),
                                           "code": pa.array(np.arange(len(frequent) + 1), pa.int32())})
            codes = pc.fill_null(pc.add(pc.index_in(values, value_set=frequent).cast(pa.int32()), 1), 0)
            table = table.set_column(table.schema.get_field_index(f"_c{k}"), f"_c{k}", codes)
        return table

    def dictionary(self, weight: str, source: exp.Expression, column: str, rule: ir.Rule,
                   tables: dict[str, exp.Table] | None = None) -> exp.Table:
        """Dictionary-encode a categorical column in SQL; codes are stable once assigned. `tables`:
        where the dictionaries are registered (default: the embeddings', which size their weights)."""
        db = self.db
        tables = self.dictionaries if tables is None else tables
        table = tables.get(weight)
        if table is None:
            table = self.temp_table("d", weight.replace(".", "_"))
            # the empty (value, code) table: `value` typed as the column is, `code` as INTEGER
            first = exp.select(q.alias(q.col(column), "value"), q.alias(q.integer(0), "code")).from_(
                source.copy(), copy=False).where(exp.false(), copy=False)
            preset = self.presets.dictionaries.get(weight)
            spec = self.template.weights.get(weight)
            min_count = spec.min_count if spec is not None and spec.kind == "embed" else None
            if preset is None and min_count:  # made and filled in one statement (an empty CREATE then an INSERT took two)
                first = exp.union(first, _as_dictionary(encoders_sql.frequent_dictionary(source, column, min_count)),
                                  distinct=False, copy=False)
            _run(db, q.create_temp(table.copy(), first), rule)
            if tables is self.dictionaries:
                self.first_use.append(weight)
            if preset is not None:
                view = f"{table.name}_preset"
                db.register(view, preset)
                try:
                    _run(db, exp.Insert(this=table.copy(), expression=exp.select(
                        q.col("value"), q.col("code")).from_(q.ident(view))), rule)
                finally:
                    db.unregister(view)
            tables[weight] = table
            if min_count:  # fixed when built: other values read the rare row 0
                return table
        elif self.template.weights.get(weight) is not None and self.template.weights[weight].min_count:
            return table
        with reported_as(db, rule):
            db.add_codes(table, source, column)
        return table

    def measure(self, relation: ir.Relation, index: int, rule: ir.Rule, source: exp.Expression, types: pa.Schema,
                features: set[int], encoders: dict[int, ir.Encode]) -> None:
        """Every statistic the rule's features and encoders need, in ONE query over its groundings
        (a wide table's 17 ple() columns took 34 scans, each running the rule's query again). Kept
        in `measured` by column key; where the query fails (a type no encoder takes, a spread that
        overflows) nothing is kept and each column measures itself, raising its own message."""
        wanted: list[tuple[str, list[exp.Expression]]] = []
        for k in sorted(features | set(encoders)):
            key = f"{relation.name}#{index}:{k}"
            if key in self.presets.feature_stats:
                continue
            raw, kind = q.col(f"_c{k}", "g"), types.field(f"_c{k}").type
            try:
                if k in features:
                    number, _ = _feature_number(raw, kind, rule, k)
                    bare = _bare(number, k)
                    parts = [_infinite_count(bare), exp.Avg(this=bare.copy()), exp.StddevPop(this=bare.copy()), _nulls(bare)]
                elif encoders[k].kind == "ple":
                    continue  # `measure_ple`, or from the numbers read (`index_rule`)
                elif encoders_sql.is_time(kind):
                    year = _bare(encoders_sql.calendar_year(raw), k)
                    parts = [exp.Avg(this=year.copy()), exp.StddevPop(this=year.copy()), _nulls(year)]
                else:
                    continue
            except SchemaError:
                continue
            wanted.append((key, parts))
        if len(wanted) < 2:
            return
        try:
            row = self.db.scalar(exp.select(*[p for _, parts in wanted for p in parts]).from_(source.copy()))
        except (duckdb.Error, RelsqlError) as err:
            if interrupted_query(err):
                raise
            return
        at = 0
        for key, parts in wanted:
            self.measured[key] = tuple(row[at:at + len(parts)])
            at += len(parts)

    def measure_ple(self, relation: ir.Relation, index: int, rule: ir.Rule, source: exp.Expression, types: pa.Schema,
                    encoders: dict[int, ir.Encode]) -> None:
        """The rule's ple columns' numbers in ONE query over its groundings, their edges computed
        here (`encoders.quantile_edges`, as the bulk reading computes them from the same numbers).
        Kept in `measured`; where the query fails, each column reads itself in `encoded`."""
        wanted: dict[int, exp.Expression] = {}
        for k in sorted(encoders):
            key = f"{relation.name}#{index}:{k}"
            if encoders[k].kind != "ple" or key in self.presets.feature_stats:
                continue
            try:
                wanted[k] = _bare(encoders_sql.ple_number(q.col(f"_c{k}", "g"), types.field(f"_c{k}").type, ""), k)
            except SchemaError:
                continue
        if len(wanted) < 2:
            return
        try:
            numbers = self.db.arrow(exp.select(*[q.alias(n, f"_c{k}") for k, n in wanted.items()], copy=False).from_(
                source.copy(), copy=False))
        except (duckdb.Error, RelsqlError) as err:
            if interrupted_query(err):
                raise
            return
        for k in wanted:
            self.measured[f"{relation.name}#{index}:{k}"] = encoders_sql.ple_column_stats(
                numbers.column(f"_c{k}"), encoders[k].bins)

    def ple_stats_of(self, key: str, numbers: pa.Array | pa.ChunkedArray, bins: int, label: str) -> list[float]:
        """A ple column's statistics from its numbers (DOUBLE, NULLs kept), kept in `feature_stats`;
        its checked edges. Infinite or NaN values are refused, as the statistics query refused them."""
        bad, stats = encoders_sql.ple_column_stats(numbers, bins)
        if bad:
            raise SchemaError(_infinite_message(label, bad))
        self.feature_stats[key] = stats
        return encoders_sql.checked_edges(stats, bins, label)

    def check_finite(self, bare: exp.Expression, grounding: exp.Expression, label: str) -> None:
        """Refuse a column with infinite or NaN values: no statistics or encoding can hold them."""
        bad = self.db.scalar(exp.select(_infinite_count(bare)).from_(grounding.copy()))[0]
        if bad:
            raise SchemaError(_infinite_message(label, bad))

    def encoded(self, key: str, encoder: ir.Encode, kind: pa.DataType, grounding: exp.Expression, k: int,
                rule: ir.Rule, ple_edges: dict[int, list[float]] | None = None) -> exp.Expression:
        """A column encoded by `ple` or `calendar` (relsql/ground/encoders.py) with statistics computed
        once over the groundings (a saved model's: `presets`): the year's by the database, a ple
        column's edges here from its numbers. With `ple_edges`, a ple column is its number and its
        checked edges (or a `_PendingEdges`) go to `ple_edges[k]` (see `encoded_columns`)."""
        raw = q.col(f"_c{k}", "g")
        label = f"{rule.head}, {rule.origin}: {encoder.kind}({column_label(rule, k)})"
        stats = self.presets.feature_stats.get(key)
        with reported_as(self.db, rule):
            if encoder.kind == "ple":
                number = encoders_sql.ple_number(raw, kind, label)
                if stats is None and key in self.measured:
                    bad, stats = self.measured.pop(key)
                    if bad:
                        raise SchemaError(_infinite_message(label, bad))
                if stats is None and ple_edges is not None:  # measured from the numbers the index query reads
                    ple_edges[k] = _PendingEdges(key, encoder.bins, label)
                    return number
                if stats is None:  # this column's numbers alone (`measure_ple` read none, or failed)
                    numbers = self.db.arrow(exp.select(q.alias(_bare(number, k), "x"), copy=False).from_(
                        grounding.copy(), copy=False)).column("x")
                    bad, stats = encoders_sql.ple_column_stats(numbers, encoder.bins)
                    if bad:
                        raise SchemaError(_infinite_message(label, bad))
                self.feature_stats[key] = stats
                edges = encoders_sql.checked_edges(stats, encoder.bins, label)
                if ple_edges is not None:
                    ple_edges[k] = edges
                    return number
                return encoders_sql.ple_sql(number, edges)
            if not encoders_sql.is_time(kind):
                raise SchemaError(f"{label} needs a date or timestamp column, got {kind}")
            if stats is None and key in self.measured:
                stats = encoders_sql.calendar_stats(*self.measured.pop(key))
            if stats is None:
                year = _bare(encoders_sql.calendar_year(raw), k)
                mean, std, nulls = self.db.scalar(exp.select(
                    exp.Avg(this=year.copy()), exp.StddevPop(this=year.copy()),
                    exp.Sub(this=exp.Count(this=exp.Star()), expression=exp.Count(this=year.copy())),
                ).from_(grounding.copy()))
                stats = encoders_sql.calendar_stats(mean, std, nulls)
            self.feature_stats[key] = encoders_sql.checked_kind(stats, "calendar", label)
            return encoders_sql.calendar_sql(raw, pa.types.is_timestamp(kind), stats)

    def feature(self, key: str, kind: pa.DataType, grounding: exp.Expression, k: int, rule: ir.Rule) -> exp.Expression:
        """A feature column encoded in SQL: standardized number, NULL as 0 plus an indicator."""
        number, scaled = _feature_number(q.col(f"_c{k}", "g"), kind, rule, k)
        stats = self.presets.feature_stats.get(key)
        if stats is None and key in self.measured:
            bad, mean, std, nulls = self.measured.pop(key)
            if bad:
                raise SchemaError(_infinite_message(f"{rule.head}, {rule.origin}: features({column_label(rule, k)})", bad))
            if all(v is None or np.isfinite(v) for v in (mean, std)):
                stats = {"mean": float(mean or 0.0) if scaled else 0.0,
                         "std": float(std) if scaled and std else 1.0, "nulls": bool(nulls)}
        if stats is None:
            bare = _bare(number, k)
            label = f"{rule.head}, {rule.origin}: features({column_label(rule, k)})"
            try:
                self.check_finite(bare, grounding, label)
                mean, std, nulls = self.db.scalar(exp.select(
                    exp.Avg(this=bare.copy()), exp.StddevPop(this=bare.copy()),
                    exp.Sub(this=exp.Count(this=exp.Star()), expression=exp.Count(this=bare.copy())),
                ).from_(grounding.copy()))
            except duckdb.Error as err:  # STDDEV_POP overflows on values beyond ~1e154
                raise SchemaError(f"{label}: the database could not compute the column's mean and spread "
                                  f"({_first_line(err)}); values this large cannot be standardized: "
                                  "rescale the column (e.g. divide it by a power of ten) or leave it out") from None
            if not all(v is None or np.isfinite(v) for v in (mean, std)):
                raise SchemaError(f"{label}: the column's mean or spread is not a finite number (values too large); "
                                  "rescale the column (e.g. divide it by a power of ten) or leave it out")
            stats = {"mean": float(mean or 0.0) if scaled else 0.0,
                     "std": float(std) if scaled and std else 1.0, "nulls": bool(nulls)}
        self.feature_stats[key] = stats
        value = exp.Coalesce(this=exp.Div(
            this=exp.paren(exp.Sub(this=number.copy(), expression=q.real(stats["mean"]))),
            expression=q.real(stats["std"])), expressions=[q.integer(0)])
        if not stats["nulls"]:
            return value
        indicator = exp.cast(exp.Is(this=number.copy(), expression=exp.Null()), exp.DataType.build(exp.DataType.Type.DOUBLE))
        return exp.Anonymous(this="list_value", expressions=[value, indicator])


@dataclass(frozen=True)
class _PendingEdges:
    """A ple column read in bulk whose edges are computed from the numbers read (`index_rule`)."""

    key: str
    bins: int
    label: str


def _feature_number(raw: exp.Expression, kind: pa.DataType, rule: ir.Rule, k: int) -> tuple[exp.Expression, bool]:
    """(the number features() standardizes for a column of arrow type `kind`, whether it is scaled)."""
    if pa.types.is_boolean(kind):
        return exp.cast(raw, exp.DataType.build(exp.DataType.Type.DOUBLE)), False
    if pa.types.is_date(kind) or pa.types.is_timestamp(kind):
        return exp.cast(exp.Anonymous(this="epoch", expressions=[raw]), exp.DataType.build(exp.DataType.Type.DOUBLE)), True
    if pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_decimal(kind):
        return exp.cast(raw, exp.DataType.build(exp.DataType.Type.DOUBLE)), True
    raise SchemaError(f"{rule.head}, {rule.origin}: features({column_label(rule, k)}) needs a numeric, boolean or date column, "
                      f"got {kind}; use embed(...) for categorical columns")


def _infinite_count(bare: exp.Expression) -> exp.Expression:
    return exp.Sum(this=exp.Case(ifs=[exp.If(this=exp.Not(this=exp.Anonymous(this="isfinite", expressions=[bare.copy()])),
                                             true=q.integer(1))], default=q.integer(0)))


def _as_dictionary(rows: exp.Query) -> exp.Select:
    """(value, code) rows as a dictionary table holds them: `code` cast to the INTEGER of its empty
    table's literal 0 (row numbers are BIGINT), as an INSERT into that table casts it."""
    named = exp.TableAlias(this=q.ident("f"), columns=[q.ident("value"), q.ident("code")])
    return exp.select(q.col("value", "f"), q.alias(exp.cast(q.col("code", "f"), exp.DataType.build("INTEGER")), "code"),
                      copy=False).from_(exp.Subquery(this=rows, alias=named), copy=False)


def _nulls(bare: exp.Expression) -> exp.Expression:
    return exp.Sub(this=exp.Count(this=exp.Star()), expression=exp.Count(this=bare.copy()))


def _infinite_message(label: str, bad: int) -> str:
    return (f"{label}: {bad} values are infinite or NaN and cannot be encoded; filter them "
            "out (e.g. WHERE isfinite(column)) or replace them in the query")


def _bare(number: exp.Expression, k: int) -> exp.Expression:
    """`number` over the grounding query's own column `_c{k}` (no `g.` alias): for statistics."""
    return number.transform(lambda n: q.col(f"_c{k}") if isinstance(n, exp.Column) else n)


def column_tensor(column: pa.ChunkedArray | pa.Array, rule: ir.Rule, k: int, embedded: bool,
                   edges: list[float] | None = None) -> torch.Tensor:
    """A grounding column as a (G, d) float64 tensor (or (G,) codes): the store's rule
    (relsql/ground/parts.py), as a tensor over the same memory; `edges`: a ple column read as its
    number, encoded over them."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # read-only numpy buffers: never written to
        return torch.from_numpy(column_values(column, rule, k, embedded, edges))
