"""Batched tensor kernels the plan's ops call: rows first, one call per op, never per grounding."""

from __future__ import annotations

import weakref

import numpy as np
import torch
import torch.nn.functional as F

from relsql.compile import sparse


# C901: one branch per activation name (a dispatch; split, one table of cases would scatter)
def activation(name: str, x: torch.Tensor, inplace: bool = False, slope: float = 0.01, heads: int = 1) -> torch.Tensor:  # noqa: C901
    """Elementwise activations; softmax normalizes each row's value (all its elements).
    `inplace` overwrites x (relu, tanh, sigmoid, leaky_relu, exp) when the plan allows it;
    `slope`: leaky_relu's negative slope. sum_per_head (not elementwise) sums each of `heads`
    equal consecutive parts of a row: multi-head dot products, sum_per_head(q * k, heads)."""
    if name == "identity":
        return x
    if name == "relu":
        return torch.relu_(x) if inplace else torch.relu(x)
    if name == "tanh":
        if _numpy_tanh_pays(x):
            return _NumpyTanh.apply(x, inplace)
        return torch.tanh_(x) if inplace else torch.tanh(x)
    if name == "sigmoid":
        return torch.sigmoid_(x) if inplace else torch.sigmoid(x)
    if name == "leaky_relu":
        return F.leaky_relu(x, slope, inplace=inplace)
    if name == "exp":
        return torch.exp_(x) if inplace else torch.exp(x)
    if name == "gelu":
        return F.gelu(x)
    if name == "sum_per_head":
        flat = x.reshape(x.shape[0], -1)
        if flat.shape[1] % heads:
            raise ValueError(f"a value of width {flat.shape[1]} does not split into {heads} heads")
        return flat.reshape(x.shape[0], heads, -1).sum(dim=2)
    if name == "log":
        return torch.log(x)
    if name == "softmax":
        flat = x.reshape(x.shape[0], -1)
        return torch.softmax(flat, dim=1).reshape(x.shape)
    if name == "signum":
        return (x > 0).to(x.dtype)
    if name == "inverse":
        return 1.0 / x
    if name == "reverse":
        return 1.0 - x
    if name == "sqrt":
        return torch.sqrt(x)
    if name == "lukasiewicz":  # NeuraLogic's smooth Łukasiewicz step: ≈0 below -0.5/6, ≈1 above 0.5/6
        return torch.sigmoid(6.0 * x + 0.5)
    if name == "norm":  # NeuraLogic's normalization: each row's elements to mean 0, variance 1
        flat = x.reshape(x.shape[0], -1)
        centred = flat - flat.mean(dim=1, keepdim=True)
        variance = (centred * centred).mean(dim=1, keepdim=True)
        return (centred / torch.sqrt(variance + 1e-10)).reshape(x.shape)
    if name == "sparsemax":
        return sparsemax(x.reshape(x.shape[0], -1)).reshape(x.shape)
    if name == "transpose":  # a column vector (n) becomes a row (1, n) and back; a matrix is transposed
        if x.dim() == 2:
            return x.unsqueeze(1) if x.shape[1] > 1 else x
        if x.dim() == 3 and x.shape[1] == 1:
            return x.squeeze(1)
        return x.transpose(1, 2)
    raise ValueError(f"unknown activation {name}")


# torch 2.13's CPU tanh is not vectorized here: 2.6 ns an element in float32 (5.2 in float64) on one
# thread, against numpy's 0.37 (1.7), within 1 ulp of it (a TPC-H batch's 4,608 x 32 part states: 394
# vs 57 us). With t torch threads torch's divides by about t, numpy's stays: numpy pays below these.
_NUMPY_TANH_MAX_THREADS = {torch.float32: 6, torch.float64: 2}
_NUMPY_TANH_MIN_ELEMENTS = 4096  # below, the extra autograd Function's ~5 us is most of the gain


