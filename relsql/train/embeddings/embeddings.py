"""Out-of-core embeddings: `embed(key, d, storage='database')` keeps one learnable row per key
value in a database table, never the whole table in torch.

Each batch reads the rows of the keys it uses (keys never seen before start from a seeded,
key-determined initial value), trains them as an ordinary leaf tensor, and hands back their
gradient; an SGD or Adagrad step computes the batch's new rows. A step reads and writes rows
in memory-mapped arrays by key (relsql/train/embeddings/rowcache.py), not the table: its cost does not grow
with the table. The rows changed since the last write-back go into the table with its step
counter in one transaction (`flush`) at every checkpoint and best-epoch copy, before anything
reads the table, and when the process exits; a crash (SIGKILL) leaves the table at its last
write-back, whole, and a resumed run starts from the checkpoint's copy as before.

The table `relsql_embedding_<weight>` has columns `key`, `e0..e{d-1}` and, for Adagrad, the
accumulated squared gradients `a0..a{d-1}`; `relsql_embedding_steps` holds each table's step.
Engines without transactions (Spark) keep the same columns in a table replaced whole
(relsql/train/embeddings/swapped.py); training ranks hold shards of it (relsql/train/embeddings/sharded.py).
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import tempfile
import threading
import weakref

import duckdb
import numpy as np
import pyarrow as pa
import sqlglot.expressions as exp
import torch

from relsql import sql as q
from relsql.data.duckdb import fetch_arrow, qualified
from relsql.data.engine import Database, ident
from relsql.errors import RelsqlError, SourceError
from relsql.template import ir
from relsql.train.embeddings.rowcache import RowCache

log = logging.getLogger("relsql")

STEPS = "relsql_embedding_steps"
OPTIMIZERS = ("sgd", "adagrad")
EPS = 1e-10  # torch.optim.Adagrad's default
_views = itertools.count()


def table_suffix(weight: str) -> str:
    """A weight's name as it appears in table names (letters, digits, underscores)."""
    return ir.table_suffix(weight)


def table_name(weight: str) -> str:
    return "relsql_embedding_" + table_suffix(weight)


def initial_rows(view: str, width: int, seed: int) -> exp.Select:
    """The initial rows of the keys in `view` (column `key`, in the table's key type), `e0..`:
    uniform values in [-sqrt(3), sqrt(3)) (unit variance) from DuckDB's hash of (key, i, seed), so
    a key starts from the same row in whichever process first reads it."""
    def value(i: int) -> exp.Expression:
        hashed = exp.Anonymous(this="hash", expressions=[q.col("key", "n"), q.integer(i), q.integer(seed)])
        unit = exp.Div(this=exp.Mod(this=hashed, expression=q.integer(1_000_003)), expression=q.real(1_000_003.0))
        return exp.Mul(this=exp.paren(exp.Sub(this=exp.Mul(this=unit, expression=q.real(2.0)), expression=q.real(1.0))),
                       expression=q.real(math.sqrt(3.0)))

    return exp.select(*[exp.alias_(value(i), ident(f"e{i}")) for i in range(width)]).from_(
        exp.alias_(exp.Table(this=ident(view)), ident("n"), table=True))


_hasher = threading.local()  # this thread's in-memory DuckDB for initial rows, opened on first use
_FRESH = "relsql_fresh_keys"


def initial_values(keys: pa.Array, width: int, seed: int) -> np.ndarray:
    """(len(keys), width): the starting rows of `keys` as `initial_rows` defines them, computed
    in an in-memory DuckDB of this process, whatever engine holds the table (their hash decides)."""
    if not width:
        return np.zeros((len(keys), 0))
    if not hasattr(_hasher, "con"):
        _hasher.con = duckdb.connect()
    _hasher.con.register(_FRESH, pa.table({"key": keys}))
    try:
        table = fetch_arrow(_hasher.con, initial_rows(_FRESH, width, seed).sql("duckdb"))
    finally:
        _hasher.con.unregister(_FRESH)
    return np.stack([table.column(i).to_numpy() for i in range(width)], axis=1)


