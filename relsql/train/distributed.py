"""Data-parallel training: N processes (ranks) train one model from one grounding store.

Every rank walks the global batches one process would (same seed, same shuffles). Each takes a
contiguous share of a batch's rows, reads their groundings from the store (files; no database),
runs forward and backward with its loss scaled by its share of the batch, and one all-reduce
sums the gradients (gloo on CPU, NCCL on CUDA). That sum is the gradient of the whole batch's
mean loss, so N ranks take the steps one process takes, equal up to the order of float
additions. Validation rows are shared out the same way and their outputs gathered, so every
rank makes the same early-stopping choice. Rank 0 hands the result back to the process that
started the ranks, which owns the database: it keeps checkpoints, predictions and saved models.

Ranks are `python -m relsql.train.distributed` processes; the job (the model's weights, task,
split and the store's description) reaches them through their stdin, from this process only.
A Spark-grounded model's ranks start through Spark's TorchDistributor instead
(relsql/train/torch_distributor.py). Database-stored embeddings are sharded over the ranks
(relsql/train/sharded.py); the parent writes them back (relsql/train/write_back.py).
"""

from __future__ import annotations

import logging
import os
import pickle
import socket
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
import torch.distributed as dist

from relsql.errors import RelsqlError
from relsql.ground.demand import database_embeddings
from relsql.ground.store import GroundingStore
from relsql.train import checkpoint as checkpoints
from relsql.train import guards, torch_distributor, write_back
from relsql.train.batched import Batched
from relsql.train.batches import Worker, batches
from relsql.train.sharded import EmbeddingJob, ShardedEmbeddings
from relsql.train.threads import default_threads

log = logging.getLogger("relsql")
RESULT = "result.pt"
_NOT_SENT = ("db", "batched")  # what stays with the parent: the database and its grounder


@dataclass
class Job:
    """Everything a rank needs: no database handle, nothing that runs code when read."""

    model: dict  # the Model's state without its database (net, head, task, labels, split)
    store: tuple  # GroundingStore.detach()
    epochs: int
    batch_size: int
    lr: float
    patience: int
    weight_decay: float
    world: int
    init_method: str
    folder: str
    threads: int
    timeout: float
    log_level: int = logging.WARNING
    checkpoint: str | None = None  # rank 0 writes it (Model.fit's format); resumed from `resume`
    checkpoint_every: int | None = None
    resume: dict | None = None
    started: float = 0.0  # time.time() when the parent started the ranks
    embeddings: dict[str, EmbeddingJob] = field(default_factory=dict)  # database-stored ones, sharded over the ranks


