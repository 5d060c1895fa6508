"""Structural classes (relsql/compile/compress.py) against plain-Python reference partitions."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from relsql.compile import compress


def partition(ids) -> set[frozenset[int]]:
    """The partition of positions that a list of class ids induces."""
    groups: dict = {}
    for position, key in enumerate(ids):
        groups.setdefault(key, set()).add(position)
    return {frozenset(g) for g in groups.values()}


def dense_ids(ids: torch.Tensor) -> bool:
    return ids.numel() == 0 or set(ids.tolist()) == set(range(int(ids.max()) + 1))


@pytest.mark.parametrize("seed", range(6))
def test_classes_of_rows(seed):
    g = torch.Generator().manual_seed(seed)
    rows = torch.randint(0, 3, (int(torch.randint(1, 400, (1,), generator=g)), 1 + seed % 4), generator=g).double()
    if seed % 2:
        rows[rows == 0] = -0.0  # equal to 0.0 under ==
    ids = compress.classes_of(rows)
    assert dense_ids(ids)
    assert partition(ids.tolist()) == partition([tuple(float(v) + 0.0 for v in r) for r in rows])


def test_classes_of_codes_and_large_ranges():
    codes = torch.tensor([10**15, 3, 10**15, -7, 3])
    assert partition(compress.classes_of(codes).tolist()) == partition(codes.tolist())
    small = torch.tensor([4, 2, 4, 9, 2, 2])  # the counting path
    ids = compress.dense(small)
    assert ids.tolist() == [1, 0, 1, 2, 0, 0]


@pytest.mark.parametrize("seed", range(4))
def test_combine_is_the_tuple_partition(seed):
    g = torch.Generator().manual_seed(seed)
    n = 300
    columns = [torch.randint(-1, 5, (n,), generator=g), torch.randint(0, 10**12, (n,), generator=g) % 7,
               torch.randint(0, 3, (n,), generator=g)]
    ids = compress.combine(columns, n)
    assert dense_ids(ids)
    assert partition(ids.tolist()) == partition(list(zip(*[c.tolist() for c in columns])))


@pytest.mark.parametrize("seed", range(4))
def test_segment_signatures_and_multiplicities(seed):
    g = torch.Generator().manual_seed(seed)
    segments, n = 60, 500
    seg = torch.sort(torch.randint(0, segments, (n,), generator=g))[0]
    cls = torch.randint(0, 4, (n,), generator=g)
    found = compress.pairs(seg, cls)
    signatures = compress.segment_signatures(found, segments)
    multisets = [frozenset(Counter(c for s, c in zip(seg.tolist(), cls.tolist()) if s == i).items()) for i in range(segments)]
    assert partition(signatures.tolist()) == partition(multisets)
    counts = torch.bincount(seg, minlength=segments)
    for average in (False, True):
        matrix = compress.multiplicity_matrix(found, counts, 4, average).to_dense()
        expected = torch.zeros(segments, 4, dtype=torch.float64)
        for s, c in zip(seg.tolist(), cls.tolist()):
            expected[s, c] += 1.0 / int(counts[s]) if average else 1.0
        assert torch.allclose(matrix, expected)


def test_a_hash_collision_falls_back_to_exact_classes(monkeypatch):
    rows = torch.tensor([[1.0, 2.0], [2.0, 1.0], [1.0, 2.0]])
    monkeypatch.setattr(compress, "_project", lambda r: torch.zeros(r.shape[0], dtype=torch.float64))  # everything collides
    assert partition(compress.classes_of(rows).tolist()) == {frozenset({0, 2}), frozenset({1})}
    seg, cls = torch.tensor([0, 0, 1, 1, 2]), torch.tensor([0, 1, 0, 2, 1])
    monkeypatch.setattr(compress, "_C1", 0)
    monkeypatch.setattr(compress, "_C2", 0)  # every element hashes alike
    assert (partition(compress.segment_signatures(compress.pairs(seg, cls), 3).tolist())
            == {frozenset({0}), frozenset({1}), frozenset({2})})


@pytest.mark.parametrize("seed", range(4))
def test_distinct_segments_only_answers_when_no_two_are_alike(seed):
    g = torch.Generator().manual_seed(seed)
    segments, n = 40, 200
    seg = torch.sort(torch.randint(0, segments, (n,), generator=g))[0]
    for classes in (3, 10**6):  # few classes: some segments alike; many: all different (almost surely)
        cls = torch.randint(0, classes, (n,), generator=g)
        multisets = [frozenset(Counter(c for s, c in zip(seg.tolist(), cls.tolist()) if s == i).items()) for i in range(segments)]
        found = compress.distinct_segments(seg, cls, segments)
        if len(set(multisets)) < segments:
            assert found is None
        else:
            assert found is not None and partition(found.tolist()) == partition(multisets)
    assert compress.distinct_segments(seg, seg * 7, segments) is not None  # each segment its own class
