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


@pytest.mark.parametrize("column_chunk", [None, 4096, 3000])
def test_top_k_random_float64_default_and_several_column_blocks(column_chunk):
    generator = torch.Generator().manual_seed(3)
    query = torch.randn(30, 8, generator=generator, dtype=torch.float64)
    candidates = torch.randn(20000, 8, generator=generator, dtype=torch.float64)
    candidates[15000] = candidates[3]  # an exact duplicate candidate: its tie goes to index 3
    scores, indices = top_k(query, candidates, 10, column_chunk=column_chunk)
    full = query @ candidates.T
    order = np.lexsort((np.arange(20000)[None, :].repeat(30, 0), -full.numpy()), axis=1)[:, :10]
    assert indices.tolist() == order.tolist()
    assert torch.equal(scores, full.gather(1, indices))


@pytest.mark.parametrize("m,columns", [(100, 40), (1000, 1000), (1000, 64), (33, 33), (31, 100), (5, 3), (2100, 700)])
def test_column_ranges_cover_the_candidates_in_whole_groups(m, columns):
    from relsql.train.ranking.topk import GROUP, _column_ranges

    ranges = _column_ranges(m, columns)
    assert [c for r in ranges for c in range(*r)] == list(range(m))
    assert all((c1 - c0) % GROUP == 0 or c1 - c0 < GROUP for c0, c1 in ranges) or columns < GROUP


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("k,column_chunk", [(1, 64), (3, 256), (10, 512), (10, 700), (20, 1024), (10, None)])
def test_top_k_group_pruning_with_some_ties(seed, k, column_chunk):
    # wide integer range: scores tie sometimes, group maxima tie sometimes, often not
    query, candidates = integer_embeddings(40, 3, 20 + seed, -30, 31), integer_embeddings(2100, 3, 40 + seed, -30, 31)
    scores, indices = top_k(query, candidates, k, row_chunk=9, column_chunk=column_chunk)
    want_scores, want_indices = naive_top_k(query, candidates, k)
    assert indices.tolist() == want_indices
    assert scores.tolist() == want_scores


def test_top_k_ties_across_groups_of_columns():
    from relsql.train.ranking.topk import GROUP

    # one column of scores over 8 groups: ties at the k-th value across groups whose maxima differ,
    # and groups whose maxima tie at the k-th group
    values = torch.zeros(8 * GROUP, 1, dtype=torch.float64)
    values[GROUP - 1], values[3 * GROUP], values[3 * GROUP + 1] = 5.0, 9.0, 5.0
    _, indices = top_k(torch.ones(3, 1, dtype=torch.float64), values, 2, column_chunk=8 * GROUP)
    assert indices.tolist() == [[3 * GROUP, GROUP - 1]] * 3
    for order in (1, -1):  # every group's maximum is 5, at varying places: the three lowest indices win
        fives = ((torch.arange(8) * GROUP + GROUP - 1 - torch.arange(8)).flip(0) if order < 0
                 else torch.arange(8) * GROUP + torch.arange(8))
        values = torch.zeros(8 * GROUP, 1, dtype=torch.float64)
        values[fives] = 5.0
        _, indices = top_k(torch.ones(3, 1, dtype=torch.float64), values, 3, column_chunk=8 * GROUP)
        assert indices.tolist() == [sorted(fives.tolist())[:3]] * 3


@pytest.mark.parametrize("k,column_chunk", [(1, 64), (3, 256), (10, 512), (20, 1024)])
def test_top_k_group_pruning_of_narrow_blocks_when_forced(monkeypatch, k, column_chunk):
    """Blocks narrower than GROUPED_FROM are selected whole (faster there); forced through the grouped
    path they must give the same exact answer, ties included."""
    from relsql.train.ranking import topk as module

    monkeypatch.setattr(module, "GROUPED_FROM", 0)
    query, candidates = integer_embeddings(40, 3, 20, -30, 31), integer_embeddings(2100, 3, 40, -30, 31)
    scores, indices = top_k(query, candidates, k, row_chunk=9, column_chunk=column_chunk)
    want_scores, want_indices = naive_top_k(query, candidates, k)
    assert indices.tolist() == want_indices
    assert scores.tolist() == want_scores
    values = torch.zeros(8 * module.GROUP, 1, dtype=torch.float64)  # group maxima tied at the k-th group
    fives = torch.arange(8) * module.GROUP + module.GROUP - 1 - torch.arange(8)
    values[fives] = 5.0
    _, indices = top_k(torch.ones(3, 1, dtype=torch.float64), values, 3, column_chunk=8 * module.GROUP)
    assert indices.tolist() == [sorted(fives.tolist())[:3]] * 3


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


