"""Primary and foreign keys for automatic templates: given, declared, else inferred and checked.
Beside the catalog (relsql/data/catalog.py) whose declared keys it completes; it reads the database
only through the `Database` it is handed, and imports no source or template.

Order of authority: keys the user gives (`keys=` / `--keys FILE`, see relsql/data/keyfile.py), then
the catalog's declared keys, then inference. A given primary key replaces the table's; given
foreign keys replace the table's declared ones. A table a given key names (`PRIMARY KEY t(...)`,
`FOREIGN KEY t(...)`) gets no inferred foreign key, as a table that declares foreign keys in the
catalog is taken as it is; only its primary key, when none is given or declared, is still
inferred (a primary key links no tables).
Inference proposes candidates from names the way warehouses write them and the database
confirms them:

- a primary key is a column whose name, less the table's column prefix and a key suffix
  (`_sk`, `key`, `_id`), names its own table (`c_customer_sk` in customer, `d_date_sk` in
  date_dim, `cd_demo_sk` in customer_demographics, `o_orderkey` in orders), unique and never
  NULL; an integer surrogate `_sk` beats a text business `_id`. A table without such a column
  (a fact table) gets the smallest unique, never-NULL set of at most three of its foreign-key
  and identifier columns (lineitem: l_orderkey, l_linenumber), or none;
- a foreign key is a key-like column whose entity, after role words (`sold_`, `bill_`,
  `current_`), names a parent's single-column key or the parent table, also abbreviated
  (`ss_sold_date_sk` ~ `d_date_sk`, `c_current_addr_sk` ~ `ca_address_sk`, `ss_cdemo_sk` ~
  customer_demographics), of the same type family, whose values the parent key contains.
  Candidates are scored (name match, type, containment) and the best parent wins. A column
  that is its own table's whole primary key is a foreign key only as a one-to-one extension:
  named exactly like the parent's key, which names the parent's table better than the child's
  (label_spend(c_customer_sk) -> customer); two tables each keyed by `row_idx` are unrelated.

A candidate parent must be a single-column key; a 1% share of orphan values is tolerated only
when the entity names match exactly (real warehouses have late-arriving rows), a third when the
child column has the very same name as the parent key (below). Every inferred key carries its
evidence (a short text) so the template and `relsql inspect` can say why. Only name-matched
candidates reach the database, one query each.

Real schemas that do not prefix their columns (nycflights13, Lahman) name a key the same in every
table that holds it. So, after the names above:

- a column unique and never NULL in one table, whose very name other tables hold with repeated
  values, most of them found in it, is that table's key (People.playerID, airlines.carrier,
  planes.tailnum) -- before a bare `id` or a weak guess; the table with the most values is home;
- a table still without a key, unique on a pair of such shared columns (text, dates and times,
  integers named like identifiers) that repeats in other tables, is keyed by the pair the most
  tables share (Teams(yearID, teamID), weather(origin, time_hour));
- a child holding every column of a composite primary key by the same names references it;
- "most" (_MOSTLY): at least two thirds of the child's distinct values and of its rows are found,
  in each of the (up to) three largest referencing tables: real data has orphans (a sixth of
  flights name a plane that planes lacks), while unrelated columns that merely share a name
  (`name`, `id`) overlap far less;
- a column named by its role (flights.origin, flights.dest) has no name to match: a text column of
  repeated codes whose values (90% of distinct values and rows, _BY_VALUES) a single-column text
  key of another table holds references it (airports.faa: that table's first column, unique and
  never NULL, becomes its key). Only pairs whose value lengths fit are queried; a child already
  linked to that parent by name gets no second key to it by value.

Integer columns named like identifiers that hold years (`yearID`: within 1800..2100, repeated)
and are in no key are values, not identifiers: `Schema.is_value(table, column)`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from itertools import combinations
from typing import TYPE_CHECKING

import duckdb
import sqlglot.expressions as exp

from relsql.data import keyfile
from relsql.data.catalog import Catalog, ForeignKey, Table, scoped_table
from relsql.data.coltypes import element, is_composite, is_integer, is_interval, is_list, is_nested, is_number
from relsql.errors import SchemaError, SourceError

if TYPE_CHECKING:
    from relsql.data.engine import Database

_SUFFIX_RANK = {"sk": 3, "key": 2, "id": 1}  # a surrogate key before a business key
_GENERIC = {"dim", "dimension", "fact", "facts", "tbl", "table", "lookup"}
_IDENTIFIER_WORDS = {"number", "num", "no", "nr", "line", "linenumber", "seq", "sequence", "sk", "key", "id"}
_EXACT, _ABBREVIATED = 3.0, 2.0
MODEL_OUTPUTS = ("predictions", "gradients", "recommendations")  # kinds of tables a model writes (engine.WRITTEN_KINDS)
_MAX_KEY_COLUMNS = 3  # a composite key of more columns is not worth guessing
_ORPHANS_ALLOWED = 0.01  # a foreign key named exactly like its parent key may miss this share of values
_MOSTLY = 2 / 3  # a reference by the very same column name(s): at least this share of distinct values and rows found
_BY_VALUES = 0.9  # a reference without a name match: at least this share of distinct values and rows found
_YEARS = (1800, 2100)  # a year-like integer column's values lie within these
_YEAR_WORDS = {"year", "yr", "season"}
_SHARED_PAIRS = 12  # composite candidates (column pairs shared by name) whose uniqueness one table's query checks
# an estimated count of distinct values (DuckDB's estimate can be 25% low) at least this share of the rows
# may be unique: count exactly
_ESTIMATE = 0.5


@dataclass
class Schema:
    """The key structure the template generator walks, and where each key came from."""

    tables: dict[str, Table]
    primary_keys: dict[str, tuple[str, ...]]
    foreign_keys: list[tuple[str, ForeignKey]]  # (child table, key)
    inferred_primary: set[str] = field(default_factory=set)
    inferred_foreign: list[tuple[str, ForeignKey]] = field(default_factory=list)
    # ("primary", table) or ("foreign", child, fk) -> "declared", "given in keys.sql line 3", "inferred"
    origins: dict[tuple, str] = field(default_factory=dict)
    evidence: dict[tuple, str] = field(default_factory=dict)  # same keys: why an inferred key was taken
    # per table, integer columns named like identifiers that hold years (`yearID`) and are no key: values, see is_value
    values: dict[str, set[str]] = field(default_factory=dict)
    # tables a model wrote (predictions, gradients, recommendations): left out, never a parent or an input
    outputs: list[str] = field(default_factory=list)
    # declared or given foreign keys over a list column (BIGINT[]: a RelBench link task's destinations): what
    # the list's keys reference (relsql.data.references), never a join (a list does not equal a key)
    list_references: list[tuple[str, ForeignKey]] = field(default_factory=list)

    def leave_out(self, names: list[str]) -> None:
        """Take tables out of the schema, with every key to or from them."""
        for name in names:
            self.tables.pop(name, None)
            self.primary_keys.pop(name, None)
            self.inferred_primary.discard(name)
        self.foreign_keys[:] = [(c, fk) for c, fk in self.foreign_keys if c not in names and fk.table not in names]
        self.inferred_foreign[:] = [(c, fk) for c, fk in self.inferred_foreign if c not in names and fk.table not in names]

    def is_value(self, table: str, column: str) -> bool:
        """Whether `table.column`, though named like an identifier (`yearID`), is a value a model may
        use as a feature: an integer holding years (within 1800..2100, on two or more rows each on
        average) that is no part of a primary, foreign or referenced key."""
        return column in self.values.get(table, ())

    def primary_note(self, table: str) -> str:
        """How `table`'s primary key is known: "declared", "given in ...", "inferred: <evidence>"."""
        return self._note(("primary", table))

    def foreign_note(self, child: str, fk: ForeignKey) -> str:
        return self._note(("foreign", child, fk))

    def _note(self, key: tuple) -> str:
        origin = self.origins.get(key, "declared")
        return f"{origin}: {self.evidence[key]}" if key in self.evidence else origin


