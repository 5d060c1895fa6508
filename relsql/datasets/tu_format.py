"""Load a graph dataset in the TU format (Morris et al., "TUDataset") into DuckDB tables.

A TU dataset ``NAME`` is a folder of text files, one value (or one comma separated row) per
line, all ids 1-based:

* ``NAME_A.txt``                 ``src, dst`` per directed edge (undirected graphs list both directions)
* ``NAME_graph_indicator.txt``   the graph id of node i on line i
* ``NAME_graph_labels.txt``      the label of graph i on line i (optional here)
* ``NAME_node_labels.txt``       the label(s) of node i on line i (optional)
* ``NAME_edge_labels.txt``       the label(s) of edge i (line i of ``_A``) on line i (optional)

They become three tables (names optionally prefixed):

* ``graph(graph_id BIGINT PRIMARY KEY, label BIGINT)``
* ``node(node_id BIGINT PRIMARY KEY, graph_id BIGINT, label BIGINT, x DOUBLE[])``, where ``x``
  is the one-hot encoding of the node label, computed as torch_geometric's ``TUDataset`` does
  (position ``label - min(label)``, width ``max - min + 1``; several label columns give one
  one-hot block per column, concatenated; ``label`` is the first column). Without node labels,
  ``label`` is NULL and ``x`` is ``[1.0]``.
* ``edge(src BIGINT, dst BIGINT [, label BIGINT])`` in the order of the ``_A`` file, ids as there.

Data goes in through registered Arrow tables, never row by row, and every statement is a
sqlglot AST: no file content or user text is pasted into SQL.
"""

from __future__ import annotations

import importlib.util
import uuid
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import sqlglot.expressions as exp

from relsql import textfile
from relsql.datasets.transaction import atomic
from relsql.errors import SourceError

DATA_LIMIT = 4 << 30  # bytes: a data file, not a hand-written one (TU datasets run to hundreds of MB)

__all__ = ["load_tu", "mutag_folder"]


# --------------------------------------------------------------------------- reading files


def _read_ints(path: Path, columns: int | None = None) -> np.ndarray:
    """An int64 matrix (lines × columns) from a comma/space separated text file."""
    text = textfile.read_text(path, "TU data file", SourceError, limit=DATA_LIMIT)
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        raise SourceError(f"{path}: the file is empty")
    width = len(lines[0].replace(",", " ").split())
    if columns is not None and width != columns:
        raise SourceError(f"{path}:1: expected {columns} value(s) per line, found {width}")
    try:
        values = np.array(text.replace(",", " ").split(), dtype=np.int64)
    except ValueError:
        values = None
    if values is None or values.shape[0] != width * len(lines):
        for number, line in enumerate(text.splitlines(), start=1):
            tokens = line.replace(",", " ").split()
            if not tokens:
                continue
            if len(tokens) != width:
                raise SourceError(f"{path}:{number}: expected {width} value(s), found {len(tokens)}")
            for token in tokens:
                try:
                    int(token)
                except ValueError:
                    raise SourceError(f"{path}:{number}: {token!r} is not an integer") from None
        raise SourceError(f"{path}: could not read the file as a table of integers")
    return values.reshape(len(lines), width)


def _one_hot(labels: np.ndarray) -> np.ndarray:
    """One block of one-hot columns per label column, as torch_geometric's TUDataset builds x."""
    shifted = labels - labels.min(axis=0, keepdims=True)
    blocks = []
    for j in range(shifted.shape[1]):
        block = np.zeros((shifted.shape[0], int(shifted[:, j].max()) + 1), dtype=np.float64)
        block[np.arange(shifted.shape[0]), shifted[:, j]] = 1.0
        blocks.append(block)
    return np.concatenate(blocks, axis=1)


def list_column(matrix: np.ndarray) -> pa.ListArray:
    """A (rows, width) float matrix as an Arrow list<double> column (DuckDB DOUBLE[])."""
    rows, width = matrix.shape
    offsets = pa.array(np.arange(rows + 1, dtype=np.int32) * width, type=pa.int32())
    return pa.ListArray.from_arrays(offsets, pa.array(matrix.reshape(-1), type=pa.float64()))


