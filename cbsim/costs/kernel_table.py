"""Kernel tables: measured per-kernel GPU times, read and interpolated (as Vidur profiles operators).

A table is a CSV file written on the GPU by ``python -m cbsim +experiment=profile_kernels
mode=runtime model=...`` (runtime/profile_kernels.py), with ``#`` header lines saying the hardware,
the software and the command, then the columns ``op,n,k,g,rows,context,us,launch``: one kernel
call's time in microseconds, as it runs inside a replayed CUDA graph (the gap to the next node
included). ``launch`` names a gemm row's BLAS library where it is not the table's ``blas:``
header line (the decode graphs' ``mode.graph_blas``), and the decode kernel's launch (``t128``:
128-token tiles, one partition; ``t64p1024``: 64-token tiles, split-K partitions of 1024 tokens;
``decode_kernel.launch_name``) where the profile timed each launch the kernel can take; empty (or
absent, in a v1 table) where a row ran the table's library or the launch the runtime's rule
picked at a table as wide as its context.

| op | n, k, g | rows | context |
| --- | --- | --- | --- |
| ``gemm`` | output features, input features, 0 | M (tokens) | 0 |
| ``decode_attention`` | query heads, head dim, kv heads | requests | KV tokens of each |
| ``prefill_attention`` | query heads, head dim, kv heads | prompts | tokens of each (causal) |
| ``rms_norm``, ``silu_mul(_fused)``, ``add``, ``argmax(_split)`` | elements per token, 0, 0 | tokens | 0 |
| ``rope``, ``kv_write(_fused)`` | elements per token (q+k, or k+v), head dim, 0 | tokens | 0 |
| ``h2d``, ``d2h`` | 0, 0, 0 | bytes | 0 |

Attention times are per layer. ``KernelTable.time_us`` interpolates log-log in rows and context
(exact at table points, monotone between monotone points), extrapolates past the last point in
proportion to the work (rows, context; context squared for prefill) and holds the first point's
time below the first point (a kernel does not get faster than its launch). A shape the table does
not hold is costed from the nearest shape of that op at the rows and context where that shape's
kernel does the same work per program (``equivalent``), scaled by the ratio of the two rooflines
there (FLOPs and bytes at the profile's peak rates): predicting each committed H200 table from the
other two, 14% rms over every point, 22% with the plain roofline ratio at the same rows
(tests/test_kernel_table_scaling.py).
"""

from __future__ import annotations

import bisect
import csv
import functools
import io
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cbsim.config.errors import ConfigError
from cbsim.config.hardware import kernel_table_files
from cbsim.config.schema import BLAS_LIBRARIES
from cbsim.rundir import atomic_write_text

COLUMNS = ("op", "n", "k", "g", "rows", "context", "us")  # v1; v2 adds "launch"
LAUNCH = "launch"
ATTENTION_OPS = ("decode_attention", "prefill_attention")
# kernels that split their elements evenly over programs (argmax is not: a program per row
# reduces the whole vocabulary, so a longer row is a longer walk, as the roofline ratio scales it)
ELEMENTWISE_OPS = ("rms_norm", "silu_mul", "add", "rope", "kv_write")
ELEMENTWISE_OPS += ("silu_mul_fused", "kv_write_fused")  # mode.fuse_epilogues' one-kernel versions
ELEMENTWISE_OPS += ("rope_kv_write",)  # mode.fuse_rope_kv: RoPE inside the K/V write
ELEMENTWISE_OPS += ("argmax_split",)  # mode.split_argmax: chunks of a row, one program each
OPS = ("gemm", *ATTENTION_OPS, *ELEMENTWISE_OPS, "argmax")
OPS += ("h2d", "d2h")
# how a kernel's time grows past the table's last context: decode reads each token once,
# prefill attention (causal) computes every pair
CONTEXT_POWER = {"decode_attention": 1.0, "prefill_attention": 2.0}
DTYPE_BYTES = 2  # the profiler times bf16 kernels
LAUNCH_NAME = re.compile(r"t[1-9][0-9]*(p[1-9][0-9]*)?")