def _q(name: str) -> exp.Identifier:
    return exp.to_identifier(name, quoted=True)


def _table(name: str) -> exp.Table:
    return exp.Table(this=_q(name))


def _family(sql_type: str) -> str:
    """number, text, INTERVAL or the type itself; a list's is its elements' (a RelBench link list
    of BIGINT[] references BIGINT keys)."""
    if is_list(sql_type):
        return _family(element(sql_type))
    if is_interval(sql_type):  # a duration, not a number that could be a key ("INT" is in its name)
        return "INTERVAL"
    if is_number(sql_type):
        return "number"
    upper = sql_type.upper()
    if not is_composite(sql_type) and ("CHAR" in upper or "TEXT" in upper or "STRING" in upper):
        return "text"
    return upper


# -- names -------------------------------------------------------------------------------------------------------
def _words(name: str) -> list[str]:
    """`ss_sold_date_sk` → [ss, sold, date, sk]; `CustomerID` → [customer, id]."""
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1 \2", name))
    return [w for w in re.split(r"[^A-Za-z0-9]+", spaced.lower()) if w]


def _singular(word: str) -> str:
    if word.endswith("ies") and len(word) > 4:
        return word[:-3] + "y"
    if word.endswith(("sses", "xes", "ches", "shes")):
        return word[:-2]
    if word.endswith("s") and not word.endswith(("ss", "us", "is")) and len(word) > 3:
        return word[:-1]
    return word


def _table_words(table: str) -> list[str]:
    """A table's name as words, without generic ones (`date_dim` → [date])."""
    words = _words(table)
    return [w for w in words if _singular(w) not in _GENERIC] or words


def _prefix(table: Table) -> str:
    """The short column prefix most of a table's columns share (`ss` in store_sales), or ""."""
    firsts = [w[0] for w in (_words(c.name) for c in table.columns) if len(w) > 1]
    if len(firsts) < 2:
        return ""
    best = max(set(firsts), key=firsts.count)
    initial = _words(table.name)[:1]
    if firsts.count(best) * 10 >= len(table.columns) * 6 and len(best) <= 4 and initial and best[0] == initial[0][0]:
        return best
    return ""


def _key_parts(column: str, prefix: str) -> tuple[list[str], str] | None:
    """(entity words, suffix) of a key-like column name, else None: `ss_sold_date_sk` with prefix
    ss → ([sold, date], sk); `o_custkey` → ([cust], key); `c_id` → ([], id)."""
    words = _words(column)
    if prefix and len(words) > 1 and words[0] == prefix:
        words = words[1:]
    last = words[-1] if words else ""
    if last in _SUFFIX_RANK:
        return words[:-1], last
    if last.endswith("key") and len(last) > 3:
        return [*words[:-1], last[:-3]], "key"
    return None


def _abbreviates(text: str, words: list[str], skip: bool) -> bool:
    """`text` is prefixes of `words` in order (`cdemo` = c(ustomer) + demo(graphics), `addr` =
    addr(ess)); with `skip`, words may be left out (`demo` names customer_demographics)."""
    if len(text) < 3:
        return False

    def fits(i: int, j: int) -> bool:
        if i == len(text):
            return skip or j == len(words)
        if j == len(words):
            return False
        return any(words[j].startswith(text[i:k]) and fits(k, j + 1) for k in range(len(text), i, -1)) \
            or (skip and fits(i, j + 1))

    return fits(0, 0)


def _name_score(entity: list[str], target: list[str], skip: bool) -> float:
    if not entity or not target:
        return 0.0
    if len(entity) == len(target) and all(_singular(a) == _singular(b) for a, b in zip(entity, target)):
        return _EXACT
    return _ABBREVIATED if _abbreviates("".join(entity), target, skip) else 0.0


# -- database checks ---------------------------------------------------------------------------------------------
def _unique_rows(db: Database, table: str, columns: tuple[str, ...]) -> int | None:
    """The row count if `columns` are unique together and never NULL (and there are rows), else None."""
    cols = [exp.column(_q(c)) for c in columns]
    distinct = exp.select(*cols).distinct().from_(_table(table)).where(
        exp.and_(*[exp.Not(this=exp.Is(this=c.copy(), expression=exp.Null())) for c in cols]))
    query = exp.select(exp.Count(this=exp.Star()),
                       exp.select(exp.Count(this=exp.Star()))
                       .from_(exp.alias_(exp.Subquery(this=distinct), _q("d"), table=True)).subquery()
                       ).from_(_table(table))
    total, count = db.scalar(query)
    return int(total) if total and total == count else None


