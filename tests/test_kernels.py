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


@pytest.mark.parametrize("kind", ["max", "min"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_max_and_min_gradients_are_torchs_own_bit_for_bit(kind, dtype):
    """The elementwise max/min's own backward (the groundings' gradient only) against torch's
    scatter_reduce autograd: ties share evenly, a segment whose extreme is exactly 0 counts the
    zero reduced into as torch does, empty segments, signs of zero; values and gradients' bits."""
    gen = torch.Generator().manual_seed(1)
    for trial in range(60):
        n, segments = int(torch.randint(1, 40, (), generator=gen)), int(torch.randint(1, 12, (), generator=gen))
        shape = [(n,), (n, 3), (n, 2, 4)][trial % 3]
        if trial % 2:  # few distinct values, zero among them: ties and zero extremes
            x = torch.randint(-2, 3, shape, generator=gen).to(dtype) / 2
        else:
            x = torch.randn(shape, generator=gen, dtype=dtype)
        ids = torch.sort(torch.randint(0, segments, (n,), generator=gen))[0]
        grad = torch.randn((segments, *shape[1:]), generator=gen, dtype=dtype)
        mine, theirs = x.clone().requires_grad_(), x.clone().requires_grad_()
        out = kernels.segment_reduce(kind, mine, ids, torch.bincount(ids, minlength=segments))
        out.backward(grad)
        index = ids.reshape(-1, *([1] * (len(shape) - 1))).expand(shape)
        naive = theirs.new_zeros((segments, *shape[1:])).scatter_reduce(0, index, theirs, reduce="a" + kind, include_self=False)
        naive.backward(grad)
        bits = torch.int32 if dtype == torch.float32 else torch.int64
        assert torch.equal(out.detach().view(bits), naive.detach().view(bits)), trial
        assert torch.equal(mine.grad.view(bits), theirs.grad.view(bits)), trial


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


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("inplace", [False, True])
def test_numpy_tanh_matches_torch_values_and_gradients(dtype, inplace):
    """Large CPU values take numpy's tanh (faster here): within 2 ulp of torch.tanh, and the same
    gradient through autograd, in place or not."""
    gen = torch.Generator().manual_seed(1)
    base = torch.randn(4608, 32, generator=gen, dtype=dtype) * 3
    assert kernels._numpy_tanh_pays(base) == (torch.get_num_threads() <= kernels._NUMPY_TANH_MAX_THREADS[dtype])
    leaf = base.clone().requires_grad_()
    x = leaf * 1.0  # not a leaf: in place is allowed
    y = kernels.activation("tanh", x, inplace=inplace)
    weights = torch.randn(base.shape, generator=gen, dtype=dtype)
    (y * weights).sum().backward()
    reference_leaf = base.clone().requires_grad_()
    reference = torch.tanh(reference_leaf * 1.0)
    (reference * weights).sum().backward()
    ulp = torch.finfo(dtype).eps
    assert torch.allclose(y.detach(), reference.detach(), rtol=2 * ulp, atol=2 * ulp)
    assert torch.allclose(leaf.grad, reference_leaf.grad, rtol=8 * ulp, atol=8 * ulp)


def test_numpy_tanh_gradcheck():
    x = torch.randn(64, 80, dtype=torch.float64, generator=torch.Generator().manual_seed(2)).requires_grad_()
    assert x.numel() >= kernels._NUMPY_TANH_MIN_ELEMENTS
    assert torch.autograd.gradcheck(lambda v: kernels._NumpyTanh.apply(v, False), (x,))


@pytest.mark.parametrize("columns", [1, 2, 3, 32, 40])
def test_affine_and_linear_with_a_contiguous_transpose_match_plain_products(columns):
    """c + x Wᵀ and x Wᵀ (the copy of Wᵀ for narrow weights) give the values and gradients of the
    plain expressions."""
    from relsql.compile.ops import OPS

    gen = torch.Generator().manual_seed(3)
    x = torch.randn(50, columns, generator=gen, dtype=torch.float64)
    c = torch.randn(50, 32, generator=gen, dtype=torch.float64)
    grad = torch.randn(50, 32, generator=gen, dtype=torch.float64)
    affine = OPS["affine"].kernel({})
    for compute, plain in ((lambda w: affine(c, x, w), lambda w: c + x @ w.T),
                           (lambda w: kernels.apply_weight(w, x), lambda w: x @ w.T)):
        w = torch.randn(32, columns, generator=gen, dtype=torch.float64, requires_grad=True)
        w_ref = w.detach().clone().requires_grad_()
        out, ref = compute(w), plain(w_ref)
        out.backward(grad)
        ref.backward(grad)
        assert torch.allclose(out, ref, atol=1e-12) and torch.allclose(w.grad, w_ref.grad, atol=1e-12)


@pytest.mark.parametrize("shape", [(8, 4), (4608, 32)])
def test_tanh_values_without_autograd_match_torch(shape):
    """The generated (fused) code's tanh: numpy's for large values, torch's for small ones."""
    x = torch.randn(shape, dtype=torch.float64, generator=torch.Generator().manual_seed(4)).requires_grad_()
    with torch.no_grad():  # as the generated code calls it
        y = kernels.tanh_values(x)
    assert not y.requires_grad and y.shape == x.shape
    assert torch.allclose(y, torch.tanh(x.detach()), rtol=2e-16, atol=2e-16)


def test_bag_mean_equals_embedding_bag_and_its_gradient():
    """The bag mean over a row's real ids only, with its backward by index, equals embedding_bag's
    mean with padding_idx: values and the weight's gradient (a row of only padding is zero)."""
    from relsql.compile.kernels import bag_mean

    torch.manual_seed(0)
    weight = torch.randn(41, 3, dtype=torch.float64, requires_grad=True)
    ids = torch.full((30, 9), 40)
    ids[:, :4] = torch.randint(0, 41, (30, 4))  # some of these are the padding id too
    ids[2] = 40
    out = bag_mean(weight, ids, 40)
    expected = torch.nn.functional.embedding_bag(ids, weight, mode="mean", padding_idx=40)
    assert torch.equal(out, expected) and torch.equal(out[2], torch.zeros(3, dtype=torch.float64))
    upstream = torch.randn_like(out)
    (grad,) = torch.autograd.grad((out * upstream).sum(), weight)
    (reference,) = torch.autograd.grad((expected * upstream).sum(), weight)
    torch.testing.assert_close(grad, reference, rtol=0, atol=1e-14)
    assert torch.autograd.gradcheck(lambda w: bag_mean(w, ids, 40), (weight,))
    assert torch.equal(bag_mean(weight, ids, 40), out)  # the packed ids are reused: same values


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_bag_gradient_by_matrix_equals_embedding_bag(dtype):
    """On the CPU the bag's weight gradient is one product by a CSR matrix kept for its ids: it
    equals embedding_bag's, a bucket read twice by a row counted twice and a row
    of only padding adding nothing, in either dtype, backward after backward."""
    from relsql.compile import kernels

    torch.manual_seed(1)
    weight = torch.randn(41, 3, dtype=dtype, requires_grad=True)
    ids = torch.full((30, 9), 40)
    ids[:, :4] = torch.randint(0, 40, (30, 4))
    ids[3, :4] = 7  # one bucket, four times
    ids[2] = 40
    expected = torch.nn.functional.embedding_bag(ids, weight, mode="mean", padding_idx=40)
    tol = 1e-14 if dtype == torch.float64 else 1e-6
    for step in range(3):
        upstream = torch.randn_like(expected)
        (grad,) = torch.autograd.grad((kernels.bag_mean(weight, ids, 40) * upstream).sum(), weight)
        (reference,) = torch.autograd.grad((expected * upstream).sum(), weight, retain_graph=True)
        torch.testing.assert_close(grad, reference, rtol=0, atol=tol, msg=f"backward {step + 1}")
    flat, counts, _ = kernels._packed(ids, 40)
    assert kernels._BAG_MATRICES[id(flat)][-1] is not None  # made once, for these ids