Shape = tuple[str, int, int, int]  # op, n, k, g
Key = tuple[str, int, int, int, str]  # a shape and its launch ("": the rule's, v1)


@dataclass(frozen=True)
class Curve:
    """One shape's times: for each profiled rows value, times over context (one point for ops
    without a context). Kept as logs in plain lists: a lookup is a few bisects, no numpy call
    (the simulator costs every step)."""

    rows: tuple[float, ...]  # ascending
    contexts: tuple[tuple[float, ...], ...]  # per rows value, ascending
    times: tuple[tuple[float, ...], ...]  # per rows value, microseconds
    context_power: float

    def __post_init__(self) -> None:
        logs = lambda xs: tuple(math.log(x) for x in xs)  # noqa: E731
        object.__setattr__(self, "_lr", logs(self.rows))
        object.__setattr__(self, "_lc", tuple(logs(c) for c in self.contexts))
        object.__setattr__(self, "_lt", tuple(logs(t) for t in self.times))

    def at(self, rows: float, context: float) -> float:
        rows, context = max(float(rows), 1e-9), max(float(context), 1e-9)
        r = self.rows
        if rows >= r[-1]:
            return self._along(len(r) - 1, context) * rows / r[-1]
        if rows <= r[0]:
            return self._along(0, context)
        i = bisect.bisect_right(r, rows) - 1
        lr = self._lr
        w = (math.log(rows) - lr[i]) / (lr[i + 1] - lr[i])
        lo, hi = self._along(i, context), self._along(i + 1, context)
        return math.exp((1 - w) * math.log(lo) + w * math.log(hi))

    def _along(self, i: int, context: float) -> float:
        ctx, t = self.contexts[i], self.times[i]
        if len(ctx) == 1 or context <= ctx[0]:
            return t[0]
        if context >= ctx[-1]:
            return t[-1] * (context / ctx[-1]) ** self.context_power
        j = bisect.bisect_right(ctx, context) - 1
        lc, lt = self._lc[i], self._lt[i]
        w = (math.log(context) - lc[j]) / (lc[j + 1] - lc[j])
        return math.exp(lt[j] + w * (lt[j + 1] - lt[j]))


@dataclass(frozen=True)
class KernelTable:
    """Every curve of one or more table files, and their header lines."""

    curves: dict[Key, Curve]
    headers: tuple[str, ...]
    source: str

    def has(self, op: str) -> bool:
        return any(s[0] == op for s in self.curves)

    @property
    def blas(self) -> str:
        """The library the table's gemm rows without a launch ran on (its ``blas:`` header line;
        torch's default, cuBLAS, in tables profiled before the line)."""
        for line in self.headers:
            key, _, value = line.partition(":")
            if key.strip() == "blas" and value.strip() in BLAS_LIBRARIES:
                return value.strip()
        return "cublas"

    def gemm_launch(self, library: str) -> str:
        """The launch key of ``library``'s gemm rows (``time_us`` falls back to the table's own)."""
        return "" if library == self.blas else library

    def has_launches(self, op: str) -> bool:
        """Whether the table timed ``op`` per launch (a v2 decode sweep)."""
        return any(s[0] == op and s[4] for s in self.curves)

    def time_us(
        self,
        op: str,
        n: int = 0,
        k: int = 0,
        g: int = 0,
        rows: float = 1,
        context: float = 0,
        *,
        flops_per_us: float = 1.0,
        bytes_per_us: float = 1.0,
        launch: str = "",
    ) -> float:
        """One call's time; a shape not in the table is scaled from its nearest one by their
        rooflines (``flops_per_us``/``bytes_per_us``: the profile's rates). ``launch``: the
        decode kernel's; a shape's own rows without launches (a v1 table) come before another
        shape's rows of that launch."""
        if rows <= 0:
            return 0.0
        shape = (op, int(n), int(k), int(g))
        # a split launch the table lacks costs about what one partition does (its last rows
        # split a table in two)
        for key in ((*shape, launch), (*shape, ""), (*shape, launch.partition("p")[0])):
            curve = self.curves.get(key)
            if curve is not None:
                return curve.at(rows, context)
        near = self.nearest(shape, launch)
        at_rows, at_context = equivalent(shape, near[:4], rows, context)
        base = self.curves[near].at(at_rows, at_context)
        want = roofline(shape, rows, context, flops_per_us, bytes_per_us)
        have = roofline(near[:4], at_rows, at_context, flops_per_us, bytes_per_us)
        return base * want / have if have > 0 else base

    def nearest(self, shape: Shape, launch: str = "") -> Key:
        """The nearest shape of the op timed at ``launch``, else at the rule's launch, else any."""
        op = shape[0]
        same = [s for s in self.curves if s[0] == op]
        if not same:
            raise ConfigError(
                f"hardware.kernel_table={self.source}: the table has no {op!r} kernels; "
                f"it has: {', '.join(sorted({s[0] for s in self.curves}))}"
            )
        pool = [s for s in same if s[4] == launch] or [s for s in same if not s[4]] or same
        return min(pool, key=lambda s: (_distance(shape, s[:4]), s))


