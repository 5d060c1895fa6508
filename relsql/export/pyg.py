"""A grounding, or a database's key graph, as a PyTorch Geometric `HeteroData`.

So a PyG user can run their own modules on what relsql grounded. Two shapes:

- a model (or a compiled net, or a learner): a node type per neural relation (node i is the
  relation's row i; `node_keys` says which key it is); an edge type per rule body literal,
  `(body relation, "rule<k>_body<j>", head relation)` and its reverse `(head, "rev_rule<k>_body<j>",
  body)` (so PyG's to_hetero needs no ToUndirected), one edge per grounding (edge e of every
  edge type of one rule is that rule's grounding e, so a rule's hyperedges can be put back
  together), ordered by head. A rule's encoded input features (features(), ple(), calendar()
  and numeric columns, as the model's SQL encoded them) go on its edges as `edge_attr`; a rule
  without body relations that grounds every head exactly once puts them on the head's nodes
  as `x`; any other rule without body relations gets a node type of its own for its groundings,
  `<head>__rule<k>`, with an edge type `rule<k>` into the head. Categorical codes (embed(),
  typed linear types, hashed text ids) go beside them in `codes` ({weight: int64 tensor}). The
  model's output relation carries `y` (labels as the model encodes them: 0/1, class index or
  standardized number; -1 / NaN where unlabelled) and `train_mask`, `val_mask`, `test_mask`.
- a database: a node type per table (rows ordered by primary key, else in scan order; `node_keys`
  holds the primary key of each node), an edge type per foreign key and direction, named as
  RelBench names them: `(child, "f2p_<column>", parent)` and `(parent, "rev_f2p_<column>",
  child)`, dangling and NULL references left out; numeric columns that are no key as `x`
  (float32, NULL as NaN; their names in `feature_names`), and a `time` attribute (epoch
  seconds) for tables named in `time_columns`. A RelBench task table carries its keys and time
  only (its other columns are labels), and columns a task hides are left out everywhere.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import sqlglot.expressions as exp
import torch

from relsql.data.duckdb import qualified
from relsql.data.engine import Database, ident
from relsql.errors import RelsqlError, SchemaError
from relsql.template import ir

if TYPE_CHECKING:
    from torch_geometric.data import HeteroData

    from relsql.ground.execute import Grounding, RuleGrounding
    from relsql.train.learner.learner import Learner

_FLOATING = (ir.Features, ir.Encode, ir.Column)


def to_heterodata(source: Any, *, keys: object = None, time_columns: dict[str, str] | None = None,
                  tables: list[str] | None = None, stypes: dict | None = None,
                  text_embedder: object = None) -> HeteroData:
    """`source` (a relsql.Model, a Learner, a CompiledNet, or a relsql.Database) as HeteroData.

    A model's own grounding (a mini-batch model's database is grounded whole, with the model's
    encodings); a database's foreign-key graph of `tables` (default all), with `keys` (a keys
    file, its text or tuples, as Template.auto takes them) completing the declared keys, and
    `time_columns` {table: column} (default the database's own, e.g. a RelBench database's).
    With PyTorch Frame installed a database's tables also carry `tf` and `col_stats` for
    RelBench's HeteroEncoder (relsql/export/frames.py: `stypes` overrides the guessed column
    types, `text_embedder` embeds text columns)."""
    if isinstance(source, Database):  # the arguments first: a wrong one fails before PyG's slow import
        times = dict(getattr(source, "time_columns", {})) if time_columns is None else _names_map(time_columns)
        if tables is not None and (isinstance(tables, str) or not isinstance(tables, list | tuple)
                                   or not all(isinstance(t, str) for t in tables)):
            raise SchemaError(f"tables must be a list of table names, got {type(tables).__name__} {str(tables)[:60]!r}; "
                              "e.g. tables=['orders', 'customers']")
        frames = (stypes, text_embedder)
        return _database_graph(_pyg()(), source, keys, times, tables, explicit=time_columns is not None, frames=frames)
    HeteroData = _pyg()
    if any(given is not None for given in (keys, time_columns, tables, stypes, text_embedder)):
        raise RelsqlError("keys=, time_columns=, tables=, stypes= and text_embedder= describe a database's key "
                          "graph; a model's grounding has its own: drop them")
    learner = getattr(source, "learner", None)
    if learner is not None or _is_learner(source):
        learner = learner or source
        return _grounding_graph(HeteroData(), _full_grounding(learner), learner)
    if hasattr(source, "grounding") and hasattr(source, "run"):  # a CompiledNet
        return _grounding_graph(HeteroData(), source.grounding, None)
    raise RelsqlError(f"to_heterodata takes a relsql.Model, a compiled net or a relsql.Database, got {type(source).__name__}")


def _names_map(time_columns: object) -> dict[str, str]:
    """time_columns as {table: column}, checked: a list or a name is refused with the form it takes."""
    if not isinstance(time_columns, Mapping) or not all(
            isinstance(t, str) and isinstance(c, str) for t, c in time_columns.items()):
        raise SchemaError(f"time_columns must map each table to its time column, e.g. {{'orders': 'date'}}; got "
                          f"{type(time_columns).__name__} {str(time_columns)[:60]!r}")
    return dict(time_columns)


def _pyg():
    try:
        from torch_geometric.data import HeteroData
    except ImportError:
        raise RelsqlError("to_heterodata needs PyTorch Geometric: pip install torch-geometric") from None
    return HeteroData


def _is_learner(source: Any) -> bool:
    from relsql.train.learner.learner import Learner

    return isinstance(source, Learner)


# -- a model's grounding ---------------------------------------------------------------------------
def _full_grounding(learner: Learner) -> Grounding:
    """The whole grounding: the net's own, or (mini-batches, or rows no output reads cut from the net's:
    relsql/ground/reach.py) the database grounded with the model's encodings."""
    from relsql.ground.execute import Grounding, ground

    if not learner.mini_batches and isinstance(learner.net.grounding, Grounding) and learner.grounding_whole:
        return learner.net.grounding
    if learner.db is None:
        raise RelsqlError("this model has no database to ground (a training rank's copy): export the Model itself")
    return ground(learner.template, learner.db, presets=learner.encodings(), progress=learner.settings.progress,
                  max_groundings=learner.settings.max_groundings)