# -- the parent: start the ranks, wait, take the result ------------------------------------------
def launched_by_torchrun() -> bool:
    """This process is one rank of a group torchrun (or another launcher with its environment) started."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1 and "RANK" in os.environ and "RELSQL_RANK" not in os.environ


def fit_as_rank(model, epochs: int, batch_size: int | None, lr: float, patience: int, weight_decay: float,
                checkpoint: Path | None = None, checkpoint_every: int | None = None, resume: bool = False,
                timeout: float = 1800.0) -> None:
    """Train as this process's rank of a torchrun group (env://: RANK, WORLD_SIZE, MASTER_ADDR,
    MASTER_PORT): every rank built the same model on its own engine session, and reads its own or
    a shared grounding store; each ends with the same weights. Rank 0 writes the checkpoints."""
    _refuse(model, int(os.environ["WORLD_SIZE"]))
    if database_embeddings(model.template):
        raise RelsqlError("under torchrun, every rank has its own database session, and database-stored embeddings need "
                          "one writer: train them with model.fit(workers=N) from one process, or declare them storage='memory'")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if model.batched is None:
        model.batched = model._batched(model._presets())
    job = _job(model, world, epochs, batch_size, lr, patience, weight_decay, checkpoint, checkpoint_every, resume, timeout,
               model={}, store=(), init_method="env://", folder="", threads=torch.get_num_threads(), started=time.time())
    started = time.perf_counter()
    owned = not dist.is_initialized()
    try:
        clock = _train(model, job, rank)
    finally:
        if owned and dist.is_initialized():
            dist.destroy_process_group()
    model.epoch_cap = epochs
    _add_timings(model, {**clock, "training": time.perf_counter() - started})
    if model.diverged:
        raise RelsqlError(model.diverged)


def _job(owner, world: int, epochs: int, batch_size: int | None, lr: float, patience: int, weight_decay: float,
         checkpoint: Path | None, checkpoint_every: int | None, resume: bool, timeout: float, **where) -> Job:
    """The job of every rank of `owner` (the Model): fit's arguments, the checkpoint to resume
    from, and `where` (the model's state sent to the ranks, the store, the rendezvous, the folder for results, threads)."""
    resumed = checkpoints.load(checkpoint) if resume and checkpoint is not None and Path(checkpoint).exists() else None
    return Job(epochs=epochs, batch_size=batch_size or owner.batch_size or len(owner.rows["train"]), lr=lr, patience=patience,
               weight_decay=weight_decay, world=world, timeout=timeout, log_level=log.getEffectiveLevel(),
               checkpoint=None if checkpoint is None else str(checkpoint), checkpoint_every=checkpoint_every,
               resume=resumed, **where)


def _refuse(model, workers: int) -> None:
    """What ranks cannot do yet, refused before anything starts."""
    if model.store is False:
        raise RelsqlError("fit(workers=N) reads every batch from the grounding store: create the Model without store=False")
    on_this_machine = not torch_distributor.applies(model.db)  # else Spark's executors hold the GPUs
    if model.device.type == "cuda" and on_this_machine and torch.cuda.device_count() < workers:
        raise RelsqlError(f"fit(workers={workers}) on CUDA needs a GPU per rank (NCCL); this machine has "
                          f"{torch.cuda.device_count()}: use workers={max(1, torch.cuda.device_count())}, or device='cpu' (gloo)")


def fit(model, workers: int, epochs: int, batch_size: int | None, lr: float, patience: int, weight_decay: float,
        checkpoint: Path | None = None, checkpoint_every: int | None = None, resume: bool = False,
        timeout: float = 1800.0) -> None:
    """Train `model` on `workers` ranks; its weights, history and best epoch become rank 0's.
    `timeout`: seconds a rank waits for the others in a collective before giving up."""
    _refuse(model, workers)
    if model.batched is None:
        model.batched = model._batched(model._presets())
    store = model.batched.grounding_store
    with tempfile.TemporaryDirectory(prefix="relsql-ranks-") as folder:
        job = _job(model, workers, epochs, batch_size, lr, patience, weight_decay, checkpoint, checkpoint_every, resume, timeout,
                   model={k: v for k, v in model.__dict__.items() if k not in _NOT_SENT}, store=store.detach(),
                   init_method=f"tcp://127.0.0.1:{_free_port()}", folder=folder,
                   threads=model.threads or max(1, default_threads() // workers))
        job.embeddings = write_back.export(model, folder, job.resume)
        if job.embeddings and job.resume is not None:
            _check_shards(job)
        started = time.perf_counter()
        job.started = time.time()
        with write_back.CheckpointWriter(model, job.embeddings, job.checkpoint, workers):
            result = _launch(model, job)
        write_back.write_result(model, job.embeddings, folder, workers, result["embedding_updates"])
    model.net.set_named_weights(result["weights"], model._fixed())
    model.head.load_state_dict(result["head"])
    model.history = list(result["history"])
    model.best_epoch, model.stopped, model.epoch_cap = result["best_epoch"], result["stopped"], epochs
    _add_timings(model, {**result["timings"], "training": time.perf_counter() - started})
    if result.get("diverged"):  # the ranks stopped at a NaN loss, with the best epoch's weights
        raise RelsqlError(result["diverged"])


def _add_timings(model, seconds: dict[str, float]) -> None:
    for name, value in seconds.items():
        model.timings[name] = model.timings.get(name, 0.0) + value


def _launch(model, job: Job) -> dict:
    """Start the ranks, wait for them, and return rank 0's result (weights, history, timings).
    A Spark-grounded model's ranks start through Spark's TorchDistributor, on the executors;
    any other through this module's own rank processes on this machine."""
    if torch_distributor.applies(model.db):
        return torch_distributor.run(model.db, job)
    _run_ranks(job)
    return torch.load(Path(job.folder) / RESULT, weights_only=True)  # tensors and numbers only


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _run_ranks(job: Job) -> None:
    """Start the ranks and wait for all; one failing (or dying) stops the others, no hang."""
    payload = pickle.dumps(job)
    root = str(Path(__file__).resolve().parents[2])
    processes = []
    try:
        for rank in range(job.world):
            env = {**os.environ, "RELSQL_RANK": str(rank), "PYTHONPATH": os.pathsep.join(
                filter(None, [root, os.environ.get("PYTHONPATH")])), "OMP_NUM_THREADS": str(job.threads)}
            errors = open(Path(job.folder) / f"rank{rank}.log", "wb")
            process = subprocess.Popen([sys.executable, "-m", "relsql.train.distributed"], stdin=subprocess.PIPE,
                                       stdout=errors, stderr=None if rank == 0 else errors, env=env)
            errors.close()
            processes.append(process)
        for process in processes:  # after all started: they import torch side by side while this writes
            try:
                process.stdin.write(payload)
                process.stdin.close()
            except BrokenPipeError:  # it died before reading: its exit code tells below
                pass
        while True:
            codes = [p.poll() for p in processes]
            failed = [r for r, c in enumerate(codes) if c not in (None, 0)]
            if failed:
                raise RelsqlError(f"training rank {failed[0]} of {job.world} failed: {_failure(job, failed[0], codes[failed[0]])}")
            if all(c == 0 for c in codes):
                return
            time.sleep(0.05)
    finally:
        for process in processes:
            if process.poll() is None:
                process.terminate()
        for process in processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()


def _failure(job: Job, rank: int, code: int) -> str:
    """The rank's own one-line account, else how it ended."""
    message = Path(job.folder) / f"rank{rank}.error"
    if message.exists():
        return message.read_text().strip()
    return f"it ended with {'signal ' + str(-code) if code < 0 else 'exit code ' + str(code)} before reporting an error"


# -- one rank ----------------------------------------------------------------------------------
def _rank_main() -> None:
    with warnings.catch_warnings():  # the probe plan's sparse tensors; the parent already said it
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
        job: Job = pickle.loads(sys.stdin.buffer.read())  # from the parent process, through a pipe
    rank = int(os.environ["RELSQL_RANK"])
    try:
        torch.set_num_threads(job.threads)
        if rank == 0 and job.log_level < logging.WARNING:
            logging.basicConfig(level=job.log_level, format="relsql: %(message)s")
        result = run_rank(job, rank)
        if rank == 0:
            partial = Path(job.folder) / (RESULT + ".tmp")
            torch.save(result, partial)
            os.replace(partial, Path(job.folder) / RESULT)
    except BaseException as err:  # one line for the parent; it stops the other ranks
        text = f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}"
        (Path(job.folder) / f"rank{rank}.error").write_text(text)
        sys.exit(1)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_rank(job: Job, rank: int) -> dict | None:
    """One rank's whole part: build the model from the job, train; rank 0 returns the result
    (weights, head, history, timings as tensors and numbers), the others None."""
    model = _model(job)
    shards = _shards(model, job, rank)
    clock = _train(model, job, rank, shards)
    if shards is not None:
        shards.write_result(job.folder)
        dist.barrier()  # every rank's rows are on disk before rank 0 reports
    if rank != 0:
        return None
    return {"weights": {n: p.detach().cpu() for n, p in model.net.weights_by_name().items()},
            "head": {k: v.cpu() for k, v in model.head.state_dict().items()},
            "history": model.history, "best_epoch": model.best_epoch, "stopped": model.stopped, "timings": clock,
            "diverged": model.diverged,
            "embedding_updates": {} if shards is None else shards.updates}


def _shards(model, job: Job, rank: int) -> ShardedEmbeddings | None:
    if not job.embeddings:
        return None
    return ShardedEmbeddings(job.embeddings, model.batched.grounding_store.embedding_keys, rank, job.world, model.dtype,
                             model.device)


def _model(job: Job):
    from relsql.model import Model

    model = Model.__new__(Model)
    model.__dict__.update(job.model)
    store = GroundingStore.attach(*job.store)
    model.db = None
    model.batched = Batched(store.grounder, model.template, model.output, model.dtype, model.seed,
                            model.embedding_optimizer or "adagrad", model.embedding_lr, store, device=model.device)
    return model


def _train(model, job: Job, rank: int, shards: ShardedEmbeddings | None = None) -> dict[str, float]:
    """The single-process loop of Model.fit, on this rank's share of every batch; the model ends
    with the best epoch's weights and its history. Returns this rank's time split."""
    device = model.device
    if device.type == "cuda":
        device = model.device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))  # this machine's GPU of the rank
        model.net.to(device)
        model.head.to(device)
        model.y = model.y.to(device)
    if not dist.is_initialized():
        _import_dynamo_first()
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", init_method=job.init_method, rank=rank,
                                world_size=job.world, timeout=timedelta(seconds=job.timeout))
    clock = {"rank_startup": time.time() - job.started, "epochs": 0.0, "waiting_on_store": 0.0, "compute": 0.0,
             "all_reduce": 0.0, "validation": 0.0}
    optimizers = model._optimizers(job.lr, job.weight_decay)
    monitor = "val" if len(model.rows["val"]) else "train"
    best = {"loss": float("inf"), "state": None}
    start_epoch, start_batch, model._running = 0, 0, (0.0, 0)
    if job.resume is not None:
        start_epoch, start_batch = model._resume_from(job.resume, job.checkpoint, optimizers, best, None)
        if shards is not None:
            _resume_shards(shards, job, best)
    model.stopped, model.diverged = "epochs", None
    try:
        _epochs(model, job, rank, start_epoch, start_batch, optimizers, best, clock, shards, monitor, device)
    except guards.Diverged as err:  # every rank sees the same summed loss: all stop here together
        model.stopped = f"diverged ({err.split} loss {err.value} at epoch {err.epoch + 1})"
        model.diverged = guards.diverged_message(err, job.lr, model.best_epoch if best["state"] is not None else None, best["loss"])
    if best["state"] is not None:
        model._restore_weights(best["state"])
        if shards is not None:
            shards.restore(best["shards"])
    return clock