# ---------------------------------------------------------------- metrics


def naive_ranking_scores(predicted: list[list[int]], truths: list[list[int]], k: int) -> dict[str, float]:
    """Per-row loops straight from the definitions."""
    sums = {"map": 0.0, "recall": 0.0, "ndcg": 0.0, "mrr": 0.0, "precision": 0.0}
    rows = 0
    for ranked, truth_list in zip(predicted, truths, strict=True):
        truth = set(truth_list)
        if not truth:
            continue
        rows += 1
        seen, hits, precision_sum, dcg, first = set(), 0, 0.0, 0.0, 0.0
        for rank, item in enumerate(ranked[:k], start=1):
            if item != -1 and item in truth and item not in seen:
                hits += 1
                precision_sum += hits / rank
                dcg += 1 / math.log2(rank + 1)
                first = first or 1 / rank
            seen.add(item)
        ideal = sum(1 / math.log2(rank + 1) for rank in range(1, min(k, len(truth)) + 1))
        sums["map"] += precision_sum / min(k, len(truth))
        sums["recall"] += hits / len(truth)
        sums["ndcg"] += dcg / ideal
        sums["mrr"] += first
        sums["precision"] += hits / k
    out = {f"{name}@{k}" if name != "mrr" else name: value / rows for name, value in sums.items()}
    out["rows"] = rows
    return out


def random_ranking_case(seed: int, n: int = 300, items: int = 40, k: int = 10):
    """Predictions with -1 slots and repeats, truths with duplicates and empty rows."""
    rng = np.random.default_rng(seed)
    predicted = rng.integers(-1, items, (n, k))
    truths = [rng.integers(0, items, rng.integers(0, 15)).tolist() for _ in range(n)]
    offsets = np.concatenate([[0], np.cumsum([len(t) for t in truths])])
    ids = np.array([i for t in truths for i in t], dtype=np.int64)
    return predicted, truths, offsets, ids


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("k", [1, 5, 10, 14])
def test_ranking_scores_match_naive_loops(seed, k):
    from relsql.train.ranking.metrics import ranking_scores

    predicted, truths, offsets, ids = random_ranking_case(seed)
    got = ranking_scores(predicted, offsets, ids, k)
    want = naive_ranking_scores(np.pad(predicted, ((0, 0), (0, max(0, k - 10))), constant_values=-1).tolist(), truths, k)
    assert got.keys() == want.keys()
    assert got["rows"] == want["rows"] < len(truths)  # some rows have no truth and are skipped
    for name in want:
        assert got[name] == pytest.approx(want[name], rel=1e-12), name


def test_ranking_scores_worked_example_and_duplicates():
    from relsql.train.ranking.metrics import ranking_scores

    # row 0: truth {1, 2, 3} (2 listed twice), ranked [1, 9, 2]: hits at ranks 1 and 3
    # row 1: truth {5}, ranked [7, 5, 5]: the repeated 5 counts once
    got = ranking_scores(np.array([[1, 9, 2], [7, 5, 5]]), np.array([0, 4, 5]), np.array([1, 2, 3, 2, 5]), 3)
    map0, map1 = (1 + 2 / 3) / 3, (1 / 2) / 1
    ndcg0 = (1 + 1 / math.log2(4)) / (1 + 1 / math.log2(3) + 1 / math.log2(4))
    ndcg1 = (1 / math.log2(3)) / 1
    assert got["map@3"] == pytest.approx((map0 + map1) / 2)
    assert got["recall@3"] == pytest.approx((2 / 3 + 1) / 2)
    assert got["ndcg@3"] == pytest.approx((ndcg0 + ndcg1) / 2)
    assert got["mrr"] == pytest.approx((1 + 1 / 2) / 2)
    assert got["precision@3"] == pytest.approx((2 / 3 + 1 / 3) / 2)
    assert got["rows"] == 2


