"""Database-stored embeddings on training ranks (`fit(workers=N)`): each rank owns a shard.

A key's owner is the rank its grounding-store code falls to (code modulo the number of ranks);
the owner keeps the key's row and optimizer state in memory (arrays by code // ranks, whose
untouched pages stay unallocated). Ranks never open the database. Per step, every rank:

1. gathers the codes all ranks' shares of the batch use (an all_gather of counts, one of codes);
2. puts the rows it owns among them into a (codes, width) tensor, zeros elsewhere; one all-reduce
   hands every rank every row (exactly: each row is its owner's value plus zeros);
3. sends its rows' gradients, scattered into that layout, with the dense gradients' all-reduce;
   owners then take the optimizer step on their rows with the summed gradient, the step one
   process takes on the whole batch (relsql/train/embeddings/embeddings.py's `step`).

Keys never seen start from the same hashed value one process gives them (DuckDB's hash, in an
in-memory DuckDB of the rank's own). A checkpoint keeps each rank's shard in files beside the
checkpoint file; the parent exports the tables before the ranks start and writes the rows back
at each checkpoint and at the end (relsql/train/embeddings/write_back.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch
import torch.distributed as dist

from relsql.errors import RelsqlError
from relsql.train.embeddings.embeddings import initial_values, step, table_suffix


@dataclass
class EmbeddingJob:
    """What a rank needs to hold one database-stored embedding's shard."""

    width: int
    key_type: pa.DataType  # the table's key column, as Arrow (hashes differ between key types)
    optimizer: str
    lr: float
    seed: int
    step: int  # the table's step counter when the ranks started
    start: str  # Arrow IPC file: the table's rows (key, e.., a..) when the ranks started


class Shard:
    """One embedding's rows owned by this rank, by local index code // world."""

    def __init__(self, weight: str, job: EmbeddingJob, keys: pa.Array, rank: int, world: int):
        self.weight, self.job, self.rank, self.world = weight, job, rank, world
        keys = keys.combine_chunks() if isinstance(keys, pa.ChunkedArray) else keys
        self.keys = keys.cast(job.key_type) if keys.type != job.key_type else keys  # the store's keys, by code
        owned = len(range(rank, len(self.keys), world))
        self.e = np.zeros((owned, job.width))
        self.a = np.zeros((owned, job.width))
        self.known = np.zeros(owned, dtype=bool)  # holds a row: from the table, initialized or updated
        self.changed = np.zeros(owned, dtype=bool)  # to write back: in the table at the start, or updated
        self._load(job.start)

    def _load(self, path: str) -> None:
        table = pa.ipc.open_file(pa.memory_map(path)).read_all()
        keys = table.column("key").combine_chunks().cast(self.job.key_type)
        codes = pc.fill_null(pc.index_in(keys, value_set=self.keys), -1).to_numpy().astype(np.int64)
        # rows of keys outside the store stay in the table
        mine = np.flatnonzero((codes >= 0) & (codes % self.world == self.rank))
        local = codes[mine] // self.world
        for i in range(self.job.width):
            self.e[local, i] = table.column(f"e{i}").to_numpy()[mine]
            self.a[local, i] = table.column(f"a{i}").to_numpy()[mine]
        self.known[local] = self.changed[local] = True

    def owned(self, codes: np.ndarray) -> np.ndarray:
        return codes % self.world == self.rank

    def rows(self, codes: np.ndarray) -> np.ndarray:
        """(len(codes), width): this rank's rows of `codes`, zeros for the others' keys."""
        out = np.zeros((len(codes), self.job.width))
        mask = self.owned(codes)
        local = codes[mask] // self.world
        fresh = local[~self.known[local]]
        if len(fresh):
            self.e[fresh] = initial_values(self.keys.take(pa.array(fresh * self.world + self.rank)), self.job.width,
                                           self.job.seed)
            self.known[fresh] = True
        out[mask] = self.e[local]
        return out

    def apply(self, codes: np.ndarray, grad: np.ndarray) -> None:
        """The optimizer step on this rank's rows of `codes` with their summed gradient."""
        mask = self.owned(codes)
        local = codes[mask] // self.world
        self.e[local], self.a[local] = step(self.e[local], self.a[local], grad[mask], self.job.optimizer, self.job.lr)
        self.changed[local] = True

    def state(self) -> tuple[np.ndarray, ...]:
        return self.e.copy(), self.a.copy(), self.known.copy(), self.changed.copy()

    def restore(self, state: tuple[np.ndarray, ...]) -> None:
        self.e, self.a, self.known, self.changed = (s.copy() for s in state)

    def changed_rows(self) -> pa.Table:
        return _rows(self.keys, self.e, self.a, self.changed, self.rank, self.world)