def _epochs(model, job: Job, rank: int, start_epoch: int, start_batch: int, optimizers, best: dict, clock: dict,
            shards: ShardedEmbeddings | None, monitor: str, device) -> None:
    """The epochs of one fit, until the last or early stopping; Diverged at a NaN loss."""
    for epoch in range(start_epoch, job.epochs):
        order = batches(model.rows["train"], job.batch_size, np.random.default_rng([model.seed, epoch]))
        first = start_batch if epoch == start_epoch else 0
        started = time.perf_counter()
        record = {"epoch": epoch, "train_loss": _epoch(model, job, rank, order, epoch, first, optimizers, best, clock, shards)}
        clock["epochs"] += time.perf_counter() - started
        started = time.perf_counter()
        record.update(_validation(model, job, rank, device, shards))
        clock["validation"] += time.perf_counter() - started
        guards.check_loss(record[f"{monitor}_loss"], epoch, split="validation" if monitor == "val" else "training")
        model.history.append(record)
        if rank == 0 and guards.logs_epoch(epoch, start_epoch, job.epochs):  # a few lines per fit
            log.info("epoch %d of %d: train loss %.4f, validation loss %.4f", epoch + 1, job.epochs,
                     record["train_loss"], record["val_loss"])
        current = record[f"{monitor}_loss"]
        stop = False
        if current < best["loss"] - 1e-7:
            best["loss"], model.best_epoch, best["state"] = current, epoch, model._weights_copy()
            if shards is not None:
                best["shards"] = shards.state()
        elif epoch - model.best_epoch >= job.patience:
            stop = True
        if job.checkpoint is not None:
            _checkpoint(model, job, rank, epoch + 1, 0, optimizers, best, shards)
        if stop:
            model.stopped = "early (no validation improvement for patience epochs)"
            break


