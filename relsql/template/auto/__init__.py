"""Automatic SQL templates from a schema's keys: `relsql template <db> --target t.c`.

The generated file is plain relsql SQL a user can read and edit. Its shape is the computation
tree of a relational GNN rooted at the target row: every table reachable within `hops`
foreign-key steps (both directions, never straight back over the edge just used) becomes a
tree node keyed by (target row, node row); nodes are filled top-down, then their values flow
bottom-up, with separate weights per foreign key and direction and a self term at each node.

Keying nodes by the target row is what lets `time_column` keep each target's future out: a row
joins the tree only if it is earlier than that target row's time. Tables whose time cannot be
determined are split by how they are reached:
- as child rows (one-to-many: events, such as sales of a customer), they are LEFT OUT, with
  their subtrees, and listed in the header: new rows arrive over time, and nothing says which
  came after the target row's time. `timeless="include"` joins them anyway (unfiltered).
- as a parent row (many-to-one: attributes, such as the item of a sale or the store), they are
  joined: one row describing an entity, not events accumulating after the target time. (A
  parent updated in place can still hold later values; the template cannot see that.)

The package, by job (each module's docstring says more), from the bottom up:
- names.py: quoted identifiers and the relation and weight names handed out, never twice;
- columns.py: what a column's type and name say (a time, a duration, an identifier);
- options.py: `Options`, generate's options checked once, and the aggregation terms;
- times.py: each table's time and how two times compare;
- paths.py: the walk over the foreign-key paths (the computation tree);
- cuts.py: what the walk leaves out (events of an unknown time, hubs, multiplying and empty paths);
- draft.py: what the statements being written share;
- encoders.py: each table's encoder of its own columns (ple, calendar, embeddings, text);
- layers.py: the message-passing statements over the tree and the prediction;
- ranking.py: a ranking target's two towers;
- scope.py: the target and the schema, checked against the database;
- header.py: the header, listing what was left out and why;
- here: `generate`, the public entry.
"""

from __future__ import annotations

import re

import sqlglot.expressions as exp

from relsql import arguments, cores
from relsql import sql as q
from relsql.data.coltypes import is_interval
from relsql.data.duckdb import engine_threads
from relsql.data.engine import Database
from relsql.targets import output_units
from relsql.template.auto import encoders, header, layers
from relsql.template.auto.columns import id_like, label_kind
from relsql.template.auto.cuts import Pruning, Sizes
from relsql.template.auto.draft import Draft
from relsql.template.auto.header import HEADER, is_automatic
from relsql.template.auto.labels import label_scale
from relsql.template.auto.names import Names, distinct, safe
from relsql.template.auto.options import AGGREGATIONS, LAYERS, NUMBERS, RANKING_AGGREGATION, TIMELESS, Options, aggregation_terms
from relsql.template.auto.paths import keyed, tree, walk
from relsql.template.auto.ranking import Ranking, ranking_header
from relsql.template.auto.scope import Scope, scope
from relsql.template.auto.times import Time, before, seconds, table_times, time_kind

__all__ = ["AGGREGATIONS", "HEADER", "LAYERS", "NUMBERS", "RANKING_AGGREGATION", "TIMELESS", "Options", "Time",
           "aggregation_terms", "before", "generate", "id_like", "is_automatic", "is_interval", "seconds", "table_times",
           "time_kind", "write"]


