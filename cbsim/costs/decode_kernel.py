"""The runtime's paged decode-attention kernel as the cost model sees it: its launch shape (KV
tokens per tile, per split-K partition), chosen from the block table's width as
runtime/kernels/paged_attention.py chooses them (pick_tile, pick_partition)."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable


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


def launch_name(tile: int, partition: int, width: int) -> str:
    """A launch as kernel tables name it: ``t<tile>`` when one partition covers the ``width``
    tokens of the table (no reduce kernel), else ``t<tile>p<partition>``."""
    return f"t{tile}" if partition >= width else f"t{tile}p{partition}"


def launch_classes(
    tile: Callable[[int], int],
    partition: Callable[[int, int, int, int], int],
    rows: int,
    kv_heads: int,
    max_blocks: int,
    block_size: int,
) -> list[int]:
    """The block-table widths (in blocks) a graph of ``rows`` requests is captured at when each
    decode-kernel launch gets its own: the widest table of each run of widths with the same tile,
    partition and single-or-split launch. A step replays the narrowest that holds its longest
    request, so its kernel runs as it would with a table as wide as that request (as the kernel
    tables time it). ``tile(width)`` and ``partition(rows, kv_heads, width, tile)`` are the
    kernel's choices, from a width in tokens."""
    tops: list[int] = []
    prev = None
    for blocks in range(1, max(1, max_blocks) + 1):
        width = blocks * block_size
        t = tile(width)
        p = partition(rows, kv_heads, width, t)
        key = (t, p, width <= p)
        if prev is not None and key != prev:
            tops.append(blocks - 1)
        prev = key
    tops.append(max(1, max_blocks))
    return tops


def class_width(tops: list[int], blocks: int) -> int:
    """The narrowest captured width (blocks) that holds ``blocks`` (the widest when none does)."""
    i = bisect_left(tops, blocks)
    return tops[min(i, len(tops) - 1)]


class GraphTables:
    """Which block table a replayed decode graph has, as runtime/runner.py captures them: one
    per launch class of the kernel up to the run's widest table (``classes``), else the widest."""

    def __init__(self, gpu, kv_heads: int, block_size: int, classes: bool) -> None:
        self.gpu, self.kv_heads, self.block_size, self.classes = gpu, kv_heads, block_size, classes
        self._tops: dict[int, list[int]] = {}

    def width(self, rows: int, longest: int, widest: int) -> int:
        """Tokens of the table a graph of ``rows`` requests replays for a step whose longest
        request has ``longest`` tokens, the run's widest table being ``widest`` tokens."""
        if not self.classes:
            return widest
        tops = self._tops.get(rows)
        if tops is None:
            tops = self._tops[rows] = launch_classes(
                tile_tokens,
                lambda r, kvh, w, _t: partition_tokens(self.gpu, w, r, kvh),
                rows,
                self.kv_heads,
                widest // self.block_size,
                self.block_size,
            )
        return class_width(tops, -(-int(longest) // self.block_size)) * self.block_size
