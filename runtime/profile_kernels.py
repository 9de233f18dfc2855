"""Time the kernels a forward step is made of into a kernel table (cbsim/costs/kernel_table.py).

``python -m cbsim +experiment=profile_kernels mode=runtime model=llama3_8b`` (conf/experiment/
profile_kernels.yaml documents the grid under ``extra``). Each kernel is called as the runtime calls
it (the GEMMs of the model's projection shapes, fused as ``mode.fuse_projections`` fuses them, on
``mode.blas`` and, at the decode graphs' rows, on ``mode.graph_blas``;
the Triton paged decode-attention kernel; the prefill-chunk attention of runtime/attention.py; the
Triton RMSNorm and RoPE kernels; SiLU x up, residual add, argmax, the KV-cache write; pinned copies),
captured ``reps`` times back to back in a CUDA graph and replayed between two CUDA events, so a
call's time is what it costs inside a replayed graph. Weights and KV caches rotate over enough
copies that the next call never finds its operand in L2, as in a forward where every layer has its
own. On a CPU (tests) the same grid runs with torch fallbacks and wall-clock timing.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from cbsim.config.errors import ConfigError
from cbsim.config.schema import CbsimConfig
from cbsim.costs.decode_kernel import launch_name
from cbsim.costs.kernel_table import write_table
from cbsim.costs.kernels import gemm_shapes

from .attention import AttnMeta, decode_torch, prefill_fresh
from .device_info import select_blas
from .profile_elementwise import dtype_of, profile_elementwise

log = logging.getLogger("cbsim")
L2_ROTATE_BYTES = 256 << 20  # operands cycled per graph: several times the H200's 50 MB L2


def _pow2(lo: int, hi: int) -> list[int]:
    return [1 << i for i in range(lo, hi + 1)]


@dataclass
class ProfileGrid:
    """Where each kernel is measured (``extra.*`` of +experiment=profile_kernels)."""

    gemm_rows: list[int] = field(default_factory=lambda: _pow2(0, 13))
    lm_head_rows_max: int = 1024  # sampled rows: at most one per request of a step
    # the runtime's graph buckets (engine.graph_batch_sizes): the kernel's split-K launch
    # follows the batch, so between two profiled batches it can be neither's (96 requests of
    # the 1B shape at 4096 tokens ran at 3.99 TB/s, 64 and 128 at 3.22 and 3.06;
    # the H200's kernel probes)
    decode_batches: list[int] = field(
        default_factory=lambda: [1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256]
    )
    decode_contexts: list[int] = field(default_factory=lambda: _pow2(7, 15))
    # every launch the kernel can take, so the cost model prices whichever the runtime's rule
    # picks at a step's table width (a rule can then be chosen from the table): KV tiles, and
    # split-K partitions besides one partition for the whole table
    decode_tiles: list[int] = field(default_factory=lambda: [64, 128])
    decode_partitions: list[int] = field(default_factory=lambda: _pow2(7, 14))
    decode_max_tokens: int = 1 << 21  # batch x context cap (8 GiB of one layer's KV for 8B)
    prefill_rows: list[int] = field(default_factory=lambda: [1, 4, 16])
    prefill_lengths: list[int] = field(default_factory=lambda: _pow2(4, 13))
    prefill_max_tokens: int = 1 << 15
    elementwise_rows: list[int] = field(default_factory=lambda: _pow2(0, 13))
    copy_bytes: list[int] = field(default_factory=lambda: [1 << i for i in range(6, 27, 2)])
    target_ms: float = 10.0  # GPU time per measured point (replays are repeated to reach it)
    max_seconds: float = 150.0  # stop after this long; the header says which kinds were left
    kinds: list[str] = field(default_factory=lambda: list(KINDS))  # which kinds, in this order
    out: str | None = None  # directory of the table; None: the run directory
    name: str | None = None  # file name stem; None: the model's name

    @classmethod
    def from_extra(cls, extra: dict[str, Any]) -> ProfileGrid:
        known = {f.name for f in fields(cls)}
        bad = sorted(set(extra) - known)
        if bad:
            raise ConfigError(
                f"extra.{bad[0]} is not a profile_kernels setting; allowed: {sorted(known)}"
            )
        grid = cls(**{k: v for k, v in extra.items() if k in known})
        for f in fields(cls):
            value = getattr(grid, f.name)
            if f.name == "kinds":
                continue
            if isinstance(value, list) and (
                not value or not all(isinstance(v, int) and v >= 1 for v in value)
            ):
                raise ConfigError(
                    f"extra.{f.name}={value} must be a non-empty list of integers >= 1"
                )
            if f.name.endswith(("_max", "_tokens")) and not (isinstance(value, int) and value >= 1):
                raise ConfigError(f"extra.{f.name}={value} must be >= 1")
        for kind in grid.kinds:
            if kind not in KINDS:
                raise ConfigError(f"extra.kinds: {kind!r} is not a kind; allowed: {list(KINDS)}")
        for key in ("target_ms", "max_seconds"):
            v = getattr(grid, key)
            if not (isinstance(v, int | float) and math.isfinite(v) and v > 0):
                raise ConfigError(f"extra.{key}={v} must be a finite number > 0")
        return grid


class OutOfTime(Exception):
    """extra.max_seconds has passed: the kind being measured stops where it is."""


class Timer:
    """Per-call time of a list of calls run back to back (a CUDA graph replay on CUDA)."""

    def __init__(self, device: torch.device, target_ms: float, deadline: float) -> None:
        self.device, self.target_ms, self.deadline = device, target_ms, deadline
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self.eager = 0  # points timed without a graph (capture failed)

    def __call__(self, calls: list[Callable[[], object]]) -> float:
        if time.monotonic() > self.deadline:
            raise OutOfTime
        if self.stream is None:
            for c in calls:
                c()
            t0 = time.perf_counter()
            for c in calls:
                c()
            return (time.perf_counter() - t0) * 1e6 / len(calls)
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            for c in calls:  # warm-up: Triton compiles, cuBLAS picks its kernel
                c()
        torch.cuda.synchronize(self.device)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, stream=self.stream):
                for c in calls:
                    c()
        except RuntimeError as exc:  # a kernel that cannot be captured: timed as launched
            log.warning("profile_kernels: graph capture failed (%s); timed eagerly", exc)
            self.eager += 1
            torch.cuda.synchronize(self.device)
            return self._timed(lambda: [c() for c in calls]) / len(calls)
        one = self._timed(graph.replay, 1)
        iters = max(3, min(200, int(self.target_ms * 1e3 / max(one, 1e-3))))
        per = self._timed(graph.replay, iters) / len(calls)
        del graph
        return per

    def _timed(self, body: Callable[[], object], n: int = 3) -> float:
        """Microseconds per run of ``body``, between two CUDA events on the timing stream."""
        start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
        with torch.cuda.stream(self.stream):
            body()
            start.record()
            for _ in range(n):
                body()
            end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e3 / n


def _copies(nbytes: int, reps_min: int = 4) -> int:
    return max(reps_min, min(64, -(-L2_ROTATE_BYTES // max(nbytes, 1))))


def profile_gemms(cfg: CbsimConfig, grid: ProfileGrid, timer: Timer, dt, dev, out: list) -> None:
    """Every GEMM on ``mode.blas`` at ``grid.gemm_rows``; where ``mode.graph_blas`` differs, on
    it too at the rows the decode graphs run (up to the biggest bucket), as ``launch`` = it."""
    runs = [(cfg.mode.blas, grid.gemm_rows, "")]
    lib = cfg.mode.graph_blas
    if dev.type == "cuda" and lib != cfg.mode.blas:
        top = max(cfg.engine.graph_batch_sizes)
        rows = sorted({*grid.gemm_rows, *cfg.engine.graph_batch_sizes})
        runs.append((lib, [r for r in rows if r <= top], lib))
    try:
        for library, rows, launch in runs:
            select_blas(library, dev)
            _gemm_rows(cfg, grid, rows, launch, timer, dt, dev, out)
    finally:
        select_blas(cfg.mode.blas, dev)


def _gemm_rows(cfg: CbsimConfig, grid, rows_list, launch: str, timer, dt, dev, out: list) -> None:
    """Each GEMM as the runtime calls it: o and down add into the residual (``addmm_``) with
    mode.fuse_epilogues, the others are nn.Linear's ``F.linear``."""
    fused = cfg.mode.fuse_projections and dev.type == "cuda"
    residual = cfg.mode.fuse_epilogues and dev.type == "cuda"
    shapes = {(n, k): name for name, n, k in gemm_shapes(cfg.model, fused)}  # k, v: one shape
    for (n, k), name in shapes.items():
        ws = [torch.randn(n, k, dtype=dt, device=dev) * 0.02 for _ in range(_copies(2 * n * k, 2))]
        for rows in rows_list:
            if name == "lm_head" and rows > grid.lm_head_rows_max:
                break
            x = torch.randn(1, rows, k, dtype=dt, device=dev)
            if residual and name in ("o", "down"):
                y = torch.zeros(rows, n, dtype=dt, device=dev)
                calls = [partial(y.addmm_, x[0], w.t()) for w in ws]
            else:  # nn.Linear's call on a [1, tokens, features] input (cuBLASLt's kernel choice
                # for it differs from torch.mm into a given output: the H200's kernel probes)
                calls = [partial(F.linear, x, w) for w in ws]
            out.append(("gemm", n, k, 0, rows, 0, timer(calls), launch))
        del ws


