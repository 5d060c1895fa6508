"""The target of a model: which column it predicts, its labelled rows, the task and the split.

The output relation is joined with the target table on its key columns, so each labelled
target row gets the value of its head; rows with a NULL target are prediction-only. Temporal
splits order rows by `time_column`. A template that reads the label is refused here too: a
model that sees its label learns nothing.
"""

from __future__ import annotations

import warnings

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import sqlglot.expressions as exp
import torch

from relsql import sql as q
from relsql.data.engine import Database
from relsql.errors import RelsqlError, SchemaError
from relsql.template.ir import Template
from relsql.train.task import checks
from relsql.train.task.leakage import target_reads
from relsql.train.task.split import split_rows
from relsql.train.task.task import Task, detect


class UnknownTimeWarning(UserWarning):
    """Labelled target rows without a time (NULL in the time column) are left out of training."""


class Target:
    """`table.column` predicted from relation `output`; after `label`, its rows, task and split.

    `positions`: the output row of every target row; `labelled`: those with a label, in label
    order; `rows[split]`: positions into `labelled`; `y`: the encoded labels, in `labelled` order."""

    def __init__(self, table: str, column: str, output: str, keys: list[str], time_column: str | None,
                 fractions: tuple[float, float, float], seed: int):
        self.table, self.column, self.output, self.keys = table, column, output, list(keys)
        self.time_column, self.fractions, self.seed = time_column, fractions, seed
        self.task: Task | None = None
        self.positions = self.labelled = np.zeros(0, dtype=np.int64)
        self.rows: dict[str, np.ndarray] = {}
        self.y = torch.zeros(0)

    @property
    def name(self) -> str:
        return f"{self.table}.{self.column}"

    def refuse_leaks(self, template: Template, db: Database) -> None:
        """A template that reads the target column (or a copy of it) is refused."""
        reads = target_reads(template, db, self.table, self.column, self.time_column)
        if reads:
            raise SchemaError(f"the template reads the target {self.name} it is to predict: {'; '.join(reads[:3])}"
                              f"{' ...' if len(reads) > 3 else ''}. A model that sees its label learns nothing: remove "
                              "these inputs, or pass allow_target_inputs=True if their values are known before "
                              "prediction time")

    def check_columns(self, db: Database) -> None:
        """The target table has the target, time and key columns the output relation needs."""
        columns = dict(db.columns(self.table))
        if self.column not in columns:
            raise SchemaError(f"target {self.name}: table `{self.table}` has no column `{self.column}`; "
                              f"columns: {', '.join(columns)}")
        if self.time_column is not None and self.time_column not in columns:
            raise SchemaError(f"time_column `{self.time_column}` is not a column of `{self.table}`")
        missing = [k for k in self.keys if k not in columns]
        if missing or not self.keys:
            raise SchemaError(
                f"output relation `{self.output}` is keyed by {self.keys}, but the target table `{self.table}` "
                f"has no column(s) {missing or '(none)'}; select the target table's key as the output's head key "
                f"(e.g. `SELECT t.id, ... FROM {self.table} t ... GROUP BY t.id`)")

    def read(self, db: Database) -> pa.Table:
        """(_rid of the output row, target value[, time]) for every target row that has a head."""
        checks.key_types(db, self.output, self.table, self.keys)
        k, t = "k", "t"
        select = [q.col("_rid", k), exp.alias_(q.col(self.column, t), q.ident("y"))]
        if self.time_column:
            select.append(exp.alias_(q.col(self.time_column, t), q.ident("t")))
        on = exp.and_(*[exp.NullSafeEQ(this=q.col(key, k), expression=q.col(key, t)) for key in self.keys])
        query = (exp.select(*select)
                 .from_(exp.alias_(db.temp_table("k", self.output), q.ident(k), table=True))
                 .join(exp.alias_(exp.Table(this=q.ident(self.table)), q.ident(t), table=True), on=on)
                 .order_by(q.col("_rid", k)))
        labels = db.arrow(query)
        if len(set(labels.column("_rid").to_pylist())) != labels.num_rows:
            raise SchemaError(f"target table `{self.table}` has several rows per output key {self.keys}; the key must be unique")
        return labels

    def label(self, db: Database, labels: pa.Table, task: str | Task | None, split: dict | None,
              dtype: torch.dtype, device: torch.device) -> None:
        """Task, labelled rows, split and encoded labels from `labels` (see `read`). A Task given
        (a saved model's) is kept as it is, with its classes and standardization."""
        column = labels.column("y").combine_chunks()
        valid = pc.is_valid(column)
        if pa.types.is_floating(column.type):  # NaN or an infinity is no label: the row is predicted, not learnt from
            valid = pc.and_(valid, pc.fill_null(pc.is_finite(column), False))
        if self.time_column:
            valid = self._timed(valid, labels.column("t"))
        self.task = task if isinstance(task, Task) else detect(column.filter(valid), self.name, task)
        self.positions = labels.column("_rid").to_numpy()
        labelled = valid.to_numpy(zero_copy_only=False)  # per row, without Python objects
        self.labelled = self.positions[labelled]
        raw = column.filter(valid)
        if split is None:
            times = labels.column("t").filter(pa.array(labelled)) if self.time_column else None
            split = split_rows(len(raw), self.fractions, self.seed, times)
            self.check_splits(db, split, len(raw))
        self.rows = {k: np.asarray(v, dtype=np.int64) for k, v in split.items()}
        if self.task.kind == "regression" and not isinstance(task, Task):  # standardized by the training rows
            train_values = pc.cast(raw, pa.float64()).to_numpy(zero_copy_only=False)[self.rows["train"]]
            self.task.mean = float(train_values.mean()) if len(train_values) else 0.0
            self.task.std = float(train_values.std()) or 1.0
        encoded = self.task.encode(raw)
        if self.task.kind in ("binary", "multiclass") and (encoded < 0).any():
            unknown = sorted(set(raw.filter(pa.array(encoded < 0)).unique().to_pylist()), key=str)
            raise SchemaError(f"target {self.name} has values {unknown[:5]} the model was not trained on")
        self.y = torch.as_tensor(encoded, dtype=dtype, device=device)

    def _timed(self, valid: pa.Array, times: pa.ChunkedArray) -> pa.Array:
        """`valid` without the rows whose time is NULL: a time split cannot place them and the time
        cut reads no history for them, so, like a NaN label, they are predicted and not learnt from
        or scored (real tables have rows of unknown date; refusing the whole target was worse)."""
        known = pc.is_valid(times.combine_chunks())
        count = int(pc.sum(pc.and_(valid, pc.invert(known))).as_py() or 0)
        if count:
            warnings.warn(f"target {self.name}: {count:,} labelled row(s) have no {self.table}.{self.time_column} "
                          "(NULL): they are predicted but neither learnt from nor scored; fill their time to use them",
                          UnknownTimeWarning, stacklevel=4)
            valid = pc.and_(valid, known)
        return valid

    def check_splits(self, db: Database, split: dict[str, np.ndarray], labelled: int) -> None:
        """Every split asked for gets rows: a model trained on one row, or judged on none, is not a
        result. The message says how many target rows the output relation reaches."""
        empty = [name for name, fraction in zip(("train", "val", "test"), self.fractions)
                 if fraction > 0 and not len(split[name])]
        if not empty:
            return
        count = exp.select(exp.Count(this=q.col(self.column))).from_(exp.Table(this=q.ident(self.table)))
        total = db.arrow(count).column(0)[0].as_py()
        raise RelsqlError(
            f"the {' and '.join(empty)} split{'s are' if len(empty) > 1 else ' is'} empty: output relation `{self.output}` "
            f"has a row for {labelled} of the {total} labelled rows of `{self.table}`. Check that `{self.output}` is the "
            f"relation that predicts {self.name} (output=...), add labelled rows, or give those splits 0 in split=")

    def restore(self, task: Task, labelled: np.ndarray, rows: dict[str, np.ndarray], y: torch.Tensor) -> None:
        """The labels a trained model already has (a training rank's), without reading the database."""
        self.task, self.labelled, self.positions = task, labelled, labelled
        self.rows, self.y = {k: np.asarray(v, dtype=np.int64) for k, v in rows.items()}, y

    def split_index(self, split: str) -> tuple[torch.Tensor, torch.Tensor]:
        """(output rows, encoded labels) of a split's rows."""
        rows = self.rows[split]
        index = torch.as_tensor(self.labelled[rows], device=self.y.device)
        return index, self.y[torch.as_tensor(rows, device=self.y.device)]
