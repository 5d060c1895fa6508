"""A model read from a file, built on first use (what `Model.load` returns).

Loading reads and checks the file, then what the database confirms cheaply: the target's
columns, the columns a GBM blend reads, the split against the count of labelled target rows.
Grounding and planning wait. `predict(keys=...)` or `predict(where=...)` then grounds only the
rows asked for (demand grounding, relsql/ground/demand.py) and runs them on a net made from
their batch with the file's weights: a user who loads a model to score a few rows pays for those
rows: the key tables are restricted to the rows the asked keys reach and numbered among them
(relsql/ground/closure.py; a GBM blend, fan-out sampling and Spark keep the whole key tables,
numbered globally). Their values equal the full model's up to the order of float sums (a batch's
plan skips the passes that reorder them: 1 ulp in float64 for a few rows). Anything else (predict
of every row, evaluate, fit, save, the net itself) first builds the model as Model(...) does, with
the file's encodings, task and split, and sets the file's weights: the same plan, so the same
predictions as the model that was saved.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

from relsql.compile.module import CompiledNet
from relsql.data.engine import first_line
from relsql.errors import RelsqlError
from relsql.ground.demand import BatchGrounder
from relsql.train.feed.batched import Batch, Batched
from relsql.train.feed.batches import batches
from relsql.train.feed.source import BatchSource
from relsql.train.learner import members
from relsql.train.learner.learner import Learner, loaded_head
from relsql.train.persist import saved
from relsql.train.persist.saved import ModelState

ROWS = 4096  # output rows per batch of a prediction of some rows (a model loaded without batch_size)


def set_weights(learner: Learner, net: CompiledNet, state: ModelState, path: str | Path) -> nn.Module:
    """The file's weights into `net`, and the head they give; a file whose weights do not fit its
    own template (a weight the plan needs is missing, a head of another width) is a RelsqlError."""
    missing = [n for n in net.weights_by_name() if n not in state.weights]
    if missing:
        raise RelsqlError(f"model file {path} does not fit its own template: weights {missing} are missing")
    plan = net.plan
    width = int(np.prod(plan.meta[plan.outputs[learner.output]].shape[1:]))
    units = learner.task.units
    try:
        net.set_named_weights(state.weights, learner.fixed())
        if state.head:
            weight = state.head["weight"]
            if tuple(weight.shape) != (units, width):
                raise ValueError(f"its head maps {tuple(weight.shape)[::-1]}, the output relation gives {width} values "
                                 f"and the task needs {units}")
            head = loaded_head(state.head, learner.dtype)
        elif (k := members.count(learner.template, learner.output, width, units)) > 1:
            head = members.MemberMean(k, units)
        elif width == units:
            head = nn.Identity()
        else:
            raise ValueError(f"it has no head, but the output relation gives {width} values and the task needs {units}")
    except (RuntimeError, KeyError, TypeError, ValueError) as err:
        raise RelsqlError(f"model file {path} does not fit its own template: {first_line(err)}") from None
    net.to(learner.device)
    return head.to(learner.device)


def set_built_weights(learner: Learner, state: ModelState, path: str | Path) -> None:
    """The file's weights into a learner built at load (a ranking model's towers, a model with
    database-stored embeddings): its net and the head its build made."""
    missing = [n for n in learner.net.weights_by_name() if n not in state.weights]
    if missing:
        raise RelsqlError(f"model file {path} does not fit its own template: weights {missing} are missing")
    try:
        learner.net.set_named_weights(state.weights, learner.fixed())
        learner.head.load_state_dict(state.head)
    except (RuntimeError, KeyError, TypeError, ValueError) as err:
        raise RelsqlError(f"model file {path} does not fit its own template: {first_line(err)}") from None
    learner.net.to(learner.device)
    learner.head.to(learner.device)


def check_head(state: ModelState, path: str | Path) -> None:
    """The head's shape as far as the file alone tells it: a (units, width) weight and a (units,)
    bias for the task's units; its width against the plan's is checked when the net is made."""
    head = state.head
    if not head:
        return
    weight, bias = head.get("weight"), head.get("bias")
    units = state.task.units
    if (set(head) != {"weight", "bias"} or not isinstance(weight, torch.Tensor) or not isinstance(bias, torch.Tensor)
            or weight.dim() != 2 or weight.shape[0] != units or tuple(bias.shape) != (units,) or weight.shape[1] < 1):
        shown = {k: tuple(v.shape) if isinstance(v, torch.Tensor) else type(v).__name__ for k, v in list(head.items())[:4]}
        raise RelsqlError(f"model file {path} does not fit its own template: its head is {shown}, not a "
                          f"({units}, width) weight and a ({units},) bias for {units} output(s)")


class Pending:
    """A loaded model's state until it is built: the rows-only machinery (a demand grounder, a
    net from the first batch) is made on the first prediction of some rows."""

    def __init__(self, state: ModelState, path: str | Path):
        self.state, self.path = state, path
        self.rows_batched: Batched | None = None
        self.rows_net: tuple[CompiledNet, nn.Module] | None = None
        self.grounded: dict[str, np.ndarray] = {}  # per relation, the global row ids the asked rows' batches grounded

    def complete(self, learner: Learner) -> None:
        """Build the model as Model(...) does, with the file's encodings, task and split, then set its weights."""
        state = self.state
        learner.build(state.presets, state.task, split=dict(learner.goal.rows))
        learner.head = set_weights(learner, learner.net, state, self.path)
        saved.check_loaded(learner, self.path)

    def asked(self, learner: Learner) -> Asked:
        return Asked(learner, self)

    def batched(self, learner: Learner) -> Batched:
        """The demand grounder of the rows asked for (no grounding store: the rows are read from
        the tables as they are), and the labels, read once."""
        if self.rows_batched is None:
            settings, goal = learner.settings, learner.goal
            # rows_only: key tables of the asked rows' closure alone (results.py restricts them per call); a
            # GBM blend reads every output row's features by row id, and fan-out sampling hashes row ids, so
            # those keep the whole key tables (and Spark, where restricting is not tested yet)
            rows_only = (getattr(learner, "hybrid", None) is None and not settings.fanout
                         and learner.db.source.kind != "spark")
            grounder = BatchGrounder(learner.template, learner.db, learner.output, self.state.presets, fanout=settings.fanout,
                                     seed=learner.seed, progress=settings.progress, max_groundings=settings.max_groundings,
                                     ple_numbers=True, rows_only=rows_only)  # no grounding store: ple read as numbers
            if not rows_only:  # else the split column is found by key (results.py), the labels are not read
                labels = goal.read(learner.db)
                goal.label(learner.db, labels, self.state.task, dict(goal.rows), learner.dtype, learner.device)
            self.rows_batched = learner.attach(grounder, None)
            if not rows_only:
                saved.check_split(learner, self.path)
        return self.rows_batched

    def net(self, learner: Learner, batch: Batch) -> tuple[CompiledNet, nn.Module]:
        """The net and head of the rows asked for: planned on their first batch, the file's weights set."""
        if self.rows_net is None:
            net = CompiledNet(batch.plan, batch.grounding, dtype=learner.dtype, seed=learner.seed)
            self.rows_net = (net, set_weights(learner, net, self.state, self.path))
        return self.rows_net


