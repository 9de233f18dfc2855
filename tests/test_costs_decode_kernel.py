"""The decode kernel's tiles: a step's attention between the table's contexts (tile multiples)
charged per token, and ``attention_tile_share`` of it per whole tile."""

from __future__ import annotations

import dataclasses

import pytest
from cost_shapes import Shape
from test_costs_walks import with_gpu
from test_kernel_tables import config

from cbsim.config.schema import DecodeLaunchConfig
from cbsim.costs import CostModel
from cbsim.costs.decode_kernel import RULE_BEFORE, LaunchRule, launch_classes, table_width

BEFORE = DecodeLaunchConfig(**dataclasses.asdict(RULE_BEFORE))


def attention(share: float, context: int, requests: int = 64) -> float:
    cfg = with_gpu(config(), attention_tile_share=share)
    cfg.workload = type(cfg.workload)(prompt_len=128, gen_len=256)  # a 384-token table: tile 128
    step = Shape([1] * requests, [context] * requests)
    return CostModel(cfg).forward(step, graph=True, carry_over=False).attention_us


def test_tiles_follow_the_table_width_as_the_rule_says():
    rule = LaunchRule.of()
    assert rule.tile(table_width(384, 16)) == 128 and rule.tile(table_width(8449, 16)) == 128
    assert RULE_BEFORE.tile(table_width(2048, 16)) == 128
    assert RULE_BEFORE.tile(table_width(2049, 16)) == 64


def test_a_context_just_past_a_tile_pays_the_whole_tile_by_its_share():
    per_token, tiled = attention(0.0, 129), attention(1.0, 129)
    assert tiled == pytest.approx(attention(0.0, 256))  # 129 tokens: two tiles, as 256
    assert attention(0.5, 129) == pytest.approx((per_token + tiled) / 2)
    assert per_token < tiled


def test_at_a_tile_multiple_the_share_changes_nothing():
    assert attention(1.0, 256) == pytest.approx(attention(0.0, 256))


def test_the_share_is_validated():
    from cbsim.config import ConfigError

    with pytest.raises(ConfigError, match="attention_tile_share"):
        with_gpu(config(), attention_tile_share=1.5)


def test_the_forward_fit_keeps_the_share_a_share():
    """Calibration fits every float GPU term; the tile share within [0, 1], the others open."""
    from cbsim.calibration.forward import ForwardProblem, gpu_terms
    from cbsim.config.schema import HardwareConfig

    hw = HardwareConfig()
    problem = ForwardProblem(hw, [], gpu_terms(hw.gpu))
    lower, upper = problem.bounds()
    share, walk = (
        problem.names.index(k) for k in ("attention_tile_share", "prefix_walk_us_per_element")
    )
    assert (lower[share], upper[share]) == (0.0, 1.0)
    assert upper[walk] > 1.0


def test_a_graph_tiles_by_its_table_an_eager_step_by_its_own():
    cfg = config()
    cfg.engine.decode_launch = BEFORE  # 64-token tiles past 2048 tokens of table
    cfg.workload = type(cfg.workload)(prompt_len=128, gen_len=4096)  # a 4224-token table
    step = Shape([1, 1], [300, 1000], kind="mixed")
    assert CostModel(cfg).decode_tile(step, padded=2) == 128  # its launch class: 1024 tokens
    assert CostModel(cfg).decode_tile(step, padded=None) == 128  # its own 1008-token table
    cfg.engine.graph_width_classes = False  # every graph as wide as the longest request
    assert CostModel(cfg).decode_tile(step, padded=2) == 64