def step(e: np.ndarray, a: np.ndarray, g: np.ndarray, optimizer: str, lr: float) -> tuple[np.ndarray, np.ndarray]:
    """One optimizer step on embedding rows `e` with accumulators `a` and gradient `g`."""
    if optimizer == "sgd":
        return e - lr * g, a
    a = a + g * g  # Adagrad: a += g^2; e -= lr * g / (sqrt(a) + eps)
    return e - lr * g / (np.sqrt(a) + EPS), a


class EmbeddingTable:
    """What every engine's embedding table shares: its name, optimizer settings, key type and
    whole-table reads (the ranks' starting rows, tests)."""

    key_arrow: pa.DataType

    def __init__(self, db: Database, weight: str, width: int, *, seed: int = 0, optimizer: str = "adagrad", lr: float = 0.1):
        if optimizer not in OPTIMIZERS:
            raise RelsqlError(f"embedding optimizer {optimizer!r} is not one of {OPTIMIZERS}")
        if db.read_only:
            raise SourceError(f"embed(..., storage='database') keeps `{weight}` in a table of {db.description}, which was "
                              "opened read-only; reconnect with read_only=False or keep the embedding in memory")
        self.db, self.weight, self.width, self.seed = db, weight, width, seed
        self.optimizer, self.lr = optimizer, lr
        self.name = table_name(weight)
        self.scope = db.scopes()[0]
        self.table = qualified(self.name, self.scope)

    def columns(self) -> list[str]:
        return ["key", *[f"{p}{i}" for p in ("e", "a") for i in range(self.width)]]

    def _check_columns(self, found: list[str]) -> None:
        if found != self.columns():
            raise RelsqlError(f"table `{self.name}` exists with columns {found}; it is not an embedding of width "
                              f"{self.width}: drop it or name the embedding differently")

    def _keys(self, keys: pa.Array) -> pa.Array:
        """Keys in the table's own type: a join on mismatched types cannot use a plain hash join
        (it cost 10-20x on a UBIGINT key against a BIGINT column)."""
        keys = keys.combine_chunks() if isinstance(keys, pa.ChunkedArray) else keys
        return keys.cast(self.key_arrow, safe=True) if keys.type != self.key_arrow else keys

    def _checked(self, keys: pa.Array) -> pa.Array:
        if keys.null_count:
            raise RelsqlError(f"embedding `{self.weight}`: {keys.null_count} keys are NULL; filter them out in the template")
        return self._keys(keys)

    def flush(self) -> None:
        """Bring the table up to date with rows trained ahead of it (none here)."""

    def rows(self) -> int:
        self.flush()
        return self.db.scalar(exp.select(exp.Count(this=exp.Star())).from_(self.table.copy()))[0]

    def export(self, path: str) -> None:
        """Every row (key, e.., a..) into an Arrow IPC file, streamed: the training ranks' starting rows."""
        self.flush()
        reader = self.db.reader(exp.select(*[q.col(c) for c in self.columns()]).from_(self.table.copy()), 1 << 20)
        with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, reader.schema) as writer:
            for chunk in reader:
                writer.write_batch(chunk)

    def values(self) -> dict:
        """{key: vector} of every row (for tests and small tables)."""
        self.flush()
        table = self.db.arrow(exp.select(q.col("key"), *[q.col(f"e{i}") for i in range(self.width)]).from_(self.table.copy()))
        keys = table.column(0).to_pylist()
        matrix = (np.stack([table.column(i + 1).to_numpy() for i in range(self.width)], axis=1) if self.width
                  else np.zeros((len(keys), 0)))
        return dict(zip(keys, matrix))


