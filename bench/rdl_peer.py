"""The RDL peer of bench/quality.py: PyG HeteroData + HeteroGraphSAGE with per-table column
encoders (pytorch-frame style), full batch, AdamW, model selection on validation.

Built from any DuckDB database with declared keys (`read`: its tables, PRIMARY KEYs and FOREIGN
KEYs from duckdb_constraints(), its numeric, boolean, text, date and timestamp columns; `run_file`)
or from a bench/relgen.py database's frames (`run`): one node type per table, an edge type per
single-column foreign key in each direction. Per table, its encoder reads every column but the
primary key, the foreign keys and the label:
- numbers: standardized, NULL -> the column's mean plus a NULL indicator (pytorch-frame's own NULL
  handling gives NaN gradients: ../shared/RECIPES.md);
- integer codes with at most 32 values: the number as above AND an embedding of the code (a
  step function of one code is otherwise hard: RECIPES.md);
- text: an embedding per column (past 1,000 distinct values, values seen once share one row);
- timestamps: epoch seconds standardized, and hour, day of week, month as sin/cos.
Then LayerNorm-ReLU-Linear, `layers` HeteroConv layers of SAGEConv (mean) summed over edge types,
each with a residual and LayerNorm, and an MLP head on the target row's final and initial
encodings. The epoch of the best validation metric (ROC-AUC, accuracy, or -MAE) is kept.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from torch import nn

CODES = 32  # integer columns with at most this many distinct values also get an embedding
IDENTITIES = 1000  # a text column with at most this many distinct values gets an embedding row for each


@dataclass
class Encoded:
    numbers: torch.Tensor  # [rows, k] float32
    codes: list[torch.Tensor]  # one LongTensor [rows] per categorical column
    sizes: list[int]  # its number of distinct codes


def _standard(x: np.ndarray) -> np.ndarray:
    std = x.std()
    return (x - x.mean()) / (std if std > 0 else 1.0)


def _number(values: np.ndarray) -> list[np.ndarray]:
    missing = np.isnan(values)
    filled = np.where(missing, np.nanmean(values) if (~missing).any() else 0.0, values)
    return [_standard(filled)] + ([missing.astype(np.float64)] if missing.any() else [])


def _time(values: pd.Series) -> list[np.ndarray]:
    missing = values.isna()
    if missing.any():  # NULL dates: the median date, and an indicator
        values = values.fillna(values.dropna().median() if (~missing).any() else pd.Timestamp(0))
    seconds = values.astype("datetime64[s]").astype(np.int64).to_numpy().astype(np.float64)
    parts = [_standard(seconds)]
    for period, value in ((24, values.dt.hour), (7, values.dt.dayofweek), (12, values.dt.month - 1)):
        angle = 2 * np.pi * value.to_numpy(np.float64) / period
        parts += [np.sin(angle), np.cos(angle)]
    return parts + ([missing.to_numpy(np.float64)] if missing.any() else [])


def _codes(column: pd.Series) -> tuple[np.ndarray, int]:
    """Category codes (NULL: code 0); past IDENTITIES distinct values, those seen only once share
    code 0 too (a customer's e-mail adds no rows; a nation's name, the only thing known of it, does)."""
    counts = column.value_counts(dropna=True)
    kept = counts.index if len(counts) <= IDENTITIES else counts.index[counts.values > 1]
    lookup = pd.Series(np.arange(1, len(kept) + 1), index=kept)
    return column.map(lookup).fillna(0).to_numpy(np.int64), len(kept) + 1


def encode(frame: pd.DataFrame, skip: set[str]) -> Encoded:
    """The encoder inputs of a table's rows, without the columns in `skip`."""
    numbers: list[np.ndarray] = []
    codes: list[torch.Tensor] = []
    sizes: list[int] = []
    for name in frame.columns:
        if name in skip:
            continue
        column = frame[name]
        if column.dtype.kind == "M":
            numbers += _time(column)
            continue
        if column.dtype.kind in "ifb":
            numbers += _number(column.to_numpy(np.float64, na_value=np.nan))
        if column.dtype.kind == "O":
            code, size = _codes(column)
            codes.append(torch.as_tensor(code, dtype=torch.long))
            sizes.append(size)
        elif column.dtype.kind == "i" and column.nunique() <= CODES:
            code, uniques = pd.factorize(column, use_na_sentinel=False)
            codes.append(torch.as_tensor(code, dtype=torch.long))
            sizes.append(len(uniques))
    matrix = np.stack(numbers, 1) if numbers else np.zeros((len(frame), 0))
    return Encoded(torch.as_tensor(matrix, dtype=torch.float32), codes, sizes)


def graph(db, label_column: str, target_table: str) -> tuple[dict[str, Encoded], dict[tuple, torch.Tensor]]:
    """(encoded tables, edge index per edge type) of a relgen database; ids are 1..n in row order."""
    tables, edges = {}, {}
    for name, table in db.tables.items():
        skip = {table.key, *table.foreign} | ({label_column} if name == target_table else set())
        tables[name] = encode(table.frame, skip)
        for column, parent in table.foreign.items():
            child_rows = torch.arange(len(table.frame))
            parent_rows = torch.as_tensor(table.frame[column].to_numpy() - 1, dtype=torch.long)
            edges[(name, column, parent)] = torch.stack([child_rows, parent_rows])
            edges[(parent, f"rev_{column}", name)] = torch.stack([parent_rows, child_rows])
    return tables, edges


