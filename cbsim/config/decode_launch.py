"""engine.decode_launch: how the Triton decode kernel launches, in both back ends."""

from __future__ import annotations

from dataclasses import dataclass

from cbsim.config.errors import ConfigError, check_range


@dataclass
class DecodeLaunchConfig:
    """The decode kernel's launch rule (cbsim.costs.decode_kernel.LaunchRule): chosen from the
    H200 kernel tables that timed every launch (the H200's kernel probes): over
    1-256 requests x 256-16384 tokens of the three Llama shapes it is 2.7% above the fastest
    launch (geometric mean; 3.1% of the total time), the rule before it 17.5% (5.5%), which
    left 1-16 requests 1.1-2.9x slower than they can be."""

    # about this many programs (request x kv head x partition) at full table width: 256, two
    # per SM of the H200's 132 (512, 1024: 4.8%, 6.9% above the fastest)
    target_programs: int = 256
    # split-K partitions are a power of two of at least this many KV tokens (one tile)
    min_partition: int = 128
    # 64-token KV tiles from this table width (tokens) on, 128 below; 0: always 128 (64 from
    # 2049 tokens was the rule before: 5.6% above the fastest, 17.5% with its partitions)
    small_tile_from: int = 0
    # graphs (engine.graph_width_classes) per power-of-two split count as well, so a graph's
    # table is at most twice the splits its requests use
    split_classes: bool = True

    def __post_init__(self) -> None:
        check_range("engine.decode_launch.target_programs", self.target_programs, 1, 1 << 20)
        check_range("engine.decode_launch.min_partition", self.min_partition, 16, 1 << 20)
        if self.min_partition & (self.min_partition - 1):
            raise ConfigError(
                f"engine.decode_launch.min_partition={self.min_partition} is not a power of two; "
                "allowed: 16, 32, 64, 128, ..."
            )
        check_range("engine.decode_launch.small_tile_from", self.small_tile_from, 0, 1 << 24)
