"""Optimizer passes, each a function plan -> plan, applied in order (sqlglot-style RULES).

Every pass keeps values and gradients identical to the unoptimized plan (tests/test_passes.py
checks each one alone and all together); switch any off by passing your own tuple to
`relsql.compile(..., passes=...)`.
"""

from __future__ import annotations

from collections.abc import Callable

from relsql.compile.passes.average_from_sum import average_from_sum
from relsql.compile.passes.choose_segment_kernels import choose_segment_kernels
from relsql.compile.passes.common_subexpressions import common_subexpressions
from relsql.compile.passes.dead_code import dead_code
from relsql.compile.passes.deduplicate_rows import deduplicate_rows
from relsql.compile.passes.dense_small_matrices import dense_small_matrices
from relsql.compile.passes.distribute_aggregation import distribute_aggregation
from relsql.compile.passes.fold_constants import fold_constants
from relsql.compile.passes.fuse_affine import fuse_affine
from relsql.compile.passes.gather_into_sparse import gather_into_sparse
from relsql.compile.passes.identity_gather import identity_gather
from relsql.compile.passes.inplace_activations import inplace_activations
from relsql.compile.passes.linear_across_aggregation import linear_across_aggregation
from relsql.compile.passes.linear_across_sparse import linear_across_sparse
from relsql.compile.passes.merge_sparse_sums import merge_sparse_sums
from relsql.compile.passes.propagate_gathers import propagate_gathers
from relsql.compile.passes.reorder_rows import reorder_rows
from relsql.compile.passes.scatter_into_sparse import scatter_into_sparse, scatter_through_weights
from relsql.compile.passes.shared_aggregation import shared_aggregation
from relsql.compile.passes.sparse_aggregate import sparse_aggregate
from relsql.compile.passes.sparse_attention import sparse_attention
from relsql.compile.passes.sparse_backward import sparse_backward
from relsql.compile.passes.stack_narrow_linears import stack_narrow_linears
from relsql.compile.passes.stack_products import stack_products
from relsql.compile.passes.stack_scatters import stack_scatters
from relsql.compile.passes.stack_weights import stack_weights
from relsql.compile.passes.uniform_segments import uniform_segments
from relsql.compile.passes.unit_factors import unit_factors
from relsql.compile.plan import Plan

Pass = Callable[[Plan], Plan]


def compress_groundings(plan: Plan) -> Plan:
    """Isomorphic compression (relsql/compile/compress.py) happens while the plan is built:
    its presence in the pass tuple switches it on; as a pass over a built plan it does nothing."""
    return plan


RULES: tuple[Pass, ...] = (
    compress_groundings,
    deduplicate_rows,
    identity_gather,
    distribute_aggregation,
    linear_across_aggregation,
    propagate_gathers,
    common_subexpressions,
    average_from_sum,
    sparse_aggregate,
    scatter_into_sparse,
    linear_across_sparse,
    linear_across_aggregation,  # again: weights the sparse pass moved out may pass a pooling
    gather_into_sparse,
    sparse_attention,
    merge_sparse_sums,
    stack_scatters,
    scatter_through_weights,
    linear_across_aggregation,  # and again: a weight the scatter hid may now pass a pooling
    shared_aggregation,
    uniform_segments,
    choose_segment_kernels,
    stack_products,
    fuse_affine,
    fold_constants,
    identity_gather,  # again: folding and pulling gathers leave some that keep every row
    unit_factors,
    stack_weights,
    stack_narrow_linears,
    dense_small_matrices,
    reorder_rows,  # before sparse_backward, which transposes the renumbered matrices
    sparse_backward,
    inplace_activations,
    dead_code,
)


def optimize(plan: Plan, passes: tuple[Pass, ...] | None = None) -> Plan:
    """Run `passes` (default: RULES) over the plan; each pass must keep values identical."""
    for rule in RULES if passes is None else passes:
        plan = rule(plan)
    return plan
