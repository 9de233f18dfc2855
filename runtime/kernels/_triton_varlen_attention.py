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

from ._triton_paged_attention import kv_tile, online_softmax, qk_scores


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
        k, v = kv_tile(
            bt_row, k_head, v_head, key, live_n, offs_d, stride_kn, stride_kt, stride_vn,
            stride_vt, BS,
        )  # fmt: skip
        # key 0 is visible to every row, so no row's running max stays -inf past the first tile
        visible = live_n[None, :] & (key[None, :] <= pos[:, None])
        s = tl.where(visible, qk_scores(q, k, scale_log2, IEEE), float("-inf"))
        m_i, l_i, acc = online_softmax(s, v, m_i, l_i, acc, IEEE)

    acc = acc / l_i[:, None]
    o_ptrs = out_ptr + tok[:, None] * stride_ot + head[:, None] * stride_oh + offs_d[None, :]
    tl.store(o_ptrs, acc.to(out_ptr.dtype.element_ty), mask=live_m[:, None])
