"""Kernels against naive per-row loops, including empty segments and NeuraLogic's max rule."""

from __future__ import annotations

import pytest
import torch

from relsql.compile import kernels


def naive_segment(kind, x, counts):
    out, start = [], 0
    for c in counts.tolist():
        rows = x[start:start + c]
        start += c
        if c == 0:
            out.append(torch.zeros((1,) if kind == "count" else x.shape[1:], dtype=x.dtype))
        elif kind == "sum":
            out.append(rows.sum(0))
        elif kind == "avg":
            out.append(rows.mean(0))
        elif kind == "count":
            out.append(torch.tensor([float(c)], dtype=x.dtype))
        elif kind == "max":
            out.append(rows.amax(0))
        elif kind == "min":
            out.append(rows.amin(0))
        else:  # whole row with the largest / smallest element sum, first on ties
            sums = [float(r.sum()) for r in rows]
            target = max(sums) if kind == "argmax" else min(sums)
            out.append(rows[sums.index(target)])
    return torch.stack(out)


@pytest.mark.parametrize("kind", ["sum", "avg", "max", "min", "argmax", "argmin", "count"])
@pytest.mark.parametrize("shape", [(3,), (2, 3)])
def test_segment_reduce_matches_naive_loop(kind, shape):
    gen = torch.Generator().manual_seed(0)
    counts = torch.tensor([2, 0, 1, 4, 0, 3])
    x = torch.randn((int(counts.sum()), *shape), generator=gen, dtype=torch.float64)
    x[5] = x[4]  # a tie inside segment 3
    ids = torch.repeat_interleave(torch.arange(len(counts)), counts)
    got = kernels.segment_reduce(kind, x, ids, counts)
    assert torch.allclose(got, naive_segment(kind, x, counts))


def test_max_gradient_goes_to_the_chosen_grounding():
    x = torch.tensor([[1.0, 5.0], [3.0, 0.0], [2.0, 2.0]], requires_grad=True)
    out = kernels.segment_reduce("argmax", x, torch.tensor([0, 0, 0]), torch.tensor([3]))
    out.sum().backward()
    assert out.tolist() == [[1.0, 5.0]]
    assert x.grad.tolist() == [[1.0, 1.0], [0.0, 0.0], [0.0, 0.0]]


def test_combinations_by_hand():
    a = torch.tensor([[1.0, 2.0]])
    b = torch.tensor([[10.0, 20.0, 30.0]])
    unit = torch.tensor([[1.0]])
    assert kernels.combine("crosssum", [a, b]).tolist() == [[11, 21, 31, 12, 22, 32]]
    assert kernels.combine("crosssum", [a, unit]).tolist() == [[2, 3]]
    assert kernels.combine("sum", [a, unit]).tolist() == [[2, 3]]
    assert kernels.combine("concat", [a, unit]).tolist() == [[1, 2, 1]]
    assert kernels.combine("argmax", [a, torch.tensor([[0.0, 2.5]])]).tolist() == [[1, 2]]
    m = torch.tensor([[[1.0, 2.0], [3.0, 4.0]]])
    assert kernels.combine("product", [m, a]).tolist() == [[5, 11]]


def test_apply_weight_shape_rules():
    w = torch.arange(6.0).reshape(3, 2)
    assert kernels.apply_weight(w, torch.tensor([[1.0, 2.0]])).tolist() == [[2, 8, 14]]
    assert kernels.apply_weight(w, torch.tensor([[2.0]])).shape == (1, 3, 2)  # matrix times a unit fact
    assert kernels.apply_weight(torch.tensor(3.0), torch.tensor([[1.0, 2.0]])).tolist() == [[3, 6]]
    with pytest.raises(ValueError):
        kernels.apply_weight(w, torch.tensor([[1.0, 2.0, 3.0]]))