def _import_dynamo_first() -> None:
    """Import torch._dynamo before a process group exists. Imported later (the first Adam does
    it), it keeps ten references to the group that destroy_process_group does not drop (torch
    2.13): the group and its gloo threads then live until interpreter exit, where tearing them
    down can abort the process ("terminate called without an active exception", seen in CI)."""
    import torch._dynamo  # noqa: F401


def _checkpoint(model, job: Job, rank: int, epoch: int, batch: int, optimizers, best: dict,
                shards: ShardedEmbeddings | None) -> None:
    """Rank 0 writes Model.fit's checkpoint file. With sharded embeddings every rank first writes
    its shards beside it (tagged by the update count), the file names that tag, and only then are
    older shard files dropped: a crash anywhere leaves a file whose shards exist."""
    if shards is None:
        if rank == 0:
            model._checkpoint(job.checkpoint, epoch, batch, optimizers, best, None)
        return
    folder = _shard_folder(job)
    tags = {"now": str(shards.steps), "best": None if "shards" not in best else f"best{best['shards']['steps']}"}
    shards.save(folder, tags["now"])
    if tags["best"] is not None:
        shards.save(folder, tags["best"], best["shards"])
    dist.barrier()
    if rank == 0:
        base = {w: spec.step for w, spec in job.embeddings.items()}  # the tables' steps when the run began
        model._checkpoint(job.checkpoint, epoch, batch, optimizers, best, None,
                          extra={"shards": {"world": job.world, "base": base, **tags}})
    dist.barrier()
    shards.drop_saved(folder, {t for t in tags.values() if t is not None})


