"""Data-parallel training: N processes (ranks) train one model from one grounding store.

Every rank walks the global batches one process would (same seed, same shuffles). Each takes a
contiguous share of a batch's rows, reads their groundings from the store (files; no database),
runs forward and backward with its loss scaled by its share of the batch, and one all-reduce
sums the gradients (gloo on CPU, NCCL on CUDA). That sum is the gradient of the whole batch's
mean loss, so N ranks take the steps one process takes, equal up to the order of float
additions. Validation rows are shared out the same way and their outputs gathered, so every
rank makes the same early-stopping choice. Rank 0 hands the result back to the process that
started the ranks, which owns the database: it keeps checkpoints, predictions and saved models.

The ranks run the one training loop (relsql/train/loop/trainer.py) with the `Ranks` strategy, which
supplies only what differs: shares of batches, the all-reduce, agreeing on new weights,
validation, embedding shards. Ranks are `python -m relsql.train.loop.distributed` processes; the job
(the model's saved state with its labels, and the store's description) reaches them through their stdin, from this process only.
A Spark-grounded model's ranks start through Spark's TorchDistributor instead
(relsql/train/loop/torch_distributor.py). Database-stored embeddings are sharded over the ranks
(relsql/train/embeddings/sharded.py); the parent writes them back (relsql/train/embeddings/write_back.py).
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

from relsql import cores
from relsql.errors import RelsqlError
from relsql.ground.demand import database_embeddings
from relsql.ground.store import GroundingStore
from relsql.train.embeddings import write_back
from relsql.train.embeddings.sharded import EmbeddingJob, ShardedEmbeddings
from relsql.train.feed.batches import batches
from relsql.train.feed.source import BatchSource
from relsql.train.learner.learner import Learner, from_state
from relsql.train.learner.record import FitRecord
from relsql.train.loop import torch_distributor
from relsql.train.loop.callbacks import EarlyStopping
from relsql.train.loop.options import FitConfig
from relsql.train.loop.strategy import Strategy
from relsql.train.loop.trainer import Trainer
from relsql.train.persist import checkpoint as checkpoints
from relsql.train.persist.saved import ModelState

log = logging.getLogger("relsql")
RESULT = "result.pt"


@dataclass
class Job:
    """Everything a rank needs: no database handle, nothing that runs code when read."""

    model: ModelState | None  # the model's state and labels, without its database (None under torchrun)
    store: tuple  # GroundingStore.detach()
    config: FitConfig  # fit's settings, its batch size resolved, no callbacks
    world: int
    init_method: str
    folder: str
    threads: int
    timeout: float
    log_level: int = logging.WARNING
    resume: dict | None = None  # the checkpoint's state (rank 0 writes config.checkpoint, Model.fit's format)
    started: float = 0.0  # time.time() when the parent started the ranks
    embeddings: dict[str, EmbeddingJob] = field(default_factory=dict)  # database-stored ones, sharded over the ranks

    @property
    def batch_size(self) -> int:
        return self.config.batch_size

    @property
    def checkpoint(self) -> str | None:
        return None if self.config.checkpoint is None else str(self.config.checkpoint)


# -- the parent: start the ranks, wait, take the result ------------------------------------------
def launched_by_torchrun() -> bool:
    """This process is one rank of a group torchrun (or another launcher with its environment) started."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1 and "RANK" in os.environ and "RELSQL_RANK" not in os.environ


def fit_as_rank(learner: Learner, config: FitConfig, timeout: float = 1800.0) -> None:
    """Train as this process's rank of a torchrun group (env://: RANK, WORLD_SIZE, MASTER_ADDR,
    MASTER_PORT): every rank built the same model on its own engine session, and reads its own or
    a shared grounding store; each ends with the same weights. Rank 0 writes the checkpoints."""
    _refuse(learner, int(os.environ["WORLD_SIZE"]))
    if database_embeddings(learner.template):
        raise RelsqlError("under torchrun, every rank has its own database session, and database-stored embeddings need "
                          "one writer: train them with model.fit(workers=N) from one process, or declare them storage='memory'")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    learner.ensure_batched()
    job = _job(learner, world, config, timeout, model=None, store=(), init_method="env://", folder="",
               threads=torch.get_num_threads(), started=time.time())
    owned = not dist.is_initialized()
    strategy = Ranks(job, rank, None)
    try:
        record = _train(learner, job, rank, strategy)
    finally:
        if owned and dist.is_initialized():
            dist.destroy_process_group()
    record.add_timings(strategy.clock)  # this rank's epochs, compute, all_reduce, ... (the trainer added "training")
    if record.diverged:
        raise RelsqlError(record.diverged)


