"""Constant sparse matrices of the plan (CSR) and the algebra the optimizer passes do on them.

Every aggregation the passes turn into a matrix — gather then sum/avg, a multiplicity matrix of
compressed groundings, a scatter into a relation's rows, a sum of several statements over the
same source — is a CSR matrix built once at compile time from the grounding indexes. Indices
are int32 where they fit (MKL's CSR kernels run faster on them); values are float64 until the
module casts them to its dtype.
"""

from __future__ import annotations

import contextlib
import warnings

import torch

CSR = torch.sparse_csr

@contextlib.contextmanager
def beta_quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "sparse CSR support is in beta"
        yield


def is_sorted(x: torch.Tensor) -> bool:
    """Whether a 1-D tensor is in ascending order (ties allowed)."""
    return x.numel() < 2 or bool((x[1:] >= x[:-1]).all())


def from_coo(rows: torch.Tensor, cols: torch.Tensor, values: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
    """CSR from (row, col, value) triples; duplicate positions are summed.

    One sort of a row-major key at most (none when the triples already come row-major, as
    grounding indexes do) instead of torch's COO coalesce, which is several times slower."""
    rows, cols, values = rows.to(torch.int64), cols.to(torch.int64), values.to(torch.float64)
    key = rows * max(shape[1], 1) + cols
    if not is_sorted(key):
        key, order = torch.sort(key, stable=True)
        values = values[order]
    key, inverse, counts = torch.unique_consecutive(key, return_inverse=True, return_counts=True)
    if key.numel() != values.numel():  # duplicates: sum them
        values = torch.zeros(key.numel(), dtype=torch.float64).index_add_(0, inverse, values)
    rows, cols = key // max(shape[1], 1), key % max(shape[1], 1)
    crow = torch.zeros(shape[0] + 1, dtype=torch.int64)
    crow[1:] = torch.cumsum(torch.bincount(rows, minlength=shape[0]), 0)
    return from_csr(crow, cols, values, shape)


def from_csr(crow: torch.Tensor, cols: torch.Tensor, values: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
    with beta_quiet():
        return compact(torch.sparse_csr_tensor(crow, cols, values.to(torch.float64), shape))


def compact(matrix: torch.Tensor) -> torch.Tensor:
    """The same matrix with int32 indices when they fit."""
    if matrix.crow_indices().dtype == torch.int32 or max(matrix.shape) >= 2**31 - 1 or matrix.values().numel() >= 2**31 - 1:
        return matrix
    with beta_quiet():
        return torch.sparse_csr_tensor(matrix.crow_indices().to(torch.int32), matrix.col_indices().to(torch.int32),
                                       matrix.values(), matrix.shape)


def triples(matrix: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(row, col, value) of every stored entry, int64 indices."""
    crow = matrix.crow_indices().to(torch.int64)
    rows = torch.repeat_interleave(torch.arange(matrix.shape[0]), crow[1:] - crow[:-1])
    return rows, matrix.col_indices().to(torch.int64), matrix.values()


def transpose(matrix: torch.Tensor) -> torch.Tensor:
    """The CSR matrix's transpose: its entries stably sorted by column (each column's entries
    stay in row order: the row-major order of the transpose), with no duplicate to merge in a
    valid CSR matrix; a third of the calls of going through `from_coo`."""
    rows, cols, values = triples(matrix)
    order = torch.argsort(cols, stable=True)
    crow = torch.zeros(matrix.shape[1] + 1, dtype=torch.int64)
    crow[1:] = torch.cumsum(torch.bincount(cols, minlength=matrix.shape[1]), 0)
    return from_csr(crow, rows[order], values[order], (matrix.shape[1], matrix.shape[0]))


def moved(matrix: torch.Tensor, device: str | torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The CSR matrix and its transpose (for `matmul`'s backward) on `device`: the transpose is
    made first, on the CPU, where `transpose` runs."""
    return matrix.to(device, dtype), transpose(matrix).to(device, dtype)


def select_columns(matrix: torch.Tensor, index: torch.Tensor, source_rows: int) -> torch.Tensor:
    """M · P where P picks rows `index` of a source with `source_rows` rows: M @ gather(S, index) = (M·P) @ S."""
    rows, cols, values = triples(matrix)
    return from_coo(rows, index.to(torch.int64)[cols], values, (matrix.shape[0], source_rows))


def select_rows(matrix: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """The rows `index` of `matrix`, in that order: gather(M @ x, index) = select_rows(M, index) @ x."""
    crow = matrix.crow_indices().to(torch.int64)
    index = index.to(torch.int64)
    counts = (crow[1:] - crow[:-1])[index]
    new_crow = torch.zeros(index.shape[0] + 1, dtype=torch.int64)
    new_crow[1:] = torch.cumsum(counts, 0)
    total = int(new_crow[-1])
    offset = torch.arange(total) - torch.repeat_interleave(new_crow[:-1], counts)
    picked = torch.repeat_interleave(crow[index], counts) + offset
    return from_csr(new_crow, matrix.col_indices().to(torch.int64)[picked], matrix.values()[picked],
                    (index.shape[0], matrix.shape[1]))


def place_rows(matrix: torch.Tensor, heads: torch.Tensor, rows: int) -> torch.Tensor:
    """Row i of `matrix` becomes row heads[i] of a `rows`-row matrix (other rows empty)."""
    r, cols, values = triples(matrix)
    return from_coo(heads.to(torch.int64)[r], cols, values, (rows, matrix.shape[1]))


def selection(index: torch.Tensor, source_rows: int) -> torch.Tensor:
    """The matrix of gather(S, index): one 1 per row."""
    n = index.shape[0]
    return from_coo(torch.arange(n), index.to(torch.int64), torch.ones(n, dtype=torch.float64), (n, source_rows))


def identity(n: int) -> torch.Tensor:
    return selection(torch.arange(n), n)


def add(matrices: list[torch.Tensor]) -> torch.Tensor:
    """The sum of same-shaped sparse matrices."""
    parts = [triples(m) for m in matrices]
    return from_coo(torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts]),
                    torch.cat([p[2].to(torch.float64) for p in parts]), tuple(matrices[0].shape))


def sparse_product(matrix: torch.Tensor, dense: torch.Tensor, add: torch.Tensor | None) -> torch.Tensor:
    """add + matrix @ dense. Without `add` the product is written straight into a new tensor:
    torch.sparse.mm fills zeros first and copies them into its result (~30% slower at width 64)."""
    if matrix.shape[1] != dense.shape[0]:  # MKL would read out of bounds instead of failing
        raise ValueError(f"a {tuple(matrix.shape)} sparse matrix cannot multiply {tuple(dense.shape)}")
    if add is not None:
        return torch.addmm(add, matrix, dense)
    out = dense.new_empty((matrix.shape[0], dense.shape[1]))
    if torch.is_grad_enabled() and dense.requires_grad:  # out= does not record autograd
        return torch.addmm(out, matrix, dense, beta=0)
    return torch.addmm(out, matrix, dense, beta=0, out=out)


class _CsrMatmul(torch.autograd.Function):
    """add + A @ x with A constant: the backward multiplies by the precomputed transpose instead
    of letting torch transpose A (a sort) on every backward pass."""

    @staticmethod
    def forward(ctx, matrix: torch.Tensor, transposed: torch.Tensor, dense: torch.Tensor,
                add: torch.Tensor | None) -> torch.Tensor:
        ctx.transposed = transposed
        ctx.add_shape = None if add is None else add.shape
        return sparse_product(matrix, dense, add)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        grad_dense = sparse_product(ctx.transposed, grad.contiguous(), None) if ctx.needs_input_grad[2] else None
        grad_add = None
        if ctx.add_shape is not None and ctx.needs_input_grad[3]:
            grad_add = grad.sum_to_size(ctx.add_shape)
        return None, None, grad_dense, grad_add


def matmul(matrix: torch.Tensor, dense: torch.Tensor, transposed: torch.Tensor | None = None,
           add: torch.Tensor | None = None) -> torch.Tensor:
    """add + matrix @ dense for a constant CSR (or dense) matrix; rows of any trailing shape."""
    rows_only = dense.dim() == 2  # no reshapes then: each would be one more autograd node
    flat = dense if rows_only else dense.reshape(dense.shape[0], -1)
    flat_add = add if add is None or add.dim() == 2 else add.reshape(add.shape[0], -1)
    if matrix.layout != CSR:  # a small matrix kept dense (passes/dense_small_matrices.py)
        out = matrix @ flat if add is None else torch.addmm(flat_add, matrix, flat)
        return out if rows_only else out.reshape(matrix.shape[0], *dense.shape[1:])
    if transposed is not None and torch.is_grad_enabled() and (flat.requires_grad or (add is not None and add.requires_grad)):
        out = _CsrMatmul.apply(matrix, transposed, flat, flat_add)
    else:
        out = sparse_product(matrix, flat, flat_add)
    return out if rows_only else out.reshape(matrix.shape[0], *dense.shape[1:])