def _containment(db: Database, child: str, columns: tuple[str, ...], parent: str,
                 keys: tuple[str, ...]) -> tuple[int, int, int, int]:
    """(child rows whose `columns` are all non-NULL, how many of them parent's `keys` lack, their distinct
    values, how many of those parent's `keys` lack): one query. The keys are unique in the parent."""
    c = [exp.column(_q(col), table=_q("c")) for col in columns]
    k = [exp.column(_q(key), table=_q("p")) for key in keys]
    found = exp.Not(this=exp.Is(this=k[0].copy(), expression=exp.Null()))

    def distinct():
        return exp.Count(this=exp.Distinct(expressions=[exp.Tuple(expressions=[x.copy() for x in c]) if len(c) > 1
                                                        else c[0].copy()]))

    on = exp.and_(*[exp.EQ(this=a.copy(), expression=b.copy()) for a, b in zip(c, k)])
    query = exp.select(exp.Count(this=exp.Star()), exp.Count(this=k[0].copy()), distinct(),
                       exp.Filter(this=distinct(), expression=exp.Where(this=found))) \
        .from_(exp.alias_(_table(child), _q("c"), table=True)) \
        .join(exp.alias_(exp.Subquery(this=exp.select(*[exp.column(_q(key)) for key in keys]).distinct().from_(_table(parent))),
                         _q("p"), table=True), on=on, join_type="left") \
        .where(exp.and_(*[exp.Not(this=exp.Is(this=x.copy(), expression=exp.Null())) for x in c]))
    present, hits, values, value_hits = db.scalar(query)
    return int(present), int(present - hits), int(values), int(values - value_hits)


def _mostly(found: tuple[int, int, int, int], share: float) -> bool:
    """At least `share` of the rows and of the distinct values were found (and there are some)."""
    present, missing, values, missing_values = found
    return present > 0 and present - missing >= share * present and values - missing_values >= share * values


def _found_text(found: tuple[int, int, int, int]) -> str:
    present, missing, values, missing_values = found
    if not missing:
        return f"all {present:,}"
    return f"{present - missing:,} of {present:,} ({missing:,} missing), {values - missing_values:,} of {values:,} distinct"


def _stats(db: Database, table: str, columns: list[str], lengths: bool = False, approximate: bool = False) -> dict:
    """One query: {"rows": n, column: (non-NULL, distinct[, shortest, longest])} for `columns` (text with
    `lengths`; distinct values estimated with `approximate`)."""
    aggregates = [exp.Count(this=exp.Star())]
    for c in columns:
        col = exp.column(_q(c))
        distinct = exp.ApproxDistinct(this=col.copy()) if approximate else exp.Count(this=exp.Distinct(expressions=[col.copy()]))
        aggregates += [exp.Count(this=col.copy()), distinct]
        if lengths:
            aggregates += [exp.Min(this=exp.Length(this=col.copy())), exp.Max(this=exp.Length(this=col.copy()))]
    row = db.scalar(exp.select(*aggregates).from_(_table(table)))
    width = 4 if lengths else 2
    out = {"rows": int(row[0])}
    for i, c in enumerate(columns):
        out[c] = tuple(row[1 + width * i: 1 + width * (i + 1)])
    return out


def _pair_stats(db: Database, table: str, pairs: list[tuple[str, str]]) -> tuple[int, list[int], dict[str, int]]:
    """One query: rows, estimated distinct values of each pair, non-NULL values of each column."""
    columns = sorted({c for pair in pairs for c in pair})
    aggregates = [exp.Count(this=exp.Star())] + [exp.Count(this=exp.column(_q(c))) for c in columns] + [
        exp.ApproxDistinct(this=exp.Tuple(expressions=[exp.column(_q(a)), exp.column(_q(b))])) for a, b in pairs]
    row = db.scalar(exp.select(*aggregates).from_(_table(table)))
    return int(row[0]), [int(n) for n in row[1 + len(columns):]], dict(zip(columns, (int(n) for n in row[1:1 + len(columns)])))


def _never_null(db: Database, table: str, columns: list[str]) -> list[str]:
    """Those of `columns` without a NULL, in one query."""
    if not columns:
        return []
    counts = [exp.Count(this=exp.Star())] + [exp.Count(this=exp.column(_q(c))) for c in columns]
    row = db.scalar(exp.select(*counts).from_(_table(table)))
    return [c for c, n in zip(columns, row[1:]) if n == row[0]]


# -- the schema --------------------------------------------------------------------------------------------------
def schema(db: Database, catalog: Catalog, infer: bool = True, given: object = None) -> Schema:
    """Keys for the template generator. `given`: keys the user states (a keys file's path, its
    text, a list of tuples; see relsql.data.keyfile), applied after those given to `relsql.connect(
    keys=...)`; they add to the declared keys (a given primary key, or a given foreign key over a
    declared one's columns, replaces it) and stop inference for the tables they name."""
    check_values(db, catalog)
    tables = dict(catalog.tables)
    primary = {name: tuple(t.primary_key) for name, t in tables.items()}
    result = Schema(tables, primary, [(name, fk) for name, t in tables.items() for fk in t.foreign_keys])
    declared = f"declared in {catalog.keys_origin}" if catalog.keys_origin else "declared"
    result.origins.update({("primary", n): declared for n, k in primary.items() if k})
    result.origins.update({("foreign", c, fk): declared for c, fk in result.foreign_keys})
    trusted = {child for child, _ in result.foreign_keys}  # a table that declares foreign keys is taken as it is
    stated = [g for g in (getattr(db, "given_keys", None), keyfile.load(given)) if g is not None]
    stated = [keyfile.resolve(g, {n: t.column_names for n, t in tables.items()}) for g in stated]
    pending = _apply_given(result, stated)
    trusted |= {key.table for keys in stated for key in keys.keys}  # given keys replace inference for their tables
    for source, key in pending:  # before any query runs; `REFERENCES parent` alone is checked once resolved
        if key.references:
            _check_types(result, key.table, ForeignKey(key.columns, key.parent, key.references), f"given in {source.where(key)}")
    for child, fk in result.foreign_keys:
        _check_types(result, child, fk, result.foreign_note(child, fk))
    result.outputs = _model_outputs(db, tables)
    result.leave_out(result.outputs)  # a model's predictions are keyed like its target: they would pass for a parent
    if infer:
        _infer_primary(db, result)
        _infer_shared_pairs(db, result)
    _resolve_pending(result, pending)
    result.leave_out(result.outputs)  # a given key to or from one
    _set_aside_lists(result)
    for child, fk in result.foreign_keys:
        _check_types(result, child, fk, result.foreign_note(child, fk))
    if infer:
        roles = _infer_foreign(db, result, trusted)
        _infer_composite_foreign(db, result, trusted)
        _infer_by_values(db, result, trusted)
        _infer_composite(db, result, roles)
        _infer_counted(db, result)
        _infer_row_identifier(db, result)
    result.values = _year_values(db, result)
    return result


