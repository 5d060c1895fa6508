"""`ModelSpec`: what a `relsql.Model` is made of, apart from its database.

Every argument of `Model(db, ...)` but `db`, as one frozen record: `model.spec` gives it back with
the values the model was built with (checked, and what the database decided filled in: the output
relation, the task, a ranking target's candidate and pair relations), and
`Model.from_spec(db, spec)` builds a model from it. Whoever makes a model like another (the
search's trials, a model on a second database, another seed) changes what differs with
`spec.replace(...)` instead of listing the constructor's arguments again, so an argument added
to Model cannot be left behind (tests/test_model_spec.py compares the two).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, fields
from pathlib import Path

import torch

from relsql.errors import RelsqlError
from relsql.template.ir import Template


@dataclass(frozen=True)
class ModelSpec:
    """The arguments of `Model(db, ...)` but `db`, with Model's defaults; see Model.__init__ for
    what each means. A spec is not checked until a model is built from it."""

    template: Template | str | Path
    target: str
    output: str | None = None
    task: str | None = None
    time_column: str | None = None
    split: tuple[float, float, float] = (0.7, 0.15, 0.15)
    seed: int = 0
    dtype: torch.dtype = torch.float32
    device: str | torch.device = "cpu"
    progress: bool | None = None
    batch_size: int | None = None
    fanout: dict[str, int] | int | None = None
    embedding_optimizer: str | None = None
    embedding_lr: float = 0.1
    allow_target_inputs: bool = False
    threads: int | None = None
    store: str | Path | bool | None = None
    max_groundings: int | None = None
    candidates: str | None = None
    pairs: str | None = None

    def replace(self, **changes: object) -> ModelSpec:
        """A copy with `changes` (argument name -> value); an unknown name is refused with the known ones."""
        names = self.names()
        unknown = sorted(set(changes) - set(names))
        if unknown:
            raise RelsqlError(f"ModelSpec.replace: {', '.join(unknown)} is not an argument of relsql.Model; "
                              f"a spec holds {', '.join(names)}")
        return dataclasses.replace(self, **changes)

    def arguments(self) -> dict[str, object]:
        """{argument name: value}: `Model(db, **spec.arguments())` is `Model.from_spec(db, spec)`."""
        return {name: getattr(self, name) for name in self.names()}

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The argument names, in Model.__init__'s order."""
        return tuple(f.name for f in fields(cls))

    @classmethod
    def of(cls, learner, *, threads: int | None, allow_target_inputs: bool) -> ModelSpec:
        """The spec of a built learner: its checked settings and what its build decided (output,
        task, split, a ranking target's candidate and pair relations). `threads` and
        `allow_target_inputs` are not the learner's to know: the Model passes them."""
        settings, task = learner.settings, learner.task
        fanout = settings.fanout
        return cls(template=learner.template, target=learner.target, output=learner.output, task=task.kind,
                   time_column=learner.time_column, split=tuple(learner.fractions), seed=learner.seed,
                   dtype=settings.dtype, device=settings.device, progress=settings.progress,
                   batch_size=settings.batch_size, fanout=dict(fanout) if isinstance(fanout, dict) else fanout,
                   embedding_optimizer=settings.embedding_optimizer, embedding_lr=settings.embedding_lr,
                   allow_target_inputs=allow_target_inputs, threads=threads, store=settings.store,
                   max_groundings=settings.max_groundings, candidates=getattr(task, "candidates", None) or None,
                   pairs=getattr(task, "pairs", None) or None)