def _grounding_graph(data: HeteroData, grounding: Grounding, learner: Learner | None) -> HeteroData:
    for name, relation in grounding.relations.items():
        data[name].num_nodes = relation.size
        data[name].node_keys = pl.from_arrow(relation.keys.drop_columns(["_rid"]))
    for name, relation in grounding.relations.items():
        node_features = []
        for k, rg in enumerate(relation.rules):
            features, codes = _rule_inputs(rg)
            if not rg.refs and _one_per_head(rg, relation.size):
                node_features.append((features, codes))
            elif not rg.refs:
                _grounding_nodes(data, name, k, rg, features, codes)
            else:
                _body_edges(data, name, k, rg, features, codes)
        _attach_node_features(data[name], node_features)
    if learner is not None:
        _labels(data[learner.output], learner, grounding.relations[learner.output].size)
    return data


def _rule_inputs(rg: RuleGrounding) -> tuple[torch.Tensor | None, dict[str, torch.Tensor]]:
    """A rule's encoded numeric inputs per grounding (G, d), in the order its expression reads
    them, and its categorical codes by weight."""
    floating, codes, seen = [], {}, set()
    size = rg.size
    for node in ir.walk(rg.rule.expr):
        if isinstance(node, _FLOATING):
            for column in node.columns if isinstance(node, (ir.Features, ir.Encode)) else (node.index,):
                if column not in seen:
                    seen.add(column)
                    floating.append(rg.columns[column].reshape(size, -1).to(torch.float64))
        for column, weight in _coded(node):
            name = weight if weight not in codes else f"{weight}#{column}"
            codes[name] = rg.columns[column].to(torch.int64)
    return (torch.cat(floating, dim=1) if floating else None), codes


