"""Database-stored embeddings on an engine without transactions (Spark's Parquet tables).

Such an engine cannot update a few rows of a table per training step, so these embeddings are
trained on ranks (relsql/train/sharded.py: `fit()` runs one rank when asked for one worker) and
the table is written back whole: the ranks' changed rows merged with the untouched ones into a
new table swapped in (`Database.replace_table`), at each checkpoint and at the end. The table's
step counter travels in the table's own comment, so the rows and their step change together;
a swap cut short is finished when the table is next opened.

The parent reads rows with one join per call (`fetch`: evaluation and prediction); keys the
table does not hold start from the same hashed value as on DuckDB (`initial_values`).
"""

from __future__ import annotations

import itertools
import re

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import sqlglot.expressions as exp
import torch

from relsql import sql as q
from relsql.db import Database, ident
from relsql.errors import RelsqlError
from relsql.train.embeddings import EmbeddingTable, initial_values

_views = itertools.count()
_STEP = re.compile(r"step (\d+)\)?$")
_SQL_TYPES = {"BIGINT": pa.int64(), "DOUBLE": pa.float64()}  # any other key is kept as a string


class SwappedEmbedding(EmbeddingTable):
    """One embedding table, replaced whole at each write-back; see the module's docstring."""

    def __init__(self, db: Database, weight: str, width: int, key_type: pa.DataType | None, *, seed: int = 0,
                 optimizer: str = "adagrad", lr: float = 0.1):
        super().__init__(db, weight, width, seed=seed, optimizer=optimizer, lr=lr)
        self.table = exp.Table(this=ident(self.name), db=ident(self.scope[1]))
        db.recover_table(self.name)
        if self.name in db._tables_in(self.scope):
            self._check_columns([c for c, _ in db._columns(self.name)])
            if self.step() is None:
                raise RelsqlError(f"table `{self.name}` in {db.description} has no relsql step counter in its comment; it is "
                                  "not an embedding relsql wrote: drop it or name the embedding differently")
        elif key_type is None:
            raise RelsqlError(f"embedding `{weight}` has no table `{self.name}` in {db.description}")
        else:
            sql_type = "DOUBLE" if pa.types.is_floating(key_type) else "BIGINT" if pa.types.is_integer(key_type) else "VARCHAR"
            empty = exp.select(*[exp.alias_(exp.cast(exp.null(), exp.DataType.build(sql_type if c == "key" else "DOUBLE")), ident(c))
                                 for c in self.columns()]).where(exp.false())
            db.replace_table(self.name, empty, self._comment(0))
        stored = dict(db._columns(self.name))["key"]
        self.key_arrow = _SQL_TYPES.get(stored, pa.string())

    def _comment(self, step: int) -> str:
        return f"relsql embedding (weight {self.weight!r}, step {int(step)})"

    def step(self) -> int | None:
        found = _STEP.search(self.db.table_comment(self.name) or "")
        return None if found is None else int(found.group(1))

    def fetch(self, keys: pa.Array) -> torch.Tensor:
        """The rows of `keys` in the order of `keys`: (n, width) float64, one join."""
        keys = self._checked(keys)
        view = f"{self.db._prefix}emb_{next(_views)}"
        self.db.register(view, pa.table({"key": keys, "_pos": np.arange(len(keys), dtype=np.int64)}))
        try:
            found = self.db.arrow(exp.select(q.col("_pos", "n"), exp.alias_(exp.Not(this=exp.Is(
                this=q.col("key", "t"), expression=exp.null())), ident("_found")), *[q.col(f"e{i}", "t") for i in range(self.width)]).from_(
                exp.alias_(exp.Table(this=ident(view)), ident("n"), table=True)).join(
                exp.alias_(self.table.copy(), ident("t"), table=True), join_type="left",
                on=exp.EQ(this=q.col("key", "t"), expression=q.col("key", "n"))))
        finally:
            self.db.unregister(view)
        order = found.column("_pos").to_numpy()  # Spark's join gives no order: put rows back by position
        values = np.zeros((len(keys), self.width))
        for i in range(self.width):
            values[order, i] = pc.fill_null(found.column(f"e{i}"), 0.0).to_numpy()
        missing = np.sort(order[~pc.fill_null(found.column("_found"), False).to_numpy()])
        if len(missing):
            values[missing] = initial_values(keys.take(pa.array(missing)), self.width, self.seed)
        return torch.from_numpy(values)

    def update(self, keys: pa.Array, grad: torch.Tensor) -> None:
        raise RelsqlError(f"{self.db.description} has no transactions to update embedding `{self.weight}` step by step: "
                          "it trains on ranks (fit(workers=N), N >= 1); train with Model.fit, not batch by batch")

    def replace_rows(self, rows: pa.Table, step: int) -> None:
        """Put the ranks' rows back (those keys' old rows replaced) with the step counter: a new
        table of the untouched rows and these, swapped in."""
        rows = rows.set_column(0, "key", self._keys(rows.column("key"))).select(self.columns())
        view = f"{self.db._prefix}emb_{next(_views)}"
        self.db.register(view, rows)
        try:
            kept = exp.select(*[q.col(c, "t") for c in self.columns()]).from_(
                exp.alias_(self.table.copy(), ident("t"), table=True)).join(
                exp.alias_(exp.Table(this=ident(view)), ident("n"), table=True), join_type="left anti",
                on=exp.EQ(this=q.col("key", "t"), expression=q.col("key", "n")))
            new = exp.select(*[q.col(c) for c in self.columns()]).from_(exp.Table(this=ident(view)))
            self.db.replace_table(self.name, exp.union(kept, new, distinct=False), self._comment(step))
        finally:
            self.db.unregister(view)
