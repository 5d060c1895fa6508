"""Batches prepared in a second process (a forked child), as a PyTorch DataLoader's worker does.

Preparing a mini-batch from the grounding store (reads, renumbering, the plan's replay) is
mostly Python. In a thread beside the trainer the two take turns on the GIL: on TPC-H sf 1 a
step took 5.4-6.6 ms with the batch prepared in a thread, 3.8-4.2 ms with every batch prepared
before the epoch (docs/performance.md). A forked child has its own interpreter: it reads the
store's files (memory-mapped, so shared with this process through the page cache) and replays
its own copy of the plan cache; only a batch's tensors come back, through a pipe, copied once.
A plan is sent whole once per recorded shape (its `Frame`); later batches of that shape send
only the tensors that fill it.

Used for one-process training on the CPU from a grounding store, where the machine has a second
core (`usable`); `RELSQL_BATCH_PROCESS=0` keeps batches in the database worker thread.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import pickle
import signal
import struct
import threading
import time
from dataclasses import dataclass

import numpy as np
import torch

from relsql import cores
from relsql.compile.reuse import Frame
from relsql.data.duckdb import release_freed_memory
from relsql.errors import RelsqlError
from relsql.ground.store import trim_heap
from relsql.train.feed.batched import Batch, Batched

ENV = "RELSQL_BATCH_PROCESS"
ALIGN = 64  # each array's bytes start at a multiple of this in a message
POLL = 1.0  # seconds between the trainer's looks at a child it waits for
STOPPED_LIMIT = 10.0  # seconds a child may sit stopped (SIGSTOP, Ctrl-Z of it alone) before the trainer gives up
IDLE_LIMIT = 300.0  # seconds a child may use no CPU at all while a batch is asked of it


def usable(batched: Batched | None) -> bool:
    """Whether `batched`'s batches should be prepared in a child process: read from a grounding
    store (no database connection in the child), planned for the CPU (a child must not touch a
    GPU context), with fork available, a core that torch's threads leave free (fit's default
    takes half of them), and not inside a training rank (ranks already are processes, one per core)."""
    if os.environ.get(ENV, "1").strip().lower() in ("0", "false", "no", "off"):
        return False
    if batched is None or batched.grounding_store is None or batched.device != "cpu":
        return False
    if "fork" not in multiprocessing.get_all_start_methods() or "RELSQL_RANK" in os.environ \
            or int(os.environ.get("WORLD_SIZE", "1") or 1) > 1:
        return False
    have = cores.usable()
    # a core torch leaves free: with torch's threads on every core the child takes one of theirs and
    # they spin-wait for it (a Loader epoch at batch 512 on the 25k-row shop, 2 cores, torch on both:
    # 1.8 s with the child, 0.3-0.4 s with the batch prepared in the thread)
    return have >= 2 and torch.get_num_threads() < have


# -- messages ------------------------------------------------------------------------------------

@dataclass
class _Array:
    """A dense CPU tensor as its numpy array (pickled out of band: no copy into the pickle)."""

    array: np.ndarray

    def tensor(self) -> torch.Tensor:
        return torch.from_numpy(self.array)


@dataclass
class _Csr:
    """A sparse CSR matrix as its three arrays."""

    crow: np.ndarray
    col: np.ndarray
    values: np.ndarray
    shape: tuple[int, ...]

    def tensor(self) -> torch.Tensor:
        return torch.sparse_csr_tensor(torch.from_numpy(self.crow), torch.from_numpy(self.col),
                                       torch.from_numpy(self.values), self.shape)


def _numpy(t: torch.Tensor) -> np.ndarray | None:
    try:
        return t.numpy()
    except (TypeError, RuntimeError):  # a dtype numpy lacks (bfloat16)
        return None


def _pack(t: torch.Tensor):
    """A plan tensor in a form that pickles as raw bytes (others pickle as torch pickles them)."""
    if t.device.type != "cpu" or t.requires_grad:
        return t
    if t.layout == torch.strided:
        array = _numpy(t)
        return t if array is None else _Array(array)
    if t.layout == torch.sparse_csr:
        parts = [_numpy(p) for p in (t.crow_indices(), t.col_indices(), t.values())]
        return t if any(p is None for p in parts) else _Csr(*parts, tuple(t.shape))
    return t


def _unpack(value) -> torch.Tensor:
    return value.tensor() if isinstance(value, _Array | _Csr) else value


def _encode(message) -> bytes:
    """`message` pickled, its arrays' bytes after it, each at an ALIGN boundary."""
    buffers: list[pickle.PickleBuffer] = []
    head = pickle.dumps(message, protocol=5, buffer_callback=buffers.append)
    raws = [b.raw() for b in buffers]
    lengths = [len(head), *(r.nbytes for r in raws)]
    prefix = struct.pack(f"<Q{len(lengths)}Q", len(lengths), *lengths)
    parts, offset = [prefix, head], len(prefix) + len(head)
    for raw in raws:
        gap = -offset % ALIGN
        parts += [bytes(gap), raw]
        offset += gap + raw.nbytes
    return b"".join(parts)


