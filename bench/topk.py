"""Exact chunked top-k (relsql.train.ranking.topk) at 100k query rows x 100k candidates.

    python -m bench.topk [--rows 100000 --candidates 100000 --dim 32 --k 10] [--naive-rows 10000] [--sweep]

Random float32 representations (seeded). Prints top_k's seconds and its peak RSS growth (the
score block plus the n x k answer), then the naive torch.topk(q @ c.T) on a --naive-rows slice,
extrapolated linearly to all rows, and whether the two agree on that slice. CPU seconds are
printed beside wall seconds: on a shared machine they show the work where the wall time shows the
neighbours too. --sweep also times a
few block shapes (rows x columns) on the slice, the measurement behind the default block.
Issue #30's target: 100k x 100k x top-10 in <= 30 s on 2 cores, memory bounded by the chunk.
Measured 2026-11-26 on the shared 2-core machine (load average 4.8 from other work): 27.8 s wall,
30.3 CPU s, peak RSS +98 MB (blocks of 167 x 100000); the naive torch.topk(q @ c.T) 52.7 s
extrapolated from 5,000 rows (0.53x), and 37 GB for its score matrix over all rows. With
--threads 1: 32.7 s wall, 16.1 CPU s.
"""

from __future__ import annotations

import argparse
import os
import resource
import time

import torch

from relsql.train.ranking import topk


def peak_rss_mb() -> float:
    """The process's peak resident set so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def timed(function):
    """(wall seconds, result) of one call; the CPU seconds of the last call are kept in CPU[0]."""
    start, cpu = time.perf_counter(), time.process_time()
    result = function()
    CPU[0] = time.process_time() - cpu
    return time.perf_counter() - start, result


CPU = [0.0]


def sweep(query: torch.Tensor, candidates: torch.Tensor, k: int) -> None:
    """Wall and CPU seconds per 10^10 scores for a few block shapes, extrapolated from the slice."""
    print(f"{'block rows x columns':>22s} {'MB':>5s} {'s per 1e10 scores':>18s} {'CPU s per 1e10':>15s}")
    per = 1e10 / (query.shape[0] * candidates.shape[0])
    for rows, columns in [(256, 2048), (1024, 8192), (2048, 8192), (1024, 16384), (512, 32768), (256, 65536), (128, 131072),
                          (64, 131072), (512, 65536)]:
        seconds, _ = timed(lambda r=rows, c=columns: topk.top_k(query, candidates, k, row_chunk=r, column_chunk=c))
        print(f"{rows:>10d} x {columns:<10d} {rows * columns * 4 / 2**20:5.0f} {seconds * per:18.1f} {CPU[0] * per:15.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--candidates", type=int, default=100_000)
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--naive-rows", type=int, default=10_000)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's own, 2 here)")
    parser.add_argument("--sweep", action="store_true")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    generator = torch.Generator().manual_seed(0)
    query = torch.randn(args.rows, args.dim, generator=generator)
    candidates = torch.randn(args.candidates, args.dim, generator=generator)
    print(f"{args.rows:,} rows x {args.candidates:,} candidates, dim {args.dim}, k {args.k}, "
          f"{torch.get_num_threads()} threads, load average {os.getloadavg()[0]:.1f}")
    columns = min(args.candidates, topk.COLUMN_CHUNK)
    print(f"default block {topk.BLOCK_BYTES // (4 * columns)} x {columns} ({topk.BLOCK_BYTES / 2**20:.0f} MB of float32 scores)")
    before = peak_rss_mb()
    seconds, (scores, indices) = timed(lambda: topk.top_k(query, candidates, args.k))
    growth = peak_rss_mb() - before
    print(f"top_k:  {seconds:8.1f} s ({CPU[0]:.1f} CPU s)   peak RSS growth {growth:7.0f} MB "
          f"(answer alone {scores.nbytes + indices.nbytes >> 20} MB)")
    part = query[: args.naive_rows]
    naive_seconds, naive = timed(lambda: torch.topk(part @ candidates.T, args.k, dim=1))
    scale = args.rows / part.shape[0]
    print(f"naive:  {naive_seconds * scale:8.1f} s ({CPU[0] * scale:.1f} CPU s)   "
          f"extrapolated from {part.shape[0]:,} rows ({naive_seconds:.2f} s), "
          f"its score matrix alone {part.shape[0] * args.candidates * 4 >> 20} MB "
          f"({args.rows * args.candidates * 4 >> 30} GB for all rows)")
    print(f"top_k / naive time: {seconds / (naive_seconds * scale):.2f}")
    same = (indices[: part.shape[0]] == naive.indices).float().mean().item()
    close = torch.allclose(scores[: part.shape[0]], naive.values, atol=1e-4)
    print(f"agreement on the slice: {same:.4%} of indices equal (float32 near-ties may swap), scores allclose {close}")
    if args.sweep:
        sweep(part, candidates, args.k)


if __name__ == "__main__":
    main()