def test_ranking_scores_map_equals_relbench():
    from relbench.metrics import map as relbench_map

    from relsql.train.ranking.metrics import ranking_scores

    rng = np.random.default_rng(4)
    n, items, k = 500, 60, 10
    predicted = np.stack([rng.permutation(items)[:k] for _ in range(n)])  # distinct ids per row, as top_k gives
    truths = [rng.choice(items, rng.integers(0, 20), replace=False) for _ in range(n)]
    offsets = np.concatenate([[0], np.cumsum([len(t) for t in truths])])
    pred_isin = np.stack([np.isin(p, t) for p, t in zip(predicted, truths, strict=True)])
    dst_count = np.array([len(t) for t in truths])
    got = ranking_scores(predicted, offsets, np.concatenate(truths).astype(np.int64), k)
    assert got[f"map@{k}"] == pytest.approx(float(relbench_map(pred_isin, dst_count)), rel=1e-12)
    assert got["rows"] == int((dst_count > 0).sum())


def test_ranking_scores_ndcg_equals_sklearn():
    from sklearn.metrics import ndcg_score

    from relsql.train.ranking.metrics import ranking_scores

    # Binary relevance over a universe of items, strictly ordered scores: sklearn's ideal DCG is the
    # one over min(k, |truth|) hits, as ours.
    rng = np.random.default_rng(5)
    n, items, k = 200, 50, 10
    scores = rng.normal(size=(n, items))
    relevant = rng.random((n, items)) < 0.15
    relevant[relevant.sum(1) == 0, 0] = True
    predicted = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    offsets = np.concatenate([[0], np.cumsum(relevant.sum(1))])
    ids = np.concatenate([np.flatnonzero(row) for row in relevant])
    got = ranking_scores(predicted, offsets, ids, k)
    assert got[f"ndcg@{k}"] == pytest.approx(ndcg_score(relevant.astype(float), scores, k=k), rel=1e-12)


def test_judge_prepared_once_scores_several_rankings_like_naive_loops():
    """Validation judges one truth several times (one ranking per blend share): each call matches the
    naive loops, including ids outside every truth, large ids and rankings with repeats."""
    from relsql.train.ranking.metrics import Judge

    _, truths, offsets, ids = random_ranking_case(3, items=40)
    judge = Judge(offsets, ids * 10**12, 10)
    for seed in range(4):
        predicted = np.random.default_rng(seed).integers(-1, 60, (len(truths), 10))
        predicted = np.where(predicted >= 0, predicted * 10**12, -1)  # ids 40..59 are in no truth
        got = judge(predicted)
        want = naive_ranking_scores(predicted.tolist(), [[i * 10**12 for i in t] for t in truths], 10)
        for name in want:
            assert got[name] == pytest.approx(want[name], rel=1e-12), (seed, name)


def test_ranking_scores_edge_cases_and_bad_input():
    from relsql.train.ranking.metrics import ranking_scores

    empty = ranking_scores(np.array([[1, 2]]), np.array([0, 0]), np.array([], dtype=np.int64), 2)
    assert empty["rows"] == 0 and math.isnan(empty["map@2"])
    short = ranking_scores(np.array([[4]]), np.array([0, 2]), np.array([4, 6]), 3)  # one column for k=3: padded
    assert short["precision@3"] == pytest.approx(1 / 3) and short["map@3"] == pytest.approx(1 / 2)
    with pytest.raises(RelsqlError, match="k >= 1"):
        ranking_scores(np.array([[1]]), np.array([0, 1]), np.array([1]), 0)
    with pytest.raises(RelsqlError, match="2 integers"):
        ranking_scores(np.array([[1]]), np.array([0, 1, 1]), np.array([1]), 1)
    with pytest.raises(RelsqlError, match="end at len"):
        ranking_scores(np.array([[1]]), np.array([0, 3]), np.array([1]), 1)


# ---------------------------------------------------------------- negatives