def _decode(data: bytes):
    """The message of `_encode`; its arrays are views of one writable copy of `data`, each ALIGN-aligned."""
    block = np.empty(len(data) + ALIGN, dtype=np.uint8)
    start = -block.ctypes.data % ALIGN
    block = block[start:start + len(data)]
    block[:] = np.frombuffer(data, dtype=np.uint8)
    buffer = memoryview(block)
    (count,) = struct.unpack_from("<Q", buffer, 0)
    lengths = struct.unpack_from(f"<{count}Q", buffer, 8)
    offset = 8 + 8 * count
    head = buffer[offset:offset + lengths[0]]
    offset += lengths[0]
    views = []
    for length in lengths[1:]:
        offset += -offset % ALIGN
        views.append(buffer[offset:offset + length])
        offset += length
    return pickle.loads(head, buffers=views)


# -- the child -----------------------------------------------------------------------------------

def _process_state(pid: int) -> tuple[str, int]:
    """(state letter, user + system clock ticks) of a process from /proc; ("?", -1) where unreadable
    (not Linux, or the process is gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            text = file.read().decode("ascii", "replace")
    except OSError:
        return "?", -1
    fields = text[text.rfind(")") + 2:].split()  # after the command name, which may hold spaces
    try:
        return fields[0], int(fields[11]) + int(fields[12])
    except (IndexError, ValueError):
        return "?", -1


def _serve(connection, other, batched: Batched) -> None:
    """The child's loop: (token, rids, sample) in, the prepared batch out, until None or the pipe closes."""
    gc.freeze()  # the parent's objects are never collected here: a DuckDB connection's finalizer crashed a child
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the trainer's to handle; it closes this process
    other.close()  # the trainer's end: when the trainer is gone, recv sees the end of the pipe
    torch.set_num_threads(1)
    batched.plans.lock = threading.Lock()  # a lock some thread of the parent held at the fork stays held here
    batched.kept_lock = threading.Lock()
    sent: dict[int, object] = {}  # id of a trace whose frame the parent has -> the trace (keeps the id unique)
    while True:
        try:
            request = connection.recv()
        except (EOFError, OSError):
            return
        if request is None:
            return
        token, rids, sample = request
        try:
            batch, trace = batched.traced(rids, sample)
            if trace is None:
                plan = ("whole", batch.plan)
            else:
                frame = None if id(trace) in sent else trace.frame
                sent[id(trace)] = trace
                plan = ("frame", id(trace), frame, [_pack(t) for t in trace.frame.tensors(batch.plan)])
            reply = ("batch", token, batch.rids, batch.rows.numpy(), batch.embedding_keys, batch.embedding_codes, plan)
        except Exception as error:  # noqa: BLE001 - every error goes back to the trainer, which raises it
            reply = ("error", token, error)
        try:
            data = _encode(reply)
        except Exception as error:  # noqa: BLE001 - an error that does not pickle goes back as its text
            data = _encode(("error", token, RelsqlError(f"preparing a batch failed: {type(error).__name__}: {error}")))
        try:
            connection.send_bytes(data)
        except (BrokenPipeError, OSError):
            return


# -- the trainer's side ----------------------------------------------------------------------------

_CHILDREN = [0]  # batch processes alive


def _frozen(change: int) -> None:
    """The first child freezes this process's objects out of the garbage collector, the last one
    gives them back: a collection writes into every object it visits, and each page written after
    the fork is copied, the child keeping the old one. Before it, garbage is freed and the C heap
    and DuckDB's allocator hand their free pages back: pages freed after the fork would stay
    mapped in the child (TPC-H sf 0.1: the child held 66-86 MiB alone, 17-29 with all this)."""
    if change > 0 and _CHILDREN[0] == 0:
        gc.collect()
        trim_heap()
        release_freed_memory()
        gc.freeze()
    _CHILDREN[0] += change
    if change < 0 and _CHILDREN[0] == 0:
        gc.unfreeze()