def _model_outputs(db: Database, tables: dict) -> list[str]:
    """The tables among `tables` that relsql wrote as a model's output (their marks read in one
    query where the handle can: `Database.written_kinds`)."""
    every = getattr(db, "written_kinds", None)
    if callable(every):
        kinds = every()
        return [name for name in tables if kinds.get(name) in MODEL_OUTPUTS]
    written = getattr(db, "written_kind", None)
    return [name for name in tables if callable(written) and written(name) in MODEL_OUTPUTS]


def _apply_given(result: Schema, stated: list[keyfile.GivenKeys]) -> list[tuple[keyfile.GivenKeys, keyfile.GivenKey]]:
    """Given primary keys replace the table's; given foreign keys add to the declared ones, as
    `ALTER TABLE ... ADD FOREIGN KEY` would, replacing only a declared key over the same columns (a
    keys file that adds a self-reference keeps the table's declared keys to its parents). A
    referenced parent without a key is keyed by the referenced columns.
    Returns the given foreign keys, resolved once every primary key is known."""
    pending = []
    for given in stated:
        for key in given.primary:
            result.primary_keys[key.table] = key.columns
            result.origins[("primary", key.table)] = f"given in {given.where(key)}"
        restated = {(key.table, key.columns) for key in given.foreign}
        result.foreign_keys = [(c, fk) for c, fk in result.foreign_keys if (c, fk.columns) not in restated]
        pending.extend((given, key) for key in given.foreign)
    for given, key in pending:
        if key.references and not result.primary_keys.get(key.parent):
            result.primary_keys[key.parent] = key.references
            result.origins[("primary", key.parent)] = f"given in {given.where(key)}, referenced by {key.table}"
    return pending


def _resolve_pending(result: Schema, pending: list[tuple[keyfile.GivenKeys, keyfile.GivenKey]]) -> None:
    """Add the given foreign keys; `REFERENCES parent` alone means the parent's primary key."""
    for given, key in pending:
        references = key.references or result.primary_keys.get(key.parent, ())
        if len(references) != len(key.columns):
            raise SchemaError(f"{given.where(key)}: `{key.parent}` has no {len(key.columns)}-column primary key for "
                              f"{key.table}({', '.join(key.columns)}) to reference; write REFERENCES "
                              f"{key.parent}(<column>) or give {key.parent} a PRIMARY KEY")
        fk = ForeignKey(key.columns, key.parent, references)
        if (key.table, fk) not in result.foreign_keys:
            result.foreign_keys.append((key.table, fk))
            result.origins[("foreign", key.table, fk)] = f"given in {given.where(key)}"


def _set_aside_lists(result: Schema) -> None:
    """Move foreign keys over a list column out of the joins into `list_references`: joining a
    list to a key fails in the engine (BIGINT[] = BIGINT), and such a list is a ranking target's
    candidates, which relsql.data.references reads from here."""
    def listed(child: str, fk: ForeignKey) -> bool:
        table = result.tables.get(child)
        return table is not None and any(c in table.column_names and is_nested(table.column(c).type) for c in fk.columns)

    found = [(c, fk) for c, fk in result.foreign_keys if listed(c, fk)]
    if found:
        result.list_references = found
        result.foreign_keys[:] = [(c, fk) for c, fk in result.foreign_keys if (c, fk) not in found]


def _comparable(sql_type: str) -> str:
    """What a value can be compared with without a cast that may fail: dates with timestamps,
    numbers with numbers, text with text; anything else only with its own type."""
    family = _family(sql_type)
    return "time" if family.startswith(("DATE", "TIMESTAMP")) else family


def _check_types(result: Schema, child: str, fk: ForeignKey, where: str) -> None:
    """A foreign key whose columns cannot be compared with its parent's (text with numbers) would
    fail inside the first join with a cast error: refuse it before any query runs, by name."""
    parent = result.tables.get(fk.table)
    if parent is None or child not in result.tables:
        return
    pairs = [(result.tables[child].column(c), parent.column(r)) for c, r in zip(fk.columns, fk.references)
             if c in result.tables[child].column_names and r in parent.column_names]
    wrong = [(c, r) for c, r in pairs if _comparable(c.type) != _comparable(r.type)]
    if wrong:
        shown = "; ".join(f"{child}.{c.name} is {c.type}, {fk.table}.{r.name} is {r.type}" for c, r in wrong)
        raise SchemaError(f"foreign key {child}({', '.join(fk.columns)}) -> {fk.table}({', '.join(fk.references)}) "
                          f"({where}): column types do not match ({shown}); give columns of matching types (a view "
                          "casting one side) or leave this key out")


def _infer_primary(db: Database, result: Schema) -> None:
    """A single column named after its own table, unique and never NULL; best-named first. Next, a
    column unique here whose name other tables share (and whose values they mostly hold): the key
    they reference (`playerID` in People, `carrier` in airlines). Last, a bare `id` or a weak guess."""
    words = {name: _table_words(name) for name in result.tables}
    shared = _shared_references(db, result)
    for name, table in result.tables.items():
        if result.primary_keys[name]:
            continue
        strong, weak = [], []
        for _score, column, why, named in _primary_candidates(table, words):
            (strong if named else weak).append((column.name, why, None))
        reference = [(shared[name][0], shared[name][1], shared[name][2])] if name in shared else []
        for column, why, rows in strong + reference + weak:
            rows = rows if rows is not None else _unique_rows(db, name, (column,))
            if rows is not None:
                _infer_key(result, name, (column,), f"{why}; unique and never NULL in {rows:,} row{'s' * (rows != 1)}")
                break


def _single_key_part(column) -> bool:
    """Text, or an integer named like an identifier: what a key shared by name holds (never a float, a
    time, a list, a count such as `G` or `AB` that box-score tables share)."""
    return not is_nested(column.type) and (_family(column.type) == "text"
                                         or (is_integer(column.type) and _key_parts(column.name, "") is not None))


