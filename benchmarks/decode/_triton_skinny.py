"""The Triton kernel behind skinny_kernel.py (imported lazily: needs triton)."""

import triton
import triton.language as tl


@triton.jit
def _skinny_gemm_kernel(
    x_ptr, w_ptr, out_ptr, res_ptr,
    M, K, stride_x, stride_w, stride_o, stride_r,
    HAS_RES: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
):  # fmt: skip
    # out[m, n] = sum_k x[m, k] * w[n, k] (+ res[m, n]), accumulated in fp32 and rounded once: a
    # program owns BN output columns of BM rows and streams their BN x K weights once
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_n = pid_n * BN + tl.arange(0, BN)
    offs_k = tl.arange(0, BK)
    rows = offs_m[:, None] < M
    x_ptrs = x_ptr + offs_m[:, None].to(tl.int64) * stride_x + offs_k[None, :]
    w_ptrs = w_ptr + offs_n[None, :].to(tl.int64) * stride_w + offs_k[:, None]
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for _ in range(0, K, BK):
        a = tl.load(x_ptrs, mask=rows, other=0.0)
        b = tl.load(w_ptrs)
        acc = tl.dot(a, b, acc)
        x_ptrs += BK
        w_ptrs += BK
    o_offs = offs_m[:, None].to(tl.int64) * stride_o + offs_n[None, :]
    if HAS_RES:
        r = tl.load(res_ptr + offs_m[:, None].to(tl.int64) * stride_r + offs_n[None, :], mask=rows)
        acc += r.to(tl.float32)
    tl.store(out_ptr + o_offs, acc.to(out_ptr.dtype.element_ty), mask=rows)
