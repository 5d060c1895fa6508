"""The ranking primitives of issue #30 against naive references written here.

top_k against a full score matrix sorted by (score descending, index ascending); the metrics
against per-row Python loops, RelBench's own MAP and scikit-learn's NDCG; the negative samplers
against their definitions; the losses against their formulas in float64.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from relsql.errors import RelsqlError
from relsql.train.ranking.topk import top_k


def naive_top_k(query: torch.Tensor, candidates: torch.Tensor, k: int, allowed=None, exclude=()) -> tuple[list, list]:
    """Full matrix, each row sorted by (-score, index) with Python's sort; excluded and disallowed dropped."""
    full = (query.double() @ candidates.double().T).tolist()
    banned = set(exclude)
    m = candidates.shape[0]
    width = min(k, m if allowed is None else sum(allowed))
    scores, indices = [], []
    for r, row in enumerate(full):
        ranked = sorted((-s, j) for j, s in enumerate(row) if (allowed is None or allowed[j]) and (r, j) not in banned)[:width]
        pad = width - len(ranked)
        scores.append([-s for s, _ in ranked] + [float("-inf")] * pad)
        indices.append([j for _, j in ranked] + [-1] * pad)
    return scores, indices


def integer_embeddings(rows: int, dim: int, seed: int, low: int = -2, high: int = 3) -> torch.Tensor:
    """Small integers in float64: exact dot products with many ties."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(low, high, (rows, dim), generator=generator).double()


@pytest.mark.parametrize("row_chunk,column_chunk", [(None, None), (1, 1), (7, 5), (16, 64), (1000, 3)])
@pytest.mark.parametrize("k", [1, 4, 10, 60])
def test_top_k_matches_full_sort_with_ties(row_chunk, column_chunk, k):
    query, candidates = integer_embeddings(45, 5, 1), integer_embeddings(53, 5, 2)
    scores, indices = top_k(query, candidates, k, row_chunk=row_chunk, column_chunk=column_chunk)
    want_scores, want_indices = naive_top_k(query, candidates, k)
    assert indices.tolist() == want_indices
    assert scores.tolist() == want_scores
    assert indices.shape == (45, min(k, 53))


def test_top_k_random_float64_default_chunks_over_several_column_blocks():
    generator = torch.Generator().manual_seed(3)
    query = torch.randn(30, 8, generator=generator, dtype=torch.float64)
    candidates = torch.randn(20000, 8, generator=generator, dtype=torch.float64)
    candidates[15000] = candidates[3]  # an exact duplicate candidate: its tie goes to index 3
    scores, indices = top_k(query, candidates, 10)
    full = query @ candidates.T
    order = np.lexsort((np.arange(20000)[None, :].repeat(30, 0), -full.numpy()), axis=1)[:, :10]
    assert indices.tolist() == order.tolist()
    assert torch.equal(scores, full.gather(1, indices))


def test_top_k_ties_go_to_the_lower_index():
    query, candidates = torch.ones(4, 3), torch.zeros(20, 3)
    scores, indices = top_k(query, candidates, 5, row_chunk=3, column_chunk=7)
    assert indices.tolist() == [[0, 1, 2, 3, 4]] * 4
    assert scores.eq(0).all()
    candidates[[2, 9, 17]] = 1.0  # three winners, then the zeros in index order
    _, indices = top_k(query, candidates, 5, column_chunk=4)
    assert indices.tolist() == [[2, 9, 17, 0, 1]] * 4


@pytest.mark.parametrize("column_chunk", [None, 4, 11])
def test_top_k_allowed_and_exclude(column_chunk):
    query, candidates = integer_embeddings(12, 4, 5), integer_embeddings(30, 4, 6)
    allowed = torch.ones(30, dtype=torch.bool)
    allowed[[0, 3, 4, 10, 11, 12, 29]] = False
    generator = torch.Generator().manual_seed(7)
    rows = torch.randint(0, 12, (60,), generator=generator)
    columns = torch.randint(0, 30, (60,), generator=generator)
    rows = torch.cat([rows, torch.full((30,), 5)])  # row 5 excludes everything: padded with -1
    columns = torch.cat([columns, torch.arange(30)])
    pairs = list(zip(rows.tolist(), columns.tolist(), strict=True))
    scores, indices = top_k(query, candidates, 8, allowed=allowed, exclude=(rows, columns), column_chunk=column_chunk)
    want_scores, want_indices = naive_top_k(query, candidates, 8, allowed=allowed.tolist(), exclude=pairs)
    assert indices.tolist() == want_indices
    assert scores.tolist() == want_scores
    assert indices[5].tolist() == [-1] * 8
    assert not set(zip(np.repeat(np.arange(12), 8).tolist(), indices.flatten().tolist(), strict=True)) & set(pairs)


def test_top_k_width_is_the_allowed_count_when_smaller_than_k():
    query, candidates = integer_embeddings(3, 2, 8), integer_embeddings(6, 2, 9)
    allowed = torch.tensor([False, True, False, True, False, False])
    scores, indices = top_k(query, candidates, 10, allowed=allowed)
    assert indices.shape == (3, 2)
    assert set(indices.flatten().tolist()) <= {1, 3}
    assert top_k(query, candidates, 10)[1].shape == (3, 6)


def test_top_k_mixed_dtypes_no_grad_and_empty_query():
    query = torch.randn(5, 3, requires_grad=True)
    candidates = torch.randn(9, 3, dtype=torch.float64)
    scores, indices = top_k(query, candidates, 2)
    assert scores.dtype == torch.float64 and indices.dtype == torch.long
    assert not scores.requires_grad
    scores, indices = top_k(torch.empty(0, 3), torch.randn(9, 3), 4)
    assert scores.shape == (0, 4) and indices.shape == (0, 4)


@pytest.mark.parametrize(
    "call,message",
    [
        (lambda q, c: top_k(q, c, 0), "k >= 1"),
        (lambda q, c: top_k(q, c, -3), "k >= 1"),
        (lambda q, c: top_k(q, c, 2.5), "k >= 1"),
        (lambda q, c: top_k(q, c[:0], 3), "candidate table is empty"),
        (lambda q, c: top_k(q, c, 3, allowed=torch.zeros(7, dtype=torch.bool)), "no candidate is allowed"),
        (lambda q, c: top_k(q, c, 3, allowed=torch.ones(6, dtype=torch.bool)), "one entry per candidate"),
        (lambda q, c: top_k(q, c[:, :2], 3), "same width"),
        (lambda q, c: top_k(q, c, 3, exclude=(torch.tensor([0]), torch.tensor([7]))), "[0, 7)"),
        (lambda q, c: top_k(q, c, 3, exclude=(torch.tensor([0, 1]), torch.tensor([1]))), "equally long"),
        (lambda q, c: top_k(q * float("nan"), c, 3), "NaN"),
        (lambda q, c: top_k(q, c, 3, row_chunk=0), "row_chunk"),
    ],
)
def test_top_k_bad_input_names_the_fix(call, message):
    with pytest.raises(RelsqlError, match=message.replace("[", r"\[").replace(")", r"\)").replace("(", r"\(")):
        call(torch.randn(4, 3), torch.randn(7, 3))


def test_top_k_float32_scores_agree_with_full_matmul():
    generator = torch.Generator().manual_seed(11)
    query, candidates = torch.randn(200, 16, generator=generator), torch.randn(3000, 16, generator=generator)
    scores, indices = top_k(query, candidates, 10, row_chunk=64, column_chunk=500)
    want = torch.topk(query @ candidates.T, 10)
    assert torch.allclose(scores, want.values, atol=1e-5)
    assert (indices == want.indices).float().mean() > 0.99  # float32 rounding may swap near-ties only
    assert math.isfinite(float(scores.sum()))