@dataclass
class Read:
    """A table read from a database: rows in primary-key order (else by every column)."""
    frame: pd.DataFrame
    key: str | None
    foreign: dict[str, tuple[str, str]]  # column -> (referenced table, referenced column)


def _plain(frame: pd.DataFrame) -> pd.DataFrame:
    """Nullable integer / boolean columns as float64 with NaN, object dates as datetime64."""
    out = {}
    for name in frame.columns:
        column = frame[name]
        if isinstance(column.dtype, pd.api.extensions.ExtensionDtype) and column.dtype.kind in "iub":
            column = column.astype("float64")
        out[name] = column
    return pd.DataFrame(out)


def read(path, keys=None) -> dict[str, Read]:
    """Every base table of the DuckDB file at `path`, with its declared single-column keys, or with
    those of `keys` (a relsql.data.keys.Schema: given or inferred keys too; only its tables)."""
    import duckdb

    con = duckdb.connect(str(path), read_only=True)
    try:
        names = [n for (n,) in con.execute("SELECT table_name FROM duckdb_tables() WHERE NOT internal "
                                           "AND schema_name = current_schema() ORDER BY table_name").fetchall()]
        if keys is None:
            constraints = con.execute("SELECT table_name, constraint_type, constraint_column_names, referenced_table, "
                                      "referenced_column_names FROM duckdb_constraints() "
                                      "WHERE constraint_type IN ('PRIMARY KEY', 'FOREIGN KEY')").fetchall()
        else:
            names = [n for n in names if n in keys.tables]
            constraints = [(t, "PRIMARY KEY", list(c), None, None) for t, c in keys.primary_keys.items() if c]
            constraints += [(child, "FOREIGN KEY", list(fk.columns), fk.table, list(fk.references))
                            for child, fk in keys.foreign_keys]
        primaries = {t: c[0] for t, kind, c, _, _ in constraints if kind == "PRIMARY KEY" and len(c) == 1}
        out = {}
        for name in names:
            foreign = {c[0]: (parent, pc[0]) for t, kind, c, parent, pc in constraints
                       if t == name and kind == "FOREIGN KEY" and len(c) == 1 and parent in names}
            key = primaries.get(name)
            quoted = '"' + name.replace('"', '""') + '"'
            order = ('"' + key.replace('"', '""') + '"') if key else "ALL"
            frame = con.execute(f"SELECT * FROM {quoted} ORDER BY {order}").df()
            out[name] = Read(_plain(frame), key, foreign)
    finally:
        con.close()
    return out


def graph_of(tables: dict[str, Read], target_table: str,
             label_column: str) -> tuple[dict[str, Encoded], dict[tuple, torch.Tensor]]:
    """(encoded tables, edge index per edge type) of tables read by `read`; a child row whose
    foreign key is NULL or matches no parent row has no edge."""
    encoded, edges = {}, {}
    for name, table in tables.items():
        skip = {table.key, *table.foreign} | ({label_column} if name == target_table else set())
        encoded[name] = encode(table.frame, skip)
        for column, (parent, parent_column) in table.foreign.items():
            found = pd.Index(tables[parent].frame[parent_column]).get_indexer(table.frame[column])
            child_rows = torch.as_tensor(np.flatnonzero(found >= 0), dtype=torch.long)
            parent_rows = torch.as_tensor(found[found >= 0], dtype=torch.long)
            edges[(name, column, parent)] = torch.stack([child_rows, parent_rows])
            edges[(parent, f"rev_{name}_{column}", name)] = torch.stack([parent_rows, child_rows])
    return encoded, edges


class Net(nn.Module):
    def __init__(self, tables: dict[str, Encoded], edge_types: list[tuple], target: str, units: int, width: int,
                 layers: int, dropout: float):
        from torch_geometric.nn import HeteroConv, SAGEConv

        super().__init__()
        self.target = target
        self.numbers = nn.ModuleDict({t: nn.Linear(e.numbers.shape[1], width) for t, e in tables.items()})
        self.codes = nn.ModuleDict({t: nn.ModuleList([nn.Embedding(s, width) for s in e.sizes]) for t, e in tables.items()})
        self.encoders = nn.ModuleDict({t: nn.Sequential(nn.LayerNorm(width), nn.ReLU(), nn.Linear(width, width)) for t in tables})
        self.convs = nn.ModuleList([HeteroConv({e: SAGEConv((width, width), width, aggr="mean") for e in edge_types}, aggr="sum")
                                    for _ in range(layers)])
        self.norms = nn.ModuleList([nn.ModuleDict({t: nn.LayerNorm(width) for t in tables}) for _ in range(layers)])
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Sequential(nn.Linear(2 * width, width), nn.ReLU(), nn.Dropout(dropout), nn.Linear(width, units))

    def forward(self, tables: dict[str, Encoded], edges: dict[tuple, torch.Tensor]) -> torch.Tensor:
        h = {}
        for t, e in tables.items():
            x = self.numbers[t](e.numbers)
            for embedding, code in zip(self.codes[t], e.codes):
                x = x + embedding(code)
            h[t] = self.encoders[t](x)
        first = h[self.target]
        for conv, norms in zip(self.convs, self.norms):
            new = conv(h, edges)
            h = {t: self.dropout(F.relu(norms[t](h[t] + new[t]))) if t in new else h[t] for t in h}
        return self.head(torch.cat([h[self.target], first], 1))