def generate(db: Database, target: str, *, hops: int = 2, width: int = 16, aggregation=None,
             time_column: str | None = None, time_columns: dict[str, str] | None = None, infer_keys: bool = True,
             timeless: str = "exclude", keys=None, layer: str = "sage", numbers: str = "ple",
             dropout: float = 0.0, dimension: int | None = None, history: bool | None = None,
             members: int | None = None) -> str:
    """An editable SQL template predicting `target` ("table.column") from its relational context.
    The options go whole into one `Options` (`write` takes that); they stay spelled out here because
    relsql/train/model/search.py reads the searchable options from this signature.

    `aggregation`: "all" (mean, sum, max and count over child rows; the default), one of avg/sum/max,
    or several ("avg,count" or a list); a ranking target's default is RANKING_AGGREGATION (no max).
    `timeless` (with `time_column`): "exclude" leaves out child tables whose rows' time is unknown,
    "include" joins them unfiltered. `keys` is passed
    to key discovery as given keys. `layer`: how a row combines the rows of each foreign key and
    direction, each with its own weights: "sage" (the aggregation terms plus the row's own
    term), "rgcn" (a mean per key and direction plus the own term: RGCN on the tree of rows),
    "gat" (GAT's attention over the child rows, scored from both ends) or "hgt" (HGT: keys,
    queries, values and outputs per table, attention and messages per key and direction).
    `numbers`: "ple" (numbers cut into ranges at the database's quantiles, calendar parts of
    dates, rare-value buckets, hashed long text) or "standardized" (the earlier encoders).
    `dropout`: the rate after each layer (0: none). `members`: independent networks side by side,
    each `width` wide, each trained on its own loss, the prediction their mean (default MEMBERS;
    1 for "gat", "hgt" and ranking targets, whose scores read every feature of a row): every
    linear map between two vectors is block-diagonal, `linear(x, n, 'name', blocks=members)`, so
    the members never mix (relsql/compile/members.py).

    Ranking. A target column that references a table R (a foreign key, or a list of R's keys:
    relsql.data.references) makes two towers of width `dimension` (default 32): the output relation,
    keyed by the target table's key, is the query tower (the usual context of the target row, no
    1-unit head) plus, with `history` (default True), the average candidate vector of the R rows
    the target row's entity (its key, or a foreign key it shares with an interaction table)
    referenced before its time, and an ID embedding of each of the target row's foreign keys; the
    candidate relation `candidate_<R>`, keyed by R's key, holds an ID embedding of R's key, R's own
    columns, R's foreign keys as codes and a popularity count (in a temporal template only from
    rows before the target table's earliest time: the tower is shared by every target row). ID
    embeddings are scaled by 1/sqrt(dimension). The history averages the candidate relation's own
    vectors (joined by key) rather than a second embed() of the interaction's key column: one
    named embedding does share its dictionary across columns, but with min_count it is fixed by
    the first statement (R's keys, one row each: all rare), and the join also carries R's columns.
    The target column's own foreign key is never followed (it is the label); history over the
    target table's own rows (a scalar target such as purchase.item_id) reads other rows' labels
    and is written commented out. Measured on bench.recommend_data's shop (2000 customers, 1000
    items, 40,000 purchases, seed 0, test MAP@10; popularity 0.050, the customer's past items
    0.108): dimension 32 with history 0.104, without 0.065; dimension 16 0.097 and 0.060.

    Defaults by measurement (bench.quality --quick, 4 targets x seeds 0 1, with fit()'s GBM
    blend): width 32 against 16 scored within one std on all four (ROC-AUC 0.904 vs 0.898,
    accuracy 0.862 vs 0.856, MAE 0.151 vs 0.148, AUC 0.935 both) at about twice the training
    time, so 16 stays; hops 3 scored as hops 2 on all four (their signals lie within two hops),
    so 2 stays: each hop multiplies the groundings. model.search tries both."""
    return write(db, target, Options(hops=hops, width=width, aggregation=aggregation, time_column=time_column,
                                     time_columns=time_columns, infer_keys=infer_keys, timeless=timeless, keys=keys,
                                     layer=layer, numbers=numbers, dropout=dropout, dimension=dimension, history=history,
                                     members=members))


def write(db: Database, target: str, options: Options) -> str:
    """The template `generate` writes, from its options in one `Options`. The user's tables and
    columns are read once (`frozen_schema`: key discovery asked for them per table)."""
    table, column = arguments.target(target)
    options = options.checked()
    with db.frozen_schema(), engine_threads(db, cores.half()):  # generation only reads; on grounding's DuckDB
        # threads (engine_threads): its ~50 small statistics queries each cost a third more CPU on two threads than one
        return _write(db, target, table, column, options)