def _job(owner: Learner, world: int, config: FitConfig, timeout: float, **where) -> Job:
    """The job of every rank of `owner`: fit's settings, the checkpoint to resume from, and
    `where` (the model's state sent to the ranks, the store, the rendezvous, the folder for results, threads)."""
    checkpoint = config.checkpoint
    resumed = checkpoints.load(checkpoint) if config.resume and checkpoint is not None and Path(checkpoint).exists() else None
    config = config.replace(batch_size=config.batch_size or owner.settings.batch_size or len(owner.rows["train"]),
                            callback=None, callbacks=())
    return Job(config=config, world=world, timeout=timeout, log_level=log.getEffectiveLevel(), resume=resumed, **where)


def _refuse(learner: Learner, workers: int) -> None:
    """What ranks cannot do yet, refused before anything starts."""
    if learner.settings.store is False:
        raise RelsqlError(f"fit(workers={workers}) reads every batch from the grounding store: create the Model without "
                          "store=False")
    on_this_machine = not torch_distributor.applies(learner.db)  # else Spark's executors hold the GPUs
    if learner.device.type == "cuda" and on_this_machine and torch.cuda.device_count() < workers:
        raise RelsqlError(f"fit(workers={workers}) on CUDA needs a GPU per rank (NCCL); this machine has "
                          f"{torch.cuda.device_count()}: use workers={max(1, torch.cuda.device_count())}, or device='cpu' (gloo)")


def capped_workers(learner: Learner, workers: int) -> int:
    """`workers`, but at most one rank process per core on this machine (more ranks than cores only
    take turns on them, each holding a copy of the model): a larger request is cut, with a warning.
    Spark's executors (TorchDistributor) have cores of their own: not capped here, nor a resumed run
    (its checkpoint's embedding shards need as many ranks as wrote them)."""
    have = cores.usable()
    if workers <= have or torch_distributor.applies(learner.db):
        return workers
    message = (f"fit(workers={workers}): this machine gives the process {have} core(s), and rank processes beyond one "
               f"per core only take turns on them; training on {have} worker(s) instead. Pass workers={have} (or "
               "fewer) to silence this")
    warnings.warn(message, RuntimeWarning, stacklevel=4)
    log.warning(message)
    return have