class DatabaseEmbedding(EmbeddingTable):
    """One embedding table of a transactional database (DuckDB) and its optimizer, updated in SQL."""

    def __init__(self, db: Database, weight: str, width: int, key_type: pa.DataType | None, *, seed: int = 0,
                 optimizer: str = "adagrad", lr: float = 0.1):
        super().__init__(db, weight, width, seed=seed, optimizer=optimizer, lr=lr)
        self.steps = qualified(STEPS, self.scope)
        self._create(key_type)
        stored = dict(self.db.read_columns(self.name))["key"]
        self.key_arrow = {"UBIGINT": pa.uint64(), "BIGINT": pa.int64(), "DOUBLE": pa.float64()}.get(stored, pa.string())
        self._live = LiveRows(self)
        self._fetched: tuple[RowCache, pa.Array, np.ndarray] | None = None
        weakref.finalize(self, self._live.flush_quietly)  # collected, or the process exits: its rows reach the table

    # -- the table -----------------------------------------------------------------------------
    def _sql_type(self, key_type: pa.DataType | None) -> str:
        if key_type is None:
            return "VARCHAR"
        if pa.types.is_unsigned_integer(key_type):
            return "UBIGINT"
        if pa.types.is_integer(key_type):
            return "BIGINT"
        if pa.types.is_floating(key_type):
            return "DOUBLE"
        return "VARCHAR"

    def _create(self, key_type: pa.DataType | None) -> None:
        # No PRIMARY KEY: keys are only ever inserted where missing, and an index over 10M keys cost
        # hundreds of MB and made putting a snapshot back (delete + insert) run out of memory.
        columns = [exp.ColumnDef(this=ident("key"), kind=exp.DataType.build(self._sql_type(key_type)))]
        columns += [exp.ColumnDef(this=ident(f"{p}{i}"), kind=exp.DataType.build("DOUBLE"))
                    for p in ("e", "a") for i in range(self.width)]
        existing = {t.casefold(): t for t in self.db.tables_in(self.scope)}  # DuckDB folds case
        if STEPS.casefold() in existing:  # checked before anything is created
            found = [c for c, _ in self.db.read_columns(existing[STEPS.casefold()])]
            if found != ["weight", "step"]:
                raise RelsqlError(f"table `{existing[STEPS.casefold()]}` exists with columns {found}, but relsql keeps its "
                                  f"embedding step counters in a table of that name (weight, step): rename your table")
        if self.name.casefold() in existing:
            self._check_columns([c for c, _ in self.db.read_columns(existing[self.name.casefold()])])
        elif key_type is None:
            raise RelsqlError(f"embedding `{self.weight}` has no table `{self.name}` in {self.db.description}")
        else:
            self.db.execute(exp.Create(this=exp.Schema(this=self.table.copy(), expressions=columns), kind="TABLE", exists=True))
        if STEPS.casefold() not in existing:
            self.db.execute(exp.Create(this=exp.Schema(this=self.steps.copy(), expressions=[
                exp.ColumnDef(this=ident("weight"), kind=exp.DataType.build("VARCHAR"),
                              constraints=[exp.ColumnConstraint(kind=exp.PrimaryKeyColumnConstraint())]),
                exp.ColumnDef(this=ident("step"), kind=exp.DataType.build("BIGINT"))]), kind="TABLE", exists=True))
        if self._table_step() is None:
            self.db.transaction([exp.Insert(this=self.steps.copy(), expression=exp.select(
                exp.Literal.string(self.weight), q.integer(0)))])

    def step(self) -> int | None:
        """How many updates the embedding has had (None before the first use); the table is
        brought up to date first."""
        self.flush()
        return self._table_step()

    def _table_step(self) -> int | None:
        row = self.db.scalar(exp.select(q.col("step")).from_(self.steps.copy()).where(
            exp.EQ(this=q.col("weight"), expression=exp.Literal.string(self.weight))))
        return None if row is None else int(row[0])

    def _view(self, data: pa.Table) -> str:
        name = f"{self.db._prefix}emb_{next(_views)}"
        self.db.register(name, data)
        return name

    # -- a batch -------------------------------------------------------------------------------
    # A step reads and writes its keys' rows in memory-mapped arrays (relsql/train/embeddings/rowcache.py),
    # loaded from the table once; the rows it changed go back to the table with the step counter
    # in one transaction (`flush`) before anything reads or copies the table: a checkpoint's or
    # the best epoch's copy, `values`, `rows`, `export`, another instance taking the table over,
    # and at the latest when this object is collected or the process exits (a KeyboardInterrupt
    # included). The join per step this replaces read every vector of the table: 0.19 s a step
    # on an empty table, 0.66 s on 7.4M rows (demos/out_of_core.py).
    def fetch(self, keys: pa.Array) -> torch.Tensor:
        """The rows of `keys` in the order of `keys`: (n, width) float64. Keys never seen get their
        initial rows, which the database holds only once a step updated them."""
        keys = self._checked(keys)
        with self._live.lock:
            cache = self._live.cache(self)
            _, rows = cache.peek(keys, self._initial)
            self._fetched = (cache, keys, rows)  # what `update` starts from when it gets the same keys
        return torch.from_numpy(np.ascontiguousarray(rows[:, :self.width]))

    def _initial(self, keys: pa.Array) -> np.ndarray:
        return initial_values(keys, self.width, self.seed)

    def update(self, keys: pa.Array, grad: torch.Tensor) -> None:
        """One optimizer step on the rows of `keys` with their gradient (n, width); the table gets
        it at the next `flush`."""
        keys = self._keys(keys)
        g = grad.detach().to("cpu", torch.float64).reshape(len(keys), self.width).numpy()
        with self._live.lock:
            cache = self._live.cache(self)
            fetched, self._fetched = self._fetched, None
            if fetched is not None and fetched[0] is cache and fetched[1].equals(keys):
                slots, rows = cache.assign(keys), fetched[2]  # no step since the fetch: its rows are current
            else:
                slots, rows = cache.read(keys, self._initial)
            e, a = step(rows[:, :self.width], rows[:, self.width:], g, self.optimizer, self.lr)
            cache.write(slots, np.concatenate([e, a], axis=1))
            self._live.step += 1

    def flush(self) -> None:
        """The rows changed since the last flush into the table, with the step counter, in one
        transaction (a no-op when nothing changed)."""
        self._live.claim()
        self._live.flush()

    # -- training ranks (relsql/train/embeddings/sharded.py) --------------------------------------------------
    def replace_rows(self, rows: pa.Table, step: int) -> None:
        """Put the ranks' rows back (those keys' old rows replaced) and set the step counter, in one
        transaction: the table is at the run's start or at its end, never in between."""
        self.flush()
        self._live.forget()
        self._live.materialize()
        rows = rows.set_column(0, "key", self._keys(rows.column("key")))
        view = self._view(rows)
        try:
            delete = exp.Delete(this=self.table.copy(), where=exp.Where(this=exp.In(
                this=q.col("key"), query=exp.Subquery(this=exp.select(q.col("key")).from_(exp.Table(this=ident(view)))))))
            insert = exp.Insert(this=self.table.copy(), expression=exp.select(exp.Star()).from_(exp.Table(this=ident(view))))
            counter = exp.Update(this=self.steps.copy(), expressions=[exp.EQ(this=q.col("step"), expression=q.integer(step))],
                                 where=exp.Where(this=exp.EQ(this=q.col("weight"), expression=exp.Literal.string(self.weight))))
            self.db.transaction([delete, insert, counter])
        finally:
            self.db.unregister(view)

    # -- snapshots -------------------------------------------------------------------------------
    # A checkpoint's copy lives in the database beside the table, named by the step it holds
    # (`<table>_checkpoint_<step>`), and the checkpoint file names that step: a crash between
    # copying and writing the file leaves the file naming the previous copy, which is dropped
    # only after the file is in place. The best epoch's copy lives in DuckDB's temp catalog:
    # a killed run leaves nothing of it behind.
    def checkpoint_table(self, step: int) -> exp.Table:
        return qualified(f"{self.name}_checkpoint_{int(step)}", self.scope)

    def best_table(self) -> exp.Table:
        return self.db.temp_table("best", self.name)

    def snapshot(self, copy: exp.Table | None = None) -> int:
        """Copy the table aside (to `copy`, default: its checkpoint copy), atomically; returns its step.
        A temp copy (the best epoch's) is only noted: the table is that copy until it next
        changes, and is copied then, if ever (`LiveRows.materialize`)."""
        if copy is not None and copy.catalog == "temp":
            return self._defer(copy)
        step = self.step()
        copy = copy if copy is not None else self.checkpoint_table(step)
        create = exp.Create(this=copy.copy(), kind="TABLE", replace=True, expression=exp.select(
            exp.Star(), exp.alias_(q.integer(step), ident("_step"))).from_(self.table.copy()))
        if copy.catalog == "temp":
            create.set("properties", exp.Properties(expressions=[exp.TemporaryProperty()]))
        self.db.transaction([create])
        return step

    def _defer(self, copy: exp.Table) -> int:
        live = self._live
        live.claim()
        with live.lock:
            if live.deferred is not None and live.deferred[0].name == copy.name:
                live.deferred = None  # superseded: never copied
            self.flush()
            step = self._table_step()
            self.db.execute(exp.Drop(tables=[copy.copy()], kind="TABLE", exists=True))  # an older copy made under that name
            live.deferred = (copy.copy(), step)
        return step

    def _deferred(self, copy: exp.Table) -> bool:
        """Whether `copy` is the noted one: the table itself, unchanged since."""
        deferred = self._live.deferred
        return deferred is not None and deferred[0].name == copy.name and deferred[0].catalog == copy.catalog

    def restore(self, copy: exp.Table | int) -> int:
        """Put a copy back (table and step counter, one transaction): a table, or the checkpoint
        copy of a step. Returns its step."""
        copy = self.checkpoint_table(copy) if isinstance(copy, int) else copy
        if self._deferred(copy):  # the table is still that copy: only the rows trained since go
            self._live.claim()
            self._live.forget()
            return self._live.deferred[1]
        if not self._exists(copy):
            raise RelsqlError(f"no copy {copy.name} of embedding `{self.weight}` in the database: the checkpoint "
                              "does not match the database (was the table dropped?); train without resume=True")
        step = self._step_of(copy)
        columns = ["key", *[f"{p}{i}" for p in ("e", "a") for i in range(self.width)]]
        fresh = qualified(f"{self.name}__restoring", self.scope)
        self._live.claim()
        self._live.forget()  # rows trained since the last flush: the copy replaces them
        self._live.materialize()
        self.db.transaction([  # a new table swapped in: no row-by-row delete and re-insert
            exp.Create(this=fresh, kind="TABLE", replace=True,
                       expression=exp.select(*[q.col(c) for c in columns]).from_(copy.copy())),
            exp.Drop(tables=[self.table.copy()], kind="TABLE"),
            exp.Alter(this=fresh.copy(), kind="TABLE", actions=[exp.AlterRename(this=exp.Table(this=ident(self.name)))]),
            exp.Update(this=self.steps.copy(), expressions=[exp.EQ(this=q.col("step"), expression=q.integer(step))],
                       where=exp.Where(this=exp.EQ(this=q.col("weight"), expression=exp.Literal.string(self.weight)))),
        ])
        return step

    def _step_of(self, copy: exp.Table) -> int:
        """The step a copy holds (recorded in its `_step` column when it was made)."""
        if self._deferred(copy):
            return self._live.deferred[1]
        row = self.db.scalar(exp.select(exp.Max(this=q.col("_step"))).from_(copy.copy()))
        return int(row[0]) if row and row[0] is not None else 0

    def _exists(self, table: exp.Table) -> bool:
        if self._deferred(table):
            return True
        if table.catalog == "temp":
            return self.db.temp_exists(table)
        return table.name in self.db.tables_in(self.scope)

    def drop(self, copy: exp.Table) -> None:
        if self._deferred(copy):
            self._live.deferred = None
        self.db.execute(exp.Drop(tables=[copy.copy()], kind="TABLE", exists=True))

    def kept_best_table(self, step: int) -> exp.Table:
        return qualified(f"{self.name}_best_{int(step)}", self.scope)

    def keep_best(self) -> int | None:
        """For a checkpoint: the best epoch's copy (temp) also kept in the database, named by its
        step, so a resumed run can still go back to it. Returns that step (None: no best yet)."""
        best = self.best_table()
        if not self._exists(best):
            return None
        step = self._step_of(best)
        kept = self.kept_best_table(step)
        if not self._exists(kept):
            source = exp.select(exp.Star()).from_(best.copy()) if not self._deferred(best) else exp.select(
                exp.Star(), exp.alias_(q.integer(step), ident("_step"))).from_(self.table.copy())  # the table is that copy
            self.db.transaction([exp.Create(this=kept, kind="TABLE", expression=source)])
        return step

    def load_best(self, step: int) -> None:
        """A resumed run's temp best copy, from the one a checkpoint kept."""
        if self._deferred(self.best_table()):
            self._live.deferred = None
        kept = self.kept_best_table(step)
        if not self._exists(kept):
            raise RelsqlError(f"no copy {kept.name} of embedding `{self.weight}` in the database: the checkpoint "
                              "does not match the database (was the table dropped?); train without resume=True")
        self.db.transaction([exp.Create(this=self.best_table(), kind="TABLE", replace=True,
                                        properties=exp.Properties(expressions=[exp.TemporaryProperty()]),
                                        expression=exp.select(exp.Star()).from_(kept.copy()))])

    def drop_checkpoints(self, keep: int | None = None, keep_best: int | None = None) -> None:
        """Drop this table's checkpoint copies except those a checkpoint file names."""
        tables = self.db.tables_in(self.scope)
        for kind, kept in (("checkpoint", keep), ("best", keep_best)):
            prefix = f"{self.name}_{kind}_"
            for name in tables:
                suffix = name[len(prefix):]
                if name.startswith(prefix) and suffix.isdigit() and int(suffix) != kept:
                    self.drop(qualified(name, self.scope))