def _shared_references(db: Database, result: Schema) -> dict[str, tuple[str, str, int]]:
    """{table: (column, evidence, rows)} for a table without a key whose column is unique and never NULL
    there, while other tables hold a column of the very same name (case aside) with repeated values
    most of which (a share of _MOSTLY of rows and distinct values) it contains: many rows referencing
    one; the (up to) three largest such tables must all agree. The table holding the most distinct
    values is the column's home; two tables each unique on a shared `id` or `row_idx` reference
    nothing. One statistics query per table with shared columns (distinct values estimated; a column
    that may be unique is counted exactly), then at most three containment queries per candidate."""
    by_name: dict[str, list[tuple[str, str]]] = {}
    for name, table in result.tables.items():
        for c in table.columns:
            if _single_key_part(c):
                by_name.setdefault(c.name.casefold(), []).append((name, c.name))
    shared = {n: places for n, places in by_name.items() if len({t for t, _ in places}) > 1}
    homes = {t for places in shared.values() for t, _ in places if not result.primary_keys[t]}
    if not homes:
        return {}
    columns: dict[str, list[str]] = {}
    for places in shared.values():
        if any(t in homes for t, _ in places):
            for t, c in places:
                columns.setdefault(t, []).append(c)
    stats = {t: _stats(db, t, cs, approximate=True) for t, cs in columns.items()}
    exact: dict[tuple[str, str], bool] = {}

    def unique(t: str, c: str) -> bool:
        """Never NULL and (estimated) unique, then checked exactly."""
        rows, (present, distinct) = stats[t]["rows"], stats[t][c]
        if not rows or present != rows or distinct < _ESTIMATE * rows:
            return False
        if (t, c) not in exact:
            exact[t, c] = _unique_rows(db, t, (c,)) is not None
        return exact[t, c]

    found: dict[str, list[tuple]] = {}
    for places in shared.values():
        if not any(t in homes for t, _ in places) or not all(t in stats for t, _ in places):
            continue
        unique_here = sorted([(stats[t][c][1], t, c) for t, c in places if unique(t, c)], reverse=True)
        if not unique_here or (len(unique_here) > 1 and unique_here[0][0] == unique_here[1][0]):
            continue
        _, home, column = unique_here[0]
        if home not in homes:
            continue
        family = _comparable(result.tables[home].column(column).type)
        referencing = sorted([(stats[t]["rows"], t, c) for t, c in places if t != home and not unique(t, c) and stats[t][c][0]
                              and _comparable(result.tables[t].column(c).type) == family], reverse=True)
        first = None
        for _, child, child_column in referencing[:3]:  # the largest referencing tables must all agree
            contained = _containment(db, child, (child_column,), home, (column,))
            if not _mostly(contained, _MOSTLY):
                first = None
                break
            first = first or (child, child_column, contained)
        if first is None:
            continue
        child, child_column, contained = first
        why = (f"references: {column} is unique here and named alike in {len(referencing)} other "
               f"table{'s' * (len(referencing) != 1)} ({', '.join(t for _, t, _ in referencing[:3])}"
               f"{', ...' if len(referencing) > 3 else ''}); {_found_text(contained)} non-NULL values of "
               f"{child}.{child_column} found here")
        found.setdefault(home, []).append((-len(referencing), _key_parts(column, "") is None,
                                           result.tables[home].column_names.index(column), column, why))
    return {t: (f[0][3], f[0][4], stats[t]["rows"]) for t, f in ((t, sorted(f)) for t, f in found.items())}


def _primary_candidates(table: Table, words: dict[str, list[str]]) -> list[tuple[float, object, str]]:
    """(score, column, evidence, named) of key-like columns, best first: named after the table (exactly,
    then abbreviated), integer before text, `_sk` before `key` before `_id`; last, as a weak
    guess, key-like columns that name no other table (those look like foreign keys). `named`: the
    column's entity names the table (not a bare `id`, not a guess)."""
    prefix, own = _prefix(table), words[table.name]
    found = []
    for position, column in enumerate(table.columns):
        parts = _key_parts(column.name, prefix)
        if parts is None:
            continue
        entity, suffix = parts
        score = _EXACT if not entity else _name_score(entity, own, skip=True)
        if score:
            why = f"names: {column.name} names its table {table.name}" + (f" (entity {' '.join(entity)})" if entity else "")
        elif not any(_name_score(entity, w, skip=False) for other, w in words.items() if other != table.name):
            score, why = 1.0, f"names: {column.name} is the first key-like column (it names no table)"
        else:
            continue
        found.append((-score, not is_integer(column.type), -_SUFFIX_RANK[suffix], position, column, why,
                      bool(entity) and score > 1))
    found.sort(key=lambda f: f[:4])
    return [(-f[0], f[4], f[5], f[6]) for f in found]


def _infer_foreign(db: Database, result: Schema, trusted: set[str]) -> dict[tuple[str, str], int]:
    """For each key-like column of a table without declared foreign keys, not already in a
    given one, the best scoring parent key that contains its values. Returns how many role words each inferred
    key's column has (`ss_sold_date_sk`: 1), which a composite key prefers to avoid."""
    roles: dict[tuple[str, str], int] = {}
    words = {name: _table_words(name) for name in result.tables}
    parents = [(p, key[0], result.tables[p].column(key[0]), _prefix(result.tables[p]))
               for p, key in result.primary_keys.items() if len(key) == 1]
    for child, table in result.tables.items():
        if child in trusted:
            continue
        prefix = _prefix(table)
        stated = {c for other, fk in result.foreign_keys if other == child for c in fk.columns}  # given ones stay
        for column in table.columns:
            if column.name in stated or is_nested(column.type):  # a list of keys is no foreign key (a ranking target's)
                continue
            candidates = parents
            if result.primary_keys[child] == (column.name,):
                candidates = _extended(child, column.name, prefix, parents, words)
                if not candidates:
                    continue
            best = _best_parent(db, child, column, prefix, candidates, words)
            if best is not None:
                fk, evidence, roles[child, column.name] = best
                _infer_reference(result, child, fk, evidence)
    return roles


def _extended(child: str, column: str, prefix: str, parents: list, words: dict[str, list[str]]) -> list:
    """The parents a table's whole primary key `column` may extend one-to-one. A shared name is no
    evidence (two tables each keyed by `row_idx` or `id` are unrelated); the extension needs the
    parent's key named exactly alike AND naming the parent's table better than the child's
    (label_spend(c_customer_sk) extends customer(c_customer_sk): `customer` is named, `label_spend` is not)."""
    own = _names_table(column, prefix, words[child])
    return [p for p in parents if p[0] != child and p[1].casefold() == column.casefold()
            and _names_table(p[1], p[3], words[p[0]]) > own]


def _names_table(column: str, prefix: str, table_words: list[str]) -> float:
    """How well a key-like column's entity names a table (0 when it has no entity: `id`, `row_idx`)."""
    parts = _key_parts(column, prefix)
    return _name_score(parts[0], table_words, skip=True) if parts else 0.0