def fit(learner: Learner, config: FitConfig, timeout: float = 1800.0, threads: int | None = None) -> None:
    """Train `learner` on `config.workers` ranks (at most one per core, see capped_workers); its
    weights, history and best epoch become rank 0's. `timeout`: seconds a rank waits for the others
    in a collective before giving up."""
    workers = config.workers
    if not (config.resume and config.checkpoint is not None and Path(config.checkpoint).exists()):
        workers = capped_workers(learner, workers)  # a resumed run needs its checkpoint's ranks
    _refuse(learner, workers)
    store = learner.ensure_batched().grounding_store
    with tempfile.TemporaryDirectory(prefix="relsql-ranks-") as folder:
        job = _job(learner, workers, config, timeout, model=ModelState.of(learner, labels=True), store=store.detach(),
                   init_method=f"tcp://127.0.0.1:{_free_port()}", folder=folder,
                   threads=threads or max(1, cores.half() // workers))
        job.embeddings = write_back.export(learner, folder, job.resume)
        if job.embeddings and job.resume is not None:
            _check_shards(job)
        started = time.perf_counter()
        job.started = time.time()
        with write_back.CheckpointWriter(learner, job.embeddings, job.checkpoint, workers):
            result = _launch(learner, job)
        write_back.write_result(learner, job.embeddings, folder, workers, result["embedding_updates"])
    learner.net.set_named_weights(result["weights"], learner.fixed())
    learner.head.load_state_dict(result["head"])
    record = FitRecord(history=list(result["history"]), best_epoch=result["best_epoch"], stopped=result["stopped"],
                       monitor=result.get("monitor"), epoch_cap=config.epochs, time_budget=config.time_budget,
                       timings=dict(learner.record.timings), diverged=result.get("diverged"))
    record.add_timings({**result["timings"], "training": time.perf_counter() - started})
    learner.record = record  # rank 0's record of training, the seconds added to the model's
    if record.diverged:  # the ranks stopped at a NaN loss, with the best epoch's weights
        raise RelsqlError(record.diverged)


def _launch(model: Learner, job: Job) -> dict:
    """Start the ranks, wait for them, and return rank 0's result (weights, history, timings).
    A Spark-grounded model's ranks start through Spark's TorchDistributor, on the executors;
    any other through this module's own rank processes on this machine."""
    if torch_distributor.applies(model.db):
        return torch_distributor.run(model.db, job, run_rank)
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
            process = subprocess.Popen([sys.executable, "-m", "relsql.train.loop.distributed"], stdin=subprocess.PIPE,
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
                raise RelsqlError(f"training rank {failed[0]} of {job.world} failed: "
                                  f"{_failure(job, failed[0], codes[failed[0]])}")
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
    """One rank's whole part: build the learner from the job's state, train; rank 0 returns the
    result (weights, head, history, timings as tensors and numbers), the others None."""
    learner = from_state(job.model, GroundingStore.attach(*job.store))
    shards = _shards(learner, job, rank)
    strategy = Ranks(job, rank, shards)
    record = _train(learner, job, rank, strategy)
    if shards is not None:
        shards.write_result(job.folder)
        dist.barrier()  # every rank's rows are on disk before rank 0 reports
    if rank != 0:
        return None
    return {"weights": {n: p.detach().cpu() for n, p in learner.net.weights_by_name().items()},
            "head": {k: v.cpu() for k, v in learner.head.state_dict().items()},
            "history": record.history, "best_epoch": record.best_epoch, "stopped": record.stopped,
            "monitor": record.monitor, "timings": strategy.clock, "diverged": record.diverged,
            "embedding_updates": {} if shards is None else shards.updates}


def _shards(learner: Learner, job: Job, rank: int) -> ShardedEmbeddings | None:
    if not job.embeddings:
        return None
    return ShardedEmbeddings(job.embeddings, learner.batched.grounding_store.embedding_keys, rank, job.world,
                             learner.dtype, learner.device)


def _train(learner: Learner, job: Job, rank: int, strategy: Ranks | None = None) -> FitRecord:
    """The one training loop (relsql/train/loop/trainer.py) as this rank; the learner ends with the best
    epoch's weights and the trainer's record (`diverged`: the message of a diverged loss)."""
    strategy = strategy or Ranks(job, rank, None)
    if learner.device.type == "cuda":  # this machine's GPU of the rank
        learner.move(torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank))))
    if not dist.is_initialized():
        _import_dynamo_first()
        dist.init_process_group("nccl" if learner.device.type == "cuda" else "gloo", init_method=job.init_method,
                                rank=rank, world_size=job.world, timeout=timedelta(seconds=job.timeout))
    strategy.clock["rank_startup"] = time.time() - job.started
    config = job.config
    if config.regression_loss is not None:
        learner.task.regression_loss = config.regression_loss
    learner.task.class_weights = None if config.class_weights is None else list(config.class_weights)
    trainer = Trainer(learner, strategy, config)
    learner.record = trainer.record
    trainer.record.stopped = "epochs"  # said even where a resumed run has no epoch left
    record = trainer.fit(batched=True, resume=job.resume)
    strategy.clock.update({k: v for k, v in trainer.clock.items() if k != "waiting_on_store"})
    strategy.clock["waiting_on_store"] = trainer.source.waited
    return record


