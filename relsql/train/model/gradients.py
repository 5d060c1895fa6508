"""The training loss's gradient as relations: one new table per weight (`Model.gradients_as_relations`).

In-memory weights become (parameter, row, gradient list) tables; a database-stored embedding's
gradient is summed per key inside the database over the split's batches (GradientStaging).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import sqlglot.expressions as exp
import torch

from relsql import arguments
from relsql.data.duckdb import qualified
from relsql.data.engine import check_table_name
from relsql.errors import RelsqlError, SchemaError
from relsql.ground.demand import database_embeddings
from relsql.train.embeddings.embeddings import GradientStaging, table_suffix
from relsql.train.feed.batches import batches
from relsql.train.feed.source import BatchSource
from relsql.train.learner.learner import Learner


def write(model: Learner, prefix: str, split: str, replace: bool) -> dict[str, str]:
    """Model.gradients_as_relations: every table name checked first, then written; on a failure the
    tables this call created are dropped again."""
    if split not in model.rows or not len(model.rows[split]):
        raise RelsqlError(f"split {split!r} has no rows to take gradients on; use 'train', 'val' or 'test'")
    arguments.text("prefix", prefix)
    names = [*model.weights_by_name(), *(database_embeddings(model.template) if model.mini_batches else {})]
    tables = {name: check_table_name(prefix + table_suffix(name)) for name in names}
    existing = {t.casefold(): t for t in model.db.tables()}
    _check_new_tables(model, tables, existing, replace)  # all names first: a refused one must not leave others written
    for p in model.parameters():
        p.grad = None
    rows = model.rows[split]
    written = {}
    try:
        _write(model, tables, split, rows, replace, written)
    except BaseException:
        for table in written.values():  # tables this call created go again; replaced ones are gone either way
            if table.casefold() not in existing:
                model.db.execute(exp.Drop(tables=[qualified(table, model.db.scopes()[0])], kind="TABLE", exists=True))
        raise
    finally:
        for p in model.parameters():
            p.grad = None
    return written


def _check_new_tables(model: Learner, tables: dict[str, str], existing: dict[str, str], replace: bool) -> None:
    """Refuse before writing: two weights onto one table, an existing table without replace
    (`existing`: folded name -> name; relsql's own prefix is refused by check_table_name)."""
    seen: dict[str, str] = {}
    for name, table in tables.items():
        other = seen.setdefault(table.casefold(), name)
        if other != name:
            raise RelsqlError(f"weights `{other}` and `{name}` would both be written to table `{table}`; rename one of them")
        if table.casefold() in existing and not replace:
            raise SchemaError(f"table `{existing[table.casefold()]}` already exists in {model.db.description}; "
                              "choose another prefix or pass replace=True (nothing was written)")


def _write(model: Learner, tables: dict[str, str], split: str, rows: np.ndarray, replace: bool, written: dict[str, str]) -> None:
    """The split's loss backwards (batch by batch for mini-batch models), then one table per weight;
    `written` collects what is written so far, for the caller to undo."""
    if model.mini_batches:
        staging: dict[str, GradientStaging] = {}
        chunks = batches(rows, model.settings.batch_size, None)
        with BatchSource(model.batched) as source:
            for b, batch, external in source.epoch([model.labelled[positions] for positions in chunks]):
                positions = chunks[b]
                out = model.batch_outputs(batch, external)
                y = model.y[torch.as_tensor(positions, device=model.device)]
                (model.task.loss(out, y) * (len(positions) / len(rows))).backward()  # the mean over the split
                for weight, values in external.items():
                    if weight not in staging:
                        staging[weight] = GradientStaging(model.db, weight, values.shape[1])
                    source.run(staging[weight].add, batch.embedding_keys[weight], values.grad)
            for weight, stage in staging.items():
                source.run(stage.write, tables[weight], replace)
                written[weight] = tables[weight]
    else:
        index, y = model.goal.split_index(split)
        model.task.loss(model.outputs().index_select(0, index), y).backward()
    for name, parameter in model.weights_by_name().items():
        grad = parameter.grad if parameter.grad is not None else torch.zeros_like(parameter)
        matrix = grad.detach().cpu().double().reshape(grad.shape[0] if grad.dim() else 1, -1).numpy()
        table = pa.table({"parameter": [name] * matrix.shape[0], "row": np.arange(matrix.shape[0], dtype=np.int64),
                          "gradient": pa.array(matrix.tolist(), type=pa.list_(pa.float64()))})
        model.db.write_table(tables[name], table, replace=replace, kind="gradients")
        written[name] = tables[name]
