"""compress._project, computed a block of rows at a time: every row's number is the naive
sequential float64 sum of its columns times the seeded weights, in column order, whatever block
the row falls in; so equal rows project equally across blocks."""

import torch

from relsql.compile import compress


def _naive(rows: torch.Tensor) -> list[float]:
    weights = torch.randn(rows.shape[1], dtype=torch.float64, generator=torch.Generator().manual_seed(0)).tolist()
    out = []
    for row in rows.to(torch.float64).tolist():
        total = row[0] * weights[0]  # Python floats: IEEE float64, one rounding per operation
        for value, weight in zip(row[1:], weights[1:]):
            total = total + value * weight
        out.append(total)
    return out


def test_project_equals_the_naive_sum_across_blocks():
    g = torch.Generator().manual_seed(3)
    rows = torch.randn((9000, 7), generator=g).to(torch.float32)  # 9000 rows: three blocks of at least 4096
    rows[8999] = rows[5]  # equal rows in the first and the last block
    rows[4100] = rows[5]
    got = compress._project(rows)
    assert got.dtype == torch.float64 and got.shape == (9000,)
    assert got.tolist() == _naive(rows)  # bit for bit
    assert got[8999] == got[5] == got[4100]


def test_project_of_a_strided_view_and_edge_shapes():
    g = torch.Generator().manual_seed(4)
    wide = torch.randn((5000, 12), generator=g, dtype=torch.float64)
    view = wide[:, ::3]  # a non-contiguous view
    assert compress._project(view).tolist() == _naive(view)
    one = torch.tensor([[1.5, -2.0, 0.25]])
    assert compress._project(one).tolist() == _naive(one)
    assert compress._project(torch.empty((0, 4))).shape == (0,)


def test_classes_of_wide_rows_spanning_blocks():
    g = torch.Generator().manual_seed(5)
    base = torch.randint(0, 3, (6, 40), generator=g).to(torch.float32)
    pick = torch.randint(0, 6, (12000,), generator=g)
    rows = base[pick]
    classes = compress.classes_of(rows)
    # naive: rows are alike exactly when they are the same base row (the bases are distinct)
    assert len({tuple(r) for r in base.tolist()}) == 6
    same = classes[:, None] == classes[None, :200]
    assert torch.equal(same, pick[:, None] == pick[None, :200])