class Ranks(Strategy):
    """The strategy of one rank among job.world: a contiguous share of every global batch, gradients
    summed in one all-reduce, new weights agreed on, validation shared out and gathered,
    database-stored embeddings in shards (relsql/train/embeddings/sharded.py), rank 0 writing checkpoints."""

    bars = False

    def __init__(self, job: Job, rank: int, shards: ShardedEmbeddings | None):
        self.job, self.rank, self.shards, self.world = job, rank, shards, job.world
        self.main = rank == 0
        self.clock: dict[str, float] = {}

    def source(self, learner: Learner, batched: bool) -> BatchSource:
        return BatchSource(learner.ensure_batched(), fetch=self._fetch)

    def _fetch(self, batch) -> dict:
        return self.shards.fetch(batch) if self.shards is not None else {}

    def shares(self, order: list[np.ndarray]) -> list[np.ndarray]:
        return [np.array_split(positions, self.world)[self.rank] for positions in order]

    def create_weights(self, trainer: Trainer, batch) -> list:
        return _agree_on_weights(trainer.learner, batch, self.world)

    def reduce(self, trainer: Trainer, loss: torch.Tensor, external: dict) -> tuple[float, list[torch.Tensor]]:
        return _all_reduce_gradients(trainer.learner, loss, self.shards.gradients(external) if self.shards else [])

    def after_step(self, trainer: Trainer, batch, external: dict, reduced) -> None:
        if self.shards is not None:
            self.shards.apply(reduced)

    def validate(self, trainer: Trainer, train_loss: float) -> dict[str, float]:
        return {"train_loss": train_loss, **_validation(trainer.learner, self.job, self.rank, self.shards)}

    def best(self, trainer: Trainer) -> None:
        if self.shards is not None:
            trainer.stopping.extra = self.shards.state()

    def keep_best(self, trainer: Trainer, last: int | None) -> None:
        if self.shards is not None and trainer.stopping.extra is not None:
            self.shards.restore(trainer.stopping.extra)

    def checkpoint(self, trainer: Trainer, epoch: int, batch: int) -> None:
        _checkpoint(trainer, self.job, self.rank, epoch, batch, self.shards)

    def resume(self, trainer: Trainer, state: dict, where: str) -> None:
        if self.shards is not None:
            _resume_shards(self.shards, self.job, trainer.stopping)

    def timings(self, trainer: Trainer) -> dict[str, float]:
        return {}

    def agree(self, stop: bool) -> bool:
        """Every rank stops if any would (each reads its own clock for the time budget)."""
        flag = torch.tensor([1.0 if stop else 0.0], device=self.job_device())
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item() > 0)

    def job_device(self) -> torch.device:
        """Where collectives' tensors live: the GPU under NCCL, else the CPU."""
        return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def _import_dynamo_first() -> None:
    """Import torch._dynamo before a process group exists. Imported later (the first Adam does
    it), it keeps ten references to the group that destroy_process_group does not drop (torch
    2.13): the group and its gloo threads then live until interpreter exit, where tearing them
    down can abort the process ("terminate called without an active exception", seen in CI)."""
    import torch._dynamo  # noqa: F401


def _checkpoint(trainer: Trainer, job: Job, rank: int, epoch: int, batch: int, shards: ShardedEmbeddings | None) -> None:
    """Rank 0 writes Model.fit's checkpoint file. With sharded embeddings every rank first writes
    its shards beside it (tagged by the update count), the file names that tag, and only then are
    older shard files dropped: a crash anywhere leaves a file whose shards exist."""
    if shards is None:
        if rank == 0:
            trainer.write_checkpoint(epoch, batch)
        return
    folder = _shard_folder(job)
    best = trainer.stopping.extra
    tags = {"now": str(shards.steps), "best": None if best is None else f"best{best['steps']}"}
    shards.save(folder, tags["now"])
    if tags["best"] is not None:
        shards.save(folder, tags["best"], best)
    dist.barrier()
    if rank == 0:
        base = {w: spec.step for w, spec in job.embeddings.items()}  # the tables' steps when the run began
        trainer.write_checkpoint(epoch, batch, extra={"shards": {"world": job.world, "base": base, **tags}})
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


