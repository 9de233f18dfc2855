"""The runtime's paged decode-attention kernel as both back ends see it: its launch shape (KV
tokens per tile, per split-K partition), chosen from the block table's width by a rule
(``engine.decode_launch``) that runtime/kernels/paged_attention.py launches with and the cost
model prices."""

from __future__ import annotations

import dataclasses
from bisect import bisect_left
from dataclasses import dataclass

from cbsim.config.decode_launch import DecodeLaunchConfig


def next_pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


@dataclass(frozen=True)
class LaunchRule:
    """Tiles of 128 KV tokens (64 from ``small_tile_from`` tokens of table; 0: never); about
    ``target_programs`` programs (request x kv head x partition) at full table width, in
    partitions of a power of two of at least ``min_partition`` tokens; graphs captured per
    power-of-two split count too (``split_classes``), else per single-or-split launch."""

    target_programs: int
    min_partition: int
    small_tile_from: int
    split_classes: bool = True

    @classmethod
    def of(cls, config: DecodeLaunchConfig | None = None) -> LaunchRule:
        """The rule ``engine.decode_launch`` configures (its default when None)."""
        return cls(**dataclasses.asdict(config if config is not None else DecodeLaunchConfig()))

    def tile(self, width: int) -> int:
        return 64 if self.small_tile_from and width >= self.small_tile_from else 128

    def partition(self, rows: int, kv_heads: int, width: int, tile: int | None = None) -> int:
        tile = self.tile(width) if tile is None else tile
        splits = max(1, -(-self.target_programs // max(1, rows * kv_heads)))
        return max(next_pow2(-(-width // splits)), self.min_partition, tile)


# the rule of every build before engine.decode_launch (recordings without otherData.decode_launch):
# 128-token tiles up to 2048 tokens of table, about 1024 programs, partitions of >= 1024 tokens
RULE_BEFORE = LaunchRule(1024, 1024, small_tile_from=2049, split_classes=False)


def table_width(longest: int, block_size: int) -> int:
    """KV tokens of a block table holding ``longest`` tokens (whole blocks)."""
    return max(1, -(-int(longest) // block_size)) * block_size


def launch_name(tile: int, partition: int, width: int) -> str:
    """A launch as kernel tables name it: ``t<tile>`` when one partition covers the ``width``
    tokens of the table (no reduce kernel), else ``t<tile>p<partition>``."""
    return f"t{tile}" if partition >= width else f"t{tile}p{partition}"


def launch_classes(rule: LaunchRule, rows: int, kv_heads: int, max_blocks: int, block_size: int):
    """The block-table widths (in blocks) a graph of ``rows`` requests is captured at when each
    decode-kernel launch gets its own: the widest table of each run of widths with the same tile,
    partition and power-of-two split count. A step replays the narrowest that holds its longest
    request, so its kernel runs about as it would with a table as wide as that request (as the
    kernel tables time it): within a class the splits past a request's context are at most
    half of them, and exit at once."""
    tops: list[int] = []
    prev = None
    for blocks in range(1, max(1, max_blocks) + 1):
        width = blocks * block_size
        t = rule.tile(width)
        p = rule.partition(rows, kv_heads, width, t)
        splits = -(-width // p)
        key = (t, p, next_pow2(splits) if rule.split_classes else splits == 1)
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

    def __init__(self, rule: LaunchRule, kv_heads: int, block_size: int, classes: bool) -> None:
        self.rule, self.kv_heads, self.block_size, self.classes = (
            rule,
            kv_heads,
            block_size,
            classes,
        )
        self._tops: dict[tuple[int, int], list[int]] = {}

    def width(self, rows: int, longest: int, widest: int) -> int:
        """Tokens of the table a graph of ``rows`` requests replays for a step whose longest
        request has ``longest`` tokens, the run's widest table being ``widest`` tokens."""
        if not self.classes:
            return widest
        key = (rows, widest)
        tops = self._tops.get(key)
        if tops is None:
            tops = self._tops[key] = launch_classes(
                self.rule, rows, self.kv_heads, widest // self.block_size, self.block_size
            )
        return class_width(tops, -(-int(longest) // self.block_size)) * self.block_size