_owners: weakref.WeakValueDictionary = weakref.WeakValueDictionary()  # (database, table) -> the LiveRows ahead of it
_owning = threading.Lock()


def _scratch_directory(path: str | None) -> str:
    """Where the row arrays' (unlinked) files go: beside the database file, on its disk, where
    it can be written; else the system's temp directory."""
    parent = os.path.dirname(os.path.abspath(path)) if path else None
    return parent if parent and os.access(parent, os.W_OK) else tempfile.gettempdir()


class LiveRows:
    """An embedding table's rows as training changes them, ahead of the table until `flush`.

    At most one LiveRows per table and database holds rows at a time (`claim`): another one
    (a new model on the same table, a resumed run) first flushes and drops the current one's, so
    every reader of the table sees every step taken. Flushes run under `lock`, as do the steps,
    so a flush (at exit, from the finalizer) never sees half a step."""

    def __init__(self, table: DatabaseEmbedding):
        self.db, self.name, self.weight, self.width = table.db, table.name, table.weight, table.width
        self.table, self.steps, self.key_arrow = table.table, table.steps, table.key_arrow
        path = table.db.database_file()
        self.key = (path or f"memory:{id(table.db)}", table.name.casefold())
        self.directory = _scratch_directory(path)
        self.lock = threading.RLock()
        self.rows: RowCache | None = None
        self.step = 0  # steps taken (while `rows` is held)
        self.stored = 0  # the table's step counter as of the last load or flush
        self.deferred: tuple[exp.Table, int] | None = None  # a temp copy the table still is, and its step

    def claim(self) -> None:
        """Make this the table's only LiveRows: the current one flushes and lets go of its rows."""
        with _owning:
            current = _owners.get(self.key)
            _owners[self.key] = self
        if current is not None and current is not self:
            current.release()
            with self.lock:
                self.rows = None  # whatever this held predates the other's steps

    def cache(self, owner: DatabaseEmbedding) -> RowCache:
        """The rows, loaded from the table on first use (one scan; steps then index arrays)."""
        self.claim()
        if self.rows is None:
            self._load(owner)
        return self.rows

    def _load(self, owner: DatabaseEmbedding) -> None:
        rows = RowCache(self.width, self.key_arrow, self.directory)
        step = owner._table_step() or 0
        columns = ["key", *[f"{p}{i}" for p in ("e", "a") for i in range(self.width)]]
        for batch in self.db.reader(exp.select(*[q.col(c) for c in columns]).from_(self.table.copy()), 1 << 17):
            rows.load(batch)
        self.rows, self.step, self.stored = rows, step, step

    def materialize(self) -> None:
        """Make the noted temp copy for real, before the table changes."""
        with self.lock:
            if self.deferred is None:
                return
            (copy, step), self.deferred = self.deferred, None
            self.db.transaction([exp.Create(this=copy.copy(), kind="TABLE", replace=True, expression=exp.select(
                exp.Star(), exp.alias_(q.integer(step), ident("_step"))).from_(self.table.copy()),
                properties=exp.Properties(expressions=[exp.TemporaryProperty()]))])

    def flush(self, keep_copy: bool = True) -> None:
        """The changed rows into the table (DELETE of their old rows + INSERT) and the step
        counter, one transaction; the rows stay held, clean. `keep_copy` False: a noted temp
        copy is dropped, not made (at exit, when temp tables go anyway)."""
        with self.lock:
            if self.rows is None:
                return
            slots = self.rows.changed_slots()
            if not len(slots) and self.step == self.stored:
                return
            if keep_copy:
                self.materialize()
            self.deferred = None
            keys, rows = f"{self.db._prefix}emb_{next(_views)}", f"{self.db._prefix}emb_{next(_views)}"
            old = slots[self.rows.stored(slots)]
            self.db.register(keys, self.rows.table(old).select(["key"]))
            self.db.register(rows, self.rows.stream(slots))  # read once, by the INSERT
            try:
                statements = []
                if len(old):  # else no old row to delete: no scan of the table's keys
                    statements.append(exp.Delete(this=self.table.copy(), where=exp.Where(this=exp.In(
                        this=q.col("key"),
                        query=exp.Subquery(this=exp.select(q.col("key")).from_(exp.Table(this=ident(keys))))))))
                if len(slots):
                    statements.append(exp.Insert(this=self.table.copy(),
                                                 expression=exp.select(exp.Star()).from_(exp.Table(this=ident(rows)))))
                statements.append(exp.Update(this=self.steps.copy(),
                                             expressions=[exp.EQ(this=q.col("step"), expression=q.integer(self.step))],
                                             where=exp.Where(this=exp.EQ(this=q.col("weight"),
                                                                         expression=exp.Literal.string(self.weight)))))
                self.db.transaction(statements)
            finally:
                self.db.unregister(keys)
                self.db.unregister(rows)
            self.rows.clean(slots)
            self.stored = self.step

    def release(self) -> None:
        """Let another LiveRows own the table: rows flushed, a noted copy made (it will write)."""
        with self.lock:
            self.flush()
            self.materialize()
            self.rows = None

    def forget(self) -> None:
        """Drop the rows unflushed (the table is being replaced)."""
        with self.lock:
            self.rows = None

    def flush_quietly(self) -> None:
        """`flush` at collection or exit: a closed database can only be reported."""
        try:
            self.flush(keep_copy=False)
        except Exception as err:  # noqa: BLE001 - nothing left to raise it to
            log.warning("embedding `%s`: the rows of the steps since the last checkpoint could not be written to the "
                        "table (%s); the table is at its step %d", self.weight, err, self.stored)