def _numpy_tanh_pays(x: torch.Tensor) -> bool:
    """The size test first: a small plan's call then costs a single attribute read more."""
    return (x.numel() >= _NUMPY_TANH_MIN_ELEMENTS and x.device.type == "cpu" and x.is_contiguous()
            and torch.get_num_threads() <= _NUMPY_TANH_MAX_THREADS.get(x.dtype, 0))


def tanh_values(x: torch.Tensor) -> torch.Tensor:
    """tanh without autograd (generated code that does its own backward), through numpy where it pays."""
    if _numpy_tanh_pays(x):
        out = torch.empty_like(x)
        np.tanh(x.detach().numpy(), out=out.numpy())
        return out
    return torch.tanh(x)


class _NumpyTanh(torch.autograd.Function):
    """tanh through numpy's vectorized loop (it releases the GIL); the backward is aten's own
    tanh_backward, 1 - y², as torch.tanh's."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, inplace: bool) -> torch.Tensor:
        out = x if inplace else torch.empty_like(x)
        np.tanh(x.detach().numpy(), out=out.detach().numpy())
        if inplace:
            ctx.mark_dirty(x)
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        (y,) = ctx.saved_tensors
        return torch.ops.aten.tanh_backward(grad, y), None


class _BagMean(torch.autograd.Function):
    """The mean of each row's bucket vectors (`ids`: rows x slots, `pad` left out), computed over
    the row's real ids only (a text value's few tokens, not its 128 slots) and with a backward that
    adds each row's share into the weight's gradient by index, where embedding_bag's own dense
    backward sorts every id first: on Lahman's people (21k rows, five hashed name columns) that
    sort was a quarter of an epoch."""

    @staticmethod
    def forward(ctx, weight: torch.Tensor, ids: torch.Tensor, pad: int) -> torch.Tensor:
        flat, counts, offsets = _packed(ids, pad)
        ctx.save_for_backward(flat, counts)
        ctx.rows = weight.shape[0]
        return torch.nn.functional.embedding_bag(flat, weight, offsets, mode="mean")

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        flat, counts = ctx.saved_tensors
        return _bag_gradient(grad, flat, counts, ctx.rows), None, None


def _bag_gradient(grad: torch.Tensor, flat: torch.Tensor, counts: torch.Tensor, rows: int) -> torch.Tensor:
    """Each row's gradient over its count, added into the buckets the row reads: on the CPU as one
    product by a CSR matrix (buckets x rows, 1 / count at each id), kept while the ids live (a
    full-batch plan reads the same ids every epoch), where the index_add of every id's share took
    12x as long (flights: 42k ids, 1.8 ms against 0.15 ms). Every CPU backward takes the matrix, so
    that a fit's numbers do not depend on which ids tensor a backward meets first (compacted tables
    make new ones per fit: relsql/compile/compact.py)."""
    matrix = _bag_matrix(flat, counts, rows, grad) if grad.device.type == "cpu" else None
    if matrix is not None:
        return sparse.sparse_product(matrix, grad.contiguous(), None)
    share = (grad / counts.clamp(min=1).unsqueeze(1).to(grad.dtype)).repeat_interleave(counts, dim=0)
    out = torch.zeros((rows, grad.shape[1]), dtype=grad.dtype, device=grad.device)
    return out.index_add_(0, flat, share)


_BAG_MATRICES: dict[int, tuple] = {}  # id(flat) -> (a weak reference to flat, rows, dtype, matrix)


def _bag_matrix(flat: torch.Tensor, counts: torch.Tensor, rows: int, grad: torch.Tensor) -> torch.Tensor:
    """The bag's gradient matrix for these ids, made at their first backward."""
    found = _BAG_MATRICES.get(id(flat))
    if found is not None and found[0]() is flat and found[1] == rows and found[2] == grad.dtype:
        return found[3]
    for key in [k for k, v in _BAG_MATRICES.items() if v[0]() is None]:
        del _BAG_MATRICES[key]
    heads = torch.repeat_interleave(torch.arange(counts.shape[0], device=flat.device), counts)
    shares = (1.0 / counts.clamp(min=1).to(torch.float64)).repeat_interleave(counts)
    matrix = sparse.from_coo(flat, heads, shares, (rows, counts.shape[0]))  # a bucket read twice by a row: summed
    with sparse.beta_quiet():
        matrix = torch.sparse_csr_tensor(matrix.crow_indices(), matrix.col_indices(), matrix.values().to(grad.dtype),
                                         matrix.shape)
    _BAG_MATRICES[id(flat)] = (weakref.ref(flat), rows, grad.dtype, matrix)
    return matrix