def _best_parent(db, child, column, prefix, parents, words) -> tuple[ForeignKey, str, int] | None:
    """The parent whose key scores best: name + type + the share of values it contains."""
    scored = []
    for parent, key, pcol, pprefix in parents:
        if (parent == child and column.name == key) or _family(column.type) != _family(pcol.type):
            continue
        name, why, roles = _foreign_name_score(column.name, prefix, key, pprefix, words[parent])
        if name:
            scored.append((name + (0.5 if column.type == pcol.type else 0.25), name, why, roles, parent, key, pcol))
    best = None
    for score, name, why, roles, parent, key, pcol in sorted(scored, key=lambda s: -s[0]):
        if best is not None and score + 1 <= best[0]:
            break  # containment adds at most 1: this one cannot win
        found = _containment(db, child, (column.name,), parent, (key,))
        present, missing = found[:2]
        allowed = present * _ORPHANS_ALLOWED if name >= _EXACT else 0
        if present == 0 or (missing > allowed and not (why == "same name" and _mostly(found, _MOSTLY))):
            continue  # the very same name may miss a third (real data has orphans), an entity 1%, an abbreviation none
        total = score + (present - missing) / present
        if best is None or total > best[0]:
            text = (f"names: {column.name} ~ {key} ({why}); types {column.type}, {pcol.type}; {_found_text(found)} "
                    f"non-NULL values found in {parent}.{key}")
            best = (total, ForeignKey((column.name,), parent, (key,)), text, roles)
    return None if best is None else best[1:]


def _foreign_name_score(column: str, prefix: str, key: str, key_prefix: str,
                        parent_words: list[str]) -> tuple[float, str, int]:
    """(score, why, role words): how well a child column names a parent key: the same name;
    else its entity, after leading role words, equals or abbreviates the key's entity or the
    parent table's name."""
    if column.lower() == key.lower():
        return _EXACT, "same name", 0
    parts, target = _key_parts(column, prefix), _key_parts(key, key_prefix)
    if parts is None or not parts[0]:
        return 0.0, "", 0
    entity = parts[0]
    targets = [t for t in ((target[0] if target else []), parent_words) if t]
    best, why, role_words = 0.0, "", 0
    for roles in range(len(entity)):
        for words in targets:
            score = _name_score(entity[roles:], words, skip=False)
            if score and score - 0.1 * roles > best:
                best, role_words = score - 0.1 * roles, roles
                why = f"entity {' '.join(entity[roles:])}" + (f" ~ {' '.join(words)}" if score < _EXACT else "") \
                    + (f", role {' '.join(entity[:roles])}" if roles else "")
    return best, why, role_words


def _pair_part(column) -> bool:
    """A column that can be half of a composite key shared by name: text, a date or time, or an integer
    named like an identifier (`yearID`); never a float or a plain count."""
    family = _comparable(column.type)
    return not is_nested(column.type) and (family in ("text", "time")
                                         or (is_integer(column.type) and _key_parts(column.name, "") is not None))


def _infer_shared_pairs(db: Database, result: Schema) -> None:
    """A table still without a key, unique and never NULL on two columns that other tables share by name
    and whose pairs of values repeat there, most of them (_MOSTLY) found here, in each of the (up to)
    three largest such tables: the pair they reference
    (Teams(yearID, teamID) from Batting, Salaries, ...; weather(origin, time_hour) from flights). Pairs
    shared by more tables are tried first; one query estimates a table's _SHARED_PAIRS best pairs' distinct
    values, and those that may be unique are counted exactly."""
    names = {t: {c.name.casefold(): c for c in table.columns if _pair_part(c)} for t, table in result.tables.items()}
    sizes = {t: table.rows for t, table in result.tables.items()}  # the catalog's row counts: an order, not a proof
    for name, table in result.tables.items():
        if result.primary_keys[name]:
            continue
        mine = [c for c in table.columns if c.name.casefold() in names[name]]
        pairs = []
        for a, b in combinations(mine, 2):
            fa, fb = a.name.casefold(), b.name.casefold()
            others = [t for t in result.tables if t != name and fa in names[t] and fb in names[t]
                      and _comparable(names[t][fa].type) == _comparable(a.type)
                      and _comparable(names[t][fb].type) == _comparable(b.type)]
            if others:
                pairs.append((-len(others), mine.index(a), mine.index(b), (a.name, b.name), others))
        if not pairs:
            continue
        pairs = sorted(pairs)[:_SHARED_PAIRS]
        rows, distinct, present = _pair_stats(db, name, [p[3] for p in pairs])
        for (_, _, _, (a, b), others), count in zip(pairs, distinct):
            if not rows or count < _ESTIMATE * rows or present[a] != rows or present[b] != rows:
                continue
            if _unique_rows(db, name, (a, b)) is None:
                continue
            confirmed = None
            for other in sorted(others, key=lambda t: -sizes[t])[:3]:  # the largest referencing tables must all agree
                ca, cb = names[other][a.casefold()].name, names[other][b.casefold()].name
                contained = _containment(db, other, (ca, cb), name, (a, b))
                if not (contained[0] > contained[2] and _mostly(contained, _MOSTLY)):  # repeated there: many rows, one here
                    confirmed = None
                    break
                confirmed = confirmed or (other, contained)
            if confirmed is None:
                continue
            other, contained = confirmed
            _infer_key(result, name, (a, b), (
                f"references: ({a}, {b}) is unique and never NULL here ({rows:,} rows) and named alike in {len(others)} other "
                f"table{'s' * (len(others) != 1)} ({', '.join(others[:3])}{', ...' if len(others) > 3 else ''}); "
                f"{_found_text(contained)} non-NULL pairs of {other} found here"))
            break


def _infer_composite_foreign(db: Database, result: Schema, trusted: set[str]) -> None:
    """A table (not one taken as it is) holding every column of another table's composite primary key,
    by the very same names: a foreign key when most (_MOSTLY) of its rows' and distinct tuples' values
    are found there. One query per candidate."""
    for parent, key in list(result.primary_keys.items()):
        if len(key) < 2:
            continue
        ptable = result.tables[parent]
        for child, table in result.tables.items():
            if child == parent or child in trusted:
                continue
            folded = {c.name.casefold(): c for c in table.columns}
            if not all(k.casefold() in folded for k in key):
                continue
            columns = tuple(folded[k.casefold()].name for k in key)
            if any(_comparable(folded[k.casefold()].type) != _comparable(ptable.column(k).type) for k in key):
                continue
            if any(fk.columns == columns for c, fk in result.foreign_keys if c == child):
                continue
            contained = _containment(db, child, columns, parent, key)
            if not _mostly(contained, _MOSTLY):
                continue
            _infer_reference(result, child, ForeignKey(columns, parent, key), (
                f"names: ({', '.join(columns)}) ~ {parent}'s primary key (same names); {_found_text(contained)} "
                f"non-NULL rows' values found in {parent}({', '.join(key)})"))


