"""The dense_small_matrices pass (relsql/compile/passes/dense_small_matrices.py): what it changes in a plan, with the plain
plan's values and gradients (tests/test_passes.py runs every pass alone and together on the
template corpus)."""

from __future__ import annotations

import torch

import relsql
from relsql.compile.passes import RULES
from tests.plan_check import assert_same, matrices, run


def test_small_matrices_are_dense_and_large_ones_stay_sparse(neuralogic_mutagenesis, random_graphs):
    from relsql.compile.costs import CPU

    db, dataset = neuralogic_mutagenesis
    template = relsql.Template.from_file(dataset.template.parent / "template_graphlets.txt")
    without = tuple(rule for rule in RULES if rule.__name__ != "dense_small_matrices")
    reference, sparse_only, dense = run(template, db, ()), run(template, db, without), run(template, db, None)
    assert_same(reference, dense, "graphlets with small dense matrices")
    assert all(m.layout == torch.sparse_csr for m in matrices(sparse_only[2]))
    small = matrices(dense[2])
    assert small and all(m.layout == torch.strided and m.shape[0] * m.shape[1] <= CPU.dense_limit for m in small)
    assert all(torch.equal(a.to_dense(), b) for a, b in zip(matrices(sparse_only[2]), small))

    gcn = relsql.Template.from_file(relsql.sql_templates.path("gcn"))
    large = matrices(run(gcn, random_graphs, None)[2])
    assert large and all(m.layout == torch.sparse_csr for m in large if m.shape[0] * m.shape[1] > CPU.dense_limit)
    assert any(m.shape[0] * m.shape[1] > CPU.dense_limit for m in large)