def _rows(keys: pa.Array, e: np.ndarray, a: np.ndarray, changed: np.ndarray, rank: int, world: int) -> pa.Table:
    """key, e0.., a0.. of a shard's rows to write back (those flagged `changed`)."""
    local = np.flatnonzero(changed)
    return pa.table({"key": keys.take(pa.array(local * world + rank)), **{f"e{i}": e[local, i] for i in range(e.shape[1])},
                     **{f"a{i}": a[local, i] for i in range(e.shape[1])}})


class ShardedEmbeddings:
    """All database-stored embeddings of a rank: their shards and the per-step collectives."""

    def __init__(self, jobs: dict[str, EmbeddingJob], keys: dict[str, pa.Array], rank: int, world: int,
                 dtype: torch.dtype, device: torch.device):
        self.names = sorted(jobs)
        self.shards = {w: Shard(w, jobs[w], keys[w], rank, world) for w in self.names}
        self.rank, self.world, self.dtype, self.device = rank, world, dtype, device
        self.steps = 0  # training steps taken (names checkpoint shards)
        self.updates = dict.fromkeys(self.names, 0)  # per weight: steps whose gradient reached it (its table's step counter)
        self._union: dict[str, np.ndarray] = {}  # per weight: the codes all ranks' shares use, sorted
        self._mine: dict[str, np.ndarray] = {}  # per weight: this rank's codes' positions in the union

    def fetch(self, batch) -> dict[str, torch.Tensor]:
        """The rows of this rank's share (None: no rows this step), as leaves collecting gradients.
        Collective: every rank calls it once per step, in the same order."""
        codes = {w: (batch.embedding_codes.get(w) if batch is not None else None) for w in self.names}
        codes = {w: np.zeros(0, np.int64) if c is None else np.asarray(c, np.int64) for w, c in codes.items()}
        counts = torch.tensor([len(codes[w]) for w in self.names], dtype=torch.int64)
        every = [torch.zeros_like(counts) for _ in range(self.world)]
        dist.all_gather(every, counts)
        widest = max(int(c.sum()) for c in every)
        mine = torch.zeros(widest, dtype=torch.int64)
        flat = np.concatenate([codes[w] for w in self.names]) if self.names else np.zeros(0, np.int64)
        mine[:len(flat)] = torch.from_numpy(flat)
        gathered = [torch.zeros_like(mine) for _ in range(self.world)]
        dist.all_gather(gathered, mine)
        parts: dict[str, list[np.ndarray]] = {w: [] for w in self.names}
        for counted, values in zip(every, gathered):
            values, start = values.numpy(), 0
            for w, n in zip(self.names, counted.tolist()):
                parts[w].append(values[start:start + n])
                start += n
        rows = []
        for w in self.names:
            self._union[w] = np.unique(np.concatenate(parts[w]))
            self._mine[w] = np.searchsorted(self._union[w], codes[w])
            rows.append(torch.from_numpy(self.shards[w].rows(self._union[w]).reshape(-1)))
        values = torch.cat(rows) if rows else torch.zeros(0, dtype=torch.float64)
        dist.all_reduce(values)
        found, start = {}, 0
        for w in self.names:
            width = self.shards[w].job.width
            block = values[start:start + len(self._union[w]) * width].view(-1, width)
            start += len(self._union[w]) * width
            if batch is not None and w in batch.embedding_keys:
                found[w] = block[torch.from_numpy(self._mine[w])].to(self.device, self.dtype).requires_grad_(True)
        return found

    def gradients(self, external: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        """This rank's gradients in the union layout of the last fetch (float64), then one flag
        per weight (1: a gradient reached it here), for the all-reduce."""
        parts, used = [], []
        for w in self.names:
            width = self.shards[w].job.width
            grad = torch.zeros((len(self._union[w]), width), dtype=torch.float64)
            value = external.get(w)
            if value is not None and value.grad is not None:
                grad[torch.from_numpy(self._mine[w])] = value.grad.detach().to("cpu", torch.float64).reshape(-1, width)
            parts.append(grad.reshape(-1))
            used.append(float(value is not None and value.grad is not None))
        return [*parts, torch.tensor(used, dtype=torch.float64)]

    def apply(self, reduced: list[torch.Tensor]) -> None:
        """Owners step their rows with the summed gradients (those of `gradients`, all-reduced)."""
        used = reduced[-1].tolist()
        for w, grad, flag in zip(self.names, reduced, used):
            if flag:
                width = self.shards[w].job.width
                self.shards[w].apply(self._union[w], grad.view(-1, width).numpy())
                self.updates[w] += 1
        self.steps += 1

    def state(self) -> dict:
        return {"steps": self.steps, "updates": dict(self.updates), **{w: s.state() for w, s in self.shards.items()}}

    def restore(self, state: dict) -> None:
        self.steps, self.updates = state["steps"], dict(state["updates"])
        for w, shard in self.shards.items():
            shard.restore(state[w])

    # -- files: the result and checkpoints ----------------------------------------------------------
    def write_result(self, folder: str) -> None:
        """Each weight's changed rows of this rank, for the parent to write back."""
        for w, shard in self.shards.items():
            _write_arrow(shard.changed_rows(), Path(folder) / result_file(w, self.rank))

    def save(self, folder: Path, tag: str, state: dict | None = None) -> None:
        """A shard file per weight (this state, default the current one), for a checkpoint."""
        state = state if state is not None else self.state()
        folder.mkdir(parents=True, exist_ok=True)
        for w in self.names:
            path = folder / _shard_file(w, self.rank, tag)
            partial = path.with_suffix(".partial")
            with open(partial, "wb") as out:
                np.savez(out, *state[w], steps=np.array(state["steps"]), updates=np.array(state["updates"][w]))
            os.replace(partial, path)

    def load(self, folder: Path, tag: str) -> dict:
        state: dict = {"updates": {}}
        for w in self.names:
            path = folder / _shard_file(w, self.rank, tag)
            if not path.exists():
                raise RelsqlError(f"checkpoint shard {path} is missing: resume with the checkpoint's number of workers, "
                                  "or start without resume=True")
            with np.load(path, allow_pickle=False) as saved:
                state[w] = tuple(saved[f"arr_{i}"] for i in range(4))
                state["steps"], state["updates"][w] = int(saved["steps"]), int(saved["updates"])
        return state

    def drop_saved(self, folder: Path, keep: set[str]) -> None:
        """This rank's shard files of other checkpoints than `keep` (tags)."""
        if not folder.exists():
            return
        for w in self.names:
            prefix = f"{table_suffix(w)}.rank{self.rank}."
            for path in folder.glob(prefix + "*.npz"):
                if path.name[len(prefix):-len(".npz")] not in keep:
                    path.unlink(missing_ok=True)


def saved_rows(folder: Path, weight: str, tag: str, keys: pa.Array, world: int) -> tuple[pa.Table, int]:
    """The rows a checkpoint's shards (every rank's, `tag`) hold to write back, and the updates
    they have had; for the parent, which has the store's keys. Missing files: OSError."""
    keys = keys.combine_chunks() if isinstance(keys, pa.ChunkedArray) else keys
    parts, updates = [], 0
    for rank in range(world):
        with np.load(folder / _shard_file(weight, rank, tag), allow_pickle=False) as saved:
            e, a, changed = saved["arr_0"], saved["arr_1"], saved["arr_3"]
            parts.append(_rows(keys, e, a, changed, rank, world))
            updates = int(saved["updates"])  # every rank counts the same updates
    return pa.concat_tables(parts), updates


def _shard_file(weight: str, rank: int, tag: str) -> str:
    return f"{table_suffix(weight)}.rank{rank}.{tag}.npz"


def result_file(weight: str, rank: int) -> str:
    return f"embedding.{table_suffix(weight)}.rank{rank}.arrow"


def _write_arrow(table: pa.Table, path: Path) -> None:
    partial = path.with_suffix(".partial")
    with pa.OSFile(str(partial), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    os.replace(partial, path)


def read_results(folder: str, weight: str, world: int) -> pa.Table:
    """The ranks' changed rows of one weight, as one table."""
    return pa.concat_tables([pa.ipc.open_file(pa.memory_map(str(Path(folder) / result_file(weight, r)))).read_all()
                             for r in range(world)])
