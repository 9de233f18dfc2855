"""A candidate GEMM for decode's few rows, measured by bench_kernels' ``skinny`` section (the
runtime keeps cuBLAS: on the H100 this kernel is within 5% of it on every 8B decode GEMM, and the
8B decode step at 32 took 7.50 ms with it in the graphs against 6.73 ms without,
experiments/benchmarks/h100/skinny_gemm.txt).

At 16-128 rows a decode GEMM reads its weight once and computes little: its time is the weight's
bytes over the memory bandwidth. cuBLAS reaches 77% of the copy rate on the 8B's q/k/v and o
GEMMs at 32 rows and 41-68% on the 1B's at 128 (the H100's kernel tables), as its tiles leave
SMs idle when N is small. Here a program owns ``block_n`` output columns of up to ``block_m``
rows and streams their weight rows once, K in ``block_k`` slices; ``block_n`` small enough that
the programs fill the GPU. A residual is added in fp32 before the one rounding, as cuBLAS's
``addmm_`` with beta = 1 does (mode.fuse_epilogues).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SkinnyLaunch:
    """A launch of the kernel: tile sizes, pipeline depth and warps."""

    block_n: int = 32
    block_k: int = 128
    stages: int = 4
    warps: int = 4


@functools.cache
def triton_skinny():
    from benchmarks.decode import _triton_skinny

    return _triton_skinny


def block_m(rows: int) -> int:
    """The row tile: the next power of two of ``rows``, 16 at least (tl.dot's smallest), 128 at
    most (more rows take more programs)."""
    return min(128, max(16, 1 << (rows - 1).bit_length()))


def skinny_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    launch: SkinnyLaunch,
    residual: torch.Tensor | None = None,
) -> torch.Tensor:
    """x @ weight.T for x [..., K] and weight [N, K]; with ``residual`` [..., N] (contiguous)
    the product is added into it and it is returned."""
    n, k = weight.shape
    x2 = x.reshape(-1, k)
    rows = x2.shape[0]
    if residual is not None:
        out = residual.view(-1, n)
        res = out
    else:
        out = torch.empty((rows, n), dtype=x.dtype, device=x.device)
        res = out  # not read: HAS_RES is off
    bm = block_m(rows)
    grid = (n // launch.block_n, -(-rows // bm))
    triton_skinny()._skinny_gemm_kernel[grid](
        x2, weight, out, res, rows, k, x2.stride(0), weight.stride(0), out.stride(0),
        res.stride(0), HAS_RES=residual is not None, BM=bm, BN=launch.block_n,
        BK=launch.block_k, num_stages=launch.stages, num_warps=launch.warps,
    )  # fmt: skip
    return out.view(*x.shape[:-1], n)
