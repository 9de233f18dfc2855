"""Section skinny: a Triton GEMM for few rows (skinny_kernel.py, a candidate) against
cuBLAS as the runtime calls it (``F.linear``; ``addmm_`` into the residual for o and down), on
each projection of the 8B, 3B and 1B shapes at the decode graphs' row counts, each over enough
weight copies that none is read from L2: per shape and rows, cuBLAS and cuBLASLt, the kernel's
best launch, and that launch's largest relative error against cuBLAS."""

from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F

from benchmarks.decode.skinny_kernel import SkinnyLaunch, skinny_linear

MODELS = {  # name: (hidden, intermediate, q heads x dim, kv heads x dim)
    "8b": (4096, 14336, 4096, 1024),
    "1b": (2048, 8192, 2048, 512),
    "3b": (3072, 8192, 3072, 1024),
}
ROWS = {"8b": (16, 32, 64), "1b": (32, 128), "3b": (32,)}
LAUNCHES = [
    SkinnyLaunch(bn, bk, st, w)
    for bn, bk, st, w in itertools.product((16, 32, 64), (128, 256), (4, 6), (4,))
]
ROTATE_BYTES = 1 << 30
RESIDUAL = ("o", "down")


def shapes(model: str) -> list[tuple[str, int, int]]:
    h, inter, q, kv = MODELS[model]
    return [("qkv", q + 2 * kv, h), ("o", h, q), ("gate_up", 2 * inter, h), ("down", h, inter)]


class SkinnySection:
    """Section ``skinny`` (a ``Bench`` mixin)."""

    def skinny(self):
        if not self.cuda:
            self.log("skinny: skipped (CPU)")
            return
        for model in MODELS:
            for name, n, k in shapes(model):
                for m in ROWS[model]:
                    if self.left() < self.args.reserve_s:
                        return
                    self._skinny_shape(f"{model} {name}", name in RESIDUAL, m, n, k)
            torch.cuda.empty_cache()

    def _per_weight(self, fn, ws) -> tuple[float, float]:
        """Microseconds and TB/s of one call of ``fn(w)``, over every weight copy in a graph."""
        us = self.time_fn(lambda: [fn(w) for w in ws])["ms"] * 1e3 / len(ws)
        return us, ws[0].numel() * 2 / (us * 1e-6) / 1e12

    def _cublas(self, x, y, ws, residual: bool, library: str) -> tuple[float, float]:
        torch.backends.cuda.preferred_blas_library(library)
        try:
            if residual:
                return self._per_weight(lambda w: y.addmm_(x, w.t()), ws)
            return self._per_weight(lambda w: F.linear(x, w), ws)
        finally:
            torch.backends.cuda.preferred_blas_library("cublas")

    def _skinny_shape(self, name: str, residual: bool, m: int, n: int, k: int) -> None:
        copies = max(2, min(32, ROTATE_BYTES // (2 * n * k)))
        ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        y = torch.zeros(m, n, device="cuda", dtype=torch.bfloat16)
        cub = self._cublas(x, y, ws, residual, "cublas")
        lt = self._cublas(x, y, ws, residual, "cublaslt")
        res = y if residual else None
        best = None
        for launch in LAUNCHES:
            if n % launch.block_n or k % launch.block_k or self.left() < self.args.reserve_s:
                continue
            try:
                us, tb = self._per_weight(lambda w, c=launch: skinny_linear(x, w, c, res), ws)
            except Exception as e:  # a launch the compiler refuses (shared memory)
                self.log(f"skinny {name} {launch}: {e!r:.120}")
                continue
            if best is None or us < best[0]:
                best = (us, tb, launch)
        if best is None:
            return
        us, tb, launch = best
        ref = F.linear(x, ws[0]).float()
        got = skinny_linear(x, ws[0], launch).float()
        err = ((got - ref).abs().max() / ref.abs().max()).item()
        self.record(section="skinny", name=name, m=m, n=n, k=k, residual=residual,
                    cublas_us=cub[0], cublas_tbps=cub[1], cublaslt_us=lt[0], cublaslt_tbps=lt[1],
                    triton_us=us, triton_tbps=tb, bn=launch.block_n, bk=launch.block_k,
                    stages=launch.stages, warps=launch.warps, rel_err=err)  # fmt: skip
        self.log(f"skinny {name:11s} M={m:3d} cuBLAS {cub[0]:7.1f} us {cub[1]:5.2f} TB/s | "
                 f"Lt {lt[0]:7.1f} {lt[1]:5.2f} | triton {us:7.1f} us {tb:5.2f} TB/s "
                 f"(BN={launch.block_n} BK={launch.block_k} st={launch.stages}) err {err:.1e}")  # fmt: skip
