"""Triton kernels behind `paged_attention.paged_decode_attention` (imported lazily: needs triton).

Flash-decoding over a paged KV cache. One program per (request, kv head, KV partition): it loads the
G = Hq / Hkv query heads that share the kv head (padded to 16 rows for the tensor cores), walks its
partition of the request's *live* tokens in tiles of BLOCK_N, gathering each token's page through the
block table, and keeps an online softmax. With one partition the program writes the output; with
several it writes a normalised partial output and its log-sum-exp, and a second kernel combines them.
Programs whose partition starts past the request's context return at once, so the grid can be sized
from static shapes (CUDA-graph capture) while only live KV is read.
"""

import triton
import triton.language as tl


@triton.jit
def kv_tile(
    bt_row, k_head, v_head, tok, live, offs_d, stride_kn, stride_kt, stride_vn, stride_vt,
    BS: tl.constexpr,
):  # fmt: skip
    """K and V [BLOCK_N, D] of a sequence's tokens ``tok``, gathered through its block-table
    row (``bt_row``) from one kv head's pages; tokens not ``live`` read as zeros."""
    page = tl.load(bt_row + tok // BS, mask=live, other=0).to(tl.int64)
    slot = tok % BS
    k_ptrs = k_head + page[:, None] * stride_kn + slot[:, None] * stride_kt + offs_d[None, :]
    v_ptrs = v_head + page[:, None] * stride_vn + slot[:, None] * stride_vt + offs_d[None, :]
    k = tl.load(k_ptrs, mask=live[:, None], other=0.0)
    v = tl.load(v_ptrs, mask=live[:, None], other=0.0)
    return k, v


@triton.jit
def qk_scores(q, k, scale_log2, IEEE: tl.constexpr):
    """q . k^T in log2 units (exact fp32 where IEEE, else the tensor cores' precision)."""
    if IEEE:
        s = tl.dot(q, tl.trans(k), input_precision="ieee")
    else:
        s = tl.dot(q, tl.trans(k))
    return s * scale_log2


@triton.jit
def online_softmax(s, v, m_i, l_i, acc, IEEE: tl.constexpr):
    """One key tile of the online softmax: masked scores ``s`` (-inf where hidden) and values
    ``v`` into the running max, sum and output; returns the three."""
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    if IEEE:
        pv = tl.dot(p, v, input_precision="ieee")
    else:
        pv = tl.dot(p.to(v.dtype), v)
    return m_new, l_i, acc * alpha[:, None] + pv


@triton.jit
def _paged_decode_split_kernel(
    q_ptr,  # [B, Hq, D]
    k_ptr,  # [num_blocks, BS, Hkv, D]
    v_ptr,
    bt_ptr,  # [B, max_blocks] int32
    ctx_ptr,  # [B] int32
    out_ptr,  # [B, Hq, D] (single partition)
    part_o_ptr,  # [B, Hq, S, D] fp32 (several partitions)
    part_lse_ptr,  # [B, Hq, S] fp32
    scale_log2,  # softmax scale * log2(e)
    stride_qb,
    stride_qh,
    stride_kn,
    stride_kt,
    stride_kh,
    stride_vn,
    stride_vt,
    stride_vh,
    stride_btb,
    stride_ob,
    stride_oh,
    num_splits,
    G: tl.constexpr,  # query heads per kv head
    G_PAD: tl.constexpr,  # G padded to >= 16
    D: tl.constexpr,
    BS: tl.constexpr,  # tokens per KV page
    BLOCK_N: tl.constexpr,  # tokens per tile
    PARTITION: tl.constexpr,  # tokens per program (multiple of BLOCK_N)
    SINGLE: tl.constexpr,  # one partition: write the output directly
    IEEE: tl.constexpr,  # fp32 inputs: exact dots instead of tf32
):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)

    ctx = tl.load(ctx_ptr + b)
    start = split * PARTITION
    offs_g = tl.arange(0, G_PAD)
    offs_d = tl.arange(0, D)
    g_mask = offs_g < G
    heads = kvh * G + offs_g

    if SINGLE:
        # A request with no context (a padding row) gets zeros.
        if ctx <= 0:
            o_ptrs = out_ptr + b * stride_ob + heads[:, None] * stride_oh + offs_d[None, :]
            zero = tl.zeros([G_PAD, D], dtype=tl.float32)
            tl.store(o_ptrs, zero.to(out_ptr.dtype.element_ty), mask=g_mask[:, None])
    if start < ctx:  # partitions past the context do nothing (the reduce skips them)
        _partition(
            q_ptr, k_ptr, v_ptr, bt_ptr, out_ptr, part_o_ptr, part_lse_ptr, scale_log2,
            stride_qb, stride_qh, stride_kn, stride_kt, stride_kh, stride_vn, stride_vt, stride_vh,
            stride_btb, stride_ob, stride_oh, num_splits, b, kvh, split, ctx, start,
            G, G_PAD, D, BS, BLOCK_N, PARTITION, SINGLE, IEEE,
        )  # fmt: skip


