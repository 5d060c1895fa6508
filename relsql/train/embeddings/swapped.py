"""Database-stored embeddings on an engine without transactions (Spark's Parquet tables).

Such an engine cannot update a few rows of a table per training step, so these embeddings are
trained on ranks (relsql/train/embeddings/sharded.py: `fit()` runs one rank when asked for one worker) and
the table is written back whole: the ranks' changed rows merged with the untouched ones into a
new table swapped in (`SparkDatabase.replace_table`, a verb of engines without transactions
only: see relsql/data/engine.py), at each checkpoint and at the end. The table's
step counter travels in the table's own comment, so the rows and their step change together;
a swap cut short is finished when the table is next opened.

The parent reads rows (`fetch`: evaluation and prediction) by array indexing into the table's
rows, read once into memory-mapped arrays (relsql/train/embeddings/rowcache.py) and again after a swap; keys
the table does not hold start from the same hashed value as on DuckDB (`initial_values`).
"""

from __future__ import annotations

import itertools
import re
import tempfile
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import sqlglot.expressions as exp
import torch

from relsql import sql as q
from relsql.data.engine import ident
from relsql.errors import RelsqlError
from relsql.train.embeddings.embeddings import EmbeddingTable, initial_values
from relsql.train.embeddings.rowcache import RowCache

if TYPE_CHECKING:
    from relsql.data.spark import SparkDatabase

_views = itertools.count()
_STEP = re.compile(r"step (\d+)\)?$")
_generations: dict[tuple[int, str], int] = {}  # (database, table) -> how many times this process replaced the table
_SQL_TYPES = {"BIGINT": pa.int64(), "DOUBLE": pa.float64()}  # any other key is kept as a string


class SwappedEmbedding(EmbeddingTable):
    """One embedding table, replaced whole at each write-back; see the module's docstring."""

    def __init__(self, db: SparkDatabase, weight: str, width: int, key_type: pa.DataType | None, *, seed: int = 0,
                 optimizer: str = "adagrad", lr: float = 0.1):
        super().__init__(db, weight, width, seed=seed, optimizer=optimizer, lr=lr)
        self.table = exp.Table(this=ident(self.name), db=ident(self.scope[1]))
        self._identity = (id(db), self.name)
        self._changed()  # opening may finish a swap cut short (and another may have written it meanwhile)
        db.recover_table(self.name)
        if self.name in db.tables_in(self.scope):
            self._check_columns([c for c, _ in db.read_columns(self.name)])
            if self.step() is None:
                raise RelsqlError(f"table `{self.name}` in {db.description} has no relsql step counter in its comment; it is "
                                  "not an embedding relsql wrote: drop it or name the embedding differently")
        elif key_type is None:
            raise RelsqlError(f"embedding `{weight}` has no table `{self.name}` in {db.description}")
        else:
            sql_type = "DOUBLE" if pa.types.is_floating(key_type) else "BIGINT" if pa.types.is_integer(key_type) else "VARCHAR"
            empty = exp.select(*[exp.alias_(exp.cast(exp.null(), exp.DataType.build(sql_type if c == "key" else "DOUBLE")),
                                            ident(c))
                                 for c in self.columns()]).where(exp.false())
            db.replace_table(self.name, empty, self._comment(0))
        stored = dict(db.read_columns(self.name))["key"]
        self.key_arrow = _SQL_TYPES.get(stored, pa.string())

    def _comment(self, step: int) -> str:
        return f"relsql embedding (weight {self.weight!r}, step {int(step)})"

    def step(self) -> int | None:
        found = _STEP.search(self.db.table_comment(self.name) or "")
        return None if found is None else int(found.group(1))

    def fetch(self, keys: pa.Array) -> torch.Tensor:
        """The rows of `keys` in the order of `keys`: (n, width) float64, by array indexing into
        the table's rows, read once (one scan) and again only after the table changed."""
        keys = self._checked(keys)
        rows = self._rows()
        _, values = rows.read(keys, lambda fresh: initial_values(fresh, self.width, self.seed))
        return torch.from_numpy(np.ascontiguousarray(values[:, :self.width]))

    def _rows(self) -> RowCache:
        """This table's rows in memory-mapped arrays, read again when any SwappedEmbedding of
        this process replaced the table since (its generation moved)."""
        generation = _generations.get(self._identity, 0)
        if self._cache is None or self._cache[0] != generation:
            rows = RowCache(self.width, self.key_arrow, tempfile.gettempdir())
            columns = [q.col(c) for c in self.columns()]
            for batch in self.db.reader(exp.select(*columns).from_(self.table.copy()), 1 << 17):
                rows.load(batch)
            self._cache = (generation, rows)
        return self._cache[1]

    def _changed(self) -> None:
        """The table was replaced: every instance's rows of it are stale."""
        _generations[self._identity] = _generations.get(self._identity, 0) + 1
        self._cache = None

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
            self._changed()
