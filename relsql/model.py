"""`relsql.Model`: a template, a database and a target column, trained end to end.

The output relation (the template's last, or `output=`) is joined with the target table on
its key columns, so each labelled target row gets the value of its head. Rows with a NULL
target are prediction-only. Temporal splits order rows by `time_column`; keeping future rows
out of a target's groundings is the template's job (see README, "Time").
"""

from __future__ import annotations

import copy
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import sqlglot.expressions as exp
import torch
from torch import nn

from relsql.compile import make_plan
from relsql.compile.module import CompiledNet
from relsql.db import Database
from relsql.errors import RelsqlError, SchemaError
from relsql.ground import query as q
from relsql.ground.execute import Presets, ground
from relsql.template.ir import Template
from relsql.train.report import plot_history, text_report
from relsql.train.split import split_rows
from relsql.train.task import Task, detect

FORMAT = "relsql-model-1"


class Model:
    """Trains a template's output relation to predict `target` ("table.column")."""

    def __init__(self, db: Database, template: Template | str | Path, target: str, *, output: str | None = None,
                 task: str | None = None, time_column: str | None = None,
                 split: tuple[float, float, float] = (0.7, 0.15, 0.15), seed: int = 0,
                 dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu", progress: bool | None = None):
        self.db = db
        self.template = template if isinstance(template, Template) else Template.from_file(template)
        self.target = target
        self.table, self.column = _parse_target(target)
        self.output = output or self.template.output
        if self.output not in self.template.relations:
            raise RelsqlError(f"output relation `{self.output}` is not in the template; it declares {list(self.template.relations)}")
        self.time_column, self.fractions, self.seed = time_column, tuple(split), seed
        self.dtype, self.device, self.progress = dtype, torch.device(device), progress
        self.history: list[dict] = []
        self.best_epoch: int | None = None
        self.timings: dict[str, float] = {}
        self._build(Presets(), task)

    # -- construction ------------------------------------------------------------------------
    def _build(self, presets: Presets, task: str | Task | None, split: dict | None = None) -> None:
        columns = dict(self.db.columns(self.table))
        if self.column not in columns:
            raise SchemaError(f"target {self.target}: table `{self.table}` has no column `{self.column}`; columns: {', '.join(columns)}")
        if self.time_column is not None and self.time_column not in columns:
            raise SchemaError(f"time_column `{self.time_column}` is not a column of `{self.table}`")
        relation = self.template.relations[self.output]
        missing = [k for k in relation.keys if k not in columns]
        if missing or not relation.keys:
            raise SchemaError(
                f"output relation `{self.output}` is keyed by {relation.keys}, but the target table `{self.table}` "
                f"has no column(s) {missing or '(none)'}; select the target table's key as the output's head key "
                f"(e.g. `SELECT t.id, ... FROM {self.table} t ... GROUP BY t.id`)")
        torch.manual_seed(self.seed)
        started = time.perf_counter()
        grounding = ground(self.template, self.db, presets=presets, progress=self.progress)
        self.timings["grounding"] = time.perf_counter() - started
        plan = make_plan(self.template, grounding, self.dtype, outputs=[self.output])
        self.net = CompiledNet(plan, grounding, dtype=self.dtype, seed=self.seed)
        labels = self._labels(relation.keys)
        where = f"{self.target}"
        self.task = task if isinstance(task, Task) else detect(labels.column("y"), where, task)
        self.positions = labels.column("_rid").to_numpy()
        values = labels.column("y").to_pylist()
        labelled = np.array([v is not None for v in values])
        self.labelled = self.positions[labelled]
        raw = [v for v in values if v is not None]
        if self.task.kind in ("binary", "multiclass"):
            unknown = sorted({v for v in raw if v not in self.task.classes}, key=str)
            if unknown:
                raise SchemaError(f"target {where} has values {unknown[:5]} the model was not trained on")
        if split is None:
            times = labels.column("t").to_pylist() if self.time_column else None
            times = [t for t, keep in zip(times, labelled) if keep] if times is not None else None
            split = split_rows(len(raw), self.fractions, self.seed, times)
        self.rows = {k: np.asarray(v, dtype=np.int64) for k, v in split.items()}
        if self.task.kind == "regression" and not isinstance(task, Task):
            train_values = np.asarray(raw, dtype=np.float64)[self.rows["train"]]
            self.task.mean = float(train_values.mean()) if len(train_values) else 0.0
            self.task.std = float(train_values.std()) or 1.0
        self.y = torch.as_tensor(self.task.encode(raw), dtype=self.dtype, device=self.device)
        width = int(np.prod(self.net.plan.meta[self.net.plan.outputs[self.output]].shape[1:]))
        self.head = nn.Identity() if width == self.task.units else nn.Linear(width, self.task.units, dtype=self.dtype)
        self.net.to(self.device)
        self.head.to(self.device)

    def _labels(self, keys: list[str]) -> pa.Table:
        """(_rid of the output row, target value[, time]) for every target row that has a head."""
        k, t = "k", "t"
        select = [q.col("_rid", k), exp.alias_(q.col(self.column, t), q.ident("y"))]
        if self.time_column:
            select.append(exp.alias_(q.col(self.time_column, t), q.ident("t")))
        on = exp.and_(*[exp.NullSafeEQ(this=q.col(key, k), expression=q.col(key, t)) for key in keys])
        query = (exp.select(*select)
                 .from_(exp.alias_(self.db.temp_table("k", self.output), q.ident(k), table=True))
                 .join(exp.alias_(exp.Table(this=q.ident(self.table)), q.ident(t), table=True), on=on)
                 .order_by(q.col("_rid", k)))
        labels = self.db.arrow(query)
        if len(set(labels.column("_rid").to_pylist())) != labels.num_rows:
            raise SchemaError(f"target table `{self.table}` has several rows per output key {keys}; the key must be unique")
        return labels

    # -- training ---------------------------------------------------------------------------
    def _outputs(self) -> torch.Tensor:
        value = self.net()[self.output]
        return self.head(value.reshape(value.shape[0], -1))

    def _split_tensors(self, split: str) -> tuple[torch.Tensor, torch.Tensor]:
        rows = self.rows[split]
        index = torch.as_tensor(self.labelled[rows], device=self.device)
        return index, self.y[torch.as_tensor(rows, device=self.device)]

    def parameters(self) -> list[nn.Parameter]:
        return [p for p in [*self.net.parameters(), *self.head.parameters()] if p.requires_grad]

    def fit(self, epochs: int = 100, batch_size: int | None = None, lr: float = 0.01, patience: int = 20,
            weight_decay: float = 0.0) -> Model:
        """Adam on the training rows; keeps the weights of the best validation loss.

        `batch_size` is a number of target rows per step; each step still evaluates the full
        plan (demand-driven mini-batches that ground only what a batch needs come later).
        """
        from tqdm.auto import tqdm

        if len(self.rows["train"]) == 0:
            raise RelsqlError(f"no labelled target rows to train on in {self.target}")
        generator = torch.Generator().manual_seed(self.seed)
        optimizer = torch.optim.Adam(self.parameters(), lr=lr, weight_decay=weight_decay)
        train_index, train_y = self._split_tensors("train")
        monitor = "val" if len(self.rows["val"]) else "train"
        best_loss, best_state = float("inf"), None
        started = time.perf_counter()
        bar = tqdm(range(epochs), desc="training", unit="epoch", disable=None if self.progress is None else not self.progress)
        for epoch in bar:
            if batch_size:
                order = torch.randperm(len(train_y), generator=generator).to(self.device)
                batches = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
            else:
                batches = [None]
            for batch in batches:
                optimizer.zero_grad()
                out = self._outputs()
                index, y = (train_index, train_y) if batch is None else (train_index[batch], train_y[batch])
                loss = self.task.loss(out.index_select(0, index), y)
                loss.backward()
                optimizer.step()
            record = {"epoch": epoch, **self._losses()}
            self.history.append(record)
            current = record[f"{monitor}_loss"]
            bar.set_postfix(loss=f"{record['train_loss']:.4f}", val=f"{record['val_loss']:.4f}")
            if current < best_loss - 1e-7:
                best_loss, self.best_epoch = current, epoch
                best_state = (copy.deepcopy(self.net.state_dict()), copy.deepcopy(self.head.state_dict()))
            elif epoch - self.best_epoch >= patience:
                break
        if best_state is not None:
            self.net.load_state_dict(best_state[0])
            self.head.load_state_dict(best_state[1])
        self.timings["training"] = self.timings.get("training", 0.0) + time.perf_counter() - started
        return self

    def _losses(self) -> dict[str, float]:
        with torch.no_grad():
            out = self._outputs()
            record = {}
            for split in ("train", "val"):
                index, y = self._split_tensors(split)
                record[f"{split}_loss"] = float(self.task.loss(out.index_select(0, index), y)) if len(y) else float("nan")
                if split == "val" and len(y):
                    for name, value in self.task.scores(out.index_select(0, index).cpu().double().numpy(), y.cpu().double().numpy()).items():
                        record[f"val_{name}"] = value
        return record

    # -- results ----------------------------------------------------------------------------
    def evaluate(self, split: str = "test") -> dict[str, float]:
        """Metrics on a split: accuracy, ROC-AUC, F1 (classification) or MAE, RMSE (regression)."""
        if split not in self.rows:
            raise RelsqlError(f"unknown split {split!r}; use 'train', 'val' or 'test'")
        index, y = self._split_tensors(split)
        if len(y) == 0:
            raise RelsqlError(f"the {split} split has no rows")
        with torch.no_grad():
            out = self._outputs().index_select(0, index)
            scores = {"loss": float(self.task.loss(out, y))}
        scores.update(self.task.scores(out.cpu().double().numpy(), y.cpu().double().numpy()))
        return scores

    def predict(self) -> pl.DataFrame:
        """Every output row: its key columns, `prediction` and (classification) `probabilities`."""
        with torch.no_grad():
            out = self._outputs().cpu().double().numpy()
        keys = pl.from_arrow(self.net.grounding.relations[self.output].keys).sort("_rid").drop("_rid")
        predictions, probabilities = self.task.decode(out)
        frame = keys.with_columns(pl.Series("prediction", predictions))
        if probabilities is not None:
            frame = frame.with_columns(pl.Series("probabilities", probabilities.tolist(), dtype=pl.List(pl.Float64)))
        return frame

    def write_predictions(self, name: str, *, replace: bool = False) -> int:
        """Write `predict()` as a new table, atomically; an existing table needs replace=True."""
        frame = self.predict()
        self.db.write_table(name, frame.to_arrow(), replace=replace)
        return frame.height

    def report(self) -> str:
        return text_report(self)

    def named_weights(self) -> dict[str, nn.Parameter]:
        weights = dict(self.net.named_weights())
        for name, p in self.head.named_parameters():
            weights[f"_head.{name}"] = p
        return weights

    # -- persistence ------------------------------------------------------------------------
    def save(self, path: str | Path) -> Path:
        """Weights, encodings, task and split in one file (written atomically), plot beside it."""
        path = Path(path)
        state = {
            "format": FORMAT, "template": self.template.source, "language": self.template.language,
            "target": self.target, "output": self.output, "time_column": self.time_column,
            "fractions": self.fractions, "seed": self.seed, "dtype": str(self.dtype).removeprefix("torch."),
            "task": self.task.__dict__, "rows": {k: v.tolist() for k, v in self.rows.items()},
            "dictionaries": {w: t.to_pylist() for w, t in self.net.grounding.dictionaries.items()},
            "feature_stats": self.net.grounding.feature_stats,
            "net": {k: v.cpu() for k, v in self.net.state_dict().items()},
            "head": {k: v.cpu() for k, v in self.head.state_dict().items()},
            "history": self.history, "best_epoch": self.best_epoch,
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        os.close(handle)
        try:
            torch.save(state, temporary)
            os.replace(temporary, path)
        finally:
            if os.path.exists(temporary):
                os.remove(temporary)
        if self.history:
            plot_history(self.history, path.with_suffix(".png"), self.task.metric)
        return path

    @classmethod
    def load(cls, path: str | Path, db: Database, *, device: str | torch.device = "cpu") -> Model:
        """A saved model on `db`: grounded again with the saved encodings, same predictions."""
        try:
            state = torch.load(path, weights_only=False)
        except (OSError, RuntimeError) as err:
            raise RelsqlError(f"cannot read model file {path}: {err}") from None
        if not isinstance(state, dict) or state.get("format") != FORMAT:
            raise RelsqlError(f"{path} is not a relsql model file")
        template = Template.from_sql(state["template"]) if state["language"] == "sql" else Template.from_datalog(state["template"])
        model = cls.__new__(cls)
        model.db, model.template, model.target = db, template, state["target"]
        model.table, model.column = _parse_target(model.target)
        model.output, model.time_column = state["output"], state["time_column"]
        model.fractions, model.seed = tuple(state["fractions"]), state["seed"]
        model.dtype, model.device, model.progress = getattr(torch, state["dtype"]), torch.device(device), None
        model.history, model.best_epoch, model.timings = state["history"], state["best_epoch"], {}
        presets = Presets({w: pa.Table.from_pylist(rows) for w, rows in state["dictionaries"].items()}, state["feature_stats"])
        model._build(presets, Task(**state["task"]), split=state["rows"])
        net_state = model.net.state_dict()
        for key, saved in state["net"].items():
            if net_state[key].shape != saved.shape:  # an embedding met new values: they start at zero
                grown = torch.zeros_like(net_state[key])
                grown[: saved.shape[0]] = saved
                saved = grown
            net_state[key] = saved
        model.net.load_state_dict(net_state)
        model.head.load_state_dict(state["head"])
        model.net.to(model.device)
        model.head.to(model.device)
        return model


def _parse_target(target: str) -> tuple[str, str]:
    parts = target.split(".")
    if len(parts) != 2 or not all(parts):
        raise RelsqlError(f"target must be written table.column, got {target!r}")
    return parts[0], parts[1]