@triton.jit
def _partition(
    q_ptr, k_ptr, v_ptr, bt_ptr, out_ptr, part_o_ptr, part_lse_ptr, scale_log2,
    stride_qb, stride_qh, stride_kn, stride_kt, stride_kh, stride_vn, stride_vt, stride_vh,
    stride_btb, stride_ob, stride_oh, num_splits, b, kvh, split, ctx, start,
    G: tl.constexpr, G_PAD: tl.constexpr, D: tl.constexpr, BS: tl.constexpr, BLOCK_N: tl.constexpr,
    PARTITION: tl.constexpr, SINGLE: tl.constexpr, IEEE: tl.constexpr,
):  # fmt: skip
    offs_g = tl.arange(0, G_PAD)
    offs_d = tl.arange(0, D)
    g_mask = offs_g < G
    heads = kvh * G + offs_g
    q_ptrs = q_ptr + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :]
    q = tl.load(q_ptrs, mask=g_mask[:, None], other=0.0)

    m_i = tl.full([G_PAD], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([G_PAD], dtype=tl.float32)
    acc = tl.zeros([G_PAD, D], dtype=tl.float32)

    end = tl.minimum(ctx, start + PARTITION)
    bt_row = bt_ptr + b.to(tl.int64) * stride_btb
    k_head = k_ptr + kvh * stride_kh
    v_head = v_ptr + kvh * stride_vh
    for n0 in range(start, end, BLOCK_N):
        tok = n0 + tl.arange(0, BLOCK_N)
        live = tok < end
        k, v = kv_tile(
            bt_row, k_head, v_head, tok, live, offs_d, stride_kn, stride_kt, stride_vn, stride_vt,
            BS,
        )  # fmt: skip
        s = tl.where(live[None, :], qk_scores(q, k, scale_log2, IEEE), float("-inf"))
        m_i, l_i, acc = online_softmax(s, v, m_i, l_i, acc, IEEE)

    acc = acc / l_i[:, None]
    if SINGLE:
        o_ptrs = out_ptr + b * stride_ob + heads[:, None] * stride_oh + offs_d[None, :]
        tl.store(o_ptrs, acc.to(out_ptr.dtype.element_ty), mask=g_mask[:, None])
    else:
        Hq = tl.num_programs(1) * G
        row = (b * Hq + heads).to(tl.int64) * num_splits + split  # [G_PAD]
        tl.store(part_o_ptr + row[:, None] * D + offs_d[None, :], acc, mask=g_mask[:, None])
        tl.store(part_lse_ptr + row, m_i + tl.log2(l_i), mask=g_mask)


@triton.jit
def _paged_decode_reduce_kernel(
    part_o_ptr,  # [B, Hq, S, D] fp32
    part_lse_ptr,  # [B, Hq, S] fp32 (log2 domain)
    ctx_ptr,
    out_ptr,
    stride_ob,
    stride_oh,
    num_splits,
    D: tl.constexpr,
    PARTITION: tl.constexpr,
    S_PAD: tl.constexpr,  # num_splits padded to a power of two
    CHUNK: tl.constexpr,  # partitions combined per loop iteration
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    Hq = tl.num_programs(1)
    ctx = tl.load(ctx_ptr + b)
    n_live = tl.minimum((ctx + PARTITION - 1) // PARTITION, num_splits)
    offs_d = tl.arange(0, D)
    row0 = (b * Hq + h).to(tl.int64) * num_splits

    offs_s = tl.arange(0, S_PAD)
    lse = tl.load(part_lse_ptr + row0 + offs_s, mask=offs_s < n_live, other=float("-inf"))
    m = tl.max(lse, axis=0)
    m = tl.where(n_live > 0, m, 0.0)

    acc = tl.zeros([D], dtype=tl.float32)
    wsum = tl.zeros([CHUNK], dtype=tl.float32)
    offs_c = tl.arange(0, CHUNK)
    for s0 in range(0, n_live, CHUNK):
        idx = s0 + offs_c
        live = idx < n_live
        w = tl.exp2(tl.load(part_lse_ptr + row0 + idx, mask=live, other=float("-inf")) - m)
        o = tl.load(
            part_o_ptr + (row0 + idx)[:, None] * D + offs_d[None, :], mask=live[:, None], other=0.0
        )
        acc += tl.sum(w[:, None] * o, axis=0)
        wsum += w
    out = tl.where(n_live > 0, acc / tl.maximum(tl.sum(wsum, axis=0), 1e-30), 0.0)
    tl.store(out_ptr + b * stride_ob + h * stride_oh + offs_d, out.to(out_ptr.dtype.element_ty))