def _write(db: Database, target: str, table: str, column: str, options: Options) -> str:
    where = scope(db, table, column, options)
    ranking = where.reference is not None  # a ranking target: two towers (ranking.py), no 1-unit head
    terms = options.terms(ranking=ranking)
    labels = dict(zip(where.keys.tables, distinct([safe(t) for t in where.keys.tables])))
    sizes = Sizes(db)
    pruning = Pruning(db, sizes, where.times, options.time_column, options.timeless, where.inclusive)
    root = tree(where.keys, table, options.hops, labels, pruning)
    nodes = list(walk(root))
    draft = Draft(db, where.keys, table, column, options, aggregation=terms, times=where.times, labels=labels, sizes=sizes,
                  inclusive=where.inclusive, members=options.member_count(ranking=ranking), ranking=ranking)
    if options.time_column and not ranking:  # earlier siblings' labels: layers.lateral
        draft.label_kind = label_kind(next(c.type for c in where.keys.tables[table].columns if c.name == column))
    scaled = draft.label_kind in ("number", "float")  # its earliest half decides its scale (labels.label_scale)
    units = where.dimension
    if not ranking:  # one read of the target column (and its time, where it sets a scale)
        rows = db.arrow(exp.select(*(q.col(c) for c in [column] + [options.time_column] * scaled)).from_(q.ident(table)))
        units = output_units(rows.column(0), f"{table}.{column}")
        if scaled:
            draft.label_scale = label_scale(rows.column(1), rows.column(0))
    tables = list(dict.fromkeys(n.table for n in nodes))
    if ranking and where.reference.table not in tables:
        tables.append(where.reference.table)  # the candidates' own columns
    for name in tables:
        if where.keys.primary_keys.get(name):  # a keyless table's rows are encoded where they are read (layers)
            encoders.encoder(draft, name)
    # what the head's own term reads: the target row's own columns again, wider, beside a relational context
    wide = encoders.own_encoder(draft) if root.children and not ranking else None
    own = f"enc_{labels[table]}"
    if wide is not None:
        own, statement = wide
        draft.out.append(statement)
    for node in nodes[1:]:
        if keyed(where.keys, node) and not layers.read_in_place(where.keys, node):  # a leaf: read where aggregated
            layers.node_rows(draft, node)
    value = layers.node_value(draft, root)
    lines = header.summary(target, options, terms, tables)
    if not ranking:
        layers.head(draft, root, value, units, own)
    else:
        lines += ranking_header(_towers(draft, where, options, root, value), target, where.interactions)
    lines += header.left_out(where, options, pruning, tables, labels) + header.keys(where)
    if draft.identifiers:
        lines.append(f"-- left out, named like identifiers but not keys (never numeric features): {', '.join(draft.identifiers)}")
    lines += header.times(where, options, pruning, tables, nodes, sibling_labels=draft.label_kind is not None)
    return _clear_of(db.catalog().names, "\n".join(lines) + "\n\n" + "\n".join(draft.out))


_CREATED = re.compile(r"^CREATE TABLE (\w+) AS$", re.MULTILINE)


def _clear_of(tables: list[str], text: str) -> str:
    """`text` with every relation it creates whose name is also a table's (`predict`, `enc_item`, ...
    are the database's tables in some schemas) renamed: a template relation shadows a table of its
    name, so the template would read its own relation where it means the table. Relations are named
    unquoted after CREATE TABLE, FROM and JOIN; tables are always quoted."""
    taken = {t.casefold() for t in tables}
    created = _CREATED.findall(text)
    clashing = [name for name in created if name.casefold() in taken]
    if not clashing:
        return text
    allocate = Names([*taken, *created])
    for name in clashing:
        text = re.sub(rf"\b(CREATE TABLE|FROM|JOIN) {re.escape(name)}\b(?!\")", rf"\1 {allocate(name + '_rel')}", text)
    return text


def _towers(draft: Draft, where: Scope, options: Options, root, value: str) -> Ranking:
    """A ranking target's statements: the timed popularity, the candidate tower, the query tower
    (the root's value, the ID embeddings of the target row's keys, the history terms)."""
    ranking = Ranking(draft, where.reference, where.dimension, options.history is not False, options.timeless)
    ranking.timed_counts(where.interactions)
    ranking.candidate(where.interactions)
    ranking.past(where.interactions, itself=True)
    layers.head(draft, root, value, where.dimension, f"enc_{draft.labels[draft.target]}", ranking=True)
    ranking.identities()
    ranking.past(where.interactions, itself=False)
    return ranking
