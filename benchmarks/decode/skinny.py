"""Section skinny: a Triton GEMM for few rows (``_triton_skinny.py``) against cuBLAS
(``F.linear``, what the runtime calls) on the projections of the 8B shape at M=32 and the 1B shape
at M=128, each over enough weight copies that none is read from L2; its best config per shape,
and that config's largest relative error against cuBLAS."""

from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F

SHAPES = {  # name: (M, N, K)
    "8b qkv": (32, 6144, 4096), "8b o": (32, 4096, 4096), "8b gate_up": (32, 28672, 4096),
    "8b down": (32, 4096, 14336), "1b qkv": (128, 3072, 2048), "1b o": (128, 2048, 2048),
    "1b gate_up": (128, 16384, 2048), "1b down": (128, 2048, 8192),
}  # fmt: skip
CONFIGS = list(itertools.product((16, 32, 64), (128, 256), (4, 6)))  # BN, BK, stages
ROTATE_BYTES = 1 << 30


def skinny_gemm(x, w, y, bn: int, bk: int, stages: int, warps: int = 4):
    from benchmarks.decode._triton_skinny import skinny_gemm_kernel

    m, k = x.shape
    n = w.shape[0]
    bm = max(16, 1 << (m - 1).bit_length())
    skinny_gemm_kernel[(-(-n // bn),)](
        x, w, y, m, n, k, x.stride(0), w.stride(0), y.stride(0),
        BM=bm, BN=bn, BK=bk, num_stages=stages, num_warps=warps,
    )  # fmt: skip
    return y


class SkinnySection:
    """Section ``skinny`` (a ``Bench`` mixin)."""

    def skinny(self):
        if not self.cuda:
            self.log("skinny: skipped (CPU)")
            return
        for name, (m, n, k) in SHAPES.items():
            if self.left() < self.args.reserve_s:
                return
            self._skinny_shape(name, m, n, k)
            torch.cuda.empty_cache()

    def _per_weight(self, fn, ws) -> tuple[float, float]:
        """Microseconds and TB/s of one call of ``fn(w)``, over every weight copy in a graph."""
        us = self.time_fn(lambda: [fn(w) for w in ws])["ms"] * 1e3 / len(ws)
        return us, ws[0].numel() * 2 / (us * 1e-6) / 1e12

    def _skinny_shape(self, name: str, m: int, n: int, k: int) -> None:
        copies = max(2, min(32, ROTATE_BYTES // (2 * n * k)))
        ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        y = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        cub_us, cub_tb = self._per_weight(lambda w: F.linear(x, w), ws)
        best = None
        for bn, bk, st in CONFIGS:
            if k % bk or self.left() < self.args.reserve_s:
                continue
            try:
                us, tb = self._per_weight(lambda w, c=(bn, bk, st): skinny_gemm(x, w, y, *c), ws)
            except Exception as e:  # a config the compiler refuses (shared memory)
                self.log(f"skinny {name} BN={bn} BK={bk} stages={st}: {e!r:.120}")
                continue
            if best is None or us < best[0]:
                best = (us, tb, bn, bk, st)
        if best is None:
            return
        us, tb, bn, bk, st = best
        ref = F.linear(x, ws[0]).float()
        got = skinny_gemm(x, ws[0], y, bn, bk, st).float()
        err = ((got - ref).abs().max() / ref.abs().max()).item()
        self.record(section="skinny", name=name, m=m, n=n, k=k, cublas_us=cub_us,
                    cublas_tbps=cub_tb, triton_us=us, triton_tbps=tb, bn=bn, bk=bk, stages=st,
                    rel_err=err)  # fmt: skip
        self.log(f"skinny {name:10s} M={m:3d} cuBLAS {cub_us:7.1f} us {cub_tb:5.2f} TB/s | "
                 f"triton {us:7.1f} us {tb:5.2f} TB/s (BN={bn} BK={bk} st={st}) err {err:.1e}")  # fmt: skip
