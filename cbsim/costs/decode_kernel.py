"""The runtime's paged decode-attention kernel as the cost model sees it: its launch shape (KV
tokens per tile, per split-K partition), chosen from the block table's width as
runtime/kernels/paged_attention.py chooses them (pick_tile, pick_partition)."""

from __future__ import annotations


def table_width(longest: int, block_size: int) -> int:
    """KV tokens of a block table holding ``longest`` tokens (whole blocks)."""
    return max(1, -(-int(longest) // block_size)) * block_size


def tile_tokens(width: int) -> int:
    """pick_tile: 128-token tiles for tables up to 2048 tokens, 64 beyond."""
    return 128 if width <= 2048 else 64


def partition_tokens(gpu, width: int, rows: int, kv_heads: int) -> int:
    """pick_partition: about ``attention_target_programs`` programs at full width, partitions
    of at least ``attention_min_partition`` tokens, a power of two, never below a tile."""
    splits = max(1, -(-gpu.attention_target_programs // max(1, rows * kv_heads)))
    part = 1 << max(0, -(-width // splits) - 1).bit_length()
    return max(part, gpu.attention_min_partition, tile_tokens(width))
