"""The optimizer's cost constants, for the device a plan will run on.

Two passes decide by constants rather than by timing each case: `linear_across_sparse` (what
one element of a sparse product or gather costs, in dense multiply-adds) and
`dense_small_matrices` (up to how many multiply-adds a small constant matrix is multiplied
densely). On CPU they were measured on these cores and stay fixed, so a plan is the same from
run to run. On any other device (CUDA) the balance is different — dense products are far
cheaper there relative to scattered memory access — so the constants are measured once per
process on that device, with the same two experiments.
"""

from __future__ import annotations

import functools
import time
import warnings
from dataclasses import dataclass

import torch

from relsql.compile import sparse


@dataclass(frozen=True)
class Costs:
    sparse_element: float  # dense GEMM multiply-adds per sparse-matmul or gathered element
    dense_limit: int  # multiply-adds up to which a constant matrix's product runs dense
    measured: bool = False


CPU = Costs(sparse_element=25.0, dense_limit=1 << 17)  # measured on these 2 cores (see the passes' docstrings)


def for_device(device: str | torch.device) -> Costs:
    """The constants for plans that run on `device`."""
    kind = torch.device(device).type
    return CPU if kind == "cpu" else measure(kind)


def synchronize(device: str | torch.device) -> None:
    """Wait for the device's queued work (CUDA runs asynchronously: a timer must wait)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def seconds(step, device: str | torch.device, repeats: int = 5) -> float:
    """Median wall time of `step` on `device` after one warm-up run (CUDA synchronized)."""
    step()
    synchronize(device)
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        step()
        synchronize(device)
        times.append(time.perf_counter() - started)
    return sorted(times)[repeats // 2]


@functools.cache
def measure(device: str) -> Costs:
    """Both constants timed on `device`: a 160k-entry CSR product against a GEMM (per element
    and per multiply-add), and a small sparse product against its dense form at growing sizes."""
    generator = torch.Generator().manual_seed(0)
    rows, degree, width = 40_000, 4, 64  # GPU timings of this size are launch-bound: the median of 5 runs
    cols = torch.randint(0, rows, (rows * degree,), generator=generator)
    crow = torch.arange(0, rows * degree + 1, degree)
    matrix = sparse.from_csr(crow, cols, torch.rand(rows * degree, generator=generator), (rows, rows)).to(device, torch.float32)
    x = torch.rand(rows, width, generator=generator).to(device)
    w = torch.rand(width, width, generator=generator).to(device)
    per_element = seconds(lambda: torch.sparse.mm(matrix, x), device) / (rows * degree * width)
    per_multiply_add = seconds(lambda: x @ w, device) / (rows * width * width)
    sparse_element = max(1.0, per_element / max(per_multiply_add, 1e-15))
    dense_limit = 1 << 12
    for n in (64, 128, 256, 512, 1024):  # square constant matrices at ~5% density, width 32, forward + backward
        small = torch.rand(n, n, generator=generator, dtype=torch.float64)
        small = small * (small > 0.95)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
            as_csr, flipped = sparse.moved(sparse.compact(small.to_sparse_csr()), device, torch.float32)
        dense = small.to(device, torch.float32)
        y = torch.rand(n, 32, generator=generator).to(device).requires_grad_()
        as_dense = seconds(lambda: sparse.matmul(dense, y).sum().backward(), device)  # noqa: B023
        if as_dense <= seconds(lambda: sparse.matmul(as_csr, y, flipped).sum().backward(), device):  # noqa: B023
            dense_limit = n * n * 32
    return Costs(sparse_element=sparse_element, dense_limit=dense_limit, measured=True)