def test_the_share_falls_with_the_tiles_kv_bytes_over_the_batch():
    """share / (1 + rows x a tile's KV bytes per request / attention_tile_share_bytes)."""
    cfg = with_gpu(config(), attention_tile_share=1.0)
    m = cfg.model
    tile_bytes = 2 * m.num_kv_heads * m.head_dim * m.dtype_bytes * 128
    fall = 64 * tile_bytes  # the share halves at 64 requests

    def at(requests: int, share: float, nbytes: float) -> float:
        c = with_gpu(config(), attention_tile_share=share, attention_tile_share_bytes=nbytes)
        c.workload = type(c.workload)(prompt_len=128, gen_len=256)
        step = Shape([1] * requests, [129] * requests)
        return CostModel(c).forward(step, graph=True, carry_over=False).attention_us

    for requests, expected in ((64, 0.5), (192, 0.25)):
        per_token, tiled = at(requests, 0.0, 0.0), at(requests, 1.0, 0.0)
        got = (at(requests, 1.0, fall) - per_token) / (tiled - per_token)
        assert got == pytest.approx(expected)
    assert at(64, 1.0, 0.0) > at(64, 1.0, fall)


def test_the_measured_share_and_its_fall_are_not_fitted():
    from cbsim.calibration.forward import fitted_terms
    from cbsim.config.schema import HardwareConfig

    hw = HardwareConfig()
    assert "attention_tile_share" in fitted_terms(hw.gpu)
    assert "attention_tile_share_bytes" not in fitted_terms(hw.gpu)
    measured = with_gpu(config(), attention_tile_share_bytes=1e8).hardware.gpu
    assert "attention_tile_share" not in fitted_terms(measured)


def test_a_negative_fall_is_refused():
    from cbsim.config import ConfigError

    with pytest.raises(ConfigError, match="attention_tile_share_bytes"):
        with_gpu(config(), attention_tile_share_bytes=-1.0)


def test_graph_table_widths_are_the_rules_launch_classes():
    """The simulator's graph widths are the launch classes runtime/runner.py captures (the same
    function over the same rule): at 32 requests the default rule launches one partition over
    any table, captured per power of two of its width; the rule before it per tile, partition
    and single-or-split launch."""
    cfg = config()
    cfg.workload = type(cfg.workload)(prompt_len=256, gen_len=8192)  # 528 blocks
    for launch, expected in (
        (DecodeLaunchConfig(), [8, 16, 32, 64, 128, 256, 512, 528]),
        (BEFORE, [64, 128, 256, 512, 528]),
    ):
        cfg.engine.decode_launch = launch
        cm = CostModel(cfg)
        for rows in (1, 4, 16, 32, 128):
            tops = launch_classes(cm.rule, rows, 8, 528, 16)
            assert tops[-1] == 528
            got = sorted({cm.graph_table(rows, ctx) // 16 for ctx in range(1, 8449, 7)} | {528})
            assert got == tops, rows
        assert launch_classes(cm.rule, 32, 8, 528, 16) == expected
        # a step replays the narrowest that holds its longest request
        widths = [cm.graph_table(32, c) for c in (1, 1024, 1025, 4096, 4097, 8448)]
        assert widths[1:] == [1024, 2048, 4096, 8192, 8448]


def test_a_split_launch_is_captured_per_power_of_two_of_its_splits():
    """One request of 8 kv heads: 32 partitions aimed at, of at least 128 tokens (the default
    rule); a graph's table is at most twice the splits its longest request uses, so the
    splits past it stay few."""
    cfg = config()
    cfg.workload = type(cfg.workload)(prompt_len=256, gen_len=8192)
    cm = CostModel(cfg)
    assert cm.partition(1, 4096) == 128 and cm.partition(1, 8448) == 512
    assert [cm.graph_table(1, c) for c in (100, 129, 300, 1000, 5000)] == [
        128,
        256,
        512,
        1024,
        8192,
    ]


def test_a_bad_launch_rule_names_its_key():
    from cbsim.config import ConfigError

    with pytest.raises(
        ConfigError, match=r"engine\.decode_launch\.min_partition=100 is not a power"
    ):
        DecodeLaunchConfig(min_partition=100)
    with pytest.raises(ConfigError, match=r"engine\.decode_launch\.target_programs"):
        DecodeLaunchConfig(target_programs=0)