def test_uniform_negatives_are_seeded_in_range_with_log_q():
    from relsql.train.ranking.negatives import sample_negatives

    first, log_q = sample_negatives("uniform", 5000, 37, torch.Generator().manual_seed(1))
    again, _ = sample_negatives("uniform", 5000, 37, torch.Generator().manual_seed(1))
    other, _ = sample_negatives("uniform", 5000, 37, torch.Generator().manual_seed(2))
    assert first.dtype == torch.long and first.shape == (5000,)
    assert torch.equal(first, again) and not torch.equal(first, other)
    assert first.min() >= 0 and first.max() == 36
    assert torch.allclose(log_q, torch.full((5000,), -math.log(37)))
    assert sample_negatives("uniform", 0, 5, torch.Generator())[0].shape == (0,)


def test_popularity_negatives_follow_count_to_the_three_quarters():
    from relsql.train.ranking.negatives import sample_negatives

    counts = torch.tensor([0.0, 1.0, 16.0, 81.0, 0.0, 256.0])
    weights = np.array([1, 1, 8, 27, 1, 64], dtype=np.float64)  # max(count, 1) ** 0.75
    want = weights / weights.sum()
    generator = torch.Generator().manual_seed(3)
    drawn, log_q = sample_negatives("popularity", 200_000, 6, generator, popularity=counts)
    frequency = np.bincount(drawn.numpy(), minlength=6) / 200_000
    assert np.abs(frequency - want).max() < 0.005  # about 5 standard errors at these sizes
    assert frequency.min() > 0  # never-seen candidates are still drawn
    assert np.allclose(log_q.double().numpy(), np.log(want)[drawn.numpy()], atol=1e-6)
    again, _ = sample_negatives("popularity", 200_000, 6, torch.Generator().manual_seed(3), popularity=counts)
    assert torch.equal(drawn, again)


@pytest.mark.parametrize(
    "kind,kwargs,message",
    [
        ("hard", {}, "'uniform', 'popularity', 'in-batch'"),
        ("in-batch", {}, "in_batch_softmax"),
        ("popularity", {}, "needs popularity="),
        ("popularity", {"popularity": torch.ones(3)}, "4 counts"),
        ("popularity", {"popularity": torch.tensor([1.0, -1.0, 2.0, 0.0])}, ">= 0"),
    ],
)
def test_negatives_bad_input_names_the_fix(kind, kwargs, message):
    from relsql.train.ranking.negatives import sample_negatives

    with pytest.raises(RelsqlError, match=message):
        sample_negatives(kind, 10, 4, torch.Generator(), **kwargs)
    with pytest.raises(RelsqlError, match="nothing to draw"):
        sample_negatives("uniform", 10, 0, torch.Generator())


# ---------------------------------------------------------------- losses


def naive_loss(kind: str, positive: list[float], negative: list[list[float]], log_q: list[list[float]] | None = None) -> float:
    """The losses from their formulas, one positive at a time."""
    def sigmoid(x: float) -> float:
        return 1 / (1 + math.exp(-x))

    total = 0.0
    for i, p in enumerate(positive):
        negatives = negative[i]
        if kind == "bce":
            total += -math.log(sigmoid(p)) + sum(-math.log(1 - sigmoid(n)) for n in negatives) / len(negatives)
        elif kind == "bpr":
            total += sum(-math.log(sigmoid(p - n)) for n in negatives) / len(negatives)
        else:
            shift = [0.0] * len(negatives)
            if log_q:  # log q_j + log mean_k(1 / q_k)
                centre = math.log(sum(math.exp(-v) for v in log_q[i]) / len(log_q[i]))
                shift = [v + centre for v in log_q[i]]
            logits = [p] + [n - shift[j] for j, n in enumerate(negatives)]
            total += -(p - math.log(sum(math.exp(v) for v in logits)))
    return total / len(positive)