def _decode_kernel(cfg: CbsimConfig, dev: torch.device):
    if dev.type == "cuda" and cfg.mode.attention != "torch":
        from .kernels.paged_attention import paged_decode_attention

        return paged_decode_attention
    return decode_torch


def decode_calls(
    kernel, kc, vc, hq: int, b: int, ctx: int, width: int, scale: float, **launch
) -> list:
    """The decode kernel on `b` requests at context `ctx` with tables `width` blocks wide, one
    call per copy of the tables (as many as the cache holds and rotating past L2 needs);
    ``launch``: the kernel's partition_size and block_n (its own rule when absent)."""
    blocks, _, hkv, d = kc.shape
    per_token = 2 * hkv * d * 2
    copies = max(1, min(_copies(b * ctx * per_token, 1), (blocks - 1) // (b * width)))
    q = torch.randn(b, hq, d, dtype=kc.dtype, device=kc.device)
    lens = torch.full((b,), ctx, dtype=torch.int32, device=kc.device)
    ids = torch.arange(copies * b * width, dtype=torch.int32, device=kc.device)
    call = partial(kernel, **launch) if launch else kernel
    return [partial(call, q, kc, vc, t, lens, scale) for t in ids.view(copies, b, width)]


def decode_launches(grid: ProfileGrid, ctx: int) -> list[tuple[int, int]]:
    """(tile, partition) of each launch timed at context ``ctx``; partition 0 is one partition
    over the table. A split launch is timed over a table of at least two partitions (a step's
    table can be wider than its requests' context, the partitions past it exiting at once)."""
    launches = [(t, 0) for t in grid.decode_tiles]
    launches += [
        (t, p) for t in grid.decode_tiles for p in grid.decode_partitions if p % t == 0 and p <= ctx
    ]
    return launches


def profile_decode(cfg: CbsimConfig, grid: ProfileGrid, timer: Timer, dt, dev, out: list) -> None:
    m, bs = cfg.model, cfg.workload.kv_block_size
    hq, hkv, d = m.num_heads, m.num_kv_heads, m.head_dim
    kernel, scale = _decode_kernel(cfg, dev), d**-0.5
    per_launch = kernel is not decode_torch  # the torch fallback has no launch to choose
    per_token = 2 * hkv * d * 2
    blocks = -(-max(2 * grid.decode_max_tokens, L2_ROTATE_BYTES // per_token) // bs) + 1
    kc = torch.randn(blocks, bs, hkv, d, dtype=dt, device=dev)
    vc = torch.randn_like(kc)
    for b in grid.decode_batches:
        for ctx in grid.decode_contexts:
            if b * ctx > grid.decode_max_tokens:
                break
            if not per_launch:
                calls = decode_calls(kernel, kc, vc, hq, b, ctx, -(-ctx // bs), scale)
                out.append(("decode_attention", hq, d, hkv, b, ctx, timer(calls), ""))
                continue
            for tile, part in decode_launches(grid, ctx):
                width = -(-max(ctx, 2 * part) // bs)
                launch = {"partition_size": part or None, "block_n": tile}
                calls = decode_calls(kernel, kc, vc, hq, b, ctx, width, scale, **launch)
                name = launch_name(tile, part or width * bs, width * bs)
                out.append(("decode_attention", hq, d, hkv, b, ctx, timer(calls), name))


def profile_prefill(cfg: CbsimConfig, grid: ProfileGrid, timer: Timer, dt, dev, out: list) -> None:
    m = cfg.model
    hq, hkv, d = m.num_heads, m.num_kv_heads, m.head_dim
    for rows in grid.prefill_rows:
        for length in grid.prefill_lengths:
            if rows * length > grid.prefill_max_tokens:
                break
            t = rows * length
            q = torch.randn(t, hq, d, dtype=dt, device=dev)
            k = torch.randn(t, hkv, d, dtype=dt, device=dev)
            v = torch.randn_like(k)
            tok = torch.arange(rows, device=dev) * length
            meta = AttnMeta(cache=None, num_tokens=t, slot_mapping=tok, pre_tok=tok)
            meta.pre_qlen, meta.pre_qmax = torch.full_like(tok, length), length
            meta.derive()
            calls = [partial(prefill_fresh, q, k, v, meta, d**-0.5)] * 2
            out.append(("prefill_attention", hq, d, hkv, rows, length, timer(calls)))


def profile_copies(cfg: CbsimConfig, grid: ProfileGrid, timer: Timer, dt, dev, out: list) -> None:
    pin = dev.type == "cuda"
    for nbytes in grid.copy_bytes:
        host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pin)
        devb = torch.empty(nbytes, dtype=torch.uint8, device=dev)
        h2d = partial(devb.copy_, host, non_blocking=True)
        d2h = partial(host.copy_, devb, non_blocking=True)
        out.append(("h2d", 0, 0, 0, nbytes, 0, timer([h2d] * 4)))
        out.append(("d2h", 0, 0, 0, nbytes, 0, timer([d2h] * 4)))


KINDS = {
    "copies": profile_copies,
    "elementwise": profile_elementwise,
    "gemm": profile_gemms,
    "prefill_attention": profile_prefill,
    "decode_attention": profile_decode,
}


def _hardware(dev: torch.device) -> str:
    parts = [f"torch {torch.__version__}"]
    if dev.type == "cuda":
        p = torch.cuda.get_device_properties(dev)
        parts = [p.name, f"{p.multi_processor_count} SMs", f"{p.total_memory / 2**30:.0f} GiB"]
        parts += [f"torch {torch.__version__}", f"cuda {torch.version.cuda}"]
        try:
            import triton

            parts.append(f"triton {triton.__version__}")
        except ImportError:
            pass
    return ", ".join(parts)


def run_profile(config: CbsimConfig, run_dir: Path, command: str = "") -> dict[str, Any]:
    """Measure every kind of kernel of ``config.model`` and write the table (again after each
    kind, so a run stopped early keeps what it measured); returns a summary."""
    grid = ProfileGrid.from_extra(dict(config.extra))
    dev = torch.device(config.mode.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"mode.device={config.mode.device}: no CUDA device is visible")
    torch.manual_seed(config.workload.seed)
    blas = select_blas(config.mode.blas, dev)  # the GEMMs as the runtime's mode.blas runs them
    t0 = time.monotonic()
    timer, dt = Timer(dev, grid.target_ms, t0 + grid.max_seconds), dtype_of(config)
    path = (Path(grid.out) if grid.out else Path(run_dir)) / f"{grid.name or config.model.name}.csv"
    rows: list[tuple] = []
    short: list[str] = []
    with torch.inference_mode():
        for kind in grid.kinds:
            before = len(rows)
            try:
                KINDS[kind](config, grid, timer, dt, dev, rows)
            except OutOfTime:
                short.append(kind)
            log.info(
                "profile_kernels: %s, %d points, %.0f s",
                kind,
                len(rows) - before,
                time.monotonic() - t0,
            )
            headers = _headers(config, dev, command, timer, t0, grid, short)
            write_table(path, rows, [*headers, f"blas: {blas}"])
            if dev.type == "cuda":
                torch.cuda.empty_cache()
    log.info("kernel table: %s (%d kernels)", path, len(rows))
    return {"kernel_table": str(path), "points": len(rows), "cut_short": short}


def _headers(config, dev, command, timer, t0, grid, short) -> list[str]:
    m, cuda = config.model, dev.type == "cuda"
    command = command or f"python -m cbsim +experiment=profile_kernels mode=runtime model={m.name}"
    headers = [
        "cbsim kernel table v2 (columns: cbsim/costs/kernel_table.py)",
        f"hardware: {_hardware(dev)}",
        f"command: {command}",
        f"model: {m.name} (hidden {m.hidden_size}, intermediate {m.intermediate_size}, heads "
        f"{m.num_heads}/{m.num_kv_heads} x {m.head_dim}, vocab {m.vocab_size}, {m.dtype})",
        f"fused: projections {cuda and config.mode.fuse_projections}, norm and rope "
        f"{cuda and config.mode.fuse_norm_rope}, epilogues {cuda and config.mode.fuse_epilogues}",
        "timing: per call, CUDA events around replays of a graph of back-to-back calls (node gap "
        f"included); {timer.eager} points eager (capture failed)"
        if cuda
        else "timing: per call, wall clock on the CPU (a smoke test, not a profile)",
        f"date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {time.monotonic() - t0:.0f} s",
    ]
    if short:
        headers.append(f"cut short by extra.max_seconds={grid.max_seconds}: {', '.join(short)}")
    return headers
