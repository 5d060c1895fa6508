"""Integrated gradients through the plain plan, per explained output row.

Every input the plan reads from the database (relsql/explain/inputs.py) is scaled together from a
baseline of zeros (standardized features at their mean, embedding and text vectors at zero) to
its value; an input element's attribution is its value times the integral of the output's
gradient along that line. The integral is a Gauss-Legendre rule on [0, 1] in float64, exact for
polynomials of degree 2 * steps - 1: for the smooth activations of a template (tanh, sigmoid, ...)
the attributions of a row then sum to output - baseline output to rounding (completeness), and
`gap` says how far they are where the plan has kinks (relu, max). `adaptive` takes as few points
as completeness needs: the gap is exact to compute, so it refines the rule until it holds.
All points of a pass run as blocks of one batched forward and backward (relsql/explain/batched.py)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

from relsql.explain.batched import Runner

CHUNK_ELEMENTS = 2**24  # per-row gradients held at once: rows in a chunk x points in a pass x input elements
PASS_ELEMENTS = 2**24  # float values of the plan held at once: points in a pass x one point's values
TOLERANCE = 1e-6  # adaptive: largest completeness gap, relative to max(1, |output|, |baseline|)
FIRST_STEPS, MOST_STEPS = 12, 192  # adaptive: Gauss-Legendre points of the first rule; the most intervals doubling reaches


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
    steps: int = 0  # integration points of the last rule taken
    gap: float = 0.0  # largest |sum of a row's attributions - (output - baseline)| / max(1, |output|, |baseline|)


def nodes(steps: int) -> tuple[np.ndarray, np.ndarray]:
    """Gauss-Legendre points and weights on [0, 1]."""
    x, w = np.polynomial.legendre.leggauss(steps)
    return (x + 1) / 2, w / 2


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


def clenshaw_curtis(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Clenshaw-Curtis points and weights on [0, 1] (n + 1 points, 0 and 1 among them): the points
    of n are among those of 2n, so doubling n reuses every gradient taken (Trefethen, "Is Gauss
    quadrature better than Clenshaw-Curtis?": about as accurate for the same points here)."""
    theta = np.pi * np.arange(n + 1) / n
    weights, inner, v = np.zeros(n + 1), np.arange(1, n), np.ones(n - 1)
    for k in range(1, (n - 1) // 2 + 1):
        v -= 2 * np.cos(2 * k * theta[inner]) / (4 * k * k - 1)
    if n % 2 == 0:
        weights[0] = weights[n] = 1.0 / (n * n - 1)
        v -= np.cos(n * theta[inner]) / (n * n - 1)
    else:
        weights[0] = weights[n] = 1.0 / (n * n)
    weights[inner] = 2 * v / n
    return (np.cos(theta) + 1) / 2, weights / 2


def adaptive(runner: Runner, rids: np.ndarray, units: np.ndarray, reach: dict | None = None,
             tolerance: float = TOLERANCE, first: int = FIRST_STEPS, most: int = MOST_STEPS) -> Attributed:
    """Integrated gradients on `first` Gauss-Legendre points, then, where the completeness gap is
    above `tolerance`, on Clenshaw-Curtis rules of 2 x `first` intervals, doubled until it is within
    (or `most` are taken: a plan with kinks may never get there; its gap says how far). Gauss-Legendre
    is the more accurate for the points (bench.explain_cost's model after 100 epochs: gap 1.9e-7 at
    12 points, 1.6e-6 at Clenshaw-Curtis' 13), Clenshaw-Curtis the cheaper to refine: its points of n
    intervals are among those of 2n. Where the asked rows read disjoint inputs, each point's gradients
    are kept (points x input elements): a doubling computes the new points only."""
    memo: dict = {}
    found = _integrate(runner, rids, units, *nodes(first), reach, None, memo)
    found.steps = first
    n, ends = 2 * first, (found.output, found.baseline)
    memo = {a: g for a, g in memo.items() if a in (0.0, 1.0)}  # the ends: points of every Clenshaw-Curtis rule
    while found.gap > tolerance and n <= max(most, 2 * first):
        found = _integrate(runner, rids, units, *clenshaw_curtis(n), reach, ends, memo)
        found.steps = n + 1
        n *= 2
    return found


def attribute(runner: Runner, rids: np.ndarray, units: np.ndarray, steps: int, reach: dict | None = None) -> Attributed:
    """Integrated gradients of output `units[i]` of output row `rids[i]`, for every asked row, on
    `steps` Gauss-Legendre points. With `reach` (`owners`) saying the asked rows read disjoint
    inputs, all rows share each backward pass."""
    found = _integrate(runner, rids, units, *nodes(steps), reach)
    found.steps = steps
    return found


def _integrate(runner: Runner, rids: np.ndarray, units: np.ndarray, points: np.ndarray, weights: np.ndarray,
               reach: dict | None, ends: tuple[np.ndarray, np.ndarray] | None = None,
               memo: dict | None = None) -> Attributed:
    """The rule (`points`, `weights`) for every asked row; `ends`: the rows' (output, baseline) where
    known (else alpha 1 and 0 lead the first pass, with no weight where the rule has them not);
    `memo`: alpha -> its gradients, kept and reused (rows reading disjoint inputs only)."""
    lead = ends is None
    if lead:
        rest = (points != 1.0) & (points != 0.0)
        at = [float(weights[points == a].sum()) for a in (1.0, 0.0)]
        points, weights = np.concatenate([[1.0, 0.0], points[rest]]), np.concatenate([at, weights[rest]])
    per_pass = max(1, min(len(points), PASS_ELEMENTS // max(runner.elements, 1)))
    if reach is not None and _separate(runner, reach):
        found, seen = _attribute_separate(runner, rids, units, points, weights, per_pass, lead, reach,
                                          {} if memo is None else memo)
    else:
        passes = [(points[s:s + per_pass], weights[s:s + per_pass]) for s in range(0, len(points), per_pass)]
        found, seen = _attribute_rows(runner, rids, units, passes, lead)
    output, baseline = seen if lead else ends
    sums = np.bincount(found["row"], weights=found["value"], minlength=len(rids))
    scale = np.maximum(1.0, np.maximum(np.abs(output), np.abs(baseline)))
    gap = float((np.abs(sums - (output - baseline)) / scale).max()) if len(rids) else 0.0
    return Attributed(**found, output=output, baseline=baseline, gap=gap)


def _picked(runner: Runner, alphas: np.ndarray, rids: np.ndarray, units: np.ndarray):
    """(the asked rows' outputs at each alpha (P, rows), the scaled inputs' leaves in input order)."""
    out, leaves = runner.outputs(alphas.tolist(), grad=True)
    index, picked = torch.as_tensor(rids, dtype=torch.long), torch.as_tensor(units, dtype=torch.long)
    return out[:, index, picked], [leaves[i.slot] for i in runner.inputs]


def _empty() -> dict[str, list[np.ndarray]]:
    return {k: [] for k in ("row", "source", "grounding", "part", "value")}


def _joined(parts: dict[str, list[np.ndarray]]) -> dict[str, np.ndarray]:
    return {k: np.concatenate(v) if v else np.zeros(0, dtype=np.float64 if k == "value" else np.int64)
            for k, v in parts.items()}


def _attribute_rows(runner: Runner, rids: np.ndarray, units: np.ndarray, passes: list, lead: bool):
    """Per-row gradients (batched over a chunk of rows): two asked rows may read one input."""
    shapes = [runner.values[i.slot].shape for i in runner.inputs]
    elements = sum(runner.values[i.slot].numel() for i in runner.inputs) * max(len(p) for p, _ in passes)
    parts, done = _empty(), 0
    seen = (np.zeros(len(rids)), np.zeros(len(rids)))
    for chunk in _chunks(np.arange(len(rids)), elements):
        totals = [torch.zeros((len(chunk), *shape), dtype=torch.float64) for shape in shapes]
        for n, (alphas, weights) in enumerate(passes):
            out, leaves = _picked(runner, alphas, rids[chunk], units[chunk])
            if lead and n == 0:
                seen[0][chunk], seen[1][chunk] = out[0].detach().numpy(), out[1].detach().numpy()
            seeds = (out * torch.as_tensor(weights).reshape(-1, 1)).sum(0)
            for total, grad, shape in zip(totals, _row_gradients(seeds, leaves), shapes):
                total.add_(grad.reshape(len(chunk), len(alphas), *shape).sum(1))
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
    return _joined(parts), seen


def _attribute_separate(runner: Runner, rids: np.ndarray, units: np.ndarray, points: np.ndarray, weights: np.ndarray,
                        per_pass: int, lead: bool, reach: dict, memo: dict):
    """`attribute` where every input grounding is read by at most one asked row (its owner): one
    backward per pass gives every row's gradients, per point (kept in `memo` by alpha)."""
    shapes = [runner.values[i.slot].shape for i in runner.inputs]
    todo = [float(a) for a in points if float(a) not in memo]
    seen = None
    for start in range(0, len(todo), per_pass):
        alphas = todo[start:start + per_pass]
        out, leaves = _picked(runner, np.asarray(alphas), rids, units)
        if lead and start == 0:
            seen = (out[0].detach().numpy().copy(), out[1].detach().numpy().copy())
        grads = torch.autograd.grad(out.sum(), leaves, allow_unused=True)
        for p, alpha in enumerate(alphas):
            memo[alpha] = [torch.zeros(shape, dtype=torch.float64) if g is None else g.reshape(len(alphas), *shape)[p]
                           for g, shape in zip(grads, shapes)]
    totals = [torch.zeros(shape, dtype=torch.float64) for shape in shapes]
    for alpha, weight in zip(points.tolist(), weights.tolist()):
        for total, grad in zip(totals, memo[alpha]):
            total.add_(grad, alpha=weight)
    parts = _empty()
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
    joined = _joined(parts)
    order = np.argsort(joined["row"], kind="stable")
    return {k: v[order] for k, v in joined.items()}, seen