def equivalent(shape: Shape, near: Shape, rows: float, context: float) -> tuple[float, float]:
    """The rows and context at which the ``near`` shape's kernel does the work ``shape``'s does
    at ``rows`` and ``context``, in the units its programs divide it into: elementwise kernels
    by elements (rows x elements per token); decode attention by (request, kv head) programs
    (rows x kv heads), each walking context x head_dim; prefill attention by query heads (the
    flash kernel's programs), over the same prompt length. A kernel's launch floor and
    occupancy then come from a measured point of the same work, not from a roofline ratio at
    the same rows (which halves a latency-bound kernel's time when its bytes halve). GEMMs keep
    the same rows: their weights, not their rows, differ."""
    op, n, k, g = shape
    _, n0, k0, g0 = near
    ratio = lambda a, b: max(a, 1) / max(b, 1)  # noqa: E731
    if op == "decode_attention":
        return rows * ratio(g, g0), context * ratio(k, k0)
    if op == "prefill_attention":
        return rows * ratio(n, n0), context
    if op in ELEMENTWISE_OPS:
        return rows * ratio(n, n0), context
    return rows, context


def _distance(a: Shape, b: Shape) -> float:
    return sum(abs(math.log(max(x, 1) / max(y, 1))) for x, y in zip(a[1:], b[1:]))


def roofline(shape: Shape, rows: float, context: float, flops_per_us: float, bpu: float) -> float:
    """A shape's roofline time, only ever used as a ratio between two shapes of one op."""
    op, n, k, g = shape
    dt = DTYPE_BYTES
    if op == "gemm":
        flops, nbytes = 2.0 * rows * n * k, dt * (n * k + rows * (n + k))
    elif op == "decode_attention":
        flops, nbytes = 4.0 * rows * context * n * k, dt * 2 * rows * context * g * k
    elif op == "prefill_attention":
        flops = 2.0 * rows * context * context * n * k
        nbytes = dt * rows * context * (2 * n * k + 2 * g * k)
    else:
        flops, nbytes = 0.0, dt * rows * max(n, 1)
    return max(flops / flops_per_us, nbytes / bpu)


# ---- files ---------------------------------------------------------------------------------


def format_table(rows: Iterable[tuple], headers: Iterable[str]) -> str:
    """The CSV text of a table: ``# key: value`` header lines, the columns, one row per call."""
    out = io.StringIO()
    for line in headers:
        out.write(f"# {line}\n")
    w = csv.writer(out, lineterminator="\n")
    w.writerow((*COLUMNS, LAUNCH))
    for op, n, k, g, r, ctx, us, *launch in rows:
        launch = launch[0] if launch else ""
        w.writerow([op, int(n), int(k), int(g), int(r), int(ctx), f"{float(us):.4g}", launch])
    return out.getvalue()