class BatchProcess:
    """A forked child that prepares batches of `batched`: `request` queues one, `receive` takes
    it back (replies come in request order; replies to requests nobody waits for are skipped)."""

    def __init__(self, batched: Batched):
        _frozen(+1)
        context = multiprocessing.get_context("fork")
        self.connection, child = context.Pipe()
        self.process = context.Process(target=_serve, args=(child, self.connection, batched),
                                       name="relsql-batches", daemon=True)
        try:
            self.process.start()
        except BaseException:
            self.connection.close()
            _frozen(-1)  # no child: the objects go back to the collector
            raise
        finally:
            child.close()
        self.frames: dict[int, Frame] = {}
        self.token = 0
        self.waited = 0.0  # seconds the trainer spent waiting for a batch

    def request(self, rids: np.ndarray, sample: int) -> int:
        self.token += 1
        try:
            self.connection.send((self.token, np.asarray(rids, dtype=np.int64), sample))
        except (BrokenPipeError, OSError) as error:
            raise self._stopped() from error
        return self.token

    def receive(self, token: int) -> Batch:
        started = time.perf_counter()
        try:
            while True:
                self._wait()
                try:
                    reply = _decode(self.connection.recv_bytes())
                except (EOFError, OSError) as error:
                    raise self._stopped() from error
                if reply[0] == "batch" and reply[-1][0] == "frame" and reply[-1][2] is not None:
                    self.frames[reply[-1][1]] = reply[-1][2]  # sent once, even with a reply nobody waits for
                if reply[1] == token:
                    break
        finally:
            self.waited += time.perf_counter() - started
        if reply[0] == "error":
            raise reply[2]
        _, _, rids, rows, keys, codes, plan = reply
        if plan[0] == "whole":
            made = plan[1]
        else:
            made = self.frames[plan[1]].fill([_unpack(t) for t in plan[3]])
        return Batch(rids, made, torch.from_numpy(rows), keys, codes)

    def _wait(self) -> None:
        """Wait until a reply can be read, watching the child: a dead child, one stopped by a signal
        for STOPPED_LIMIT seconds, or one that used no CPU for IDLE_LIMIT seconds is a RelsqlError,
        where a plain read would wait forever."""
        stopped_since = idle_since = None
        last_cpu = -1
        while not self.connection.poll(POLL):
            if not self.process.is_alive():
                raise self._stopped()
            state, cpu = _process_state(self.process.pid)
            now = time.monotonic()
            stopped_since = (stopped_since or now) if state in ("T", "t") else None
            if stopped_since is not None and now - stopped_since >= STOPPED_LIMIT:
                raise RelsqlError(f"the process preparing mini-batches (pid {self.process.pid}) has been stopped by a "
                                  f"signal for {now - stopped_since:.0f}s; continue it (kill -CONT {self.process.pid}) "
                                  f"and run again, or set {ENV}=0 to prepare batches in a thread")
            idle_since = (idle_since or now) if cpu >= 0 and cpu == last_cpu else None
            last_cpu = cpu
            if idle_since is not None and now - idle_since >= IDLE_LIMIT:
                raise RelsqlError(f"the process preparing mini-batches (pid {self.process.pid}) used no CPU for "
                                  f"{now - idle_since:.0f}s while a batch was asked of it; set {ENV}=0 to prepare "
                                  "batches in a thread")

    def _stopped(self) -> RelsqlError:
        self.process.join(timeout=1.0)
        return RelsqlError(f"the process preparing mini-batches (pid {self.process.pid}) stopped "
                           f"(exit code {self.process.exitcode}); to prepare them in a thread instead, set {ENV}=0")

    def close(self) -> None:
        """Stop the child (it exits between batches) and close the pipe."""
        try:
            self.connection.send(None)
        except (BrokenPipeError, OSError):
            pass
        self.process.join(timeout=5.0)
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(timeout=5.0)
        if self.process.is_alive():  # a stopped child keeps SIGTERM pending; SIGKILL ends it all the same
            self.process.kill()
            self.process.join(timeout=5.0)
        self.connection.close()
        _frozen(-1)