@pytest.mark.parametrize("kind", ["bce", "bpr", "softmax"])
def test_ranking_losses_match_their_formulas(kind):
    from relsql.train.ranking.losses import ranking_loss

    generator = torch.Generator().manual_seed(6)
    positive = torch.randn(7, generator=generator, dtype=torch.float64, requires_grad=True)
    negative = torch.randn(7, 5, generator=generator, dtype=torch.float64, requires_grad=True)
    loss = ranking_loss(kind, positive, negative)
    assert loss.dim() == 0
    assert float(loss.detach()) == pytest.approx(naive_loss(kind, positive.tolist(), negative.tolist()), rel=1e-12)
    loss.backward()
    assert torch.isfinite(positive.grad).all() and torch.isfinite(negative.grad).all()
    assert (positive.grad < 0).all()  # raising a positive's score always lowers each of these losses
    shared = negative[0].detach()
    assert float(ranking_loss(kind, positive, shared).detach()) == pytest.approx(
        naive_loss(kind, positive.tolist(), [shared.tolist()] * 7), rel=1e-12)


def test_sampled_softmax_log_q_correction():
    from relsql.train.ranking.losses import ranking_loss

    generator = torch.Generator().manual_seed(7)
    positive = torch.randn(6, generator=generator, dtype=torch.float64)
    negative = torch.randn(6, 4, generator=generator, dtype=torch.float64)
    log_q = torch.log(torch.rand(4, generator=generator, dtype=torch.float64))
    got = ranking_loss("softmax", positive, negative, log_q=log_q)
    assert float(got) == pytest.approx(naive_loss("softmax", positive.tolist(), negative.tolist(), [log_q.tolist()] * 6),
                                       rel=1e-12)
    assert float(got) != pytest.approx(float(ranking_loss("softmax", positive, negative)))
    for constant in (0.0, -math.log(1000.0), 3.5):  # uniform sampling: the correction is no correction
        for shape in ((4,), (6, 4)):
            flat = torch.full(shape, constant, dtype=torch.float64)
            assert float(ranking_loss("softmax", positive, negative, log_q=flat)) == pytest.approx(
                float(ranking_loss("softmax", positive, negative)), rel=1e-14)
    per_row = log_q[None, :].expand(6, 4) + torch.arange(6, dtype=torch.float64)[:, None]  # a per-row constant changes nothing
    assert float(ranking_loss("softmax", positive, negative, log_q=per_row)) == pytest.approx(float(got), rel=1e-14)


def test_in_batch_softmax_and_loss_errors():
    from relsql.train.ranking.losses import in_batch_softmax, ranking_loss

    generator = torch.Generator().manual_seed(8)
    query = torch.randn(5, 3, generator=generator, dtype=torch.float64, requires_grad=True)
    item = torch.randn(5, 3, generator=generator, dtype=torch.float64, requires_grad=True)
    loss = in_batch_softmax(query, item)
    scores = (query @ item.T).tolist()
    want = sum(math.log(sum(math.exp(v) for v in row)) - row[i] for i, row in enumerate(scores)) / 5
    assert float(loss.detach()) == pytest.approx(want, rel=1e-12)
    loss.backward()
    assert torch.isfinite(query.grad).all() and torch.isfinite(item.grad).all()
    positive, negative = torch.zeros(3), torch.zeros(3, 2)
    with pytest.raises(RelsqlError, match="'bce', 'bpr', 'softmax'"):
        ranking_loss("hinge", positive, negative)
    with pytest.raises(RelsqlError, match="sampled softmax only"):
        ranking_loss("bpr", positive, negative, log_q=torch.zeros(2))
    with pytest.raises(RelsqlError, match="at least one sample"):
        ranking_loss("bce", positive, torch.zeros(4, 2))
    with pytest.raises(RelsqlError, match="log_q must be"):
        ranking_loss("softmax", positive, negative, log_q=torch.zeros(3))
    with pytest.raises(RelsqlError, match="batch, dimension"):
        in_batch_softmax(torch.zeros(4, 3), torch.zeros(5, 3))


def test_ranking_batch_takes_several_steps_only_where_rows_are_fewer_than_a_step():
    from relsql.train.learner.defaults import RANKING_BATCH, RANKING_MIN_BATCH, ranking_batch

    assert ranking_batch(9400) == ranking_batch(RANKING_BATCH) == RANKING_BATCH
    assert ranking_batch(974) == RANKING_MIN_BATCH  # 4 steps of 244 would be under the minimum
    assert ranking_batch(3000) == 750 and -(-3000 // 750) == 4
    assert ranking_batch(10) == RANKING_MIN_BATCH
