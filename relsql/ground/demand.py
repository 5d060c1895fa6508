"""Demand-driven grounding: only what a batch of output rows needs, computed by the database.

Setup, once: every relation the output depends on gets its key table (its distinct heads,
numbered: global row ids), and the embedding dictionaries and feature statistics are computed,
all over the whole database but inside DuckDB (keys and summaries; no grounding leaves it).

Per batch: the batch's output rows are the demand of the output relation. Going down the rule
dependency graph, each rule is grounded for the demanded heads only (its body joined with the
demanded row ids: a semi-join the database runs), and the row ids those groundings reference
become the demand of the relations they reference. The groundings arrive as Arrow record
batches; at the end every index is renumbered to the batch's own rows (sorted global ids, so
the order of groundings is the full grounding's order restricted to the batch).

With `rows_only` (a loaded model's predict(keys=/where=)) the key tables start empty and
`restrict` fills them, per call, with only the rows the asked output rows reach: candidates
top-down (relsql/ground/closure.py), existence bottom-up, each numbered in key order among its
rows, so the batches ground as above over far fewer rows.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import sqlglot.errors
import sqlglot.expressions as exp
import torch

from relsql import sql as q
from relsql.data.duckdb import interrupted_query, lost_connection
from relsql.data.engine import Database
from relsql.errors import GroundingError, SchemaError
from relsql.ground import closure, inline
from relsql.ground.execute import (
    Grounder,
    Grounding,
    Presets,
    RelationGrounding,
    RuleGrounding,
    column_tensor,
    interruptible,
    reported_as,
)
from relsql.ground.parts import check_refs
from relsql.ground.tensors import to_tensor
from relsql.progress import relations
from relsql.template import ir

_views = itertools.count()
# DuckDB types whose equality Arrow's `index_in` shares (`BatchGrounder._coded_here`)
_CODABLE = {"VARCHAR", "BOOLEAN", "TINYINT", "SMALLINT", "INTEGER", "BIGINT", "UTINYINT", "USMALLINT", "UINTEGER", "UBIGINT"}


@dataclass
class PreparedRule:
    index: int
    rule: ir.Rule
    source: exp.Expression  # the rule body (neural relations read through their key tables)
    select: exp.Select  # the same body, unwrapped: a batch narrows it to its heads (`sql.heads_within`)
    columns: list[exp.Expression]  # the encoded grounding columns, over alias `g`
    stored: dict[int, str]  # column -> weight of an embedding kept in the database (raw keys)
    edges: dict[int, list[float]] = field(default_factory=dict)  # ple columns read as numbers: their edges
    coded: dict[int, str] = field(default_factory=dict)  # column -> weight of an embedding coded here (`_coded_here`)


@dataclass
class BatchGrounding(Grounding):
    """A batch's grounding: indexes local to the batch; `rows` maps each relation's batch rows to
    its global row ids; `embedding_keys` holds, per database-stored embedding, the keys of its
    batch rows in code order, and (read from a grounding store) `embedding_codes` their codes there."""

    rows: dict[str, torch.Tensor] = field(default_factory=dict)
    embedding_keys: dict[str, pa.Array] = field(default_factory=dict)
    embedding_codes: dict[str, np.ndarray] = field(default_factory=dict)


def needed_relations(template: ir.Template, output: str) -> list[str]:
    """The relations `output` depends on (itself included), in dependency order."""
    needed, todo = set(), [output]
    while todo:
        name = todo.pop()
        if name in needed:
            continue
        needed.add(name)
        for rule in template.relations[name].rules:
            todo.extend(r for r in [*rule.refs, *rule.depends] if r in template.relations)
    return [name for name in template.order() if name in needed]


def database_embeddings(template: ir.Template) -> dict[str, ir.WeightSpec]:
    return {name: spec for name, spec in template.weights.items() if spec.kind == "embed" and spec.storage == "database"}


class BatchGrounder(Grounder):
    """Key tables once, groundings per batch. Not thread-safe: use it from one thread at a time."""

    def __init__(self, template: ir.Template, db: Database, output: str, presets: Presets | None = None,
                 fanout: dict[str, int] | int | None = None, seed: int = 0, progress: bool | None = None,
                 max_groundings: int | None = None, ple_numbers: bool = False, rows_only: bool = False):
        """`max_groundings`: a rule the database estimates beyond it is refused before it runs
        (default relsql.ground.execute.MAX_GROUNDINGS); on an error or Ctrl-C no temp table stays.
        `ple_numbers`: a batch reads ple columns whose edges the presets hold as numbers and
        encodes them here (`_ple_preset`); only for batches this grounder grounds itself (a
        grounding store writes `PreparedRule.columns` as they are, so it needs them encoded).
        `rows_only`: the key tables start empty and `restrict` fills them with the rows some asked
        output rows reach (row ids numbered among those), instead of every row of every relation;
        the setup then estimates only the bodies over base tables alone (`check_size`: the key tables are
        still empty; a batch's queries are narrowed to its heads).
        Not with `fanout`: its sampling hashes row ids, which differ from the whole key tables'."""
        super().__init__(template, db, presets or Presets(), max_groundings, (output,))
        self.ple_numbers, self.rows_only = ple_numbers, rows_only
        self.output, self.seed = output, seed
        self.order = needed_relations(template, output)
        self.fanout = fanout
        self.stored = database_embeddings(template)
        self.prepared: dict[str, list[PreparedRule]] = {}
        self._source_types: tuple[exp.Expression, dict[str, str]] | None = None  # a body's column types (`dictionary`)
        self._small_kinds: dict[str, str] = {}  # DuckDB value type of each dictionary made from the file's rows as literals
        self._pending: dict[str, str] = {}  # the same, for those no SQL reads (coded here alone): not made as tables
        self._weights: list[str] = []  # every dictionary's weight in the order of first use (`dictionary_tables`)
        with interruptible(db), self.cleanup_on_error():
            with db.frozen_schema():
                bar = relations(self.order, progress)
                for name in bar:
                    bar.set_postfix_str(name)
                    self._prepare(template.relations[name])
            self.sizes = {} if rows_only else self._sizes()
            self.dictionary_tables = self._read_dictionaries()

    def _read_dictionaries(self) -> dict[str, pa.Table]:
        """Each embedding dictionary's rows in code order. The small ones a loaded model made from its
        file's rows (`dictionary`) are read in one query per value type, each then taken out by its
        number (Lahman's 115 dictionaries were 115 queries); others one query each."""
        weights = [w for w in self._weights if w in self.dictionaries or w in self._pending]
        seen = set(weights)
        weights += [w for w in self.dictionaries if w not in seen]
        groups: dict[str, list[str]] = {}
        for weight in weights:
            kind = self._pending.get(weight) or self._small_kinds.get(weight)
            groups.setdefault(f"={weight}" if kind is None else kind, []).append(weight)
        tables: dict[str, pa.Table] = {}
        for names in groups.values():
            if len(names) == 1 and names[0] not in self._pending:
                tables[names[0]] = self.db.arrow(exp.select(exp.Star()).from_(self.dictionaries[names[0]].copy()).order_by(
                    q.col("code")))
                continue
            union = None
            for i, weight in enumerate(names):
                if weight in self._pending:  # the file's rows as literals, typed as its table would be
                    rows = q.alias(exp.Subquery(this=inline.rows_query(self.presets.dictionaries[weight])), "v", table=True)
                    part = _typed_dictionary(rows, exp.DataType.build(self._pending[weight], dialect="duckdb"))
                    part = exp.select(q.alias(q.integer(i), "_w"), exp.Star()).from_(
                        q.alias(exp.Subquery(this=part), "p", table=True), copy=False)
                else:
                    part = exp.select(q.alias(q.integer(i), "_w"), exp.Star()).from_(self.dictionaries[weight].copy())
                union = part if union is None else exp.union(union, part, distinct=False, copy=False)
            read = self.db.arrow(exp.select(exp.Star()).from_(q.alias(exp.Subquery(this=union), "u", table=True)).order_by(
                q.col("_w"), q.col("code")))
            numbers = read.column("_w").to_numpy()
            bounds = np.searchsorted(numbers, np.arange(len(names) + 1))
            read = read.drop_columns(["_w"])
            for i, weight in enumerate(names):
                tables[weight] = read.slice(int(bounds[i]), int(bounds[i + 1] - bounds[i])).combine_chunks()
        return {weight: tables[weight] for weight in weights}

    def _sizes(self) -> dict[str, int]:
        # one statement for all (a restrict of Lahman's 70 relations counted them in 70)
        counted = self.db.arrow(q.row_counts([self.key_tables[name] for name in self.order]))
        position = dict(zip(counted.column("_i").to_pylist(), counted.column("_n").to_pylist()))
        sizes = {name: int(position[i]) for i, name in enumerate(self.order)}
        if sizes[self.output] == 0 and not self.rows_only:
            raise GroundingError(f"relation {self.output} has no rows: none of its statements has groundings")
        return sizes

    # -- setup ---------------------------------------------------------------------------------
    def check_size(self, relation: ir.Relation, rule: ir.Rule, select: exp.Select) -> None:
        """As the Grounder's, except that with `rows_only` a body reading a key table is not
        estimated: its key tables are still empty here, so the estimate would tell nothing (and its
        EXPLAIN cost Lahman's setup about 0.5 s); a batch reads it narrowed to its heads."""
        if self.rows_only:
            names = {t.name for t in self.key_tables.values()}
            if any(t.name in names for t in select.find_all(exp.Table)):
                return
        super().check_size(relation, rule, select)

    def dictionary(self, weight: str, source: exp.Expression, column: str, rule: ir.Rule,
                   tables: dict[str, exp.Table] | None = None) -> exp.Table:
        """As the Grounder's; with `rows_only`, a dictionary the file holds whole (an embedding
        with min_count is fixed when built: no codes are added) is made from it in one statement,
        `value` typed as the column is and `code` INTEGER as there, the types read once per body
        (Lahman's 115 dictionaries of 17 bodies were two statements each over the body); one that
        Python codes alone (`_coded_here`) is made only when SQL looks it up, typed as at its first use."""
        preset = self.presets.dictionaries.get(weight)
        spec = self.template.weights.get(weight)
        if tables is None and weight not in self._weights:
            self._weights.append(weight)
        if (not self.rows_only or tables is not None or weight in self.dictionaries or preset is None
                or spec is None or spec.kind != "embed" or not spec.min_count):
            return super().dictionary(weight, source, column, rule, tables)
        named = self._pending.pop(weight, None) or self._column_types(source, rule).get(column)  # typed as at its first use
        try:
            kind = exp.DataType.build(named, dialect="duckdb") if named else None
        except (sqlglot.errors.ParseError, ValueError):
            kind = None
        if kind is None:  # a column the body lacks, or a type sqlglot does not read: the general way
            return super().dictionary(weight, source, column, rule, tables)
        table = self.temp_table("d", weight.replace(".", "_"))
        with reported_as(self.db, rule):
            small = self._from_rows(table, preset, lambda rows: _typed_dictionary(rows, kind))
        self.dictionaries[weight] = table
        if small:
            self._small_kinds[weight] = named
        return table

    def _column_types(self, source: exp.Expression, rule: ir.Rule) -> dict[str, str]:
        """A body's column types as DuckDB names them, read once per body."""
        if self._source_types is None or self._source_types[0] is not source:
            query = exp.select(exp.Star()).from_(source.copy(), copy=False).limit(q.integer(0), copy=False)
            with reported_as(self.db, rule):
                self._source_types = (source, dict(self.db.result_columns(query)))
        return self._source_types[1]

    def _from_rows(self, table: exp.Table, data: pa.Table, select: Callable[[exp.Expression], exp.Select]) -> bool:
        """Temp table `table` as `select(rows)` over `data`'s rows: as typed literals where it is small
        (relsql/ground/inline.py: no scan of a Python object), else registered. Whether it was small."""
        rows = inline.rows_query(data)
        if rows is not None:
            self.db.run(q.create_temp(table.copy(), select(q.alias(exp.Subquery(this=rows), "v", table=True))))
            return True
        view = f"{table.name}_rows"
        self.db.register(view, data)
        try:
            self.db.run(q.create_temp(table.copy(), select(exp.Table(this=q.ident(view)))))
        finally:
            self.db.unregister(view)
        return False

    def _prepare(self, relation: ir.Relation) -> None:
        sources = []
        for index, rule in enumerate(relation.rules):
            select = self.rule_select(relation, rule)
            if select is not None:
                sources.append((index, rule, select, exp.Subquery(this=select)))
        if self.rows_only and relation.keys and sources:  # typed and empty: `restrict` fills it
            keys_table = self.temp_table("rk", relation.name)  # not "k": a full grounding on this handle has those
            with self.cleanup_on_error():
                self.db.run(q.create_temp(keys_table, q.numbered_keys(
                    q.distinct_keys([s for *_, s in sources], relation.keys), relation.keys).limit(q.integer(0), copy=False)))
            self.key_tables[relation.name] = keys_table
        else:
            self.key_tables[relation.name] = self.key_table(relation, [(rule, source) for _, rule, _, source in sources])
        prepared = []
        for index, rule, select, source in sources:
            stored = {e.column: e.weight for e in ir.walk(rule.expr) if isinstance(e, ir.Embed) and e.weight in self.stored}
            edges: dict[int, list[float]] | None = {} if self._ple_preset(relation, index, rule) else None
            for k, weight in sorted(ir.coded_columns(rule).items()):  # first use in column order, as `encoded_columns`
                if k not in stored and weight not in self._weights:
                    self._weights.append(weight)
            coded = self._coded_here(rule, source, set(stored))
            columns = self.encoded_columns(relation, index, rule, source, skip=set(stored) | set(coded), ple_edges=edges)
            prepared.append(PreparedRule(index, rule, source, select, columns, stored, edges or {}, coded))
        self.prepared[relation.name] = prepared

    def _coded_here(self, rule: ir.Rule, source: exp.Expression, stored: set[int]) -> dict[int, str]:
        """The embedded columns a batch reads raw and codes here (`_codes`), with `rows_only`: those of
        an ungrouped rule (one grounding per head, so the order of groundings never depends on the
        codes) whose dictionary was made from the file's rows (`dictionary`) with the column's own
        type, a text, integer or boolean one (equality the same in Arrow as in DuckDB). The
        database's lookup is a join per column: Lahman's 17 encoding rules' 115 of them cost a
        predict(keys=) about a third of its batch."""
        if not self.rows_only or rule.grouped:
            return {}
        coded = {}
        for k, weight in sorted(ir.coded_columns(rule).items()):  # in column order, as `encoded_columns` makes them
            spec = self.template.weights.get(weight)
            fixed = spec is not None and spec.kind == "embed" and spec.min_count and weight in self.presets.dictionaries
            if k in stored or not fixed:
                continue
            named = self._column_types(source, rule).get(f"_c{k}")
            if named not in _CODABLE:
                continue  # `encoded_columns` looks it up in SQL
            if weight in self.dictionaries:
                kind = self._small_kinds.get(weight)
            elif weight in self._pending:
                kind = self._pending[weight]
            elif inline.rows_query(self.presets.dictionaries[weight]) is not None:
                kind = self._pending[weight] = named  # its first use: no table until SQL reads it (`dictionary`)
            else:
                continue
            if kind == named:
                coded[k] = weight
        return coded

    def _codes(self, weight: str, column: pa.ChunkedArray) -> pa.ChunkedArray:
        """A raw column's codes in the dictionary of `weight`, as the database's lookup gives them: a
        value matched with NULL matching NULL, one without a code the rare row 0 (`rare_lookup`)."""
        dictionary = self.dictionary_tables[weight]
        index = pc.index_in(column, value_set=dictionary.column("value").combine_chunks(), skip_nulls=False)
        return pc.fill_null(pc.take(dictionary.column("code"), index), 0)

    def _ple_preset(self, relation: ir.Relation, index: int, rule: ir.Rule) -> bool:
        """Whether every ple column of the rule has its edges from the presets (a saved model's):
        then a batch reads those columns as numbers and encodes them here, as construction's bulk
        reading does (the database's (bins + 1)-wide SQL per column cost a batch of Lahman's more to
        generate and plan than its rows to read); edges measured from one batch's numbers would be
        that batch's, so without presets the database encodes them."""
        columns = {c for e in ir.walk(rule.expr) if isinstance(e, ir.Encode) and e.kind == "ple" for c in e.columns}
        preset = self.presets.feature_stats
        return self.ple_numbers and bool(columns) and all(f"{relation.name}#{index}:{c}" in preset for c in columns)

    # -- the rows some output rows reach ---------------------------------------------------------
    def restrict(self, asked: pa.Table | None) -> None:
        """Key tables holding only the rows that the output rows with keys `asked` (a table of the
        output relation's key columns; None: every row) reach, numbered 0..n-1 in key order among
        them (`rows_only`). Top-down, each relation's candidates from its readers' bodies
        (relsql/ground/closure.py: a superset); bottom-up, its key table from its candidates'
        groundings over the key tables below it, as the full key table is from all groundings:
        so each holds exactly the full key table's rows among its candidates, in the same order,
        and a batch's groundings are the full grounding's restricted to it."""
        db, template = self.db, self.template
        tables = {self.key_tables[n].name: (n, list(template.relations[n].keys)) for n in self.order}
        made: list[exp.Table] = []
        with interruptible(db), self.cleanup_on_error(), db.frozen_schema():
            try:
                candidates: dict[str, closure.Asked | None] = {}
                wanted: dict[str, list[closure.Reach] | None] = {}  # per relation, what its readers need (None: whole)
                for name in reversed(self.order):
                    relation = template.relations[name]
                    if name == self.output:
                        mine = None if asked is None else self._asked_table(name, [asked], tuple(asked.column_names), made)
                    else:
                        mine = self._merged(name, wanted.get(name, []), made)
                    candidates[name] = mine
                    for prepared in self.prepared[name]:
                        found = None if mine is None else closure.reach(prepared.select, relation.keys, tables, mine)
                        for reached in self._whole(prepared) if found is None else found:
                            current = wanted.get(reached.relation, [])
                            wanted[reached.relation] = None if current is None or reached.query is None else [*current, reached]
                for name in self.order:
                    self._fill(template.relations[name], candidates[name])
            finally:
                for table in made:
                    db.execute(exp.Drop(tables=[table.copy()], kind="TABLE", exists=True))
            self.sizes = self._sizes()

    def _whole(self, prepared: PreparedRule) -> list[closure.Reach]:
        """Every relation a body reads, whole (a body `closure.reach` does not read)."""
        names = {self.key_tables[n].name: n for n in self.order}
        return [closure.Reach(t.alias_or_name, names[t.name]) for t in prepared.select.find_all(exp.Table) if t.name in names]

    def _merged(self, name: str, found: list[closure.Reach] | None, made: list[exp.Table]) -> closure.Asked | None:
        """A relation's candidates from what its readers need (None: whole): on the key columns
        every reader binds, the union of their values."""
        if found is None or not self.template.relations[name].keys:
            return None
        if not found:  # read by none of the relations reached: no candidates
            return self._asked_table(name, [], tuple(self.template.relations[name].keys[:1]), made, empty=True)
        common = [c for c in self.template.relations[name].keys if all(c in f.columns for f in found)]
        if not common:
            return None
        if len(found) == 1 and found[0].same and found[0].columns == tuple(common):  # its reader's candidates, as they are
            return closure.Asked(found[0].query.args["from_"].this, tuple(common))
        parts = [exp.select(*[q.col(c, "c") for c in common]).from_(q.alias(exp.Subquery(this=f.query), "c", table=True))
                 for f in found]
        return self._asked_table(name, parts, tuple(common), made)

    def _asked_table(self, name: str, parts: list, columns: tuple[str, ...], made: list[exp.Table],
                     empty: bool = False) -> closure.Asked:
        """The distinct rows of `parts` (queries, or one Arrow table) as a temp table."""
        table = self.temp_table("ra", name)
        made.append(table)
        if parts and isinstance(parts[0], pa.Table):
            self._from_rows(table, parts[0], lambda rows: exp.select(*[q.col(c) for c in columns]).distinct().from_(
                rows, copy=False))
        elif empty:
            key_table = self.key_tables[name]
            self.db.run(q.create_temp(table.copy(), exp.select(*[q.col(c) for c in columns]).from_(key_table.copy()).limit(
                q.integer(0))))
        else:
            union = parts[0]
            for part in parts[1:]:
                union = exp.union(union, part, distinct=False, copy=False)
            self.db.run(q.create_temp(table.copy(), exp.select(exp.Star()).distinct().from_(
                q.alias(exp.Subquery(this=union), "u", table=True))))
        return closure.Asked(table, columns)

    def _fill(self, relation: ir.Relation, asked: closure.Asked | None) -> None:
        """A relation's key table, from the groundings of its candidates `asked` (None: all)."""
        prepared = self.prepared[relation.name]
        if not relation.keys or not prepared:
            return  # a keyless relation's table, or one without statements, is the setup's
        sources = [exp.Subquery(this=p.select.copy() if asked is None else closure.narrowed(p.select, relation.keys, asked))
                   for p in prepared]
        try:  # the sources are fresh: taken into the query, not copied again
            self.db.create_key_table(self.key_tables[relation.name].copy(),
                                     q.distinct_keys(sources, relation.keys, copy=False), relation.keys)
        except duckdb.Error as err:
            raise grounding_error(relation, prepared[0].rule, err, self.db.description) from None

    def keys(self, name: str, rids: np.ndarray | None = None) -> pa.Table:
        """Key columns and global `_rid` of a relation's rows (those in `rids`, else all), by `_rid`."""
        select = exp.select(exp.Star()).from_(self.key_tables[name].copy())
        if rids is None:
            return self.db.arrow(select.order_by(q.col("_rid")))
        view = f"{self.db._prefix}keys_{next(_views)}"
        self.db.register(view, pa.table({"_rid": np.asarray(rids, dtype=np.int64)}))
        try:
            semi = exp.select(q.col("_rid")).from_(q.ident(view))
            return self.db.arrow(select.where(exp.In(this=q.col("_rid"), query=exp.Subquery(this=semi))).order_by(q.col("_rid")))
        finally:
            self.db.unregister(view)

    # -- one batch -----------------------------------------------------------------------------
    def ground(self, rids: np.ndarray, sample: int = 0) -> BatchGrounding:
        """The grounding of the output rows with global ids `rids`; `sample` reseeds fan-out sampling."""
        with interruptible():  # a batch's queries are small: DuckDB's own Ctrl-C check suffices
            return self._ground(rids, sample)

    def _ground(self, rids: np.ndarray, sample: int) -> BatchGrounding:
        # a copy: Arrow arrays are read-only
        demand: dict[str, torch.Tensor] = {self.output: torch.unique(torch.from_numpy(np.array(rids, dtype=np.int64)))}
        fetched: dict[str, list[tuple[PreparedRule, pa.Table]]] = {}
        for name in reversed(self.order):
            wanted = demand.get(name)
            if wanted is None or wanted.numel() == 0:
                continue
            relation = self.template.relations[name]
            view = f"{self.db._prefix}demand_{next(_views)}"
            # every row of the key table (a restricted one's, mostly): the demand is the key table itself,
            # not its rows read out and registered again (70 statements of a Lahman predict(keys=))
            every = bool(relation.keys) and wanted.numel() == self.sizes.get(name)
            if not every:  # the demanded rows' keys too: each rule's body is narrowed to them (`_fetch`)
                self.db.register(view, self.keys(name, wanted.numpy()) if relation.keys else pa.table({"_rid": wanted.numpy()}))
            try:
                fetched[name] = []
                for prepared in self.prepared[name]:
                    table = self._fetch(relation, prepared, self.key_tables[name] if every else exp.Table(this=q.ident(view)),
                                        sample)
                    fetched[name].append((prepared, table))
                    for j, ref in enumerate(prepared.rule.refs):
                        ids = to_tensor(table.column(f"_r{j}"), torch.int64)
                        demand[ref] = torch.unique(torch.cat([demand[ref], ids])) if ref in demand else torch.unique(ids)
            finally:
                if not every:
                    self.db.unregister(view)
        return self._localize(demand, fetched)

    def _fetch(self, relation: ir.Relation, prepared: PreparedRule, demand: exp.Table, sample: int) -> pa.Table:
        """A rule's groundings of the heads in `demand` (a table of `_rid`s and, with keys, the key columns)."""
        rule = prepared.rule
        limit = self.fanout.get(relation.name) if isinstance(self.fanout, dict) else self.fanout
        # the demanded heads' groundings only (not inside a body that reads the demand's table itself: one name for two)
        inside = not any(t.name == demand.name for t in prepared.select.find_all(exp.Table))
        narrowed = q.heads_within(prepared.select, demand, relation.keys) if inside else None
        source = prepared.source if narrowed is None else exp.Subquery(this=narrowed)
        select = q.rule_index_query(source, self.key_tables[relation.name], relation.keys, len(rule.refs),
                                    prepared.columns, demand=demand,
                                    per_head=(limit, self.seed * 100_003 + sample) if limit and rule.grouped else None)
        try:
            reader = self.db.reader(select, 1 << 20)
            table = pa.Table.from_batches(list(reader), schema=reader.schema)  # Arrow record batches, this batch's rows only
        except (duckdb.Error, OSError, pa.ArrowException) as err:  # a DuckDB error read through Arrow is an OSError
            raise grounding_error(relation, rule, err, self.db.description) from None
        check_refs(relation, rule, table)
        return table

    def _localize(self, demand: dict[str, torch.Tensor], fetched) -> BatchGrounding:
        relations: dict[str, RelationGrounding] = {}
        keys: dict[str, list[pa.Array]] = {}
        for prepared_tables in fetched.values():
            for prepared, table in prepared_tables:
                for k, weight in prepared.stored.items():
                    keys.setdefault(weight, []).append(table.column(f"_c{k}").combine_chunks())
        embedding_keys = {w: pc.unique(pa.concat_arrays(arrays)).sort() for w, arrays in keys.items()}
        dictionaries = dict(self.dictionary_tables)
        for weight, values in embedding_keys.items():
            dictionaries[weight] = pa.table({"value": values, "code": pa.array(np.arange(len(values), dtype=np.int64))})
        for name in self.order:
            if name not in fetched:
                continue
            rows = demand[name]
            result = RelationGrounding(name, pa.table({"_rid": np.arange(rows.shape[0], dtype=np.int64),
                                                       "_global": rows.numpy()}))
            for prepared, table in fetched[name]:
                if table.num_rows == 0:
                    continue
                head = torch.searchsorted(rows, to_tensor(table.column("_head"), torch.int64))
                refs = [torch.searchsorted(demand[ref], to_tensor(table.column(f"_r{j}"), torch.int64))
                        for j, ref in enumerate(prepared.rule.refs)]
                values = {}
                for k in range(prepared.rule.n_columns):
                    column = table.column(f"_c{k}")
                    if k in prepared.stored:
                        codes = pc.index_in(column.combine_chunks(), value_set=embedding_keys[prepared.stored[k]])
                        values[k] = to_tensor(codes, torch.int64)
                    elif k in prepared.coded:
                        values[k] = column_tensor(self._codes(prepared.coded[k], column), prepared.rule, k, embedded=True)
                    else:
                        values[k] = column_tensor(column, prepared.rule, k, embedded=k in ir.coded_columns(prepared.rule),
                                                   edges=prepared.edges.get(k))
                segment_heads, counts = torch.unique_consecutive(head, return_counts=True)
                offsets = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(counts, 0)])
                result.rules.append(RuleGrounding(prepared.rule, head, refs, values, segment_heads, offsets))
            relations[name] = result
        return BatchGrounding(relations, dictionaries, self.feature_stats, rows={n: demand[n] for n in relations},
                              embedding_keys=embedding_keys)


