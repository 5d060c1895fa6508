"""Rows renumbered so that sparse products and gathers read memory in order (reverse Cuthill–McKee).

relsql numbers a relation's rows by key order. When the keys say nothing about the graph (hashes,
UUIDs, ids handed out in load order), a neighbour aggregation reads its input rows from all over
memory. Renumbering the rows so that neighbours get near numbers (reverse Cuthill–McKee of the
products' pattern, scipy's implementation) makes those reads nearly sequential.

One row space — the rows that the plan's largest sparse products map onto themselves — is held
permuted inside the plan: constant inputs in it are permuted once here, a product's matrix becomes
P·A·Qᵀ, a gather reading permuted rows reads them by renumbered ids (its result put in the order of
the rows it reads, so the gather runs sequentially too), and row-wise ops run unchanged. Any other
op, and every result the plan returns, gets its rows back in the user's order by one gather. Values
are the same: only the order of the terms summed within a product's row can change (rounding).

Renumbering changes the order of the terms summed, so on the CPU it is decided by a rule that the
machine's load cannot flip: it fires when RCM brings the pattern's mean |row - col| to at most
CPU_SPREAD of what it was (a hashed grid: 69,995 -> 273; bench.locality measured the epoch 14%
faster there, and a random graph, which RCM cannot band, 15% slower when forced). On another
device the products and gathers it changes, and the reorders it adds, are timed forward + backward
with and without; it fires only when they get at least GAIN faster. Small plans (a pattern of
fewer than MIN_ENTRIES entries) and rows already in a good order (RCM would not bring rows'
neighbours to at most SPREAD of their mean distance) are left alone without timing. Mini-batch
plans do not run it (relsql/train/feed/batched.py): measuring per batch would cost more than it saves.
"""

from __future__ import annotations

import numpy as np
import torch

from relsql.compile import costs, sparse
from relsql.compile.passes._rewrite import matrix_position, weight_dependent
from relsql.compile.plan import Op, Plan, make_op

MIN_ENTRIES = 200_000  # pattern entries below which nothing is timed
GAIN = 0.15  # the timed ops must get at least this much faster
SPREAD = 0.5  # RCM must bring the pattern's mean |row - col| to at most this fraction to be worth timing
CPU_SPREAD = 0.1  # on the CPU, RCM renumbers when it brings the mean |row - col| to at most this fraction
REPEATS = 3
ROW_WISE = ("linear", "stacked_linear", "affine", "binary", "act", "combine", "sum")


def _row_positions(plan: Plan, op: Op) -> list[int]:
    """Arguments of a row-wise op that hold one row per output row (weights and 1-row terms broadcast)."""
    if op.kind == "linear":
        candidates: tuple[int, ...] = (1,)
    elif op.kind == "affine":
        candidates = (0, 1)
    elif op.kind == "binary" and "reshape_right" in op.attrs:
        candidates = (0,)
    else:
        candidates = tuple(range(len(op.args)))
    return [i for i in candidates if op.args[i] not in plan.param_slots and plan.meta[op.args[i]].dim()
            and plan.meta[op.args[i]].shape[0] == op.rows and op.rows > 1]


def _index(plan: Plan, slot: int) -> torch.Tensor | None:
    found = plan.inputs.get(slot)
    return found if found is not None and found.layout == torch.strided and not found.is_floating_point() else None


def _patterns(plan: Plan) -> dict[int, list[tuple[torch.Tensor, torch.Tensor]]]:
    """Row space size -> (row, row) pairs that products connect: a square product's entries, and a
    product over gathered rows (compressed groundings) traced back to the rows gathered."""
    origin: dict[int, tuple[int, torch.Tensor]] = {}  # slot -> (rows of the gathered source, index)
    found: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}
    for op in plan.ops:
        if op.kind == "gather" and op.args[0] not in plan.param_slots and _index(plan, op.args[1]) is not None:
            origin[op.out] = (plan.meta[op.args[0]].shape[0], _index(plan, op.args[1]))
        elif op.kind in ROW_WISE:
            traced = {id(origin[op.args[i]][1]): origin[op.args[i]] for i in _row_positions(plan, op) if op.args[i] in origin}
            if len(traced) == 1:
                origin[op.out] = next(iter(traced.values()))
        at = matrix_position(op)
        matrix = plan.inputs.get(op.args[at]) if at is not None else None
        if matrix is None or matrix.layout != sparse.CSR:
            continue
        rows, cols, _ = sparse.triples(matrix)
        x = op.args[-1]
        if x in origin and origin[x][0] == matrix.shape[0]:
            found.setdefault(matrix.shape[0], []).append((rows, origin[x][1].to(torch.int64)[cols]))
        elif x not in origin and matrix.shape[0] == matrix.shape[1]:
            found.setdefault(matrix.shape[0], []).append((rows, cols))
    return found