class GradientStaging:
    """A database-stored embedding's gradient over many batches, summed per key in the database."""

    def __init__(self, db: Database, weight: str, width: int):
        self.db, self.weight, self.width = db, weight, width
        self.table = db.temp_table("grad", table_suffix(weight))
        self._created = False

    def add(self, keys: pa.Array, grad: torch.Tensor) -> None:
        g = grad.detach().to("cpu", torch.float64).reshape(len(keys), self.width).numpy()
        name = f"{self.db._prefix}stage_{next(_views)}"
        self.db.register(name, pa.table({"key": keys, **{f"g{i}": g[:, i] for i in range(self.width)}}))
        try:
            rows = exp.select(exp.Star()).from_(exp.Table(this=ident(name)))
            if self._created:
                self.db.execute(exp.Insert(this=self.table.copy(), expression=rows))
            else:  # the first batch fixes the key column's type
                self.db.execute(exp.Create(this=self.table.copy(), kind="TABLE", replace=True, expression=rows,
                                           properties=exp.Properties(expressions=[exp.TemporaryProperty()])))
                self._created = True
        finally:
            self.db.unregister(name)

    def write(self, name: str, replace: bool) -> str:
        """`name` (key, gradient list) = the staged rows summed per key, created atomically."""
        from relsql.errors import SchemaError

        exists = name in self.db.tables_in(self.db.scopes()[0])
        if exists and not replace:
            raise SchemaError(f"table `{name}` already exists in {self.db.description}; "
                              "choose another prefix or pass replace=True")
        self.db.source.refuse_read_only(name)
        summed = exp.select(q.col("key"), exp.alias_(exp.Array(expressions=[
            exp.Sum(this=q.col(f"g{i}")) for i in range(self.width)]), ident("gradient"))).from_(self.table.copy()).group_by(
            q.col("key")).order_by(q.col("key"))
        self.db.create_table_as(name, summed, exists, kind="gradients")
        self.db.execute(exp.Drop(tables=[self.table.copy()], kind="TABLE", exists=True))
        return name