class Asked:
    """A loaded model not built yet, as `predict(keys=..., where=...)` reads it (relsql/train/learner/results.py,
    and the blend's GBM, relsql/train/gbm/hybrid.py): mini-batches of the rows asked for. It declares what
    those read; the rest of the learner is not reachable through it (a new read is an AttributeError
    in the tests, not a silent build)."""

    mini_batches = True

    def __init__(self, learner: Learner, pending: Pending):
        self._learner, self._pending = learner, pending

    db = property(lambda self: self._learner.db)
    goal = property(lambda self: self._learner.goal)
    task = property(lambda self: self._learner.task)
    answers = property(lambda self: self._learner.answers)
    table = property(lambda self: self._learner.table)
    output = property(lambda self: self._learner.output)
    hybrid = property(lambda self: getattr(self._learner, "hybrid", None))
    batched = property(lambda self: self._pending.batched(self._learner))
    labelled = property(lambda self: (self.batched, self._learner.goal.labelled)[1])
    rows = property(lambda self: (self.batched, self._learner.goal.rows)[1])
    output_rows = property(lambda self: self.batched.grounder.sizes[self._learner.output])

    def outputs_of(self, rids: np.ndarray, source: BatchSource | None = None, batch_size: int | None = None) -> torch.Tensor:
        """Outputs for output rows `rids`, in that order, without gradients."""
        learner = self._learner
        size = batch_size or learner.settings.batch_size or ROWS
        outs = [torch.zeros((0, learner.task.units), dtype=learner.dtype, device=learner.device)]
        chunks = batches(np.asarray(rids), size, None)
        batched = self.batched
        batched.replay = len(chunks) > 2  # a plan is recorded for replay where batches of its shape recur
        with BatchSource(batched) as source:
            for _, batch, external in source.epoch(chunks):
                if batch is not None:
                    for name, ids in batch.grounding.rows.items():
                        grounded = self._pending.grounded
                        grounded[name] = np.union1d(grounded.get(name, ids.numpy()[:0]), ids.numpy())
                    net, head = self._pending.net(learner, batch)
                    with torch.no_grad():
                        outs.append(Batched.outputs(net, head, batch, external, learner.output))
        return torch.cat(outs)