def _rcm(n: int, pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> np.ndarray:
    """Reverse Cuthill–McKee order (new position -> old row) of the symmetrized pattern."""
    import scipy.sparse
    from scipy.sparse.csgraph import reverse_cuthill_mckee

    rows = torch.cat([r for r, _ in pairs]).numpy()
    cols = torch.cat([c for _, c in pairs]).numpy()
    pattern = scipy.sparse.csr_matrix((np.ones(rows.shape[0], dtype=np.int8), (rows, cols)), shape=(n, n))
    return np.asarray(reverse_cuthill_mckee((pattern + pattern.T).tocsr(), symmetric_mode=True), dtype=np.int64)


class _Rewrite:
    """The plan's ops with one row space held permuted. State of a slot: 0 = the user's row order,
    k > 0 = rows in order perms[k] (row i holds the user's row perms[k][i])."""

    def __init__(self, plan: Plan, n: int, order: torch.Tensor):
        self.plan, self.n = plan, n
        self.perms: dict[int, torch.Tensor] = {1: order}
        self.inverses: dict[int, torch.Tensor] = {1: torch.argsort(order)}
        self.state: dict[int, int] = {}
        self.ops: list[Op] = []
        self.new_inputs: list[int] = []
        self.timed: list[tuple[Op, Op]] = []  # (original, rewritten) products and gathers
        self.added: list[Op] = []  # products by permutation matrices that reorder rows at run time
        self._cache: dict[tuple, int] = {}

    def _input(self, tensor: torch.Tensor, state: int = 0) -> int:
        slot = self.plan.add_input(tensor)
        self.new_inputs.append(slot)
        self.state[slot] = state
        return slot

    def _new_state(self, order: torch.Tensor) -> int:
        k = len(self.perms) + 1
        self.perms[k], self.inverses[k] = order, torch.argsort(order)
        return k

    def to_state(self, slot: int, wanted: int, note: str) -> int:
        """`slot`'s value with rows in state `wanted`: permuted here for a constant, else by a gather."""
        have = self.state.get(slot, 0)
        if have == wanted:
            return slot
        key = (slot, wanted)
        if key not in self._cache:
            constant = self.plan.inputs.get(slot)
            if have == 0 and constant is not None and constant.layout == torch.strided:
                self._cache[key] = self._input(constant[self.perms[wanted]], wanted)
            else:
                index = (self.inverses[have] if wanted == 0 else self.perms[wanted] if have == 0
                         else self.inverses[have][self.perms[wanted]])
                # a product by a permutation matrix, not a gather: its backward (after sparse_backward) is
                # the inverse permutation's product, where a gather's is a scatter_add (7x slower here)
                permutation = sparse.selection(index, index.shape[0])
                reorder = make_op(self.plan, "spmm", (self._input(permutation), slot), note, row_order=True)
                self.ops.append(reorder)
                self.added.append(reorder)
                self.state[reorder.out] = wanted
                self._cache[key] = reorder.out
        return self._cache[key]

    def _constant(self, slot: int) -> bool:
        found = self.plan.inputs.get(slot)
        return not self.state.get(slot, 0) and found is not None and found.layout == torch.strided

    def _replace(self, op: Op, args: tuple[int, ...], state: int) -> Op:
        new = op if args == op.args else Op(op.kind, op.out, args, op.attrs, op.rows, op.shape, op.note)
        self.ops.append(new)
        self.state[op.out] = state
        return new

    def _matrix(self, slot: int, out_state: int, in_state: int) -> int:
        """M'[i, j] = M[perm_out[i], perm_in[j]], made once per states."""
        key = ("matrix", slot, out_state, in_state)
        if key not in self._cache:
            matrix = self.plan.inputs[slot]
            if matrix.layout == sparse.CSR:
                rows, cols, values = sparse.triples(matrix)
                if out_state:
                    rows = self.inverses[out_state][rows]
                if in_state:
                    cols = self.inverses[in_state][cols]
                permuted = sparse.from_coo(rows, cols, values, tuple(matrix.shape))
            else:
                permuted = matrix[self.perms[out_state]] if out_state else matrix
                permuted = permuted[:, self.perms[in_state]] if in_state else permuted
            self._cache[key] = self._input(permuted)
        return self._cache[key]

    def op(self, op: Op) -> None:
        state = self.state.get
        if op.kind in ROW_WISE:
            positions = _row_positions(self.plan, op)
            moved = [state(op.args[i], 0) for i in positions if state(op.args[i], 0)]
            if not moved and positions and op.rows == self.n and all(self._constant(op.args[i]) for i in positions):
                moved = [1]  # rows entering the space from constants: permuted here, once
            if moved:
                args = list(op.args)
                for i in positions:
                    args[i] = self.to_state(args[i], moved[0], f"{op.note} (rows reordered)")
                self._replace(op, tuple(args), moved[0])
                return
        elif op.kind == "gather" and not state(op.args[0], 0) and op.rows == self.n and _index(self.plan, op.args[1]) is not None:
            index = _index(self.plan, op.args[1])  # rows entering the space by a gather: its index permuted here
            self._replace(op, (op.args[0], self._input(index[self.perms[1]])), 1)
            return
        elif op.kind == "gather" and state(op.args[0], 0) and _index(self.plan, op.args[1]) is not None:
            renumbered = self.inverses[state(op.args[0])][_index(self.plan, op.args[1]).to(torch.int64)]
            order = torch.argsort(renumbered, stable=True)  # read the source in order; rows follow
            if bool(torch.equal(order, torch.arange(order.shape[0]))):
                self.timed.append((op, self._replace(op, (op.args[0], self._input(renumbered)), 0)))
            else:
                k = self._new_state(order)
                self.timed.append((op, self._replace(op, (op.args[0], self._input(renumbered[order])), k)))
            return
        elif matrix_position(op) is not None and len(op.args) == matrix_position(op) + 2 \
                and op.args[matrix_position(op)] in self.plan.inputs:
            at, x = matrix_position(op), op.args[-1]
            out_state, in_state = (1 if op.rows == self.n else 0), state(x, 0)
            if out_state or in_state:
                args = list(op.args)
                args[at] = self._matrix(op.args[at], out_state, in_state)
                if at == 1 and self.plan.meta[args[0]].shape[0] == op.rows and op.rows > 1:
                    args[0] = self.to_state(args[0], out_state, f"{op.note} (rows reordered)")
                self.timed.append((op, self._replace(op, tuple(args), out_state)))
                return
        elif op.kind == "dense_reduce" and op.attrs["kind"] in ("sum", "avg", "max", "min") and op.rows == 1 \
                and op.attrs["width"] == self.plan.meta[op.args[0]].shape[0]:
            self._replace(op, op.args, 0)  # one group of every row: the order does not matter
            return
        self._replace(op, tuple(self.to_state(a, 0, f"{op.note} (rows back in the user's order)") for a in op.args), 0)

    def finish(self) -> dict[str, int]:
        return {name: self.to_state(slot, 0, f"{name} (rows back in the user's order)")
                for name, slot in self.plan.outputs.items()}


def _seconds(plan: Plan, op: Op, trainable: set[int]) -> float:
    """Forward (+ backward where its input needs a gradient) of one product or gather on the plan's device."""
    device, x_slot = plan.device, op.args[-1] if op.kind != "gather" else op.args[0]
    meta = plan.meta[x_slot]
    x = torch.randn(tuple(meta.shape), dtype=meta.dtype, device=device, requires_grad=x_slot in trainable)
    if op.kind == "gather":
        index = plan.inputs[op.args[1]].to(device)

        def step() -> None:
            out = x.index_select(0, index)
            if x.requires_grad:
                out.sum().backward()
    else:
        matrix = plan.inputs[op.args[matrix_position(op)]]
        if matrix.layout == sparse.CSR and x.requires_grad:
            on_device, flipped = sparse.moved(matrix, device, meta.dtype)
        else:
            on_device, flipped = matrix.to(device, meta.dtype), None

        def step() -> None:
            out = sparse.matmul(on_device, x, flipped)
            if x.requires_grad:
                out.sum().backward()
    return costs.seconds(step, device, REPEATS)


def _spread(rows: torch.Tensor, cols: torch.Tensor) -> tuple[float, int]:
    distance = (rows - cols).abs()
    return float(distance.double().mean()), int(distance.max())


def reorder_rows(plan: Plan, force: bool = False) -> Plan:
    """Renumber the rows of the plan's largest self-mapped row space by RCM where that pays (a rule on the CPU, timed elsewhere);
    `force` renumbers whenever there is such a row space (tests)."""
    patterns = _patterns(plan)
    if not patterns:
        plan.log.append("reorder_rows: 0 row spaces renumbered (no product maps rows onto themselves)")
        return plan
    n, pairs = max(patterns.items(), key=lambda item: sum(r.numel() for r, _ in item[1]))
    entries = sum(r.numel() for r, _ in pairs)
    if entries < MIN_ENTRIES and not force:
        plan.log.append(f"reorder_rows: 0 row spaces renumbered (the largest pattern has {entries} entries, "
                        f"fewer than {MIN_ENTRIES})")
        return plan
    order = torch.from_numpy(_rcm(n, pairs))
    inverse = torch.argsort(order)
    rows, cols = torch.cat([r for r, _ in pairs]), torch.cat([c for _, c in pairs])
    (before, band_before), (after, band_after) = _spread(rows, cols), _spread(inverse[rows], inverse[cols])
    summary = f"{n} rows, bandwidth {band_before} -> {band_after}, mean |i - j| {before:.0f} -> {after:.0f}"
    on_cpu = torch.device(plan.device).type == "cpu"
    if not force and after > (CPU_SPREAD if on_cpu else SPREAD) * before:
        why = ("not banded enough by RCM to renumber on the CPU" if on_cpu and after <= SPREAD * before
               else "already in a good order")
        plan.log.append(f"reorder_rows: 0 row spaces renumbered (RCM: {summary}; {why})")
        return plan
    rewrite = _Rewrite(plan, n, order)
    original_ops, original_outputs = plan.ops, plan.outputs
    for op in original_ops:
        rewrite.op(op)
    outputs = rewrite.finish()
    plan.ops = rewrite.ops  # the rewritten plan's inputs are in place for timing
    trainable = weight_dependent(plan)  # rewritten ops keep their output slots: the same set serves both plans
    old = new = 0.0
    timed = not force and not on_cpu
    if timed:
        for before_op, after_op in rewrite.timed:  # alternated, so that a busy moment hits both sides
            old += _seconds(plan, before_op, trainable)
            new += _seconds(plan, after_op, trainable)
        new += sum(_seconds(plan, gather, trainable) for gather in rewrite.added)
    timing = f"timed {old * 1e3:.0f} -> {new * 1e3:.0f} ms on {plan.device}" if timed else \
        ("forced, not timed" if force else "banded by RCM, not timed on the CPU")
    if not timed or new <= (1 - GAIN) * old:
        plan.outputs = outputs
        plan.log.append(f"reorder_rows: 1 row spaces renumbered (RCM: {summary}); {len(rewrite.timed)} products and gathers "
                        f"{timing}, {len(rewrite.added)} row reorders added")
        return plan
    plan.ops, plan.outputs = original_ops, original_outputs
    for slot in rewrite.new_inputs:
        del plan.inputs[slot], plan.meta[slot]
    plan.log.append(f"reorder_rows: 0 row spaces renumbered (RCM: {summary}; {len(rewrite.timed)} products and gathers {timing}, "
                    f"not {GAIN:.0%} faster)")
    return plan