def _infer_by_values(db: Database, result: Schema, trusted: set[str]) -> None:
    """Codes named by their role, not their parent (flights.origin, flights.dest -> airports.faa): a text
    column of repeated short codes (at most half as many values as rows, at least two) whose values
    (_BY_VALUES of distinct values and rows) a single-column text key of another table holds: its
    primary key, or, for a table without one, its first column when unique and never NULL (then that
    becomes its key). Only pairs whose value lengths fit are queried, one query each; a child already
    linked to that parent by name, and a column already in a single-column foreign key, are left alone."""
    parents: dict[str, str] = {}
    for name, table in result.tables.items():
        key = result.primary_keys[name]
        if len(key) == 1 and _family(table.column(key[0]).type) == "text":
            parents[name] = key[0]
        elif not key and table.columns and _family(table.columns[0].type) == "text" and not is_nested(table.columns[0].type):
            parents[name] = table.columns[0].name  # a candidate, if unique
    if not parents:
        return
    single = {(c, fk.columns[0]) for c, fk in result.foreign_keys if len(fk.columns) == 1}
    linked = {(c, fk.table) for c, fk in result.foreign_keys}
    children: dict[str, list[str]] = {}
    for name, table in result.tables.items():
        if name in trusted:
            continue
        cols = [c.name for c in table.columns
                if _family(c.type) == "text" and not is_nested(c.type) and (name, c.name) not in single
                and result.primary_keys[name] != (c.name,)]
        if cols:
            children[name] = cols
    stats = {t: _stats(db, t, sorted(set(children.get(t, [])) | ({parents[t]} if t in parents else set())), lengths=True,
                       approximate=True) for t in set(children) | set(parents)}  # a first guess: which pairs to query
    keys = {}
    for p, k in parents.items():
        exact = stats[p] if result.primary_keys[p] else _stats(db, p, [k], lengths=True)  # a candidate must be unique
        rows, (present, distinct, shortest, longest) = exact["rows"], exact[k]
        if rows and present == rows and (result.primary_keys[p] or distinct == rows):
            keys[p] = (k, rows, shortest, longest)
    for child, cols in children.items():
        rows = stats[child]["rows"]
        for column in cols:
            present, distinct, shortest, longest = stats[child][column]
            if distinct < 2 or 2 * distinct > present:
                continue  # not a code: values on a row or two each (names, ids of this table's own rows)
            distinct = min(distinct, present)
            best = None
            for parent, (key, values, kshort, klong) in keys.items():
                if parent == child or (child, parent) in linked or distinct > values or shortest < kshort or longest > klong:
                    continue
                contained = _containment(db, child, (column,), parent, (key,))
                if _mostly(contained, _BY_VALUES):
                    share = (contained[2] - contained[3]) / contained[2]
                    if best is None or share > best[0]:
                        best = (share, parent, key, contained)
            if best is None:
                continue
            _, parent, key, contained = best
            if not result.primary_keys[parent]:
                _infer_key(result, parent, (key,), f"references: {key}, its first column, is unique and never NULL "
                                                   f"({stats[parent]['rows']:,} rows) and holds the codes of {child}.{column}")
            _infer_reference(result, child, ForeignKey((column,), parent, (key,)), (
                f"values: {column} holds {contained[2]:,} codes on {rows:,} rows; {_found_text(contained)} non-NULL values "
                f"found in {parent}.{key} (no name match: at least {_BY_VALUES:.0%} needed)"))


def _year_values(db: Database, result: Schema) -> dict[str, set[str]]:
    """Per table, its integer columns named like identifiers and after years (`yearID`, `season_id`) that
    are in no key (primary, foreign or referenced) and hold years: within _YEARS, on two or more rows each
    on average. One query per table with such a column; none for most schemas."""
    keyed = {name: set(key) for name, key in result.primary_keys.items()}
    for child, fk in result.foreign_keys:
        keyed.setdefault(child, set()).update(fk.columns)
        keyed.setdefault(fk.table, set()).update(fk.references)
    out: dict[str, set[str]] = {}
    for name, table in result.tables.items():
        candidates = [c.name for c in table.columns if is_integer(c.type) and c.name not in keyed.get(name, set())
                      and _key_parts(c.name, "") is not None and _YEAR_WORDS & set(_words(c.name))]
        if not candidates:
            continue
        aggregates = [exp.Count(this=exp.Star())]
        for c in candidates:
            col = exp.column(_q(c))
            aggregates += [exp.Min(this=col.copy()), exp.Max(this=col.copy()), exp.Count(this=col.copy()),
                           exp.Count(this=exp.Distinct(expressions=[col.copy()]))]
        row = db.scalar(exp.select(*aggregates).from_(_table(name)))
        for i, c in enumerate(candidates):
            low, high, present, distinct = row[1 + 4 * i: 5 + 4 * i]
            if present and _YEARS[0] <= low and high <= _YEARS[1] and 2 * distinct <= present:
                out.setdefault(name, set()).add(c)
    return out


def _infer_composite(db: Database, result: Schema, roles: dict[tuple[str, str], int]) -> None:
    """A table still without a key (a fact or link table): the smallest unique, never-NULL set of
    its foreign-key and identifier columns, at most three, preferring a foreign key with a line
    or ticket number; else it stays without one."""
    for name, table in result.tables.items():
        if result.primary_keys[name]:
            continue
        units = list(dict.fromkeys(fk.columns for child, fk in result.foreign_keys if child == name))
        in_units = {c for unit in units for c in unit}
        if not units:
            continue
        identifiers = [c.name for c in table.columns if c.name not in in_units and _identifier(c)]
        solid = set(_never_null(db, name, sorted(in_units | set(identifiers))))
        units = [u for u in units if set(u) <= solid] + [(c,) for c in identifiers if c in solid]
        role_words = {c: roles.get((name, c), 0) for unit in units for c in unit}
        for columns in _composite_candidates(units, set(identifiers), role_words):
            rows = _unique_rows(db, name, columns)
            if rows is not None:
                _infer_key(result, name, columns, f"no column names {name}; ({', '.join(columns)}) is the smallest unique, "
                                                  f"never-NULL set of its foreign-key and identifier columns ({rows:,} rows)")
                break


