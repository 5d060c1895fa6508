"""The RDL peer of bench/quality.py: PyG HeteroData + HeteroGraphSAGE with per-table column
encoders (pytorch-frame style), full batch, AdamW, model selection on validation.

Built from a bench/relgen.py database (its frames, keys and links), one node type per table, an
edge type per foreign key in each direction. Per table, its encoder reads every column but the
primary key, the foreign keys and the label:
- numbers: standardized, NULL -> the column's mean plus a NULL indicator (pytorch-frame's own NULL
  handling gives NaN gradients: ../shared/RECIPES.md);
- integer codes with at most 32 values: the number as above AND an embedding of the code (a
  step function of one code is otherwise hard: RECIPES.md);
- text: an embedding per column;
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
    seconds = values.astype("datetime64[s]").astype(np.int64).to_numpy().astype(np.float64)
    parts = [_standard(seconds)]
    for period, value in ((24, values.dt.hour), (7, values.dt.dayofweek), (12, values.dt.month - 1)):
        angle = 2 * np.pi * value.to_numpy(np.float64) / period
        parts += [np.sin(angle), np.cos(angle)]
    return parts


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
        if column.dtype.kind in "if":
            numbers += _number(column.to_numpy(np.float64))
        if column.dtype.kind == "O" or (column.dtype.kind == "i" and column.nunique() <= CODES):
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


def run(db, target, rows: dict[str, np.ndarray], seed: int, *, width: int = 64, layers: int = 2, dropout: float = 0.1,
        lr: float = 0.002, weight_decay: float = 1e-4, epochs: int = 300, patience: int = 60) -> dict:
    """Train on `rows["train"]` (positions of the target table's rows), select on "val", score "test".
    Returns {"scores": test scores, "val": the best validation scores, "best_epoch", "epochs"}."""
    tables, edges = graph(db, target.column, target.table)
    kind = target.kind
    if kind == "regression":
        values = target.values.astype(np.float64)
        mean, scale = values[rows["train"]].mean(), values[rows["train"]].std() or 1.0
        y = torch.as_tensor((values - mean) / scale, dtype=torch.float32)
        units = 1
    else:
        classes = sorted(set(target.values.tolist()), key=str)
        y = torch.as_tensor([classes.index(v) for v in target.values.tolist()], dtype=torch.float32)
        scale, units = 1.0, (1 if kind == "binary" else len(classes))
    with torch.random.fork_rng(devices=[]):  # the caller's generator is left as it was
        torch.manual_seed(seed)
        net = Net(tables, list(edges), target.table, units, width, layers, dropout)
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
