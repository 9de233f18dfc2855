"""Triton kernels behind `fused_elementwise` (imported lazily: needs triton).

Both reproduce transformers' bf16 rounding step for step, so their outputs equal the unfused torch
code's (RMSNorm up to the order of the fp32 sum of squares; RoPE exactly).
"""

import triton
import triton.language as tl


@triton.jit
def _rmsnorm_kernel(
    x_ptr, w_ptr, out_ptr, stride_x, stride_o, eps, N: tl.constexpr, BLOCK: tl.constexpr
):
    # transformers' LlamaRMSNorm: w * (x.float() * rsqrt(mean(x.float()**2) + eps)).to(x.dtype)
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < N
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    var = tl.sum(x * x, axis=0) / N
    y = (x * tl.math.rsqrt(var + eps)).to(x_ptr.dtype.element_ty)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0)
    out = (w.to(tl.float32) * y.to(tl.float32)).to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + row * stride_o + offs, out, mask=mask)


@triton.jit
def _rope_kernel(
    q_ptr, k_ptr, cos_ptr, sin_ptr, qo_ptr, ko_ptr,
    S, Hq, Hkv,
    sqb, sqh, sqs, skb, skh, sks,  # q/k strides (batch, head, seq); the head dim is contiguous
    sob, soh, sos, tob, toh, tos,  # output strides
    scb, scs, ssb, sss,  # cos/sin strides (batch, seq)
    HALF: tl.constexpr, HB: tl.constexpr, NQB: tl.constexpr,
):  # fmt: skip
    # transformers' apply_rotary_pos_emb in the input dtype: x * cos + rotate_half(x) * sin, each
    # product and the sum rounded as torch rounds them
    tok = tl.program_id(0)
    hb = tl.program_id(1)
    b = tok // S
    s = tok % S
    offs_d = tl.arange(0, HALF)
    c_lo = tl.load(cos_ptr + b * scb + s * scs + offs_d).to(tl.float32)
    c_hi = tl.load(cos_ptr + b * scb + s * scs + HALF + offs_d).to(tl.float32)
    s_lo = tl.load(sin_ptr + b * ssb + s * sss + offs_d).to(tl.float32)
    s_hi = tl.load(sin_ptr + b * ssb + s * sss + HALF + offs_d).to(tl.float32)
    if hb < NQB:
        heads = hb * HB + tl.arange(0, HB)
        mask = (heads < Hq)[:, None]
        src = q_ptr + b * sqb + s * sqs + heads[:, None] * sqh
        dst = qo_ptr + b * sob + s * sos + heads[:, None] * soh
    else:
        heads = (hb - NQB) * HB + tl.arange(0, HB)
        mask = (heads < Hkv)[:, None]
        src = k_ptr + b * skb + s * sks + heads[:, None] * skh
        dst = ko_ptr + b * tob + s * tos + heads[:, None] * toh
    x1 = tl.load(src + offs_d[None, :], mask=mask, other=0.0)
    x2 = tl.load(src + HALF + offs_d[None, :], mask=mask, other=0.0)
    dt = x1.dtype
    x1 = x1.to(tl.float32)
    x2 = x2.to(tl.float32)
    lo = (x1 * c_lo[None, :]).to(dt).to(tl.float32) - (x2 * s_lo[None, :]).to(dt).to(tl.float32)
    hi = (x2 * c_hi[None, :]).to(dt).to(tl.float32) + (x1 * s_hi[None, :]).to(dt).to(tl.float32)
    tl.store(dst + offs_d[None, :], lo.to(dt), mask=mask)
    tl.store(dst + HALF + offs_d[None, :], hi.to(dt), mask=mask)