def _infer_key(result: Schema, table: str, columns: tuple[str, ...], evidence: str) -> None:
    """Take `columns` as `table`'s inferred primary key, with the evidence `relsql inspect` shows."""
    result.primary_keys[table] = columns
    result.inferred_primary.add(table)
    result.origins[("primary", table)] = "inferred"
    result.evidence[("primary", table)] = evidence


def _infer_reference(result: Schema, child: str, fk: ForeignKey, evidence: str) -> None:
    """Take `fk` as an inferred foreign key of `child`, with its evidence."""
    result.foreign_keys.append((child, fk))
    result.inferred_foreign.append((child, fk))
    result.origins[("foreign", child, fk)] = "inferred"
    result.evidence[("foreign", child, fk)] = evidence


_ROW_WORDS = {"idx", "index", "rowid", "row", "id"}
# an integer that counts a row's repeats within its foreign keys: a player's second spell with a team
# in a season (Lahman's batting.stint), a half season, a round
_COUNTER_WORDS = {"stint", "seq", "sequence", "round", "half", "split", "part", "version", "period", "occurrence", "instance"}


def _infer_counted(db: Database, result: Schema) -> None:
    """A table still without a key whose foreign keys become unique with one counter column added
    (batting: (playerID, yearID, teamID, stint)): that set, of at most four columns."""
    for name, table in result.tables.items():
        if result.primary_keys[name]:
            continue
        units = list(dict.fromkeys(fk.columns for child, fk in result.foreign_keys if child == name))
        counters = [c.name for c in table.columns
                    if is_integer(c.type) and _words(c.name) and _words(c.name)[-1] in _COUNTER_WORDS
                    and not any(c.name in unit for unit in units)]
        if not units or not counters:
            continue
        candidates = []
        for size in range(1, len(units) + 1):
            for combo in combinations(units, size):
                columns = tuple(c for unit in combo for c in unit)
                if len(columns) < _MAX_KEY_COLUMNS + 1:
                    candidates += [(len(columns), columns + (counter,)) for counter in counters]
        for _, columns in sorted(candidates, key=lambda c: c[0]):
            if len(_never_null(db, name, list(columns))) != len(columns):
                continue
            rows = _unique_rows(db, name, columns)
            if rows is not None:
                _infer_key(result, name, columns, f"its foreign keys ({', '.join(columns[:-1])}) with the counter "
                                                  f"{columns[-1]} are unique and never NULL in {rows:,} rows")
                break


def _infer_row_identifier(db: Database, result: Schema) -> None:
    """Last, a table still without a key whose column numbers its rows (`row_idx`, `index`, `id`),
    unique and never NULL, is keyed by it: a generator's or a dump's own row numbers. (What its
    other columns reference stays unknown where no name says which table: `foreign_row_0`.)"""
    for name, table in result.tables.items():
        if result.primary_keys[name]:
            continue
        for column in table.columns:
            words = _words(column.name)
            if not words or words[-1] not in _ROW_WORDS or is_nested(column.type) or \
                    not (is_integer(column.type) or _family(column.type) == "text"):
                continue
            rows = _unique_rows(db, name, (column.name,))
            if rows is not None:
                _infer_key(result, name, (column.name,), f"{column.name} numbers the rows: unique and never NULL in "
                                                         f"{rows:,} row{'s' * (rows != 1)}, and no other key was found")
                break


def _identifier(column) -> bool:
    """An integer column that numbers things (`l_linenumber`, `ss_ticket_number`, `seq`, `..._id`)."""
    words = _words(column.name)
    return is_integer(column.type) and bool(words) and (
        words[-1] in _IDENTIFIER_WORDS or words[-1].endswith(("number", "key")) or _key_parts(column.name, "") is not None)


def _composite_candidates(units: list[tuple[str, ...]], identifiers: set[str],
                          role_words: dict[str, int]) -> list[tuple[str, ...]]:
    """Sets of units with at most three columns: fewest columns first, then those pairing a
    foreign key with an identifier (an order's line number), then those of foreign keys without
    role words (an order's item, not its return time), then in column order."""
    found = []
    for size in range(1, min(len(units), _MAX_KEY_COLUMNS) + 1):
        for combo in combinations(range(len(units)), size):
            columns = tuple(c for i in combo for c in units[i])
            if len(columns) <= _MAX_KEY_COLUMNS:
                mixed = any(c in identifiers for c in columns) and any(c not in identifiers for c in columns)
                found.append((len(columns), not mixed, sum(role_words.get(c, 0) for c in columns), combo, columns))
    found.sort(key=lambda f: f[:4])
    return [f[4] for f in found]


# -- values SQLite stores against their declared type ----------------------------------------------------------
def check_values(db: Database, catalog: Catalog) -> None:
    """SQLite stores any value in any column, and DuckDB reads a column by its declared type: text
    in an INTEGER column fails every query that reads it. Read each table's columns once (one
    count per table) and name the first column DuckDB cannot read, before a template or a key
    inference trips over it. Other sources enforce their types: nothing to check."""
    if catalog.kind != "sqlite":
        return
    for table in catalog:
        problem = _unreadable(db, table.name, table.column_names) if table.columns else ""
        if not problem:
            continue
        shown = f"table {table.name}"
        for column in table.columns:
            found = _unreadable(db, table.name, [column.name])
            if found:
                shown, problem = f"column {table.name}.{column.name} (declared {column.type})", found
                break
        raise SourceError(f"{catalog.source}: {shown} holds values DuckDB cannot read as that type ({problem}); SQLite "
                          "does not enforce column types: store values of the declared type there (or NULL), or give "
                          "relsql a copy whose column has the type of its values")


def _unreadable(db: Database, table: str, columns: list[str]) -> str:
    """DuckDB's complaint reading `columns` of `table` (one count each), or "" when they read."""
    scope = db.table_scopes().get(table)
    source = scoped_table(table, scope) if scope else exp.Table(this=exp.to_identifier(table, quoted=True))
    query = exp.select(*[exp.Count(this=exp.column(exp.to_identifier(c, quoted=True))) for c in columns]).from_(source)
    try:
        db.scalar(query)
    except duckdb.Error as err:
        return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return ""