def bag_gradient(grad: torch.Tensor, ids: torch.Tensor, pad: int, rows: int) -> torch.Tensor:
    """The gradient of bag_mean's weight (of `rows` rows): _BagMean's, for the fused plans of
    relsql/compile/fused.py."""
    flat, counts, _ = _packed(ids if ids.dim() == 2 else ids.reshape(ids.shape[0], -1), pad)
    return _bag_gradient(grad, flat, counts, rows)


_PACKED: dict[int, tuple] = {}  # id(ids) -> (a weak reference to ids, its version, pad, flat, counts, offsets)


def _packed(ids: torch.Tensor, pad: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(the real ids in row order, their count per row, each row's first position): once per ids
    tensor (a plan's bucket ids are the same tensor every epoch), kept while that tensor lives."""
    found = _PACKED.get(id(ids))
    if found is not None and found[0]() is ids and found[1] == ids._version and found[2] == pad:
        return found[3:]
    kept = ids != pad
    counts = kept.sum(1)
    flat = ids[kept]
    offsets = torch.zeros(ids.shape[0], dtype=torch.int64, device=ids.device)
    torch.cumsum(counts[:-1], 0, out=offsets[1:])
    for key in [k for k, v in _PACKED.items() if v[0]() is None]:
        del _PACKED[key]
    _PACKED[id(ids)] = (weakref.ref(ids), ids._version, pad, flat, counts, offsets)
    return flat, counts, offsets


def bag_mean(weight: torch.Tensor, ids: torch.Tensor, pad: int) -> torch.Tensor:
    """embedding_bag(mode="mean", padding_idx=pad) over `ids` (rows x slots): a row of only padding
    is a zero vector."""
    return _BagMean.apply(weight, ids if ids.dim() == 2 else ids.reshape(ids.shape[0], -1), pad)


def _narrow(weight: torch.Tensor) -> bool:
    return narrow_shape(tuple(weight.shape))


def narrow_shape(shape: tuple) -> bool:
    """A matrix with fewer columns than rows, and at least 2 (one column: F.linear's own path is faster)."""
    return len(shape) == 2 and 1 < shape[1] < shape[0]


def transposed(weight: torch.Tensor) -> torch.Tensor:
    """Wᵀ for `x @ Wᵀ`, as a contiguous copy where W is narrow: the gradient of W is then one
    (in, rows) x (rows, out) product instead of (out, rows) x (rows, in) on a transposed view,
    which MKL runs 3-4x slower (4,608 rows, W 32 x 3: 289 -> 141 us fwd + bwd)."""
    return weight.t().contiguous() if _narrow(weight) else weight.t()


def sparsemax(z: torch.Tensor) -> torch.Tensor:
    """Sparsemax of each row (Martins & Astudillo 2016): the Euclidean projection onto the
    simplex, max(z - tau, 0). Written with sort and cumsum so autograd gives its exact Jacobian
    (1/k over the k supported elements), as NeuraLogic's backward does."""
    ordered, _ = torch.sort(z, dim=1, descending=True)
    k = torch.arange(1, z.shape[1] + 1, dtype=z.dtype, device=z.device)
    sums = ordered.cumsum(dim=1)
    support = ((1 + k * ordered) > sums).sum(dim=1, keepdim=True)  # the support's size, at least 1
    tau = (sums.gather(1, support - 1) - 1) / support.to(z.dtype)
    return torch.clamp(z - tau, min=0)


def apply_weight(weight: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """A weight times each row's value, with NeuraLogic's shape rules.

    matrix (m, n) × vector (n) → (m); matrix × scalar value (1) → the scaled matrix (m, n);
    matrix (m, n) × matrix value (n, k) → (m, k); a scalar or (1,) weight scales the value;
    a vector weight (m) × a scalar value → (m); vector weight × vector value → elementwise.
    """
    value_shape = x.shape[1:]
    if weight.dim() == 0 or (weight.dim() == 1 and weight.shape[0] == 1):
        return x * weight.reshape((1,) * x.dim()) if weight.dim() == 0 else x * weight.reshape(1, *([1] * (x.dim() - 1)))
    if weight.dim() == 1:
        if value_shape == (1,):
            return x * weight.unsqueeze(0)
        return x * weight.reshape(1, *weight.shape)
    if len(value_shape) == 1:
        if value_shape[0] == weight.shape[1]:
            if x.dim() == 2 and _narrow(weight):
                return torch.mm(x, transposed(weight))
            return F.linear(x, weight)  # x Wᵀ without a transposed view (one autograd node)
        if value_shape[0] == 1:
            return x.reshape(-1, 1, 1) * weight.unsqueeze(0)
    if len(value_shape) == 2 and value_shape[0] == weight.shape[1]:
        return torch.matmul(weight.unsqueeze(0), x)
    raise ValueError(f"weight of shape {tuple(weight.shape)} does not fit a value of shape {tuple(value_shape)}")


def broadcast_rows(x: torch.Tensor, rows: int) -> torch.Tensor:
    """A constant (no row dimension) or single-row tensor repeated (as a view) over `rows`."""
    return x.expand(rows, *x.shape[1:])


def _align(values: list[torch.Tensor], expand: bool = True) -> list[torch.Tensor]:
    """Scalar values (1,) broadcast against vectors/matrices, as NeuraLogic adds unit facts
    (expanded to the full shape, or only reshaped for torch's broadcasting)."""
    shapes = [v.shape[1:] for v in values]
    target = max(shapes, key=lambda s: (len(s), tuple(s)))
    out = []
    for v in values:
        if v.shape[1:] == target:
            out.append(v)
        elif tuple(v.shape[1:]) == (1,):
            column = v.reshape(v.shape[0], *([1] * len(target)))
            out.append(column.expand(v.shape[0], *target) if expand else column)
        else:
            raise ValueError(f"values of shapes {[tuple(s) for s in shapes]} cannot be combined")
    return out


def combine(kind: str, values: list[torch.Tensor]) -> torch.Tensor:
    """NeuraLogic's combination functions over a rule's body values, row by row."""
    rows = max(v.shape[0] for v in values)
    values = [broadcast_rows(v, rows) if v.shape[0] != rows else v for v in values]
    if kind == "concat":
        return torch.cat([v.reshape(rows, -1) for v in values], dim=1)
    if kind in ("softmax", "sparsemax"):  # NeuraLogic's: scalar inputs, one vector of their weights
        if any(v[0].numel() != 1 for v in values):
            raise ValueError(f"a {kind} combination takes scalar inputs (NeuraLogic's Softmax/Sparsemax); got "
                             f"shapes {[tuple(v.shape[1:]) for v in values]}")
        scores = torch.cat([v.reshape(rows, 1) for v in values], dim=1)
        return torch.softmax(scores, dim=1) if kind == "softmax" else sparsemax(scores)
    if kind == "cossim":  # cosine similarity of exactly two vectors, a scalar (no epsilon, as NeuraLogic)
        if len(values) != 2:
            raise ValueError(f"a cosine similarity combines exactly 2 inputs, got {len(values)}")
        a, b = (v.reshape(rows, -1) for v in values)
        dot = (a * b).sum(dim=1, keepdim=True)
        return dot / (torch.sqrt((a * a).sum(dim=1, keepdim=True)) * torch.sqrt((b * b).sum(dim=1, keepdim=True)))
    if kind == "count":  # the number of inputs: a constant, no gradient to them
        return values[0].new_full((rows, 1), float(len(values)))
    if kind == "product":
        result = values[0]
        for v in values[1:]:
            if result.dim() == 2 and tuple(result.shape[1:]) == (1,):
                result = result.reshape(rows, *([1] * (v.dim() - 1))) * v
            elif v.dim() == 2 and tuple(v.shape[1:]) == (1,):
                result = result * v.reshape(rows, *([1] * (result.dim() - 1)))
            else:
                a = result if result.dim() == 3 else result.unsqueeze(1)
                b = v if v.dim() == 3 else v.unsqueeze(2)
                out = torch.matmul(a, b)
                if result.dim() == 2:
                    out = out.squeeze(1)
                if v.dim() == 2:
                    out = out.squeeze(-1)
                result = out
        return result
    if kind == "crosssum":
        result = values[0].reshape(rows, -1)
        for v in values[1:]:
            v = v.reshape(rows, -1)
            result = (result.unsqueeze(2) + v.unsqueeze(1)).reshape(rows, -1)
        return result
    if kind in ("argmax", "argmin") and len({v.shape[1:] for v in values}) > 1:
        raise ValueError(
            "a max/min combination of values of different shapes picks a value whose shape depends "
            "on the data (NeuraLogic keeps a winning scalar as a scalar); give every input one shape")
    if kind in ("sum", "avg", "elementproduct"):  # a chain of binary ops: half the time of stack + reduce
        aligned = _align(values, expand=False)
        result = aligned[0]
        for v in aligned[1:]:
            result = result * v if kind == "elementproduct" else result + v
        return result / len(aligned) if kind == "avg" else result
    stacked = torch.stack(_align(values), dim=0)
    if kind in ("argmax", "argmin"):
        # NeuraLogic picks the whole value whose elements sum highest (lowest), not elementwise.
        sums = stacked.reshape(stacked.shape[0], rows, -1).sum(2)
        pick = sums.argmax(0) if kind == "argmax" else sums.argmin(0)
        index = pick.reshape(1, rows, *([1] * (stacked.dim() - 2))).expand(1, *stacked.shape[1:])
        return stacked.gather(0, index).squeeze(0)
    raise ValueError(f"unknown combination {kind}")


class _TypedRows(torch.autograd.Function):
    """Rows already grouped by type (`sizes` rows of type 0, then of type 1, ...) times their
    type's matrix. Each type's GEMM writes its slice of one result, forwards and backwards: no
    cat of per-type parts, and the weight's gradient is one (types, out, in) tensor filled type
    by type (autograd's weight[t] would add a zero-filled (types, out, in) tensor per type)."""

    @staticmethod
    def forward(ctx, weight: torch.Tensor, x: torch.Tensor, sizes: list[int]) -> torch.Tensor:
        out = x.new_empty((x.shape[0], weight.shape[1]))
        start = 0
        for t, size in enumerate(sizes):
            if size:
                torch.mm(x[start:start + size], weight[t].t(), out=out[start:start + size])
            start += size
        ctx.save_for_backward(weight, x)
        ctx.sizes = sizes
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        weight, x = ctx.saved_tensors
        grad = grad.contiguous()
        grad_weight = torch.zeros_like(weight) if ctx.needs_input_grad[0] else None
        grad_x = x.new_empty(x.shape) if ctx.needs_input_grad[1] else None
        start = 0
        for t, size in enumerate(ctx.sizes):
            if size:
                part = grad[start:start + size]
                if grad_weight is not None:
                    torch.mm(part.t(), x[start:start + size], out=grad_weight[t])
                if grad_x is not None:
                    torch.mm(part, weight[t], out=grad_x[start:start + size])
            start += size
        return grad_weight, grad_x, None


def typed_linear(weight: torch.Tensor, x: torch.Tensor, order: torch.Tensor, counts: torch.Tensor,
                 in_order: bool = False) -> torch.Tensor:
    """Row i times the matrix of its type: `weight` (types, out, in), `x` (n, in), `order` the
    rows sorted by type (stable), `counts` rows per type. One GEMM per type present over its
    contiguous rows, then back to the rows' order: no (n, out, in) gather of matrices.
    `in_order`: the rows are already sorted by type (the planner sorts a rule's groundings so),
    no gather into type order and back."""
    n = x.shape[0]
    if weight.shape[0] == 1:
        return x.reshape(n, -1) @ weight[0].t()
    flat = x.reshape(n, -1).contiguous()
    out = _TypedRows.apply(weight, flat if in_order else flat.index_select(0, order), counts.tolist())
    return out if in_order else out.new_empty(out.shape).index_copy(0, order, out)


def _segment_softmax(score: torch.Tensor, rows_of: torch.Tensor, crow: torch.Tensor) -> torch.Tensor:
    """softmax of `score` (n,) within the entries of each CSR row, shifted by the row's maximum
    (a constant within the row: the result is exact, and exp cannot overflow). One-dimensional:
    torch's index kernels on (n, 1) columns run several times slower than on (n,) vectors."""
    top = torch.segment_reduce(score, "max", offsets=crow)  # entries are sorted by row
    weight = torch.exp(score - top.index_select(0, rows_of))
    total = score.new_zeros(crow.shape[0] - 1).index_add_(0, rows_of, weight)
    return weight / total.index_select(0, rows_of)


def _head(x: torch.Tensor, h: int, heads: int) -> torch.Tensor:
    """Head h's columns of x (n, H*C), contiguous (the sparse kernels need it)."""
    if heads == 1:
        return x.contiguous()
    width = x.shape[1] // heads
    return x[:, h * width:(h + 1) * width].contiguous()


class _SparseAttention(torch.autograd.Function):
    """Per row r and head h: sum_g alpha_gh source[cols_g, h], alpha the softmax of the scores of
    r's groundings. The groundings are the entries of a CSR matrix (crow, cols) whose values are
    the alphas: one sparse product per head reads the source rows in place, no (n, H*C) tensor of
    per-grounding values is made (a gather, a product and a scatter would each write one). The
    backward is two sparse kernels per head: d source = A^T @ d out with a stored transpose
    pattern (crow_t, rows_t; order_t: the grounding of each transposed entry), and d alpha_g =
    d out[r_g] . source[cols_g] sampled at the entries only (sampled_addmm); then the softmax's
    d score_g = alpha_g (d alpha_g - sum_{g' in r} alpha_g' d alpha_g')."""

    @staticmethod
    def forward(ctx, score: torch.Tensor, source: torch.Tensor, rows_of: torch.Tensor, crow: torch.Tensor,
                cols: torch.Tensor, crow_t: torch.Tensor, rows_t: torch.Tensor, order_t: torch.Tensor) -> torch.Tensor:
        rows, heads = crow.shape[0] - 1, score.shape[1]
        offsets = crow.to(torch.int64)
        alphas = [_segment_softmax(score[:, h].contiguous(), rows_of, offsets) for h in range(heads)]
        with sparse.beta_quiet():
            parts = [sparse.sparse_product(torch.sparse_csr_tensor(crow, cols, a, (rows, source.shape[0])),
                                     _head(source, h, heads), None) for h, a in enumerate(alphas)]
        ctx.save_for_backward(source, rows_of, crow, cols, crow_t, rows_t, order_t, *alphas)
        return parts[0] if heads == 1 else torch.cat(parts, 1)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        source, rows_of, crow, cols, crow_t, rows_t, order_t, *alphas = ctx.saved_tensors
        rows, heads, n = crow.shape[0] - 1, len(alphas), source.shape[0]
        d_source, d_score = [], []
        with sparse.beta_quiet():
            for h, a in enumerate(alphas):
                g = _head(grad, h, heads)
                if ctx.needs_input_grad[1]:
                    d_source.append(sparse.sparse_product(torch.sparse_csr_tensor(crow_t, rows_t, a.index_select(0, order_t),
                                                                            (n, rows)), g, None))
                if ctx.needs_input_grad[0]:
                    pattern = torch.sparse_csr_tensor(crow, cols, a, (rows, n))
                    weighted = a * torch.sparse.sampled_addmm(pattern, g, _head(source, h, heads).t(), beta=0).values()
                    per_row = a.new_zeros(rows).index_add_(0, rows_of, weighted)
                    d_score.append(weighted - a * per_row.index_select(0, rows_of))
        grad_score = torch.stack(d_score, 1) if d_score else None
        grad_source = None if not d_source else d_source[0] if heads == 1 else torch.cat(d_source, 1)
        return grad_score, grad_source, None, None, None, None, None, None


def sparse_attention(score: torch.Tensor, source: torch.Tensor, rows_of: torch.Tensor, crow: torch.Tensor,
                     cols: torch.Tensor, crow_t: torch.Tensor, rows_t: torch.Tensor, order_t: torch.Tensor,
                     add: torch.Tensor | None = None, mode: str = "concat") -> torch.Tensor:
    """Attention over groundings given as a CSR pattern (rows: the results, columns: the rows of
    `source` each grounding reads); `score` (n, H) in entry order, `rows_of` each entry's row
    (int64), the transpose pattern for the backward. A row without groundings gives zeros.
    `add` (a bias) is added in place: no second result-sized tensor (large ones cost more to
    allocate, page by page, than to fill)."""
    n = score.shape[0]
    score = score.reshape(n, -1)
    heads = score.shape[1]
    flat = source.reshape(source.shape[0], -1)
    if flat.shape[1] % heads:
        raise ValueError(f"a value of width {flat.shape[1]} does not split into {heads} attention heads (one per score column)")
    out = _SparseAttention.apply(score, flat, rows_of, crow, cols, crow_t, rows_t, order_t)
    if mode == "mean":
        out = out.reshape(out.shape[0], heads, -1).mean(dim=1)
    return out if add is None else out.add_(add)


def attention(score: torch.Tensor, value: torch.Tensor, segment_ids: torch.Tensor, counts: torch.Tensor,
              mode: str = "concat") -> torch.Tensor:
    """Per segment (a head's sorted groundings) and attention head h: sum_g softmax_g(score_gh) *
    value_g[h]. `score` (n, H), `value` (n, H*C); the result is (segments, H*C), or (segments, C)
    averaged over heads with mode "mean". The sparse kernel with grounding g reading value row g
    (the optimizer's `sparse_attention` pass lets it read the rows a gather would have copied)."""
    n = score.shape[0]
    crow = torch.zeros(counts.shape[0] + 1, dtype=torch.int64, device=counts.device)
    torch.cumsum(counts, 0, out=crow[1:])
    entries = torch.arange(n, device=score.device)
    crow_t = torch.arange(n + 1, device=score.device)
    return sparse_attention(score, value.reshape(n, -1), segment_ids, crow, entries, crow_t, segment_ids, entries, mode=mode)


def _extremes(x: torch.Tensor, segment_ids: torch.Tensor, segments: int, reduce: str) -> torch.Tensor:
    """Each segment's elementwise max ("amax") or min ("amin") of its rows of `x`; zeros where empty."""
    index = segment_ids.reshape(-1, *([1] * (x.dim() - 1))).expand_as(x)
    return x.new_zeros((segments, *x.shape[1:])).scatter_reduce(0, index, x, reduce=reduce, include_self=False)


class _SegmentExtreme(torch.autograd.Function):
    """_extremes with the gradient of its groundings only. torch's scatter_reduce backward also makes
    the gradient of the zeros reduced into (a scatter over every grounding, then discarded: a third of
    a Lahman epoch's backward) and reads the index expanded to every element; this one computes
    torch's own formula for the groundings, bit for bit, with row indices: a tie shares the gradient
    evenly, and (as torch counts the zeros reduced into, include_self=False or not) a segment whose
    extreme is exactly 0 counts one more share."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, segment_ids: torch.Tensor, segments: int, reduce: str) -> torch.Tensor:
        out = _extremes(x, segment_ids, segments, reduce)
        ctx.save_for_backward(x, segment_ids, out)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, segment_ids, out = ctx.saved_tensors
        return extreme_gradient(grad, x, segment_ids, out), None, None, None


def extreme_gradient(grad: torch.Tensor, x: torch.Tensor, segment_ids: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """The groundings' gradient of a segment max/min `out` of `x` (_SegmentExtreme's, which the fused
    plans of relsql/compile/fused.py call too): the rows equal to their segment's extreme share it."""
    hit = torch.eq(x, out.index_select(0, segment_ids), out=torch.empty_like(x))  # 1.0/0.0: products 4x a bool mask's speed
    shares = (out == 0).to(x.dtype).index_add_(0, segment_ids, hit)
    return hit.mul_((grad / shares).index_select(0, segment_ids))


def mean_gradient(grad: torch.Tensor, segment_ids: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """The groundings' gradient of segment_reduce("avg") as autograd computes it: each segment's
    gradient over its count (at least 1), read back by every grounding of the segment."""
    scale = counts.to(grad.dtype).reshape(counts.shape[0], *([1] * (grad.dim() - 1)))
    return (grad / scale.clamp(min=1)).index_select(0, segment_ids)


def segment_reduce(kind: str, x: torch.Tensor, segment_ids: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """Reduce sorted groundings into their segments; an empty segment reduces to zeros."""
    segments = counts.shape[0]
    if kind == "count":  # a scalar per head, whatever the groundings' shape
        return counts.to(x.dtype).reshape(segments, 1)
    if kind in ("sum", "avg"):
        out = x.new_zeros((segments, *x.shape[1:])).index_add_(0, segment_ids, x)
        if kind == "sum":
            return out
        return out / counts.to(x.dtype).reshape(segments, *([1] * (x.dim() - 1))).clamp(min=1)
    if kind in ("max", "min"):  # elementwise, as SQL and PyG aggregate
        reduce = "amax" if kind == "max" else "amin"
        if torch.is_grad_enabled() and x.requires_grad:
            return _SegmentExtreme.apply(x, segment_ids, segments, reduce)
        return _extremes(x, segment_ids, segments, reduce)
    if kind in ("argmax", "argmin"):
        # NeuraLogic keeps the grounding whose value sums highest (lowest); the first on ties.
        sums = x.detach().reshape(x.shape[0], -1).sum(1)
        reduce = "amax" if kind == "argmax" else "amin"
        best = sums.new_zeros(segments).scatter_reduce(0, segment_ids, sums, reduce=reduce, include_self=False)
        positions = torch.arange(x.shape[0], device=x.device)
        candidates = torch.where(sums == best[segment_ids], positions, x.shape[0])
        first = candidates.new_full((segments,), x.shape[0]).scatter_reduce(0, segment_ids, candidates, reduce="amin")
        padded = torch.cat([x, x.new_zeros((1, *x.shape[1:]))])  # row G: the empty segments' zero
        return padded.index_select(0, first)
    raise ValueError(f"unknown aggregate {kind}")


def scatter_rows(x: torch.Tensor, index: torch.Tensor, rows: int) -> torch.Tensor:
    """Place per-head results of one rule into the relation's rows (others stay zero)."""
    return x.new_zeros((rows, *x.shape[1:])).index_add_(0, index, x)