def write_table(path: Path, rows: Iterable[tuple], headers: Iterable[str]) -> Path:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    return atomic_write_text(path, format_table(rows, headers))


def load_table(path: str) -> KernelTable:
    files = kernel_table_files(path)
    return _load(tuple(str(f) for f in files), tuple(f.stat().st_mtime_ns for f in files), path)


@functools.lru_cache(maxsize=16)
def _load(files: tuple[str, ...], _mtimes: tuple[int, ...], source: str) -> KernelTable:
    points: dict[Key, dict[tuple[int, int], list[float]]] = {}
    headers: list[str] = []
    for name in files:
        text = Path(name).read_text()
        headers += [ln[1:].strip() for ln in text.splitlines() if ln.startswith("#")]
        body = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
        for i, rec in enumerate(csv.DictReader(body)):
            shape, r, ctx, us = _parse(rec, f"{name}:{i + 2}")
            points.setdefault(shape, {}).setdefault((r, ctx), []).append(us)
    if not points:
        raise ConfigError(f"hardware.kernel_table={source!r}: the table holds no kernels")
    curves = {shape: _curve(shape[0], pts) for shape, pts in points.items()}
    return KernelTable(curves=curves, headers=tuple(headers), source=source)


def _parse(rec: dict, where: str) -> tuple[Key, int, int, float]:
    if set(COLUMNS) - set(rec):
        raise ConfigError(f"{where}: a kernel table needs the columns {','.join(COLUMNS)}")
    op = rec["op"]
    if op not in OPS:
        raise ConfigError(f"{where}: op={op!r} is not a kernel; allowed: {', '.join(OPS)}")
    try:
        n, k, g, r, ctx = (int(rec[c]) for c in ("n", "k", "g", "rows", "context"))
        us = float(rec["us"])
    except ValueError:
        raise ConfigError(f"{where}: n,k,g,rows,context must be integers and us a number") from None
    if r < 1 or min(n, k, g, ctx) < 0 or not (math.isfinite(us) and us > 0):
        raise ConfigError(f"{where}: rows must be >= 1, n/k/g/context >= 0, us finite and > 0")
    launch = (rec.get(LAUNCH) or "").strip()
    if launch and op == "gemm" and launch not in BLAS_LIBRARIES:
        raise ConfigError(
            f"{where}: launch={launch!r}: a gemm row names the BLAS library it ran on; "
            f"allowed: {', '.join(BLAS_LIBRARIES)} (empty: the table's blas)"
        )
    if launch and op not in ("gemm", "decode_attention"):
        raise ConfigError(
            f"{where}: launch={launch!r}: only gemm and decode_attention rows name one"
        )
    if launch and op == "decode_attention" and not LAUNCH_NAME.fullmatch(launch):
        raise ConfigError(
            f"{where}: launch={launch!r}: a decode_attention row names its launch as t<tile> "
            "or t<tile>p<partition> (t128, t64p1024)"
        )
    return (op, n, k, g, launch), r, ctx, us


def _curve(op: str, pts: dict[tuple[int, int], list[float]]) -> Curve:
    by_rows: dict[int, list[tuple[int, float]]] = {}
    for (r, ctx), us in pts.items():
        by_rows.setdefault(r, []).append((ctx, float(np.median(us))))
    rows = sorted(by_rows)
    lines = [sorted(by_rows[r]) for r in rows]
    return Curve(
        rows=tuple(float(r) for r in rows),
        contexts=tuple(tuple(float(max(c, 1)) for c, _ in line) for line in lines),
        times=tuple(tuple(t for _, t in line) for line in lines),
        context_power=CONTEXT_POWER.get(op, 1.0),
    )
