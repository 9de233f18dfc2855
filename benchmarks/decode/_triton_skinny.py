"""A candidate GEMM for decode's few rows (a candidate measured by bench_kernels' ``skinny``
section; the runtime does not use it): y[M, N] = x[M, K] @ w[N, K]^T with all M rows in one tile,
one program per BN output columns streaming its BN weight rows through a multi-stage pipeline.
At M <= 128 the weights are the traffic; cuBLAS picks tiles made for larger M."""

import triton
import triton.language as tl


@triton.jit
def skinny_gemm_kernel(
    x_ptr, w_ptr, y_ptr, M, N, K, sxm, swn, sym,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    rn = pid * BN + tl.arange(0, BN)
    rm = tl.arange(0, BM)
    rk = tl.arange(0, BK)
    x_ptrs = x_ptr + rm[:, None] * sxm + rk[None, :]
    w_ptrs = w_ptr + rn[:, None].to(tl.int64) * swn + rk[None, :]
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for _ in range(0, K, BK):  # K is a multiple of BK (the caller checks)
        a = tl.load(x_ptrs, mask=rm[:, None] < M, other=0.0)
        b = tl.load(w_ptrs, mask=rn[:, None] < N, other=0.0)
        acc = tl.dot(a, tl.trans(b), acc)
        x_ptrs += BK
        w_ptrs += BK
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    tl.store(y_ptr + rm[:, None] * sym + rn[None, :], acc.to(y_ptr.dtype.element_ty), mask=mask)