def _shard_folder(job: Job) -> Path:
    return Path(job.checkpoint + ".shards")


def _check_shards(job: Job) -> None:
    """A checkpoint holds the embeddings' shards of as many ranks as wrote it: resume with as many."""
    saved = job.resume.get("shards")
    if saved is None or saved["world"] != job.world:
        raise RelsqlError(f"checkpoint {job.checkpoint} holds no embedding shards for {job.world} workers (it has "
                          f"{'none' if saved is None else saved['world']}): resume with as many workers as wrote it, "
                          "or start without resume=True")


def _resume_shards(shards: ShardedEmbeddings, job: Job, best: dict) -> None:
    """The shards the resumed checkpoint names (written by as many ranks as there are now)."""
    _check_shards(job)
    saved = job.resume["shards"]
    shards.restore(shards.load(_shard_folder(job), saved["now"]))
    if saved["best"] is not None:
        best["shards"] = shards.load(_shard_folder(job), saved["best"])


def _epoch(model, job: Job, rank: int, order: list[np.ndarray], epoch: int, first: int, optimizers, best: dict,
           clock: dict, shards: ShardedEmbeddings | None) -> float:
    """One pass over the global batches (from batch `first`); returns the mean loss over the
    epoch's rows. Rank 0 writes the mid-epoch checkpoints."""
    shares = [np.array_split(positions, job.world)[rank] for positions in order]
    total, count = model._running if first else (0.0, 0)
    with Worker() as worker:
        pending = worker.prefetch(_prepare, model, shares[first], epoch) if first < len(order) else None
        for b in range(first, len(order)):
            positions = order[b]
            batch = worker.wait(pending)
            pending = worker.prefetch(_prepare, model, shares[b + 1], epoch) if b + 1 < len(order) else None
            started = time.perf_counter()
            external = shards.fetch(batch) if shards is not None else {}
            clock["all_reduce"] += time.perf_counter() - started
            started = time.perf_counter()
            _agree_on_weights(model, batch, optimizers, job)
            for optimizer in optimizers:
                optimizer.zero_grad()
            loss = torch.zeros((), dtype=model.dtype, device=model.device)
            if batch is not None:
                out = Batched.outputs(model.net, model.head, batch, external, model.output)
                y = model.y[torch.as_tensor(shares[b], device=model.device)]
                loss = model.task.loss(out, y) * (len(shares[b]) / len(positions))  # this share's part of the batch mean
                loss.backward()
            clock["compute"] += time.perf_counter() - started
            started = time.perf_counter()
            batch_loss, reduced = _all_reduce_gradients(model, loss.detach(), shards.gradients(external) if shards else [])
            clock["all_reduce"] += time.perf_counter() - started
            guards.check_loss(batch_loss, epoch, b, len(order))  # the summed loss: every rank stops at the same step
            started = time.perf_counter()
            for optimizer in optimizers:
                optimizer.step()
            if shards is not None:
                shards.apply(reduced)
            clock["compute"] += time.perf_counter() - started
            total, count = total + batch_loss * len(positions), count + len(positions)
            model._running = (total, count)
            if job.checkpoint is not None and job.checkpoint_every and (b + 1) % job.checkpoint_every == 0 and b + 1 < len(order):
                _checkpoint(model, job, rank, epoch, b + 1, optimizers, best, shards)
        clock["waiting_on_store"] += worker.waited
    return total / count if count else float("nan")


def _prepare(model, positions: np.ndarray, epoch: int):
    return model.batched.prepare(model.labelled[positions], epoch) if len(positions) else None


