"""GEMMs of a few rows (decode steps) as one Triton kernel that streams the weight at the copy rate.

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
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

BLOCK_NS = (64, 32, 16)  # the column tiles a rule picks from, widest first


@dataclass(frozen=True)
class SkinnyLaunch:
    """A launch of the kernel: tile sizes, pipeline depth and warps."""

    block_n: int = 32
    block_k: int = 128
    stages: int = 4
    warps: int = 4


@dataclass(frozen=True)
class SkinnyRule:
    """Which calls take the kernel and how it launches (mode.skinny_gemm on ``sms`` SMs)."""

    max_rows: int
    block_k: int
    stages: int
    warps: int
    programs_per_sm: float
    sms: int

    @classmethod
    def of(cls, config, sms: int) -> SkinnyRule:
        """From a mode.skinny_gemm config (any object with its fields)."""
        keys = ("max_rows", "block_k", "stages", "warps", "programs_per_sm")
        return cls(**{k: getattr(config, k) for k in keys}, sms=sms)

    @classmethod
    def for_device(cls, config, device: torch.device) -> SkinnyRule | None:
        """mode.skinny_gemm's rule on this GPU; None where it is off or cannot run (a CPU)."""
        if not config.enabled or device.type != "cuda":
            return None
        return cls.of(config, torch.cuda.get_device_properties(device).multi_processor_count)

    def launch(self, n: int, k: int) -> SkinnyLaunch | None:
        """The widest column tile that still gives each SM ``programs_per_sm`` programs (the
        narrowest that divides ``n`` where none does); None where no tile fits the shape."""
        if k % self.block_k:
            return None
        fits = [b for b in BLOCK_NS if n % b == 0]
        if not fits:
            return None
        wide = [b for b in fits if n // b >= self.programs_per_sm * self.sms]
        return SkinnyLaunch(wide[0] if wide else fits[-1], self.block_k, self.stages, self.warps)


_active: SkinnyRule | None = None


@contextmanager
def skinny_gemms(rule: SkinnyRule | None) -> Iterator[None]:
    """The GEMMs that ``maybe_skinny`` is offered inside run on the kernel under ``rule`` (the
    decode graphs' warm-up and capture); None: every call keeps cuBLAS."""
    global _active
    before, _active = _active, rule
    try:
        yield
    finally:
        _active = before


def maybe_skinny(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    residual: torch.Tensor | None = None,
) -> torch.Tensor | None:
    """``skinny_linear`` where a rule is active and takes the call; None: the caller's cuBLAS."""
    rule = _active
    if rule is None or bias is not None:
        return None
    launch = rule.launch(*weight.shape)
    if launch is None or not skinny_ok(x, weight, launch, rule.max_rows):
        return None
    return skinny_linear(x, weight, launch, residual)


@functools.cache
def triton_skinny():
    from . import _triton_skinny_gemm

    return _triton_skinny_gemm


def skinny_ok(x: torch.Tensor, weight: torch.Tensor, launch: SkinnyLaunch, max_rows: int) -> bool:
    """Whether the kernel takes this call: a CUDA (or interpreted) bf16/fp16 GEMM of at most
    ``max_rows`` rows whose N and K divide into the launch's tiles."""
    if not (x.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"):
        return False
    n, k = weight.shape
    rows = x.numel() // max(x.shape[-1], 1)
    return (
        0 < rows <= max_rows
        and x.dtype == weight.dtype
        and x.dtype in (torch.bfloat16, torch.float16)
        and n % launch.block_n == 0
        and k % launch.block_k == 0
        and weight.stride(-1) == 1
        and x.stride(-1) == 1
    )


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