def _resume_shards(shards: ShardedEmbeddings, job: Job, stopping: EarlyStopping) -> None:
    """The shards the resumed checkpoint names (written by as many ranks as there are now)."""
    _check_shards(job)
    saved = job.resume["shards"]
    shards.restore(shards.load(_shard_folder(job), saved["now"]))
    if saved["best"] is not None:
        stopping.extra = shards.load(_shard_folder(job), saved["best"])


def _agree_on_weights(learner: Learner, batch, world: int) -> list:
    """Every rank creates the weights any rank's share needs first (one process would create
    them for the whole batch at this step), so all hold the same parameters in the same state."""
    have = learner.net.weights_by_name()
    new = {} if batch is None else {n: s for n, s in batch.plan.params.items() if not s.external and n not in have}
    flag = torch.tensor([len(new)], dtype=torch.int64)
    dist.all_reduce(flag)
    if not int(flag):
        return []
    gathered: list[dict] = [{} for _ in range(world)]
    dist.all_gather_object(gathered, new)
    merged = {name: spec for part in gathered for name, spec in sorted(part.items())}
    return learner.net.add_weights(SimpleNamespace(params=merged))


def _all_reduce_gradients(learner: Learner, loss: torch.Tensor, extra: list[torch.Tensor]) -> tuple[float, list[torch.Tensor]]:
    """Sum gradients (and the batch loss, and `extra`: the sharded embeddings' part) over the
    ranks in one all-reduce; a weight no rank used keeps no gradient, as in one process (Adam
    then leaves it alone). Returns the batch loss and `extra` summed."""
    params = [p for _, p in sorted(learner.net.weights_by_name().items()) if p.requires_grad]
    params += [p for p in learner.head.parameters() if p.requires_grad]
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


def _outputs_in_step(learner: Learner, job: Job, shares: list[np.ndarray], rids: np.ndarray,
                     shards: ShardedEmbeddings) -> torch.Tensor:
    """Outputs of this rank's rows `rids` in batches, every rank taking as many steps as the one
    with the most (fetching the embeddings is collective): the others fetch nothing then."""
    steps = max(len(batches(np.arange(len(s)), job.batch_size, None)) if len(s) else 0 for s in shares)
    chunks = batches(rids, job.batch_size, None) if len(rids) else []
    chunks += [np.zeros(0, dtype=np.int64)] * (steps - len(chunks))
    outs = [torch.zeros((0, learner.task.units), dtype=learner.dtype, device=learner.device)]
    with BatchSource(learner.batched, fetch=shards.fetch) as source:
        for _, batch, external in source.epoch(chunks):
            if batch is not None:
                outs.append(learner.batch_outputs(batch, external))
    return torch.cat(outs)


def _validation(learner: Learner, job: Job, rank: int, shards: ShardedEmbeddings | None) -> dict[str, float]:
    """Validation loss and metrics over all its rows: each rank computes a share, all gather."""
    positions = learner.rows["val"]
    if not len(positions):
        return {"val_loss": float("nan")}
    shares = np.array_split(np.arange(len(positions)), job.world)
    mine = positions[shares[rank]]
    with torch.no_grad():
        if shards is not None:
            out = _outputs_in_step(learner, job, shares, learner.labelled[mine], shards)
        elif len(mine):
            out = learner.outputs_of(learner.labelled[mine], None, job.batch_size)
        else:
            out = torch.zeros((0, learner.task.units), dtype=learner.dtype, device=learner.device)
    widest = max(len(s) for s in shares)
    padded = torch.zeros((widest, out.shape[1]), dtype=out.dtype, device=out.device)
    padded[:len(out)] = out
    gathered = [torch.empty_like(padded) for _ in range(job.world)]
    dist.all_gather(gathered, padded)
    out = torch.cat([g[:len(s)] for g, s in zip(gathered, shares)])
    y = learner.y[torch.as_tensor(positions, device=learner.y.device)]
    return learner.scores(out, y, "val_")


if __name__ == "__main__":
    _rank_main()
