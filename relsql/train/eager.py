"""torch.optim's optimizers without their torch.compile guards, for relsql's own training.

torch 2.13 marks `Optimizer.zero_grad`, `add_param_group`, `state_dict`, `load_state_dict` and
the Adam/AdamW/Adagrad/SGD `step`s as "not to be traced by torch.compile"; the mark imports
`torch._dynamo` (the compiler's front end: ~1 CPU-s and ~65 MB, more than a whole small fit) at
the first call. relsql never compiles a training step, so fit's optimizers and the report's
linear baseline (LBFGS) call the unmarked functions: the same arithmetic (the same fused
kernels, bitwise the same weights: tests/test_eager_optimizers.py), without the import. An
optimizer the user passes (the Loader's) is theirs, left as it is.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from functools import cache

import torch


def _unmarked(method: Callable) -> Callable:
    """The function under torch's wrappers (each keeps the one it wraps as `__wrapped__`): the
    guard, and the step hooks torch adds to a class once an instance of it exists (this class's
    own step runs the hooks). The method itself where a torch version wraps it otherwise: still
    correct, only slower to start."""
    return inspect.unwrap(method)


class _Eager:
    """The four Optimizer methods and `step` of the class after this one in the MRO, unguarded."""

    _base: type[torch.optim.Optimizer]

    def step(self, closure=None):
        # the guard's other job: no autograd graph through the update unless `differentiable` (LBFGS: never)
        with torch.set_grad_enabled(self.defaults.get("differentiable", False)):
            return _unmarked(self._base.step)(self, closure)

    def zero_grad(self, set_to_none: bool = True) -> None:
        _unmarked(torch.optim.Optimizer.zero_grad)(self, set_to_none)

    def add_param_group(self, param_group: dict) -> None:
        _unmarked(torch.optim.Optimizer.add_param_group)(self, param_group)

    def state_dict(self) -> dict:
        return _unmarked(torch.optim.Optimizer.state_dict)(self)

    def load_state_dict(self, state_dict: dict) -> None:
        _unmarked(torch.optim.Optimizer.load_state_dict)(self, state_dict)


@cache
def eager(base: type[torch.optim.Optimizer]) -> type[torch.optim.Optimizer]:
    """`base` (Adam, AdamW, Adagrad, SGD, LBFGS) without the guards: a subclass, so isinstance checks and
    its state dict are torch's."""
    doc = f"torch.optim.{base.__name__} without the torch.compile guards (relsql/train/eager.py)."
    return type(base.__name__, (_Eager, base), {"_base": base, "__module__": __name__, "__doc__": doc})
