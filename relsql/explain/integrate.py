"""Integrated gradients through the plain plan, per explained output row.

Every input the plan reads from the database (relsql/explain/inputs.py) is scaled together from a
baseline of zeros (standardized features at their mean, embedding and text vectors at zero) to
its value; an input element's attribution is its value times the integral of the output's
gradient along that line. The integral is a Gauss-Legendre rule on [0, 1] in float64, exact for
polynomials of degree 2 * steps - 1: for the smooth activations of a template (tanh, sigmoid, ...)
the attributions of a row then sum to output - baseline output to rounding (completeness), and
`gap` says how far they are where the plan has kinks (relu, max)."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

from relsql.compile.ops import is_random, kernel
from relsql.compile.plan import Plan
from relsql.explain.inputs import Input

CHUNK_ELEMENTS = 2**24  # per-row gradients held at once: rows in a chunk x input elements


@dataclass
class Attributed:
    """Sparse attributions of some output rows: entry e is output row `row[e]` (a position among
    the rows asked for), input `source[e]` (an index into the inputs), its grounding `grounding[e]`
    and column part `part[e]`; `output`/`baseline` per asked row."""

    row: np.ndarray
    source: np.ndarray
    grounding: np.ndarray
    part: np.ndarray
    value: np.ndarray
    output: np.ndarray
    baseline: np.ndarray


def nodes(steps: int) -> tuple[np.ndarray, np.ndarray]:
    """Gauss-Legendre points and weights on [0, 1]."""
    x, w = np.polynomial.legendre.leggauss(steps)
    return (x + 1) / 2, w / 2


class Runner:
    """Runs `plan` with float64 copies of a net's weights and head, its inputs scaled by alpha."""

    def __init__(self, plan: Plan, inputs: list[Input], weights: dict[str, torch.Tensor], head: torch.nn.Module,
                 output: str, external: dict[str, torch.Tensor] | None = None):
        self.plan, self.inputs, self.output = plan, inputs, output
        self.weights = {n: w.detach().to("cpu", torch.float64) for n, w in weights.items()}
        self.weights.update({n: w.detach().to("cpu", torch.float64) for n, w in (external or {}).items()})
        self.head = copy.deepcopy(head).to("cpu", torch.float64).eval()
        for parameter in self.head.parameters():
            parameter.requires_grad_(False)
        self.program = [(op.out, None if op.kind == "param" else
                         kernel(op.kind, {**op.attrs, "training": lambda: False} if is_random(op.kind) else op.attrs),
                         op.args, op.attrs.get("name")) for op in plan.ops]
        self.values: dict[int, torch.Tensor] = {}  # each input's value at alpha = 1
        self.outputs(1.0, grad=False)

    def outputs(self, alpha: float, grad: bool) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """(every output row's outputs after the head, the scaled inputs by slot (leaves when `grad`))."""
        leaves: dict[int, torch.Tensor] = {}
        computed = {i.slot for i in self.inputs if i.computed}

        def scaled(slot: int, value: torch.Tensor) -> torch.Tensor:
            self.values.setdefault(slot, value.detach())
            leaf = (alpha * self.values[slot]).detach().requires_grad_(grad)
            leaves[slot] = leaf
            return leaf

        slots = {s: t.to(torch.float64) if t.is_floating_point() else t for s, t in self.plan.inputs.items()}
        for i in self.inputs:
            if not i.computed:
                slots[i.slot] = scaled(i.slot, slots[i.slot])
        with torch.set_grad_enabled(grad):
            for out, run, args, name in self.program:
                slots[out] = self.weights[name] if run is None else run(*[slots[a] for a in args])
                if out in computed:
                    slots[out] = scaled(out, slots[out])
            value = slots[self.plan.outputs[self.output]]
            return self.head(value.reshape(value.shape[0], -1)), leaves


def _row_gradients(out: torch.Tensor, leaves: list[torch.Tensor]) -> list[torch.Tensor]:
    """d out[r] / d leaf for every row r of `out` (k,), stacked: one batched backward, or one
    backward per row where a kernel cannot be batched."""
    k = out.shape[0]
    try:
        grads = torch.autograd.grad(out, leaves, grad_outputs=torch.eye(k, dtype=out.dtype), is_grads_batched=True,
                                    allow_unused=True, retain_graph=True)
    except (RuntimeError, NotImplementedError):
        per_row = [torch.autograd.grad(out[r], leaves, allow_unused=True, retain_graph=True) for r in range(k)]
        grads = tuple(torch.stack([g[j] if g[j] is not None else torch.zeros_like(leaves[j]) for g in per_row])
                      for j in range(len(leaves)))
    return [g if g is not None else torch.zeros((k, *leaf.shape), dtype=leaf.dtype) for g, leaf in zip(grads, leaves)]