def _agree_on_weights(model, batch, optimizers, job: Job) -> None:
    """Every rank creates the weights any rank's share needs first (one process would create
    them for the whole batch at this step), so all hold the same parameters in the same state."""
    new = {} if batch is None else {n: s for n, s in batch.plan.params.items()
                                    if not s.external and n not in model.net._param_keys}
    flag = torch.tensor([len(new)], dtype=torch.int64)
    dist.all_reduce(flag)
    if not int(flag):
        return
    gathered: list[dict] = [{} for _ in range(job.world)]
    dist.all_gather_object(gathered, new)
    merged = {name: spec for part in gathered for name, spec in sorted(part.items())}
    created = model.net.add_weights(SimpleNamespace(params=merged))
    dense = [p for p in created if p.requires_grad and not model._is_embedding(p)]
    if dense:
        optimizers[0].add_param_group({"params": dense, "lr": job.lr, "weight_decay": job.weight_decay})
    sparse = [p for p in created if p.requires_grad and model._is_embedding(p)]
    if sparse:
        optimizers.append(model._optimizers_for(sparse))


def _all_reduce_gradients(model, loss: torch.Tensor, extra: list[torch.Tensor]) -> tuple[float, list[torch.Tensor]]:
    """Sum gradients (and the batch loss, and `extra`: the sharded embeddings' part) over the
    ranks in one all-reduce; a weight no rank used keeps no gradient, as in one process (Adam
    then leaves it alone). Returns the batch loss and `extra` summed."""
    params = [p for _, p in sorted(model.net.weights_by_name().items()) if p.requires_grad]
    params += [p for p in model.head.parameters() if p.requires_grad]
    parts = [(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params]
    used = torch.tensor([p.grad is not None for p in params], dtype=loss.dtype, device=loss.device)
    extra = [e.to(loss.device, loss.dtype) for e in extra]
    flat = torch.cat([*parts, used, loss.reshape(1), *extra])
    dist.all_reduce(flat)
    offset, dense = 0, sum(part.numel() for part in parts)
    for p, part, count in zip(params, parts, flat[dense:dense + len(params)].tolist()):
        p.grad = flat[offset:offset + part.numel()].view_as(p).clone() if count else None
        offset += part.numel()
    offset += len(params)
    batch_loss = float(flat[offset])
    offset += 1
    summed = []
    for e in extra:
        summed.append(flat[offset:offset + e.numel()].to("cpu", torch.float64))
        offset += e.numel()
    return batch_loss, summed


def _outputs_in_step(model, job: Job, shares: list[np.ndarray], rids: np.ndarray, shards: ShardedEmbeddings) -> torch.Tensor:
    """Outputs of this rank's rows `rids` in batches, every rank taking as many steps as the one
    with the most (fetching the embeddings is collective): the others fetch nothing then."""
    steps = max(len(batches(np.arange(len(s)), job.batch_size, None)) if len(s) else 0 for s in shares)
    chunks = batches(rids, job.batch_size, None) if len(rids) else []
    outs = [torch.zeros((0, model.task.units), dtype=model.dtype, device=model.device)]
    for i in range(steps):
        batch = model.batched.prepare(chunks[i]) if i < len(chunks) else None
        external = shards.fetch(batch)
        if batch is not None:
            outs.append(Batched.outputs(model.net, model.head, batch, external, model.output))
    return torch.cat(outs)


def _validation(model, job: Job, rank: int, device: torch.device, shards: ShardedEmbeddings | None) -> dict[str, float]:
    """Validation loss and metrics over all its rows: each rank computes a share, all gather."""
    positions = model.rows["val"]
    if not len(positions):
        return {"val_loss": float("nan")}
    shares = np.array_split(np.arange(len(positions)), job.world)
    mine = positions[shares[rank]]
    with torch.no_grad():
        if shards is not None:
            out = _outputs_in_step(model, job, shares, model.labelled[mine], shards)
        elif len(mine):
            out = model._batched_outputs(model.labelled[mine], None, job.batch_size)
        else:
            out = torch.zeros((0, model.task.units), dtype=model.dtype, device=device)
    widest = max(len(s) for s in shares)
    padded = torch.zeros((widest, out.shape[1]), dtype=out.dtype, device=out.device)
    padded[:len(out)] = out
    gathered = [torch.empty_like(padded) for _ in range(job.world)]
    dist.all_gather(gathered, padded)
    out = torch.cat([g[:len(s)] for g, s in zip(gathered, shares)])
    y = model.y[torch.as_tensor(positions, device=model.y.device)]
    record = {"val_loss": float(model.task.loss(out, y))}
    for name, value in model.task.scores(out.cpu().double().numpy(), y.cpu().double().numpy()).items():
        record[f"val_{name}"] = value
    return record


if __name__ == "__main__":
    _rank_main()