def _coded(node: ir.Expr) -> list[tuple[int, str]]:
    if isinstance(node, (ir.Embed, ir.Text)):
        return [(node.column, node.weight)]
    if isinstance(node, ir.Apply) and node.types is not None:
        return [(node.types, node.weight)]
    return []


def _one_per_head(rg: RuleGrounding, heads: int) -> bool:
    return rg.size == heads and bool(torch.equal(rg.head, torch.arange(heads, dtype=rg.head.dtype)))


def _grounding_nodes(data: HeteroData, head: str, k: int, rg: RuleGrounding, features, codes) -> None:
    """A rule without body relations that is no per-row layer: its groundings become nodes."""
    kind = f"{head}__rule{k}"
    data[kind].num_nodes = rg.size
    _attach_node_features(data[kind], [(features, codes)])
    edges = data[kind, f"rule{k}", head]
    edges.edge_index = torch.stack([torch.arange(rg.size, dtype=torch.int64), rg.head.to(torch.int64)])
    edges.origin = rg.rule.origin


def _body_edges(data: HeteroData, head: str, k: int, rg: RuleGrounding, features, codes) -> None:
    """A body literal's groundings as edges into the head, and the same edges reversed (`rev_...`,
    as RelBench names its reverse edges), so that every relation receives messages and PyG's
    `to_hetero` converts a homogeneous GNN without a ToUndirected first."""
    for j, (body, rows) in enumerate(zip(rg.rule.refs, rg.refs)):
        edge_index = torch.stack([rows.to(torch.int64), rg.head.to(torch.int64)])
        for edges, index in ((data[body, f"rule{k}_body{j}", head], edge_index),
                             (data[head, f"rev_rule{k}_body{j}", body], edge_index.flip(0))):
            edges.edge_index = index
            edges.origin = rg.rule.origin
            if features is not None:
                edges.edge_attr = features
            if codes:
                edges.codes = codes


def _attach_node_features(store, parts: list) -> None:
    features = [f for f, _ in parts if f is not None]
    if features:
        store.x = torch.cat(features, dim=1)
    codes = {name: c for _, found in parts for name, c in found.items()}
    if codes:
        store.codes = codes


def _labels(store, learner: Learner, rows: int) -> None:
    """The output relation's labels where known, and each split's rows as masks."""
    y = learner.y.detach().cpu()
    classification = learner.task.kind != "regression"
    full = torch.full((rows,), -1 if classification else float("nan"), dtype=torch.int64 if classification else y.dtype)
    labelled = torch.as_tensor(learner.labelled, dtype=torch.int64)
    full[labelled] = y.to(full.dtype)
    store.y = full
    for split in ("train", "val", "test"):
        mask = torch.zeros(rows, dtype=torch.bool)
        mask[labelled[torch.as_tensor(learner.rows.get(split, np.zeros(0, np.int64)), dtype=torch.int64)]] = True
        store[f"{split}_mask"] = mask


# -- a database's foreign-key graph -----------------------------------------------------------------
def _database_graph(data: HeteroData, db: Database, given: object, time_columns: dict[str, str],
                    tables: list[str] | None, explicit: bool, frames: tuple = (None, None)) -> HeteroData:
    from relsql.data import keys as keyspec
    from relsql.export import frames as tabular

    schema = keyspec.schema(db, db.catalog(), given=given)
    chosen = list(schema.tables) if tables is None else list(tables)
    for table in [*chosen, *(time_columns if explicit else ())]:
        if table not in schema.tables:
            what = "tables" if table in chosen else "time_columns"
            raise SchemaError(f"{what} names table `{table}`, which is not in {db.description}; known tables: "
                              f"{', '.join(schema.tables)}")
    time_columns = {t: c for t, c in time_columns.items() if t in chosen}
    torch_frame = tabular.torch_frame_or_none()
    stypes, text_embedder = frames
    stypes = tabular.checked_stypes(stypes, chosen, torch_frame)
    task_tables, hidden = tabular.task_columns(db), tabular.hidden_columns(db)
    scopes = db.table_scopes()
    frames = {name: _read_table(db, name, scopes[name], schema.primary_keys.get(name, ())) for name in chosen}
    foreign = [(child, fk) for child, fk in schema.foreign_keys if child in frames and fk.table in frames]
    references = {(child, c) for child, fk in foreign for c in fk.columns}
    for name, frame in frames.items():
        store = data[name]
        store.num_nodes = frame.num_rows
        primary = schema.primary_keys.get(name, ())
        if primary:
            store.node_keys = pl.from_arrow(frame.select(list(primary)))
        skip = set(primary) | {c for t, c in references if t == name} | {c for t, c in hidden if t == name}
        if name in task_tables:  # a task table's other columns are its labels: never features
            skip |= set(frame.column_names)
        _table_features(store, frame, skip)
        if torch_frame is not None:
            features = [c for c in frame.column_names if c not in skip]
            tabular.table_frame(store, frame, features, stypes.get(name, {}), torch_frame, text_embedder)
        if name in time_columns:
            store.time = _epoch_seconds(frame, name, time_columns[name])
    for child, fk in foreign:
        _key_edges(data, frames[child], frames[fk.table], child, fk)
    return data


