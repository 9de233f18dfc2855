"""Decode attention over a paged KV cache: a Triton kernel and two pure-torch versions.

Shapes (one layer, one query token per request):

    q             [B, Hq, D]                          the current token's queries (after RoPE)
    k_cache       [num_blocks, block_size, Hkv, D]    this layer's keys, paged; Hq % Hkv == 0
    v_cache       [num_blocks, block_size, Hkv, D]
    block_tables  [B, max_blocks] int32               page ids of each request, in token order
    context_lens  [B] int32                           KV tokens of each request, the current one
                                                      included (its K/V already written); 0 = padding
    returns       [B, Hq, D], q's dtype               (rows with context 0 are zeros)

- `paged_decode_attention`: the Triton kernel (flash-decoding: KV split into partitions of
  `partition_size` tokens, combined by a second kernel). Reads only live KV; no host syncs; every
  allocation is sized from static shapes, so it can be captured in a CUDA graph (warm it up once
  outside the capture so Triton compiles first).
- `paged_decode_attention_sdpa`: gathers every page in the block table and runs torch's SDPA with a
  padding mask: reads max_blocks * block_size tokens per request, live or not. Graph-capturable.
- `paged_decode_attention_reference`: float32 math in plain torch, for tests; runs on the CPU.

This module imports torch only; triton is imported the first time the kernel is called, so the module
loads on machines without triton or CUDA.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from cbsim.costs.decode_kernel import LaunchRule

# The launch rule ("auto": tile and split-K partition from the table width) is shared with the
# cost model and configured as engine.decode_launch (cbsim/costs/decode_kernel.py); this is its
# default, chosen from the H200 kernel tables (the H200's kernel probes).
DEFAULT_RULE = LaunchRule.of()

DecodeAttention = Callable[..., torch.Tensor]


@functools.cache
def _triton_kernels():
    from . import _triton_paged_attention

    return _triton_paged_attention


def triton_available() -> bool:
    """True when triton imports (the kernel then runs on CUDA tensors, or anywhere under
    TRITON_INTERPRET=1)."""
    try:
        _triton_kernels()
    except ImportError:
        return False
    return True


def _check(q, k_cache, v_cache, block_tables, context_lens) -> tuple[int, int, int, int, int]:
    if q.dim() != 3:
        raise ValueError(f"q must be [B, Hq, D], got {tuple(q.shape)}")
    if k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError(
            f"k_cache and v_cache must both be [num_blocks, block_size, Hkv, D], got "
            f"{tuple(k_cache.shape)} and {tuple(v_cache.shape)}"
        )
    B, Hq, D = q.shape
    _, block_size, Hkv, Dk = k_cache.shape
    if Dk != D:
        raise ValueError(f"head_dim of q ({D}) and of the cache ({Dk}) differ")
    if Hq % Hkv:
        raise ValueError(f"query heads ({Hq}) must be a multiple of kv heads ({Hkv})")
    if block_tables.dim() != 2 or block_tables.shape[0] != B:
        raise ValueError(
            f"block_tables must be [B={B}, max_blocks], got {tuple(block_tables.shape)}"
        )
    if context_lens.shape != (B,):
        raise ValueError(f"context_lens must be [B={B}], got {tuple(context_lens.shape)}")
    return B, Hq, Hkv, D, block_size


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    *,
    partition_size: int | str | None = "auto",
    block_n: int | str = "auto",
    num_warps: int = 4,
    num_stages: int | None = None,
    out: torch.Tensor | None = None,
    rule: LaunchRule = DEFAULT_RULE,
) -> torch.Tensor:
    """The Triton paged decode-attention kernel (see the module docstring for shapes).

    partition_size: tokens per split-K program (a multiple of block_n); None = one partition
    covering the block table (no second kernel); "auto" = `pick_partition`. The number of
    partitions is ceil(max_blocks * block_size / partition_size): static, so graph capture sees
    fixed shapes, and partitions past a request's context exit at once.
    block_n: tokens per tile; "auto" = `pick_tile` (from the table width). num_stages: None = 3
    for 64-token tiles, 2 for larger. rule: the launch rule "auto" follows.
    """
    tk = _triton_kernels()
    B, Hq, Hkv, D, block_size = _check(q, k_cache, v_cache, block_tables, context_lens)
    if D & (D - 1) or D < 16:
        raise ValueError(f"head_dim must be a power of two >= 16 for the Triton kernel, got {D}")
    if q.stride(-1) != 1:
        q = q.contiguous()
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("k_cache and v_cache must be contiguous in the head dimension")
    if out is None:
        out = torch.empty((B, Hq, D), dtype=q.dtype, device=q.device)
    if B == 0:
        return out
    G = Hq // Hkv
    max_ctx = block_tables.shape[1] * block_size
    if block_n == "auto":
        block_n = pick_tile(max_ctx, rule)
        if isinstance(partition_size, int):
            block_n = min(block_n, partition_size)
    if num_stages is None:
        num_stages = 3 if block_n <= 64 else 2
    if partition_size is None:
        partition = max(block_n, triton_next_pow2(max_ctx))
    elif partition_size == "auto":
        partition = pick_partition(B, Hkv, max_ctx, block_n, rule)
    else:
        if partition_size % block_n:
            raise ValueError(
                f"partition_size={partition_size} must be a multiple of block_n={block_n}"
            )
        partition = partition_size
    num_splits = max(1, -(-max_ctx // partition))
    single = num_splits == 1
    if single:
        part_o = part_lse = out  # unused
    else:
        part_o = torch.empty((B, Hq, num_splits, D), dtype=torch.float32, device=q.device)
        part_lse = torch.empty((B, Hq, num_splits), dtype=torch.float32, device=q.device)
    tk._paged_decode_split_kernel[(B, Hkv, num_splits)](
        q,
        k_cache,
        v_cache,
        block_tables,
        context_lens,
        out,
        part_o,
        part_lse,
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
        num_splits,
        G=G,
        G_PAD=max(16, triton_next_pow2(G)),
        D=D,
        BS=block_size,
        BLOCK_N=block_n,
        PARTITION=partition,
        SINGLE=single,
        IEEE=q.dtype == torch.float32,
        num_warps=num_warps,
        num_stages=num_stages,
    )
    if not single:
        tk._paged_decode_reduce_kernel[(B, Hq)](
            part_o,
            part_lse,
            context_lens,
            out,
            out.stride(0),
            out.stride(1),
            num_splits,
            D=D,
            PARTITION=partition,
            S_PAD=triton_next_pow2(num_splits),
            CHUNK=16,
            num_warps=4,
        )
    return out


def pick_tile(max_ctx: int, rule: LaunchRule = DEFAULT_RULE) -> int:
    """Tokens per tile from the static table width (``rule.tile``)."""
    return rule.tile(max_ctx)


def pick_partition(
    batch: int,
    kv_heads: int,
    max_ctx: int,
    block_n: int | None = None,
    rule: LaunchRule = DEFAULT_RULE,
) -> int:
    """Tokens per partition for a static (batch, kv heads, table width) (``rule.partition``)."""
    return rule.partition(batch, kv_heads, max_ctx, block_n)


def compiled_variants(
    max_rows: int, kv_heads: int, max_width: int, block_size: int, rule: LaunchRule = DEFAULT_RULE
) -> list[tuple[int, int]]:
    """One (rows, table width) per kernel variant Triton compiles for batches of up to
    ``max_rows`` requests and tables up to ``max_width`` blocks: the constexprs (tile, partition,
    one partition or several, the reduce's padded split count) and the integer arguments
    Triton specialises (equal to 1, divisible by 16: the table stride and the split count).
    Eager mixed steps reach many of them; compiling one mid-run costs 0.1-1 s (measured on
    the H200, runtime/README.md), so the runtime's warm-up runs each once."""
    seen: dict[tuple, tuple[int, int]] = {}
    # from this many rows on every table is one split per (request, kv head): the variants
    # depend on the width alone, so rows past it add none
    full = max(1, -(-rule.target_programs // max(1, kv_heads)))
    for rows in range(1, min(max_rows, full) + 1):
        for width in range(1, max_width + 1):
            max_ctx = width * block_size
            tile = pick_tile(max_ctx, rule)
            partition = pick_partition(rows, kv_heads, max_ctx, tile, rule)
            splits = max(1, -(-max_ctx // partition))
            key = (
                tile,
                partition,
                splits == 1,
                triton_next_pow2(splits),
                splits % 16 == 0,
                width == 1,
                width % 16 == 0,
            )
            seen.setdefault(key, (rows, width))
    return sorted(seen.values())


def triton_next_pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def _gather(cache: torch.Tensor, block_tables: torch.Tensor) -> torch.Tensor:
    """[B, max_blocks * block_size, Hkv, D]: every page in the table (unused entries may be -1)."""
    num_blocks, block_size, Hkv, D = cache.shape
    B = block_tables.shape[0]
    idx = block_tables.long().clamp(0, num_blocks - 1)
    return cache[idx].reshape(B, -1, Hkv, D)


def _gathered(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
) -> tuple[tuple[int, int, int, int, int], torch.Tensor, torch.Tensor, torch.Tensor]:
    """What both torch versions start from: the checked shapes (B, Hq, Hkv, G query heads per kv
    head, D), which of the L = max_blocks * block_size table positions are live ([B, L]), and
    every page of the table gathered, keys and values ([B, L, Hkv, D])."""
    B, Hq, Hkv, D, block_size = _check(q, k_cache, v_cache, block_tables, context_lens)
    pos = torch.arange(block_tables.shape[1] * block_size, device=block_tables.device)
    live = pos[None, :] < context_lens[:, None].to(pos.dtype)
    k, v = _gather(k_cache, block_tables), _gather(v_cache, block_tables)
    return (B, Hq, Hkv, Hq // Hkv, D), live, k, v


def paged_decode_attention_reference(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Float32 paged decode attention in plain torch (CPU or GPU); the tests' reference."""
    (B, Hq, Hkv, G, D), live, k, v = _gathered(q, k_cache, v_cache, block_tables, context_lens)
    k = k.float().masked_fill(~live[:, :, None, None], 0.0)
    v = v.float().masked_fill(~live[:, :, None, None], 0.0)
    qf = q.float().reshape(B, Hkv, G, D)
    scores = torch.einsum("bhgd,blhd->bhgl", qf, k) * scale
    scores = scores.masked_fill(~live[:, None, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # context 0: all -inf -> zeros
    out = torch.einsum("bhgl,blhd->bhgd", probs, v)
    return out.reshape(B, Hq, D).to(q.dtype)


def paged_decode_attention_sdpa(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Gather the pages, then torch SDPA with a padding mask (the G query heads sharing a kv head
    ride as G query positions, so no KV is repeated). Reads every page in the block table."""
    (B, Hq, Hkv, G, D), live, k, v = _gathered(q, k_cache, v_cache, block_tables, context_lens)
    k, v = k.transpose(1, 2), v.transpose(1, 2)  # [B, Hkv, L, D]
    out = F.scaled_dot_product_attention(
        q.reshape(B, Hkv, G, D), k, v, attn_mask=live[:, None, None, :], scale=scale
    )
    out = out.reshape(B, Hq, D)
    return torch.where((context_lens > 0)[:, None, None], out, torch.zeros_like(out))


def store_kv(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Write new tokens' K/V ([T, Hkv, D] each) into the paged caches at flat slots
    (page * block_size + offset; [T] int64). Graph-capturable (index_copy_, no sync)."""
    num_blocks, block_size, Hkv, D = k_cache.shape
    k_cache.view(num_blocks * block_size, Hkv, D).index_copy_(
        0, slot_mapping, key.to(k_cache.dtype)
    )
    v_cache.view(num_blocks * block_size, Hkv, D).index_copy_(
        0, slot_mapping, value.to(v_cache.dtype)
    )


def get_decode_attention(name: str, device: torch.device | str) -> DecodeAttention:
    """The decode-attention function for a runtime's `mode.attention` on `device`.

    "triton": the kernel (needs CUDA and triton); "torch": gathered SDPA; "auto": the kernel where it
    runs (CUDA + triton), else gathered SDPA.
    """
    on_cuda = torch.device(device).type == "cuda"
    if name == "torch":
        return paged_decode_attention_sdpa
    if name == "triton":
        if not on_cuda or not triton_available():
            raise RuntimeError(
                "mode.attention=triton needs a CUDA device and the triton package; "
                "use mode.attention=torch or auto here"
            )
        return paged_decode_attention
    if name == "auto":
        if on_cuda and triton_available():
            return paged_decode_attention
        return paged_decode_attention_sdpa
    raise ValueError(f"unknown decode attention {name!r}: expected triton, torch or auto")
