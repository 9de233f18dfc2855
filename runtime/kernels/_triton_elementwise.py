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
def rotate_tile(src, cos_row, sin_row, mask, HALF: tl.constexpr):
    """transformers' apply_rotary_pos_emb of the heads at ``src`` (rows of 2 x HALF) in their
    dtype: x * cos + rotate_half(x) * sin, each product and the sum rounded as torch rounds
    them. Returns the two halves (lo, hi) in that dtype."""
    offs_d = tl.arange(0, HALF)
    c_lo = tl.load(cos_row + offs_d).to(tl.float32)
    c_hi = tl.load(cos_row + HALF + offs_d).to(tl.float32)
    s_lo = tl.load(sin_row + offs_d).to(tl.float32)
    s_hi = tl.load(sin_row + HALF + offs_d).to(tl.float32)
    x1 = tl.load(src + offs_d[None, :], mask=mask, other=0.0)
    x2 = tl.load(src + HALF + offs_d[None, :], mask=mask, other=0.0)
    dt = x1.dtype
    x1 = x1.to(tl.float32)
    x2 = x2.to(tl.float32)
    lo = (x1 * c_lo[None, :]).to(dt).to(tl.float32) - (x2 * s_lo[None, :]).to(dt).to(tl.float32)
    hi = (x2 * c_hi[None, :]).to(dt).to(tl.float32) + (x1 * s_hi[None, :]).to(dt).to(tl.float32)
    return lo.to(dt), hi.to(dt)


@triton.jit
def store_halves(dst, lo, hi, mask, HALF: tl.constexpr):
    """Rows of 2 x HALF at ``dst``: ``lo`` then ``hi``."""
    offs_d = tl.arange(0, HALF)
    tl.store(dst + offs_d[None, :], lo, mask=mask)
    tl.store(dst + HALF + offs_d[None, :], hi, mask=mask)


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
    cos_row = cos_ptr + b * scb + s * scs
    lo, hi = rotate_tile(src, cos_row, sin_ptr + b * ssb + s * sss, mask, HALF)
    store_halves(dst, lo, hi, mask, HALF)


@triton.jit
def _silu_mul_kernel(gu_ptr, out_ptr, stride_g, stride_o, N, BLOCK: tl.constexpr):
    # transformers' LlamaMLP on the fused gate/up output: silu(gate) * up, each rounded to the
    # input dtype where torch rounds it (silu's result, then the product)
    row = tl.program_id(0).to(tl.int64)
    col = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = col < N
    g = tl.load(gu_ptr + row * stride_g + col, mask=mask, other=0.0)
    u = tl.load(gu_ptr + row * stride_g + N + col, mask=mask, other=0.0)
    dt = g.dtype
    gf = g.to(tl.float32)
    s = (gf / (1.0 + tl.exp(-gf))).to(dt)
    out = (s.to(tl.float32) * u.to(tl.float32)).to(dt)
    tl.store(out_ptr + row * stride_o + col, out, mask=mask)


@triton.jit
def _kv_write_kernel(
    k_ptr, v_ptr, kc_ptr, vc_ptr, slot_ptr,
    skt, skh, svt, svh,  # key/value [T, H, D] strides (the head dim is contiguous)
    H, HB: tl.constexpr, D: tl.constexpr,
):  # fmt: skip
    # one token's K and V rows into their slot of the flat [slots, H, D] caches
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    heads = tl.arange(0, HB)
    offs_d = tl.arange(0, D)
    mask = (heads < H)[:, None]
    dst = slot * H * D + heads[:, None] * D + offs_d[None, :]
    k = tl.load(k_ptr + t * skt + heads[:, None] * skh + offs_d[None, :], mask=mask)
    v = tl.load(v_ptr + t * svt + heads[:, None] * svh + offs_d[None, :], mask=mask)
    tl.store(kc_ptr + dst, k, mask=mask)
    tl.store(vc_ptr + dst, v, mask=mask)


@triton.jit
def _rope_kv_write_kernel(
    q_ptr, k_ptr, v_ptr, cos_ptr, sin_ptr, qo_ptr, ko_ptr, kc_ptr, vc_ptr, slot_ptr,
    Hq, Hkv,
    sqh, sqs, skh, sks, svh, svs,  # q/k/v strides (head, token); batch 1, the head dim contiguous
    soh, sos, toh, tos,  # rotated q/k strides (head, token)
    scs, sss,  # cos/sin strides (token)
    HALF: tl.constexpr, HB: tl.constexpr, NQB: tl.constexpr,
):  # fmt: skip
    # _rope_kernel's rotation (the same roundings), and the rotated K with V written into their
    # cache slot as _kv_write_kernel writes them: one kernel where those were two
    s = tl.program_id(0)
    hb = tl.program_id(1)
    if hb < NQB:
        heads = hb * HB + tl.arange(0, HB)
        mask = (heads < Hq)[:, None]
        src = q_ptr + s * sqs + heads[:, None] * sqh
        dst = qo_ptr + s * sos + heads[:, None] * soh
    else:
        heads = (hb - NQB) * HB + tl.arange(0, HB)
        mask = (heads < Hkv)[:, None]
        src = k_ptr + s * sks + heads[:, None] * skh
        dst = ko_ptr + s * tos + heads[:, None] * toh
    lo, hi = rotate_tile(src, cos_ptr + s * scs, sin_ptr + s * sss, mask, HALF)
    store_halves(dst, lo, hi, mask, HALF)
    if hb >= NQB:
        row = (tl.load(slot_ptr + s).to(tl.int64) * Hkv + heads[:, None]) * 2 * HALF
        store_halves(kc_ptr + row, lo, hi, mask, HALF)
        v_src = v_ptr + s * svs + heads[:, None] * svh
        offs_d = tl.arange(0, HALF)
        v1 = tl.load(v_src + offs_d[None, :], mask=mask, other=0.0)
        v2 = tl.load(v_src + HALF + offs_d[None, :], mask=mask, other=0.0)
        store_halves(vc_ptr + row, v1, v2, mask, HALF)
