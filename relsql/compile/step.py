"""A whole training step of a small fused plan without autograd or torch.optim.

On NeuraLogic's toy datasets a fused plan's forward and backward take 20-160 us, but a step
through autograd cost ~240 us more: the autograd engine walking the plan's node and the loss's,
the loss's own ops, zero_grad, and torch.optim's step with its hooks and per-weight loops (a
`_foreach` op on CPU costs ~1 us per tensor). Here one call runs the generated forward, the
loss's gradient in closed form, the generated backward and the optimizer's update on ONE flat
buffer: the trained weights become views of it (the same Parameter objects; `p.data` is
repointed), their gradients views of a flat gradient, the optimizer's moments flat too. The
update is torch's own formula (SGD with momentum, dampening, Nesterov and weight decay; Adam
and AdamW without amsgrad), elementwise on the flat buffer, so the numbers are those of the
regular path (tests/test_fused_step.py: float64, several steps, 1e-12).

`FusedStep.build` returns None where the step cannot run this way (a plan that does not fuse,
another optimizer or option such as amsgrad, several parameter groups, a weight the loss reaches
that the optimizer does not train): the caller keeps its regular path. `sync()` writes the
moments back into the torch optimizer's state, so the regular path can take over (a checkpoint,
a plan that changed). `choose` decides by measurement, as the other passes do: it times the
regular path (`regular_step`), the fused step of the plan as `net()` fuses it and the fused step
of the plan fused whatever its size, each also on one torch thread where several are set (small
plans' products otherwise wake the other threads for every call), and returns the fastest (None:
the regular path as set; a `RegularStep`: the regular path on one thread).

Usage, in a loop of one's own over a `relsql.compile`d net:

    loss = SquaredError({"out": target}, {"out": None})  # Σ (net()["out"] - target)²
    step = choose(net, optimizer, loss)
    for epoch in range(epochs):
        value = step.step() if step is not None else regular_step(net, optimizer, loss)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from relsql.compile import fused
from relsql.compile.module import CompiledNet

_SGD = {"momentum", "dampening", "weight_decay", "nesterov", "maximize", "foreach", "differentiable", "fused", "lr"}
_ADAM = {"lr", "betas", "eps", "weight_decay", "amsgrad", "maximize", "foreach", "capturable", "differentiable",
         "fused", "decoupled_weight_decay"}


@dataclass
class SquaredError:
    """Σ over outputs of Σ (o[rows] − t)², or its mean over the rows' elements (`mean`):
    `targets[name]` aligned with `rows[name]` (None: every row of that output)."""

    targets: dict[str, torch.Tensor]
    rows: dict[str, torch.Tensor | None]
    mean: bool = False


class _Loss:
    """SquaredError prepared for one plan's outputs: the full-size target, a 0/1 mask of the
    rows with a target (None: all) and the gradient's factor (2, or 2/n for a mean), so an
    output costs four small ops a step: difference, mask, gradient, dot product."""

    def __init__(self, loss: SquaredError, code: fused.Fused, outputs: tuple):
        index = dict(code.outputs)
        self.parts = []
        for name, target in loss.targets.items():
            i = index[name]
            out, rows = outputs[i], loss.rows.get(name)
            full, mask = torch.zeros_like(out), None
            if rows is None:
                full.copy_(target.reshape(out.shape))
            else:
                full.index_copy_(0, rows, target.to(out.dtype).reshape(len(rows), *out.shape[1:]))
                mask = torch.zeros_like(out).index_fill_(0, rows, 1.0)
            share = 1.0 / target.numel() if loss.mean else 1.0
            self.parts.append((i, full, mask, 2.0 * share, share))
        self.zeros = [torch.zeros_like(o) for o in outputs]  # outputs without a loss: no gradient

    def __call__(self, outputs: tuple) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """(loss value, d loss / d output for each of the forward's outputs)."""
        value, grads = None, list(self.zeros)
        for i, full, mask, scale, share in self.parts:
            diff = outputs[i] - full
            if mask is not None:
                diff.mul_(mask)
            grad = diff * scale
            grads[i] = grad if grads[i] is self.zeros[i] else grads[i] + grad
            flat = diff.reshape(-1)
            part = flat.dot(flat) if share == 1.0 else flat.dot(flat) * share
            value = part if value is None else value + part
        return value, grads


def _settings(optimizer: torch.optim.Optimizer) -> dict | None:
    """The optimizer's one group's settings, if the flat update reproduces it exactly; else None."""
    if len(optimizer.param_groups) != 1:
        return None
    group = optimizer.param_groups[0]
    if type(optimizer) is torch.optim.SGD:
        allowed, kind = _SGD, "sgd"
    elif type(optimizer) in (torch.optim.Adam, torch.optim.AdamW):
        allowed, kind = _ADAM, "adamw" if type(optimizer) is torch.optim.AdamW or group.get("decoupled_weight_decay") else "adam"
        if group["amsgrad"] or group.get("capturable") or isinstance(group["betas"][0], torch.Tensor):
            return None
    else:
        return None
    if group.get("maximize") or group.get("differentiable") or group.get("fused") or isinstance(group["lr"], torch.Tensor):
        return None
    if any(k not in allowed for k in group if k != "params"):
        return None
    if optimizer._optimizer_step_pre_hooks or optimizer._optimizer_step_post_hooks:
        return None
    return {"kind": kind, "group": group}


class FusedStep:
    """`step()`: one forward, loss, backward and optimizer update of `net`'s fused plan; returns
    the loss (a 0-d tensor). Build with `FusedStep.build`."""

    def __init__(self, net: CompiledNet, optimizer: torch.optim.Optimizer, code: fused.Fused, kind: str,
                 trained: list[int], flatten: list[bool], loss: _Loss):
        self.net, self.optimizer, self.code, self.kind, self.loss = net, optimizer, code, kind, loss
        self.group = optimizer.param_groups[0]
        weights = net.weights_by_name()
        self.weights = [weights[n] for n in code.names]  # the forward's arguments (views once flattened)
        self.trained, self.flatten = trained, flatten  # the weights the update moves; whose gradient is reshaped
        self.params = [self.weights[i] for i in trained]
        self.sizes = [p.numel() for p in self.params]
        self.flat = torch.cat([p.detach().reshape(-1) for p in self.params])
        self.grad = torch.zeros_like(self.flat)
        self.step_count, self.moments = self._import_state()
        for p, value, grad in zip(self.params, self.flat.split(self.sizes), self.grad.split(self.sizes)):
            p.data = value.view(p.shape)  # the same Parameter, its values now in the flat buffer
            p.grad = grad.view(p.shape)
        self.inputs = [net._buffers[net._inputs[s]] for s in code.inputs]

    @classmethod
    def build(cls, net: CompiledNet, optimizer: torch.optim.Optimizer, loss: SquaredError,
              force: bool = False) -> FusedStep | None:
        """The fused step of `net` trained by `optimizer` on `loss`, or None where only the
        regular path reproduces it (see the module docstring). `force`: the plan's code fused
        whatever the size of its values (CompiledNet.execution "fused"), as `choose` tries it."""
        settings = _settings(optimizer)
        if settings is None:
            return None
        execution = net.execution
        if force and execution != "ops":
            net.execution = "fused"
        try:
            code = net.fused_code()
        finally:
            net.execution = execution
        if not isinstance(code, fused.Fused) or any(n not in dict(code.outputs) for n in loss.targets):
            return None
        weights = net.weights_by_name()
        with torch.no_grad():
            outputs, held, kept = code.forward(*[weights[n] for n in code.names],
                                               *[net._buffers[net._inputs[s]] for s in code.inputs])
            reached = code.backward(held, kept, tuple(torch.ones_like(o) for o in outputs))
        upstream = _upstream(net.plan, {net.plan.outputs[name] for name in loss.targets})
        trained = [i for i, n in enumerate(code.names)
                   if weights[n].requires_grad and reached[i] is not None and n in upstream]
        moved = {id(weights[code.names[i]]) for i in trained}  # torch.optim skips a weight without a gradient
        if not trained or not moved <= {id(p) for p in optimizer.param_groups[0]["params"]}:
            return None  # the optimizer misses a weight the loss reaches (its others get no gradient: skipped)
        if len({weights[code.names[i]].dtype for i in trained}) != 1:
            return None
        if any(reached[i].shape != weights[code.names[i]].shape for i in trained):
            return None
        flatten = [reached[i].dim() != 1 for i in trained]
        try:
            return cls(net, optimizer, code, settings["kind"], trained, flatten, _Loss(loss, code, outputs))
        except ValueError:  # optimizer state the flat buffers cannot take over
            return None

    def _import_state(self) -> tuple[int, list[torch.Tensor]]:
        """The optimizer's state so far (steps, moments) as flat buffers; none yet: zeros."""
        state = [self.optimizer.state.get(p, {}) for p in self.params]
        names = {"sgd": ["momentum_buffer"], "adam": ["exp_avg", "exp_avg_sq"], "adamw": ["exp_avg", "exp_avg_sq"]}[self.kind]
        if not any(state):
            return 0, [] if self.kind == "sgd" and not self.group["momentum"] else [torch.zeros_like(self.flat) for _ in names]
        if not all(state) or any(s.get(n) is None for s in state for n in names):
            raise ValueError("the optimizer holds state for some of the plan's weights only")
        steps = {int(s["step"]) for s in state} if self.kind != "sgd" else {1}
        if len(steps) != 1:
            raise ValueError("the optimizer's weights have taken different numbers of steps")
        return steps.pop(), [torch.cat([s[n].reshape(-1) for s in state]) for n in names]

    def sync(self) -> None:
        """Write the steps taken and the moments into the torch optimizer's state (views of the
        flat buffers are copied: the regular path may take over afterwards)."""
        if not self.step_count or not self.moments:
            return
        names = ["momentum_buffer"] if self.kind == "sgd" else ["exp_avg", "exp_avg_sq"]
        for name, flat in zip(names, self.moments):
            for p, part in zip(self.params, flat.split(self.sizes)):
                self.optimizer.state[p][name] = part.view(p.shape).clone()
        if self.kind != "sgd":
            for p in self.params:
                self.optimizer.state[p]["step"] = torch.tensor(float(self.step_count), dtype=torch.float32)

    threads: int | None = None  # torch threads for the step (None: as set); choose() sets 1 where that measures faster

    def step(self) -> torch.Tensor:
        """One training step; the loss before it."""
        return _on_threads(self.threads, self._step)

    def _step(self) -> torch.Tensor:
        code = self.code
        with torch.no_grad():
            outputs, held, kept = code.forward(*self.weights, *self.inputs)
            value, grads = self.loss(outputs)
            found = code.backward(held, kept, grads)
            torch.cat([found[i].reshape(-1) if flat else found[i] for i, flat in zip(self.trained, self.flatten)],
                      out=self.grad)
            self._update()
        return value

    def _update(self) -> None:
        """torch.optim's update for one group (single-tensor formulas), on the flat buffers."""
        group, w, g = self.group, self.flat, self.grad
        lr, wd = group["lr"], group["weight_decay"]
        self.step_count += 1
        if self.kind == "sgd":
            if wd:
                g = g.add(w, alpha=wd)
            momentum = group["momentum"]
            if momentum:
                buf = self.moments[0]
                if self.step_count == 1:
                    buf.copy_(g)
                else:
                    buf.mul_(momentum).add_(g, alpha=1 - group["dampening"])
                g = g.add(buf, alpha=momentum) if group["nesterov"] else buf
            w.add_(g, alpha=-lr)
            return
        beta1, beta2 = group["betas"]
        if wd:
            if self.kind == "adamw":
                w.mul_(1 - lr * wd)
            else:
                g = g.add(w, alpha=wd)
        m, v = self.moments
        m.lerp_(g, 1 - beta1)
        v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
        step = float(self.step_count)
        bias1, bias2 = 1 - beta1 ** step, 1 - beta2 ** step
        denom = (v.sqrt() / bias2 ** 0.5).add_(group["eps"])
        w.addcdiv_(m, denom, value=-(lr / bias1))


def _upstream(plan, slots: set[int]) -> set[str]:
    """The weights (by name) some of `slots` depend on: autograd gives the others no gradient
    (not even zeros), and torch.optim then skips them, weight decay and moments included."""
    needed, names = set(slots), set()
    for op in reversed(plan.ops):
        if op.out in needed:
            needed.update(op.args)
            if op.kind == "param":
                names.add(op.attrs["name"])
    return names


def _on_threads(threads: int | None, fn, *args):
    """fn(*args) with torch on `threads` threads (None: as set), the caller's count put back."""
    before = torch.get_num_threads()
    if threads is None or threads == before:
        return fn(*args)
    torch.set_num_threads(threads)  # 0.2 us the pair
    try:
        return fn(*args)
    finally:
        torch.set_num_threads(before)


class RegularStep:
    """`regular_step` on `threads` torch threads: what `choose` returns where a plan that does not
    fuse steps faster on one thread than on the several set."""

    def __init__(self, net: CompiledNet, optimizer: torch.optim.Optimizer, loss: SquaredError, threads: int | None):
        self.net, self.optimizer, self.loss, self.threads = net, optimizer, loss, threads

    def step(self) -> torch.Tensor:
        return _on_threads(self.threads, regular_step, self.net, self.optimizer, self.loss)

    def sync(self) -> None:
        """Nothing to write back: the optimizer's own state is the state."""


def regular_step(net: CompiledNet, optimizer: torch.optim.Optimizer, loss: SquaredError) -> torch.Tensor:
    """The step FusedStep replaces: net() (fused through autograd or op by op, as `net.execution`
    says), torch's squared error, backward, torch.optim's step; the loss before it."""
    outputs = net()
    value = None
    for name, target in loss.targets.items():
        rows = loss.rows.get(name)
        out = outputs[name] if rows is None else outputs[name].index_select(0, rows)
        part = torch.nn.functional.mse_loss(out, target.reshape(out.shape), reduction="mean" if loss.mean else "sum")
        value = part if value is None else value + part
    optimizer.zero_grad(set_to_none=True)
    value.backward()
    optimizer.step()
    return value.detach()


BLOCK_S = 0.005  # each candidate's timed block lasts about this long (several steps of a small plan)


def choose(net: CompiledNet, optimizer: torch.optim.Optimizer, loss: SquaredError,
           rounds: int = 3) -> FusedStep | RegularStep | None:
    """The fastest way to step `net` on this data, by measurement: the regular path (None), the
    fused step of the plan as `net()` runs it, or the fused step of the plan fused whatever its
    size; with several torch threads, each of them on one thread too (a `RegularStep` for the
    regular path). Blocks of steps alternate over `rounds`, medians compared; the weights,
    gradients and optimizer state are put back after every block, so the choice leaves no trace."""
    import copy
    import statistics
    import time

    params = [p for p in net.parameters()]
    saved = [p.detach().clone() for p in params]
    state = copy.deepcopy(optimizer.state_dict())

    def restore() -> None:
        with torch.no_grad():
            for p, value in zip(params, saved):
                p.copy_(value)
                p.grad = None
        optimizer.load_state_dict(copy.deepcopy(state))

    def made(kind: str, threads: int | None) -> FusedStep | RegularStep | None:
        if kind == "regular":
            return RegularStep(net, optimizer, loss, threads)
        step = FusedStep.build(net, optimizer, loss, force=kind == "forced")
        if step is not None:
            step.threads = threads
        return step

    # (kind, threads): with several threads, small matrix products wake the others for each call
    # (MKL's [139, 8] x [8, 32] in float64: 5.6 us on one thread, 95 with two passive OpenMP threads)
    thread_counts = [None, 1] if torch.get_num_threads() > 1 else [None]
    counts, times = {}, {}
    for name in [(kind, threads) for threads in thread_counts for kind in ("regular", "fused", "forced")]:
        step = made(*name)
        if step is not None:
            started = time.perf_counter()
            step.step()  # warm-up, and how many steps fill a block
            counts[name] = max(1, min(50, int(BLOCK_S / max(time.perf_counter() - started, 1e-6))))
        restore()
    if ("fused", None) in counts:  # the plan fuses as it runs: forcing it gives the same code
        counts.pop(("forced", None), None)
        counts.pop(("forced", 1), None)
    if counts.keys() == {("regular", None)}:
        return None
    for _ in range(rounds):
        for name in counts:
            run = made(*name).step
            started = time.perf_counter()
            for _ in range(counts[name]):
                run()
            times.setdefault(name, []).append((time.perf_counter() - started) / counts[name])
            restore()
    best = min(times, key=lambda name: statistics.median(times[name]))
    return None if best == ("regular", None) else made(*best)
