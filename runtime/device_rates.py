"""The device's own rates, measured in seconds: what a hardware profile's physical quantities are
(hbm_bandwidth, peak_flops, h2d_bandwidth, d2h_bandwidth, memory_bytes), so a profile never
carries a bandwidth above what the device copies or a FLOP rate above what its GEMM reaches.
The copy rate is runtime/machine.py's, measured anew: the rate every run's HBM-floor share
divides by, so a profile and a report mean the same bandwidth.

On CUDA each rate is timed with CUDA events around back-to-back repetitions, the best of a few
rounds (the rate the device can reach, as a datasheet states it). On a CPU the same operations
are timed with the wall clock: a smoke test, not a profile (no host-device copies there).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from .machine import read_machine

PINNED_BYTES = 256 << 20  # host <-> device over the bus
GEMM_N = 8192  # a square bf16 matmul: the compute-bound rate
ROUNDS = 5
REPS = 10


def _best_seconds(device: torch.device, body: Callable[[], object], reps: int) -> float:
    """The fastest of ROUNDS rounds of ``reps`` calls, per call (after one warm-up call)."""
    body()
    best = float("inf")
    for _ in range(ROUNDS):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(reps):
                body()
            end.record()
            end.synchronize()
            seconds = start.elapsed_time(end) / 1e3
        else:
            t0 = time.perf_counter()
            for _ in range(reps):
                body()
            seconds = time.perf_counter() - t0
        best = min(best, seconds / reps)
    return best


def gemm_flops(device: torch.device, n: int = GEMM_N) -> float:
    """A bf16 n x n x n matmul on random data (float32 on a CPU), FLOP/s."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    a = torch.randn(n, n, dtype=dtype, device=device)
    b = torch.randn(n, n, dtype=dtype, device=device)
    out = torch.empty(n, n, dtype=dtype, device=device)
    seconds = _best_seconds(device, lambda: torch.matmul(a, b, out=out), REPS)
    return 2.0 * n**3 / seconds


def pinned_bandwidths(device: torch.device, nbytes: int = PINNED_BYTES) -> tuple[float, float]:
    """Pinned host -> device and device -> host copies, bytes/s each way."""
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(nbytes, dtype=torch.uint8, device=device)
    h2d = _best_seconds(device, lambda: dev.copy_(host, non_blocking=True), 3)
    d2h = _best_seconds(device, lambda: host.copy_(dev, non_blocking=True), 3)
    return nbytes / h2d, nbytes / d2h


def measure_rates(device: torch.device, small: bool = False) -> dict[str, Any]:
    """The device's rates and facts; ``small``: short sizes for a smoke test (a CPU run)."""
    info = read_machine(device, refresh=True)
    out: dict[str, Any] = {
        "device_name": info.get("name", "cpu"),
        "hbm_bandwidth": info.get("copy_bytes_per_s"),
        "peak_flops": gemm_flops(device, 256 if small else GEMM_N),
        "info": info,
    }
    if device.type == "cuda":
        out["h2d_bandwidth"], out["d2h_bandwidth"] = pinned_bandwidths(device)
        out["memory_bytes"] = float(info["memory_bytes"])
        torch.cuda.empty_cache()
    return out