def _metric(kind: str, out: np.ndarray, y: np.ndarray, scale: float) -> dict[str, float]:
    """The task's scores (as relsql names them) of outputs against labels (regression: standardized, times `scale`)."""
    from sklearn import metrics

    if kind == "regression":
        error = (out[:, 0] - y) * scale
        return {"mae": float(np.abs(error).mean()), "rmse": float(np.sqrt((error ** 2).mean()))}
    if kind == "binary":
        return {"accuracy": float(((out[:, 0] > 0) == (y > 0.5)).mean()), "roc_auc": float(metrics.roc_auc_score(y, out[:, 0]))}
    return {"accuracy": float((out.argmax(1) == y).mean())}


def select_score(kind: str, scores: dict[str, float]) -> float:
    """Higher is better: ROC-AUC, accuracy, or -MAE."""
    if kind == "binary":
        return scores["roc_auc"]
    return scores["accuracy"] if kind == "multiclass" else -scores["mae"]


def run(db, target, rows: dict[str, np.ndarray], seed: int, **options) -> dict:
    """The peer on a bench/relgen.py database's frames (`train`'s options)."""
    tables, edges = graph(db, target.column, target.table)
    return train(tables, edges, target.table, target.kind, target.values, rows, seed, **options)


def run_file(path, table: str, column: str, kind: str, rows: dict[str, np.ndarray], seed: int, **options) -> dict:
    """The peer on any DuckDB file with declared keys: `rows` are positions in `table`'s primary-key
    order, the labels its `column` (`train`'s options)."""
    tables = read(path)
    values = tables[table].frame[column].to_numpy()
    encoded, edges = graph_of(tables, table, column)
    return train(encoded, edges, table, kind, values, rows, seed, **options)


def train(tables: dict[str, Encoded], edges: dict[tuple, torch.Tensor], table: str, kind: str, values: np.ndarray,
          rows: dict[str, np.ndarray], seed: int, *, width: int = 64, layers: int = 2, dropout: float = 0.1,
          lr: float = 0.002, weight_decay: float = 1e-4, epochs: int = 300, patience: int = 60) -> dict:
    """Train on `rows["train"]` (positions of the target table's rows), select on "val", score "test".
    Returns {"scores": test scores, "best_epoch", "epochs"}."""
    if kind == "regression":
        values = values.astype(np.float64)
        mean, scale = values[rows["train"]].mean(), values[rows["train"]].std() or 1.0
        y = torch.as_tensor((values - mean) / scale, dtype=torch.float32)
        units = 1
    else:
        classes = sorted(set(values.tolist()), key=str)
        y = torch.as_tensor([classes.index(v) for v in values.tolist()], dtype=torch.float32)
        scale, units = 1.0, (1 if kind == "binary" else len(classes))
    with torch.random.fork_rng(devices=[]):  # the caller's generator is left as it was
        torch.manual_seed(seed)
        net = Net(tables, list(edges), table, units, width, layers, dropout)
        optimizer = torch.optim.AdamW(net.parameters(), lr=lr, weight_decay=weight_decay)
        index = {k: torch.as_tensor(v, dtype=torch.long) for k, v in rows.items()}
        best, best_state, best_epoch, epoch = -np.inf, None, 0, 0
        for epoch in range(epochs):
            net.train()
            optimizer.zero_grad()
            out = net(tables, edges)[index["train"]]
            target_y = y[index["train"]]
            loss = (F.binary_cross_entropy_with_logits(out[:, 0], target_y) if kind == "binary"
                    else F.cross_entropy(out, target_y.long()) if kind == "multiclass" else F.mse_loss(out[:, 0], target_y))
            loss.backward()
            nn.utils.clip_grad_norm_(net.parameters(), 1.0)
            optimizer.step()
            net.eval()
            with torch.no_grad():
                out = net(tables, edges).double().numpy()
            score = select_score(kind, _metric(kind, out[rows["val"]], y[index["val"]].double().numpy(), scale))
            if score > best:
                best, best_state, best_epoch = score, copy.deepcopy(net.state_dict()), epoch
            elif epoch - best_epoch >= patience:
                break
        net.load_state_dict(best_state)
        net.eval()
        with torch.no_grad():
            out = net(tables, edges).double().numpy()
    return {"scores": _metric(kind, out[rows["test"]], y[index["test"]].double().numpy(), scale),
            "best_epoch": best_epoch, "epochs": epoch + 1}