def _read_table(db: Database, name: str, scope: tuple[str, str], primary: tuple[str, ...]) -> pa.Table:
    """The table's rows, ordered by its primary key (one read: the node order everything else uses)."""
    query = exp.select(exp.Star()).from_(qualified(name, scope))
    if primary:
        query = query.order_by(*[exp.Ordered(this=exp.column(ident(c)), nulls_first=True) for c in primary])
    return db.arrow(query)


def _numeric(kind: pa.DataType) -> bool:
    return pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_decimal(kind) or pa.types.is_boolean(kind)


def _table_features(store, frame: pa.Table, skip: set[str]) -> None:
    names = [f.name for f in frame.schema if f.name not in skip and _numeric(f.type)]
    if not names:
        return
    columns = [frame.column(n).cast(pa.float64()).to_numpy(zero_copy_only=False) for n in names]
    store.x = torch.from_numpy(np.stack(columns, axis=1).astype(np.float32))
    store.feature_names = names


def _epoch_seconds(frame: pa.Table, table: str, column: str) -> torch.Tensor:
    if column not in frame.column_names:
        raise SchemaError(f"time_columns: table `{table}` has no column `{column}`")
    values = frame.column(column)
    if not (pa.types.is_timestamp(values.type) or pa.types.is_date(values.type)):
        raise SchemaError(f"time_columns: `{table}.{column}` is {values.type}, not a date or timestamp")
    seconds = pc.cast(pc.cast(values, pa.timestamp("s")), pa.int64()).to_numpy(zero_copy_only=False)
    return torch.from_numpy(np.array(seconds, dtype=np.int64))


def _key_edges(data: HeteroData, child: pa.Table, parent: pa.Table, child_name: str, fk) -> None:
    """Both directions of one foreign key: child node -> the parent node whose referenced columns match."""
    references = fk.references or ()
    if len(references) != len(fk.columns):
        raise SchemaError(f"foreign key {child_name}{fk} names no referenced columns of `{fk.table}`; declare them")
    left = pl.from_arrow(child.select(list(fk.columns))).with_row_index("_src")
    right = pl.from_arrow(parent.select(list(references))).with_row_index("_dst")
    left = left.with_columns([pl.col(c).cast(right[r].dtype) for c, r in zip(fk.columns, references)])
    joined = left.join(right, left_on=list(fk.columns), right_on=list(references), how="inner").sort(["_src", "_dst"])
    src = torch.from_numpy(joined["_src"].cast(pl.Int64).to_numpy().copy())
    dst = torch.from_numpy(joined["_dst"].cast(pl.Int64).to_numpy().copy())
    label = "_".join(fk.columns)
    data[child_name, f"f2p_{label}", fk.table].edge_index = torch.stack([src, dst])
    order = torch.argsort(dst * max(len(left), 1) + src)
    data[fk.table, f"rev_f2p_{label}", child_name].edge_index = torch.stack([dst[order], src[order]])