def _typed_dictionary(rows: exp.Expression, kind: exp.DataType) -> exp.Select:
    """A dictionary's (value, code) over the file's rows `rows`: `value` typed as its column, `code` INTEGER."""
    return exp.select(q.alias(exp.Cast(this=q.col("value"), to=kind.copy()), "value"),
                      q.alias(exp.Cast(this=q.col("code"), to=exp.DataType.build("INTEGER")), "code")).from_(rows, copy=False)


def grounding_error(relation: ir.Relation, rule: ir.Rule, err: BaseException, source: str) -> BaseException:
    """The database's error `err` while grounding `rule` as relsql's; Ctrl-C stays an interrupt,
    and a server gone away is named as such (`source`: the database's description)."""
    if interrupted_query(err):
        return KeyboardInterrupt(f"grounding interrupted ({relation.name}, {rule.origin})")
    lost = lost_connection(source, err)
    if lost is not None:
        return lost
    first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    if isinstance(err, duckdb.CatalogException | duckdb.BinderException):
        return SchemaError(f"{relation.name}, {rule.origin}: {first}. Check the table and column names and join conditions.")
    return GroundingError(f"{relation.name}, {rule.origin}: the database could not enumerate the groundings: {first}")


__all__ = ["BatchGrounder", "BatchGrounding", "database_embeddings", "needed_relations"]
