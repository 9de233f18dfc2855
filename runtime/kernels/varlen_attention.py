"""Attention of a step's variable-length query chunks over the paged KV cache, in one kernel.

What a step with prompt tokens needs to run inside a CUDA graph (engine.mixed_graphs=full): every
sequence of the step, whatever its chunk (a decode token, a prompt from position 0, a chunk after a
cached prefix), is (first token row, query length, context length, block-table row), and each of
its query tokens attends causally to the sequence's cached keys up to its own position. The step's
new K/V are written into the cache first (`store_kv`), so a chunk reads its own keys from the pages
too. Shapes (one layer):

    q           [T, Hq, D]       the step's queries after RoPE (padding rows belong to no sequence)
    k_cache     [num_blocks, block_size, Hkv, D], v_cache alike
    q0, qlen, ctx   [S] int      per sequence; entries past the step's have qlen 0
    block_tables    [S, W] int   page ids of each sequence in token order
    tile_seq, tile_q [P] int     the work list (`tile_map`): the sequence and first query of each
                                 tile of ``block_q`` tokens; -1 past the step's tiles
    out         [>= T, Hq, D]    written at the sequences' rows only

Every size is static per token bucket (S, W and P are capacities), so the kernel can be captured in
a graph and replayed over any step that fits; programs past the step's tiles exit at once and a
tile reads keys only up to its last row's position. `varlen_attention_reference` is the float32
torch version the tests and the CPU emulation use.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch

from .paged_attention import triton_next_pow2

BLOCK_N = 64  # keys per tile
TILE_ROWS = 64  # query rows (tokens x the query heads of a kv head) a program computes


@functools.cache
def _triton_kernels():
    from . import _triton_varlen_attention

    return _triton_varlen_attention


def heads_padded(q_heads: int, kv_heads: int) -> int:
    return triton_next_pow2(q_heads // kv_heads)


def tokens_per_tile(q_heads: int, kv_heads: int) -> int:
    """Query tokens of one sequence per program: TILE_ROWS rows over the padded head group."""
    return max(1, TILE_ROWS // heads_padded(q_heads, kv_heads))


def tile_capacity(tokens: int, sequences: int, block_q: int) -> int:
    """Tiles any step of up to ``tokens`` tokens in ``sequences`` sequences can need (each
    sequence may end in a partial tile)."""
    return -(-tokens // block_q) + sequences


def tile_map(qlen: np.ndarray, capacity: int, block_q: int) -> tuple[np.ndarray, np.ndarray]:
    """(tile_seq, tile_q) of a step, padded with -1 / 0 to ``capacity`` tiles."""
    per_seq = -(-qlen // block_q)
    n = int(per_seq.sum())
    if n > capacity:
        raise RuntimeError(f"{n} attention tiles exceed the capacity of {capacity}")
    seq = np.full(capacity, -1, np.int64)
    first = np.zeros(capacity, np.int64)
    seq[:n] = np.repeat(np.arange(len(qlen)), per_seq)
    starts = np.cumsum(per_seq) - per_seq
    first[:n] = (np.arange(n) - np.repeat(starts, per_seq)) * block_q
    return seq, first


def varlen_paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    out: torch.Tensor,
    q0: torch.Tensor,
    qlen: torch.Tensor,
    ctx: torch.Tensor,
    block_tables: torch.Tensor,
    tile_seq: torch.Tensor,
    tile_q: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """The Triton kernel (see the module docstring); returns ``out``."""
    tk = _triton_kernels()
    t, hq, d = q.shape
    _, block_size, hkv, dk = k_cache.shape
    if dk != d or hq % hkv or d & (d - 1) or d < 16:
        raise ValueError(
            f"q [T, Hq={hq}, D={d}] and the cache [.., Hkv={hkv}, D={dk}] need equal head dims "
            "(a power of two >= 16) and Hq a multiple of Hkv"
        )
    if q.stride(-1) != 1:
        q = q.contiguous()
    g = hq // hkv
    tk._varlen_paged_kernel[(tile_seq.shape[0], hkv)](
        q,
        k_cache,
        v_cache,
        out,
        q0,
        qlen,
        ctx,
        block_tables,
        tile_seq,
        tile_q,
        scale * math.log2(math.e),
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        block_tables.stride(0),
        out.stride(0),
        out.stride(1),
        G=g,
        G_PAD=heads_padded(hq, hkv),
        D=d,
        BS=block_size,
        BLOCK_Q=tokens_per_tile(hq, hkv),
        BLOCK_N=BLOCK_N,
        IEEE=q.dtype == torch.float32,
        num_warps=4,
        num_stages=2,
    )
    return out


def varlen_attention_reference(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    out: torch.Tensor,
    q0: torch.Tensor,
    qlen: torch.Tensor,
    ctx: torch.Tensor,
    block_tables: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Float32 math in plain torch, a sequence at a time (reads its lengths on the host: for the
    tests and the CPU emulation, not for a graph); writes the sequences' rows of ``out``."""
    _, block_size, hkv, d = k_cache.shape
    g = q.shape[1] // hkv
    for s in range(qlen.shape[0]):
        n, c, r = int(qlen[s]), int(ctx[s]), int(q0[s])
        if n == 0:
            continue
        pages = block_tables[s, : -(-c // block_size)].long()
        k = k_cache[pages].flatten(0, 1)[:c].float().repeat_interleave(g, dim=1)  # [C, Hq, D]
        v = v_cache[pages].flatten(0, 1)[:c].float().repeat_interleave(g, dim=1)
        qs = q[r : r + n].float()  # [N, Hq, D]
        scores = torch.einsum("nhd,chd->hnc", qs, k) * scale
        pos = torch.arange(c - n, c, device=q.device)
        visible = torch.arange(c, device=q.device)[None, :] <= pos[:, None]  # [N, C]
        probs = torch.softmax(scores.masked_fill(~visible[None], float("-inf")), dim=-1)
        out[r : r + n] = torch.einsum("hnc,chd->nhd", probs, v).to(out.dtype)
    return out