def _chunks(rids: np.ndarray, elements: int) -> Iterator[np.ndarray]:
    size = max(1, min(len(rids), CHUNK_ELEMENTS // max(elements, 1)))
    for start in range(0, len(rids), size):
        yield rids[start:start + size]


def owners(grounding, output: str, rids: np.ndarray) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Per relation, the smallest and largest position in `rids` of the asked rows that reach each of its
    rows through the groundings (len(rids) and -1 where none does): a row with both equal is read by
    one asked row only. Relations are grounded in dependency order, so one pass from the output down
    visits every reader of a relation before the relation."""
    n = len(rids)
    lo = {r: torch.full((g.size,), n, dtype=torch.long) for r, g in grounding.relations.items()}
    hi = {r: torch.full((g.size,), -1, dtype=torch.long) for r, g in grounding.relations.items()}
    index = torch.as_tensor(rids, dtype=torch.long)
    lo[output][index] = torch.arange(n)
    hi[output][index] = torch.arange(n)
    for name in reversed(list(grounding.relations)):
        for rg in grounding.relations[name].rules:
            first, last = lo[name][rg.head], hi[name][rg.head]
            for ref, rows in zip(rg.rule.refs, rg.refs):
                lo[ref].scatter_reduce_(0, rows, first, "amin")
                hi[ref].scatter_reduce_(0, rows, last, "amax")
    return {r: (lo[r], hi[r]) for r in lo}


def _separate(runner: Runner, reach: dict) -> bool:
    """Whether no input grounding is read by two asked rows: one backward of their summed outputs
    then gives every row's own gradients."""
    for i in runner.inputs:
        lo, hi = reach[i.relation]
        first, last = lo[i.rg.head], hi[i.rg.head]
        if bool(((first < last) & (last >= 0)).any()):
            return False
    return True


def attribute(runner: Runner, rids: np.ndarray, units: np.ndarray, steps: int, reach: dict | None = None) -> Attributed:
    """Integrated gradients of output `units[i]` of output row `rids[i]`, for every asked row. With
    `reach` (`owners`) saying the asked rows read disjoint inputs, all rows share each backward pass."""
    if reach is not None and _separate(runner, reach):
        return _attribute_separate(runner, rids, units, steps, reach)
    points, weights = nodes(steps)
    full, _ = runner.outputs(1.0, grad=False)
    zero, _ = runner.outputs(0.0, grad=False)
    picked = torch.as_tensor(units, dtype=torch.long)
    index = torch.as_tensor(rids, dtype=torch.long)
    output = full[index, picked].numpy().copy()
    baseline = zero[index, picked].numpy().copy()
    slots = [i.slot for i in runner.inputs]
    elements = sum(runner.values[s].numel() for s in slots)
    parts: dict[str, list[np.ndarray]] = {k: [] for k in ("row", "source", "grounding", "part", "value")}
    done = 0
    for chunk in _chunks(np.arange(len(rids)), elements):
        rows = torch.as_tensor(rids[chunk], dtype=torch.long)
        totals = [torch.zeros((len(chunk), *runner.values[s].shape), dtype=torch.float64) for s in slots]
        for alpha, weight in zip(points.tolist(), weights.tolist()):
            out, leaves = runner.outputs(alpha, grad=True)
            grads = _row_gradients(out[rows, picked[chunk]], [leaves[s] for s in slots])
            for total, grad in zip(totals, grads):
                total.add_(grad, alpha=weight)
        for n, (i, total) in enumerate(zip(runner.inputs, totals)):
            contribution = (total * runner.values[i.slot]).reshape(len(chunk), total.shape[1], -1)
            bounds = np.cumsum([0, *i.widths])
            for p in range(len(i.widths)):
                summed = contribution[:, :, bounds[p]:bounds[p + 1]].sum(dim=2)
                r, g = torch.nonzero(summed, as_tuple=True)
                parts["row"].append(r.numpy() + done)
                parts["source"].append(np.full(len(r), n, dtype=np.int64))
                parts["grounding"].append((g if i.order is None else i.order[g]).numpy())
                parts["part"].append(np.full(len(r), p, dtype=np.int64))
                parts["value"].append(summed[r, g].numpy())
        done += len(chunk)
    joined = {k: np.concatenate(v) if v else np.zeros(0, dtype=np.float64 if k == "value" else np.int64)
              for k, v in parts.items()}
    return Attributed(**joined, output=output, baseline=baseline)


def _attribute_separate(runner: Runner, rids: np.ndarray, units: np.ndarray, steps: int, reach: dict) -> Attributed:
    """`attribute` where every input grounding is read by at most one asked row (its owner)."""
    points, weights = nodes(steps)
    full, _ = runner.outputs(1.0, grad=False)
    zero, _ = runner.outputs(0.0, grad=False)
    picked = torch.as_tensor(units, dtype=torch.long)
    index = torch.as_tensor(rids, dtype=torch.long)
    slots = [i.slot for i in runner.inputs]
    totals = [torch.zeros_like(runner.values[s]) for s in slots]
    for alpha, weight in zip(points.tolist(), weights.tolist()):
        out, leaves = runner.outputs(alpha, grad=True)
        grads = torch.autograd.grad(out[index, picked].sum(), [leaves[s] for s in slots], allow_unused=True)
        for total, grad in zip(totals, grads):
            if grad is not None:
                total.add_(grad, alpha=weight)
    parts: dict[str, list[np.ndarray]] = {k: [] for k in ("row", "source", "grounding", "part", "value")}
    for n, (i, total) in enumerate(zip(runner.inputs, totals)):
        contribution = (total * runner.values[i.slot]).reshape(total.shape[0], -1)
        groundings = torch.arange(total.shape[0]) if i.order is None else i.order
        owner = reach[i.relation][0][i.rg.head[groundings]]
        bounds = np.cumsum([0, *i.widths])
        for p in range(len(i.widths)):
            summed = contribution[:, bounds[p]:bounds[p + 1]].sum(dim=1)
            (g,) = torch.nonzero((summed != 0) & (owner < len(rids)), as_tuple=True)
            parts["row"].append(owner[g].numpy())
            parts["source"].append(np.full(len(g), n, dtype=np.int64))
            parts["grounding"].append(groundings[g].numpy())
            parts["part"].append(np.full(len(g), p, dtype=np.int64))
            parts["value"].append(summed[g].numpy())
    joined = {k: np.concatenate(v) if v else np.zeros(0, dtype=np.float64 if k == "value" else np.int64)
              for k, v in parts.items()}
    order = np.argsort(joined["row"], kind="stable")
    return Attributed(**{k: v[order] for k, v in joined.items()}, output=full[index, picked].numpy().copy(),
                      baseline=zero[index, picked].numpy().copy())