def _arrow_tables(folder: Path, name: str, edge_labels: bool) -> dict[str, pa.Table]:
    def file(kind: str) -> Path:
        return folder / f"{name}_{kind}.txt"

    for required in ("A", "graph_indicator"):
        if not file(required).is_file():
            raise SourceError(f"{folder} is not a TU dataset named {name!r}: {file(required).name} is missing")

    indicator = _read_ints(file("graph_indicator"), 1)[:, 0]
    num_nodes = indicator.shape[0]
    if indicator.min() < 1:
        raise SourceError(f"{file('graph_indicator')}: graph ids must start at 1, found {int(indicator.min())}")
    num_graphs = int(indicator.max())

    if file("graph_labels").is_file():
        graph_labels = _read_ints(file("graph_labels"), 1)[:, 0]
        if graph_labels.shape[0] != num_graphs:
            raise SourceError(
                f"{file('graph_labels')}: {graph_labels.shape[0]} lines, but the graph indicator names {num_graphs} graphs")
        graph_label = pa.array(graph_labels, type=pa.int64())
    else:
        graph_label = pa.nulls(num_graphs, type=pa.int64())

    if file("node_labels").is_file():
        node_labels = _read_ints(file("node_labels"))
        if node_labels.shape[0] != num_nodes:
            raise SourceError(f"{file('node_labels')}: {node_labels.shape[0]} lines, but there are {num_nodes} nodes")
        node_label = pa.array(node_labels[:, 0], type=pa.int64())
        x = _one_hot(node_labels)
    else:
        node_label = pa.nulls(num_nodes, type=pa.int64())
        x = np.ones((num_nodes, 1), dtype=np.float64)

    edges = _read_ints(file("A"), 2)
    bad = (edges < 1) | (edges > num_nodes)
    if bad.any():
        line = int(np.nonzero(bad.any(axis=1))[0][0]) + 1
        raise SourceError(f"{file('A')}:{line}: node id out of range 1..{num_nodes}")
    edge_columns = {"src": pa.array(edges[:, 0], type=pa.int64()), "dst": pa.array(edges[:, 1], type=pa.int64())}
    if edge_labels and file("edge_labels").is_file():
        labels = _read_ints(file("edge_labels"))
        if labels.shape[0] != edges.shape[0]:
            raise SourceError(f"{file('edge_labels')}: {labels.shape[0]} lines, but {file('A').name} has {edges.shape[0]} edges")
        edge_columns["label"] = pa.array(labels[:, 0], type=pa.int64())

    return {
        "graph": pa.table({"graph_id": pa.array(np.arange(1, num_graphs + 1), type=pa.int64()), "label": graph_label}),
        "node": pa.table({
            "node_id": pa.array(np.arange(1, num_nodes + 1), type=pa.int64()),
            "graph_id": pa.array(indicator, type=pa.int64()),
            "label": node_label,
            "x": list_column(x),
        }),
        "edge": pa.table(edge_columns),
    }


# --------------------------------------------------------------------------- writing tables

_TYPES = {"graph_id": "BIGINT", "node_id": "BIGINT", "label": "BIGINT", "src": "BIGINT", "dst": "BIGINT", "x": "DOUBLE[]"}
_PRIMARY_KEYS = {"graph": "graph_id", "node": "node_id"}


def _ident(name: str) -> exp.Identifier:
    return exp.to_identifier(name, quoted=True)


def _create_statements(table_name: str, kind: str, table: pa.Table, view: str) -> list[exp.Expression]:
    """CREATE TABLE with typed columns (and the primary key), then INSERT ... SELECT from the view."""
    columns = []
    for column in table.column_names:
        constraints = [exp.ColumnConstraint(kind=exp.PrimaryKeyColumnConstraint())] if _PRIMARY_KEYS.get(kind) == column else []
        columns.append(exp.ColumnDef(this=_ident(column), kind=exp.DataType.build(_TYPES[column], dialect="duckdb"),
                                     constraints=constraints))
    target = exp.Table(this=_ident(table_name))
    create = exp.Create(kind="TABLE", this=exp.Schema(this=target, expressions=columns))
    select = exp.select(*[exp.column(_ident(c)) for c in table.column_names]).from_(exp.Table(this=_ident(view)))
    insert = exp.Insert(
        this=exp.Schema(this=target.copy(), expressions=[_ident(c) for c in table.column_names]),
        expression=select,
    )
    return [create, insert]


def _existing_tables(con: duckdb.DuckDBPyConnection) -> set[str]:
    rows = con.execute(
        "SELECT table_name FROM information_schema.tables "
        "WHERE table_catalog = current_database() AND table_schema = current_schema()"
    ).fetchall()
    return {r[0].lower() for r in rows}


def load_tu(con, folder: str | Path, name: str, *, prefix: str = "", edge_labels: bool = True) -> dict[str, int]:
    """Load the TU dataset `name` from `folder` into `graph`, `node`, `edge` (each name prefixed
    by `prefix`). `con` is a DuckDB connection or a `relsql.Database`. Existing tables are never
    overwritten: a clash raises `SourceError` and nothing is created. Returns {table: rows}."""
    con = getattr(con, "con", con)
    if not isinstance(con, duckdb.DuckDBPyConnection):
        raise SourceError(f"load_tu needs a DuckDB connection or a relsql.Database, got {type(con).__name__}")
    tables = _arrow_tables(Path(folder), name, edge_labels)
    names = {kind: f"{prefix}{kind}" for kind in tables}
    clashes = sorted(n for n in names.values() if n.lower() in _existing_tables(con))
    if clashes:
        raise SourceError(f"table(s) {', '.join(clashes)} already exist; drop them or pass another prefix=")
    views = []
    current = [""]
    try:
        with atomic(con, current):
            for kind, table in tables.items():
                current[0] = names[kind]
                view = f"__relsql_tu_{uuid.uuid4().hex}"
                con.register(view, table)
                views.append(view)
                for statement in _create_statements(names[kind], kind, table, view):
                    con.execute(statement.sql(dialect="duckdb"))
    finally:
        for view in views:
            con.unregister(view)
    return {names[kind]: table.num_rows for kind, table in tables.items()}


def mutag_folder() -> Path:
    """The MUTAG folder shipped inside the installed `grakel` wheel (grakel is not imported)."""
    spec = importlib.util.find_spec("grakel")
    if spec is None or not spec.submodule_search_locations:
        raise SourceError("MUTAG comes with the grakel package here; install it (pip install grakel)")
    folder = Path(next(iter(spec.submodule_search_locations))) / "tests" / "data" / "MUTAG"
    if not (folder / "MUTAG_A.txt").is_file():
        raise SourceError(f"the installed grakel package has no MUTAG data at {folder}")
    return folder
