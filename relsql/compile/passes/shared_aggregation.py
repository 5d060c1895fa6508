"""Shared partial aggregation (HAG, Jia et al., KDD 2020): heads whose source sets overlap
compute each common partial sum once.

A neighbour aggregation is a CSR product A·X. When many heads read the same sources u and v
(cliques of a collaboration graph, users who rated the same items), each of them adds x_u and
x_v itself. This pass runs HAG's capacity-bounded sequential greedy on the rows of A: a max-heap
of pair co-occurrence counts (lazy entries, counts updated as heads change), repeatedly taking
the most frequent pair (u, v), making an aggregate a = u + ρ·v and replacing u and v by a in
every head that reads both with that weight ratio ρ. Aggregates may contain aggregates (up to
MAX_LEVELS levels), so a whole clique can become one row. The product becomes

    Z_1 = C_1x·X,   Z_k = C_kx·X + C_kz·[Z_1; ...; Z_{k-1}],   A·X = B_x·X + B_z·[Z_1; ...; Z_L]

with nnz(B) + Σ nnz(C_k) < nnz(A): fewer stored entries, each one a row of X added.

Weights. An entry's value may depend on its head and its source (avg: 1/deg(head); GCN:
1/sqrt(deg(head)·deg(source))). A pair is shared only by heads where the ratio w_v/w_u is the
same (within 1e-12, relative); the aggregate carries ρ and each head its own w_u. Sum and avg
(a per-head constant) always have ρ = 1; GCN's normalization has a fixed ρ = sqrt(d_u/d_v) per
pair, so it shares as well. Max is not rewritten (its backward routes differently).

Cost. Each level adds sequential products with fixed costs, and saving nnz only pays where the
product is bandwidth-bound, so the pass times the plain product against the factored chain
(forward + backward, on the plan's device: relsql/compile/costs.py) and rewrites only where the
chain takes at most SPEEDUP of the time. Products under MIN_NNZ entries, or where the greedy
saves less than MIN_SAVED of the entries, are not timed. The greedy itself runs only where it
could pay for itself: where PAYBACK_STEPS forward + backward passes of the plain product take at
least the greedy's expected time (GREEDY_SECONDS per entry it may visit), since even a chain of
no cost saves at most the plain product's time per step (on the outside corpus's Lahman salaries,
two 52k-entry products of 0.8 ms were factored in 0.32 s each, then declined). `force=True`
skips the timing and this bound.

Limits (stated, not hidden): pairs are counted only in heads of at most MAX_DEGREE sources (the
pair count of a head grows with its degree squared); such hub heads still take an aggregate
when they hold both its parts, but do not vote for pairs. The greedy is pure Python: its time
grows with the entries of the heads it changes, and it stops after MAX_WORK of them (planning
must stay short; what it found by then is used). On large overlapping products that bound finds
part of the sharing only; `force=True` (tests, bench) runs the greedy to the end.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from dataclasses import dataclass

import numpy as np
import torch

from relsql.compile import costs, sparse
from relsql.compile.passes._rewrite import weight_dependent
from relsql.compile.plan import Op, Plan, make_op

MIN_COUNT = 3  # a pair shared by c heads saves c - 2 stored entries: at least one
MAX_LEVELS = 3  # aggregates of aggregates, at most this deep (each level is one more product)
CAPACITY = 1.0  # at most this many aggregates per source row (HAG's capacity)
MAX_AGGREGATES = 50_000  # and at most this many in all: the greedy is Python, about 10 µs per head entry it changes
MAX_WORK = 400_000  # head entries the greedy may visit in all (a bound on planning time: about 1-4 s)
MAX_DEGREE = 64  # heads with more sources do not vote for pairs
PAIR_BUDGET = 20_000_000  # pairs counted at most (heads of high degree left out first)
MIN_NNZ = 20_000  # smaller products are not worth timing
MIN_SAVED = 0.15  # the greedy must remove this fraction of the entries before the chain is timed
SPEEDUP = 0.85  # the chain must take at most this fraction of the plain product's time
PAYBACK_STEPS = 200  # the greedy runs where this many plain forward + backward passes take its expected time
GREEDY_SECONDS = 6e-6  # the greedy's time per entry it may visit (0.32 CPU-s for 51,924 entries, measured)
RATIO_SCALE = 1e12  # weight ratios equal to this relative precision share an aggregate
FLOAT32_SCALE = 2.0**18  # ... or to this one, when every value was rounded to float32 (a float32 plan)


@dataclass
class Factoring:
    """A·X = B_x·X + B_z·Z where Z stacks the aggregate levels; level k: C_kx·X + C_kz·Z_{<k}."""

    levels: list[tuple[torch.Tensor, torch.Tensor]]  # (C_kx, C_kz) per level
    heads_x: torch.Tensor
    heads_z: torch.Tensor
    nnz_before: int
    aggregates: int

    @property
    def nnz_after(self) -> int:
        parts = [self.heads_x, self.heads_z, *(m for level in self.levels for m in level)]
        return sum(int(m.values().numel()) for m in parts)


def _ratio_key(wu: float, wv: float, scale: float) -> int:
    """Integer key of w_v / w_u: equal keys are equal ratios to 1/scale relative precision (0: equal weights)."""
    if wu == wv:
        return 0
    ratio = wv / wu
    return int(round(math.log(abs(ratio)) * scale)) * 2 + (ratio < 0)


def _initial_pairs(crow: np.ndarray, cols: np.ndarray, vals: np.ndarray, max_degree: int, scale: float) -> dict:
    """(u, v, ratio key) -> number of heads of degree <= max_degree reading u and v with that ratio,
    for the pairs in at least MIN_COUNT heads (counts of pairs of sources only ever decrease)."""
    degree = np.diff(crow)
    n = int(cols.max()) + 1 if cols.size else 1
    keys, ratios = [], []
    for d in np.unique(degree[(degree >= 2) & (degree <= max_degree)]):
        rows = np.flatnonzero(degree == d)
        at = crow[rows][:, None] + np.arange(d)[None, :]
        c, w = cols[at], vals[at]
        i, j = np.triu_indices(int(d), 1)
        u, v, wu, wv = c[:, i].ravel(), c[:, j].ravel(), w[:, i].ravel(), w[:, j].ravel()
        keep = (wu != 0) & (wv != 0) & (u != v)
        u, v, wu, wv = u[keep], v[keep], wu[keep], wv[keep]
        swap = u > v
        u, v, wu, wv = np.where(swap, v, u), np.where(swap, u, v), np.where(swap, wv, wu), np.where(swap, wu, wv)
        ratio = wv / wu
        keys.append(u.astype(np.int64) * n + v)
        ratios.append(np.round(np.log(np.abs(ratio)) * scale).astype(np.int64) * 2 + (ratio < 0))
    if not keys:
        return {}
    key, ratio = np.concatenate(keys), np.concatenate(ratios)
    order = np.lexsort((ratio, key))
    key, ratio = key[order], ratio[order]
    starts = np.flatnonzero(np.r_[True, (key[1:] != key[:-1]) | (ratio[1:] != ratio[:-1])])
    counts = np.diff(np.r_[starts, key.size])
    keep = counts >= MIN_COUNT
    key, ratio, counts = key[starts[keep]], ratio[starts[keep]], counts[keep]
    return {(int(k // n), int(k % n), int(q)): int(c) for k, q, c in zip(key, ratio, counts)}


def _degree_limit(degree: np.ndarray) -> int:
    """The largest head degree (<= MAX_DEGREE) whose heads' pairs fit in PAIR_BUDGET."""
    limit = MAX_DEGREE
    while limit >= 2:
        small = degree[degree <= limit]
        if int((small * (small - 1) // 2).sum()) <= PAIR_BUDGET:
            return limit
        limit //= 2
    return 1


def factor(matrix: torch.Tensor, max_levels: int = MAX_LEVELS,
           max_work: float = MAX_WORK) -> Factoring | None:
    """HAG's greedy on a CSR matrix's rows, stopping after `max_work` visited head entries; None
    when no pair is shared by MIN_COUNT heads."""
    crow = matrix.crow_indices().to(torch.int64).numpy()
    cols = matrix.col_indices().to(torch.int64).numpy()
    vals = matrix.values().to(torch.float64).numpy()
    heads, sources = matrix.shape
    degree = np.diff(crow)
    limit = _degree_limit(degree)
    # a float32 plan's weights (GCN's 1/sqrt(d_i d_j) read as float32) carry float32 rounding: their
    # ratios agree across heads to a few float32 ulps only, and the factored sums differ from the
    # plain ones by about that much; float64 weights share only ratios equal to 1e-12
    scale = FLOAT32_SCALE if bool((vals == vals.astype(np.float32)).all()) else RATIO_SCALE
    counts = _initial_pairs(crow, cols, vals, limit, scale)
    if not counts:
        return None
    # CSC: which heads read each source (a superset once heads change; checked against `rows`)
    by_col = np.argsort(cols, kind="stable")
    col_start = np.searchsorted(cols[by_col], np.arange(sources + 1))
    row_of = np.repeat(np.arange(heads), degree)[by_col]
    uniform = bool((vals == np.repeat(vals[crow[:-1][degree > 0]], degree[degree > 0])).all())  # sum, avg: ratios all 1
    rows: dict[int, dict[int, float]] = {}  # heads changed so far: source/aggregate -> weight
    readers: dict[int, set[int]] = {}

    def row(h: int) -> dict[int, float]:
        if h not in rows:
            s, e = crow[h], crow[h + 1]
            rows[h] = dict(zip(cols[s:e].tolist(), vals[s:e].tolist()))
        return rows[h]

    def read_by(node: int) -> set[int]:
        if node not in readers:
            readers[node] = set(row_of[col_start[node]:col_start[node + 1]].tolist())
        return readers[node]

    level = {}  # aggregate id -> level (sources: 0)
    members: list[tuple[int, int, float]] = []  # per aggregate: (u, v, ρ), a = u + ρ·v
    heap = [(-c, 1, key) for key, c in counts.items()]
    heapq.heapify(heap)
    most = max(1, min(int(CAPACITY * sources), MAX_AGGREGATES))
    work = 0
    while heap and len(members) < most and work < max_work:
        negative, lvl, key = heapq.heappop(heap)
        current = counts.get(key, 0)
        if current != -negative:  # a lazy entry: its count changed since it was pushed
            if current >= MIN_COUNT:
                heapq.heappush(heap, (-current, lvl, key))
            continue
        u, v, q = key
        sharing = []
        for h in sorted(read_by(u) & read_by(v)):
            r = row(h)
            if u in r and v in r and r[u] != 0 and r[v] != 0 and _ratio_key(r[u], r[v], scale) == q:
                sharing.append(h)
        voters = sum(1 for h in sharing if degree[h] <= limit)
        if voters != current:  # the counts drifted (ratio keys rounded apart): trust the heads
            counts[key] = voters
            if voters >= MIN_COUNT:
                heapq.heappush(heap, (-voters, lvl, key))
            continue
        a = sources + len(members)
        first = rows[sharing[0]]
        members.append((u, v, first[v] / first[u]))
        level[a] = lvl
        del counts[key]
        made: Counter = Counter()
        readers[a] = set()
        for h in sharing:
            r = rows[h]
            work += len(r)
            wu = r.pop(u)
            del r[v]
            if degree[h] <= limit:  # new pairs (w, a); pairs with u or v are recounted when popped
                if uniform:
                    made.update(r.keys())
                else:
                    made.update((w, _ratio_key(ww, wu, scale)) for w, ww in r.items() if ww != 0)
            r[a] = wu
            read_by(u).discard(h)
            read_by(v).discard(h)
            readers[a].add(h)
        for found, c in made.items():
            if c >= MIN_COUNT:
                new = (found, a, 0) if uniform else (found[0], a, found[1])  # a is the newest id: the larger
                depth = max(level.get(new[0], 0), lvl) + 1
                if depth <= max_levels:
                    counts[new] = c
                    heapq.heappush(heap, (-c, depth, new))
    if not members:
        return None
    return _matrices(crow, cols, vals, (heads, sources), rows, members, level)


def _matrices(crow, cols, vals, shape, rows, members, level) -> Factoring:
    """B and the C_k from the greedy's rows and aggregates, aggregates numbered level by level."""
    heads, sources = shape
    order = sorted(range(len(members)), key=lambda i: (level[sources + i], i))
    position = {sources + i: p for p, i in enumerate(order)}  # aggregate id -> row of Z
    depth = max(level.values())
    starts = [sum(1 for i in order if level[sources + i] < k) for k in range(1, depth + 2)]
    levels = []
    for k in range(1, depth + 1):
        ids = [i for i in order if level[sources + i] == k]
        x_part, z_part = ([], [], []), ([], [], [])
        for r, i in enumerate(ids):
            u, v, rho = members[i]
            for node, weight in ((u, 1.0), (v, rho)):
                target = x_part if node < sources else z_part
                target[0].append(r)
                target[1].append(node if node < sources else position[node])
                target[2].append(weight)
        levels.append((_csr(x_part, (len(ids), sources)), _csr(z_part, (len(ids), starts[k - 1]))))
    changed = np.zeros(heads, dtype=bool)
    changed[list(rows)] = True
    kept = np.repeat(~changed, np.diff(crow))
    head_of = np.repeat(np.arange(heads), np.diff(crow))
    x_part = [head_of[kept].tolist(), cols[kept].tolist(), vals[kept].tolist()]
    z_part = ([], [], [])
    for h, r in rows.items():
        for node, weight in r.items():
            target = x_part if node < sources else z_part
            target[0].append(h)
            target[1].append(node if node < sources else position[node])
            target[2].append(weight)
    return Factoring(levels, _csr(x_part, (heads, sources)), _csr(z_part, (heads, len(members))),
                     int(vals.size), len(members))


def _csr(triples, shape: tuple[int, int]) -> torch.Tensor:
    r, c, v = (torch.as_tensor(np.asarray(t), dtype=d) for t, d in zip(triples, (torch.int64, torch.int64, torch.float64)))
    return sparse.from_coo(r.reshape(-1), c.reshape(-1), v.reshape(-1), shape)


def apply(f: Factoring, x: torch.Tensor, transposes: dict | None = None) -> torch.Tensor:
    """A·x through the factoring (the chain the rewritten plan runs; used to time it)."""
    def product(m, dense, add=None):
        t = None if transposes is None else transposes[id(m)]
        return sparse.matmul(m, dense, t, add)

    stacked = None
    parts = []
    for cx, cz in f.levels:
        z = product(cx, x) if cz.values().numel() == 0 or stacked is None else \
            product(cx, x, product(cz, stacked)) if cx.values().numel() else product(cz, stacked)
        parts.append(z)
        stacked = parts[0] if len(parts) == 1 else torch.cat(parts)
    return product(f.heads_x, x, product(f.heads_z, stacked))


def plain_seconds(plan: Plan, matrix: torch.Tensor, width: tuple[int, ...]) -> float:
    """The plain product's forward + backward on the plan's device (float32)."""
    x = torch.randn(matrix.shape[1], *width, device=plan.device, requires_grad=True)
    plain, flipped = sparse.moved(matrix, plan.device, torch.float32)
    return costs.seconds(lambda: sparse.matmul(plain, x, flipped).sum().backward(), plan.device)


def worth_factoring(matrix: torch.Tensor, plain: float) -> bool:
    """Whether the greedy could pay for itself within PAYBACK_STEPS steps of a product taking `plain` seconds."""
    return plain * PAYBACK_STEPS >= GREEDY_SECONDS * min(int(matrix.values().numel()), MAX_WORK)


def _pays(plan: Plan, f: Factoring, width: tuple[int, ...], plain: float) -> bool:
    """The factored chain's forward + backward against the plain product's (`plain` seconds), on the plan's device."""
    device = plan.device
    x = torch.randn(f.heads_x.shape[1], *width, device=device, requires_grad=True)
    pieces = [f.heads_x, f.heads_z, *(m for level in f.levels for m in level)]
    moved = {id(m): sparse.moved(m, device, torch.float32) for m in pieces}
    on = Factoring([(moved[id(a)][0], moved[id(b)][0]) for a, b in f.levels], moved[id(f.heads_x)][0],
                   moved[id(f.heads_z)][0], f.nnz_before, f.aggregates)
    transposes = {id(m): t for m, t in moved.values()}
    after = costs.seconds(lambda: apply(on, x, transposes).sum().backward(), device)
    return after <= SPEEDUP * plain


def _emit(plan: Plan, ops: list[Op], op: Op, f: Factoring) -> None:
    """The chain as plan ops; the last one writes the original product's slot."""
    x = op.args[1]
    stacked, parts = None, []
    for cx, cz in f.levels:
        if stacked is None or cz.values().numel() == 0:
            z = make_op(plan, "spmm", (plan.add_input(cx), x), op.note + " (shared partial sums)")
        else:
            z = make_op(plan, "spmm", (plan.add_input(cz), stacked), op.note + " (shared partial sums)")
            if cx.values().numel():
                ops.append(z)
                z = make_op(plan, "addspmm", (z.out, plan.add_input(cx), x), op.note + " (shared partial sums)")
        ops.append(z)
        parts.append(z.out)
        if len(parts) == 1:
            stacked = parts[0]
        else:
            cat = make_op(plan, "cat", tuple(parts), op.note + " (shared partial sums)",
                          row_count=sum(plan.meta[p].shape[0] for p in parts))
            ops.append(cat)
            stacked = cat.out
    shared = make_op(plan, "spmm", (plan.add_input(f.heads_z), stacked), op.note)
    ops.append(shared)
    ops.append(Op("addspmm", op.out, (shared.out, plan.add_input(f.heads_x), x), {}, op.rows, op.shape, op.note))


def shared_aggregation(plan: Plan, force: bool = False) -> Plan:
    """Factor sparse aggregations through shared partial sums where timing shows it pays
    (`force`: wherever the greedy finds a shared pair, untimed: for tests)."""
    trainable = weight_dependent(plan)
    rewritten, aggregates, before, after = 0, 0, 0, 0
    ops: list[Op] = []
    for op in plan.ops:
        matrix = plan.inputs.get(op.args[0]) if op.kind == "spmm" and len(op.args) == 2 else None
        if matrix is None or matrix.layout != sparse.CSR or op.args[1] not in trainable \
                or (not force and matrix.values().numel() < MIN_NNZ):
            ops.append(op)
            continue
        f = _chosen(plan, matrix, tuple(op.shape), force)
        if f is None:
            ops.append(op)
            continue
        _emit(plan, ops, op, f)
        rewritten += 1
        aggregates += f.aggregates
        before += f.nnz_before
        after += f.nnz_after
    plan.ops = ops
    plan.log.append(f"shared_aggregation: {rewritten} sparse matmuls through {aggregates} shared partial sums "
                    f"({before} -> {after} stored entries)")
    return plan


def _chosen(plan: Plan, matrix: torch.Tensor, width: tuple[int, ...], force: bool) -> Factoring | None:
    """The factoring of `matrix`'s product by a `width`-wide value, where it pays (`force`: wherever
    it has fewer entries)."""
    if force:
        f = factor(matrix, max_work=math.inf)
        return f if f is not None and f.nnz_after < f.nnz_before else None
    plain = plain_seconds(plan, matrix, width)
    if not worth_factoring(matrix, plain):
        return None
    f = factor(matrix, max_work=MAX_WORK)
    if f is None or f.nnz_after > (1 - MIN_SAVED) * f.nnz_before or not _pays(plan, f, width, plain):
        return None
    return f
