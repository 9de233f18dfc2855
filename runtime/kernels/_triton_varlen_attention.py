"""The Triton kernel behind `varlen_attention.varlen_paged_attention` (imported lazily: needs triton).

One program per (query tile, kv head). A tile is up to BLOCK_Q query tokens of one sequence; its
rows are those tokens times the G query heads sharing the kv head (padded to G_PAD), so grouped-
query attention reads each K/V tile once for G heads and the tensor cores see BLOCK_Q * G_PAD
rows. The program walks the sequence's paged keys up to its last row's position, gathering pages
through the block table, masks each row causally at its own position (cached prefix + index in
the chunk) and keeps an online softmax. The tile -> (sequence, first query) map is an input array
sized for the step's capacity; entries of -1 return at once, so the grid is static (CUDA-graph
capture) while only live rows and live KV are touched.
"""

import triton
import triton.language as tl


@triton.jit
def _varlen_paged_kernel(
    q_ptr,  # [T, Hq, D]
    k_ptr,  # [num_blocks, BS, Hkv, D]
    v_ptr,
    out_ptr,  # [>= T, Hq, D]
    q0_ptr,  # [S] first token row of each sequence
    qlen_ptr,  # [S] query tokens of each sequence (0: an unused entry)
    ctx_ptr,  # [S] KV tokens once this step's are written (cached prefix + chunk)
    bt_ptr,  # [S, W] page ids
    tile_seq_ptr,  # [P] the sequence of each tile, -1: none
    tile_q_ptr,  # [P] its first query index within the sequence's chunk
    scale_log2,  # softmax scale * log2(e)
    stride_qt,
    stride_qh,
    stride_kn,
    stride_kt,
    stride_kh,
    stride_vn,
    stride_vt,
    stride_vh,
    stride_bts,
    stride_ot,
    stride_oh,
    G: tl.constexpr,
    G_PAD: tl.constexpr,
    D: tl.constexpr,
    BS: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_N: tl.constexpr,
    IEEE: tl.constexpr,
):
    pid = tl.program_id(0)
    kvh = tl.program_id(1)
    seq = tl.load(tile_seq_ptr + pid)
    if seq >= 0:
        _tile(
            q_ptr, k_ptr, v_ptr, out_ptr, q0_ptr, qlen_ptr, ctx_ptr, bt_ptr, tile_q_ptr,
            scale_log2, stride_qt, stride_qh, stride_kn, stride_kt, stride_kh, stride_vn,
            stride_vt, stride_vh, stride_bts, stride_ot, stride_oh, pid, kvh, seq,
            G, G_PAD, D, BS, BLOCK_Q, BLOCK_N, IEEE,
        )  # fmt: skip


@triton.jit
def _tile(
    q_ptr, k_ptr, v_ptr, out_ptr, q0_ptr, qlen_ptr, ctx_ptr, bt_ptr, tile_q_ptr,
    scale_log2, stride_qt, stride_qh, stride_kn, stride_kt, stride_kh, stride_vn,
    stride_vt, stride_vh, stride_bts, stride_ot, stride_oh, pid, kvh, seq,
    G: tl.constexpr, G_PAD: tl.constexpr, D: tl.constexpr, BS: tl.constexpr,
    BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr, IEEE: tl.constexpr,
):  # fmt: skip
    qi0 = tl.load(tile_q_ptr + pid)
    qlen = tl.load(qlen_ptr + seq)
    ctx = tl.load(ctx_ptr + seq)
    row0 = tl.load(q0_ptr + seq)
    prefix = ctx - qlen

    offs_m = tl.arange(0, BLOCK_Q * G_PAD)
    offs_d = tl.arange(0, D)
    qi = qi0 + offs_m // G_PAD
    g = offs_m % G_PAD
    live_m = (qi < qlen) & (g < G)
    tok = (row0 + qi).to(tl.int64)
    head = kvh * G + g
    q_ptrs = q_ptr + tok[:, None] * stride_qt + head[:, None] * stride_qh + offs_d[None, :]
    q = tl.load(q_ptrs, mask=live_m[:, None], other=0.0)
    pos = prefix + qi  # each row attends to keys 0..pos

    m_i = tl.full([BLOCK_Q * G_PAD], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_Q * G_PAD], dtype=tl.float32)
    acc = tl.zeros([BLOCK_Q * G_PAD, D], dtype=tl.float32)

    kv_end = tl.minimum(ctx, prefix + qi0 + BLOCK_Q)  # the tile's last row's position + 1
    bt_row = bt_ptr + seq.to(tl.int64) * stride_bts
    k_head = k_ptr + kvh * stride_kh
    v_head = v_ptr + kvh * stride_vh
    for n0 in range(0, kv_end, BLOCK_N):
        key = n0 + tl.arange(0, BLOCK_N)
        live_n = key < kv_end
        page = tl.load(bt_row + key // BS, mask=live_n, other=0).to(tl.int64)
        slot = key % BS
        k_ptrs = k_head + page[:, None] * stride_kn + slot[:, None] * stride_kt + offs_d[None, :]
        v_ptrs = v_head + page[:, None] * stride_vn + slot[:, None] * stride_vt + offs_d[None, :]
        k = tl.load(k_ptrs, mask=live_n[:, None], other=0.0)
        v = tl.load(v_ptrs, mask=live_n[:, None], other=0.0)
        if IEEE:
            s = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k))
        s = s * scale_log2
        # key 0 is visible to every row, so no row's running max stays -inf past the first tile
        s = tl.where(live_n[None, :] & (key[None, :] <= pos[:, None]), s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        if IEEE:
            pv = tl.dot(p, v, input_precision="ieee")
        else:
            pv = tl.dot(p.to(v.dtype), v)
        acc = acc * alpha[:, None] + pv
        m_i = m_new

    acc = acc / l_i[:, None]
    o_ptrs = out_ptr + tok[:, None] * stride_ot + head[:, None] * stride_oh + offs_d[None, :]
    tl.store(o_ptrs, acc.to(out_ptr.dtype.element_ty), mask=live_m[:, None])
