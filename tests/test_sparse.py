"""The compile-time sparse algebra (relsql/compile/sparse.py) against dense torch as the oracle."""

from __future__ import annotations

import pytest
import torch

from relsql.compile import sparse


def random_csr(rows: int, cols: int, nnz: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    r = torch.randint(0, rows, (nnz,), generator=g)
    c = torch.randint(0, cols, (nnz,), generator=g)
    v = torch.randn(nnz, generator=g, dtype=torch.float64)
    return sparse.from_coo(r, c, v, (rows, cols))


def dense(m: torch.Tensor) -> torch.Tensor:
    return m.to_dense()


def test_from_coo_sums_duplicates_and_uses_int32():
    m = sparse.from_coo(torch.tensor([0, 0, 2]), torch.tensor([1, 1, 0]), torch.tensor([1.5, 2.0, -1.0]), (3, 2))
    assert torch.equal(dense(m), torch.tensor([[0.0, 3.5], [0.0, 0.0], [-1.0, 0.0]], dtype=torch.float64))
    assert m.crow_indices().dtype == torch.int32 and m.col_indices().dtype == torch.int32


@pytest.mark.parametrize("seed", range(4))
def test_algebra_matches_dense(seed):
    a = random_csr(7, 5, 12, seed)
    index = torch.randint(0, 9, (5,), generator=torch.Generator().manual_seed(seed))
    select = torch.zeros(5, 9, dtype=torch.float64)
    select[torch.arange(5), index] = 1
    assert torch.allclose(dense(sparse.select_columns(a, index, 9)), dense(a) @ select)
    assert torch.equal(dense(sparse.selection(index, 9)), select)
    assert torch.equal(dense(sparse.transpose(a)), dense(a).T)
    heads = torch.randperm(11, generator=torch.Generator().manual_seed(seed))[:7]
    placed = torch.zeros(11, 5, dtype=torch.float64)
    placed[heads] = dense(a)
    assert torch.equal(dense(sparse.place_rows(a, heads, 11)), placed)
    rows = torch.randint(0, 7, (10,), generator=torch.Generator().manual_seed(seed))
    assert torch.equal(dense(sparse.select_rows(a, rows)), dense(a)[rows])
    b = random_csr(7, 5, 9, seed + 100)
    assert torch.allclose(dense(sparse.add([a, b, b])), dense(a) + 2 * dense(b))
    assert torch.equal(dense(sparse.identity(4)), torch.eye(4, dtype=torch.float64))


@pytest.mark.parametrize("with_add", [False, True])
def test_matmul_values_and_gradients(with_add):
    a = random_csr(6, 4, 10, 3)
    at = sparse.transpose(a)
    x = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    add = torch.randn(1, 3, dtype=torch.float64, requires_grad=True) if with_add else None
    out = sparse.matmul(a, x, at, add=add)
    expected = dense(a) @ x + (add if with_add else 0)
    assert torch.allclose(out, expected)
    inputs = (x, add) if with_add else (x,)
    assert torch.autograd.gradcheck(lambda *t: sparse.matmul(a, t[0], at, add=t[1] if with_add else None), inputs)


def test_matmul_refuses_a_matrix_that_does_not_fit():
    a = random_csr(3, 4, 5, 0)
    with pytest.raises(ValueError, match="cannot multiply"):
        sparse.matmul(a, torch.randn(2, 3, dtype=torch.float64))
