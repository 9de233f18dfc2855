"""The roofline cost model: each term from the config, checked against the brief's figures."""

from __future__ import annotations

import dataclasses
import math

import pytest
from cost_shapes import Shape

from cbsim.config.schema import CbsimConfig, GpuCosts, HardwareConfig, HostCosts, PhaseCost
from cbsim.costs import CostModel


def decode(requests, context):
    return Shape([1] * requests, [context] * requests)


def model(**gpu):
    cfg = CbsimConfig()
    cfg.mode.fuse_epilogues = False  # the build the counts below were taken from
    if gpu:
        cfg.hardware.gpu = dataclasses.replace(cfg.hardware.gpu, **gpu)
    return CostModel(cfg)


def test_weights_time_matches_the_brief_at_bs32():
    # BRIEF: 16.06 GB of 8B weights, about 5.3 ms/step with cuBLAS at bs 32 on the H200
    cfg = CbsimConfig()
    cfg.hardware.gpu.gemm_bandwidth_eff = 0.66  # conf/hardware/h200_estimates.yaml
    f = CostModel(cfg).forward(decode(32, 1), graph=True, carry_over=False)
    assert 5.0e3 < f.linear_us + f.lm_head_us < 5.6e3
    assert f.attention_us < 10  # one KV token each: nothing to read


def test_attention_reads_kv_per_token_and_grows_linearly():
    cm = model()
    a1 = cm.forward(decode(32, 4096), graph=True, carry_over=False).attention_us
    a2 = cm.forward(decode(32, 8192), graph=True, carry_over=False).attention_us
    assert a2 / a1 == pytest.approx(2.0, rel=0.01)
    # 32 x 4096 tokens x 128 KiB at 4.27 TB/s x attention_bandwidth_eff
    expect = (32 * 4096 + 32) * 128 * 1024 / (4.27e12 * 0.5) * 1e6
    assert a1 == pytest.approx(expect, rel=1e-6)


def test_kv_padding_reads_more():
    base = model().forward(decode(8, 1000), graph=True, carry_over=False).attention_us
    padded = model(attention_kv_pad=1024).forward(decode(8, 1000), graph=True, carry_over=False)
    assert padded.attention_us == pytest.approx(base * (1024 + 1) / 1001, rel=1e-6)


def test_prefill_is_compute_bound():
    """The GEMMs at their FLOP rate, plus the activations' elementwise traffic, which runs in
    kernels of its own and is not hidden under the GEMMs."""
    cm = model()
    f = cm.forward(Shape([8192], [8192], "prefill"), graph=False, carry_over=False)
    flops = 2 * CbsimConfig().model.num_params * 8192
    gemms = cm.linear_flops_per_token * 8192 / (7.88e14 * 0.7) * 1e6
    elementwise = cm.act_bytes_per_token * 8192 / cm.gemm_bw
    assert f.linear_us == pytest.approx(gemms + elementwise, rel=1e-9)
    assert 0.05 * gemms < elementwise < 0.5 * gemms
    assert f.linear_us > 0.85 * flops / (7.88e14 * 0.7) * 1e6  # all but embedding and LM head
    assert f.attention_us > cm.forward(decode(1, 8192), graph=False, carry_over=False).attention_us


@pytest.mark.parametrize("fused", [False, True])
def test_graph_replay_vs_eager_gaps_and_carry_over(fused):
    cfg = CbsimConfig()
    cfg.mode.fuse_epilogues = fused
    cm = CostModel(cfg)
    eager = cm.forward(decode(4, 100), graph=False, carry_over=False)
    graph = cm.forward(decode(4, 100), graph=True, carry_over=False)
    carry = cm.forward(decode(4, 100), graph=True, carry_over=True)
    # fused: two adds, a multiply, a cache write fewer, and the rope inside the cache write
    kernels = (9 if fused else 14) * 32 + 6
    assert eager.kernels == kernels and carry.kernels == kernels + 1
    assert eager.overhead_us - graph.overhead_us == pytest.approx(kernels * (2.0 - 0.5))
    assert carry.total_us - graph.total_us == pytest.approx(3.0 + 0.5)


def test_graph_padding_computes_padded_rows():
    cm = model()
    assert cm.graph_size(3) == 4 and cm.graph_size(33) == 48 and cm.graph_size(10**6) is None
    plain = cm.forward(decode(3, 10), graph=True, carry_over=False)
    padded = cm.forward(decode(3, 10), graph=True, carry_over=False, padded_requests=4)
    assert padded.lm_head_us >= plain.lm_head_us and padded.linear_us >= plain.linear_us


def test_eager_steps_with_prompt_tokens_compute_their_padded_rows():
    """engine.eager_token_multiple: a mixed step of 502 tokens runs (and costs) 512 rows, as
    the runtime computes them; a step of one token per request, or off (1), as it is."""
    cm = model()
    assert cm.token_multiple == 64  # the default
    mixed = Shape([1, 1, 500], [300, 301, 500], kind="mixed")
    rows = Shape([1, 1, 510], [300, 301, 510], kind="mixed")  # the same rows unpadded
    padded = cm.forward(mixed, graph=False, carry_over=False)
    assert padded.linear_us == pytest.approx(
        cm.forward(rows, graph=False, carry_over=False).linear_us
    )
    cfg = CbsimConfig()
    cfg.mode.fuse_epilogues = False
    cfg.engine.eager_token_multiple = 1
    assert CostModel(cfg).forward(mixed, graph=False, carry_over=False).linear_us < padded.linear_us
    last_token = Shape([1, 1], [300, 700], kind="mixed")
    assert cm.forward(last_token, graph=False, carry_over=False).linear_us == pytest.approx(
        CostModel(cfg).forward(last_token, graph=False, carry_over=False).linear_us
    )


def test_copies_are_latency_plus_bytes_over_bandwidth():
    cm = model()
    assert cm.h2d_us(0) == 8.0
    assert cm.h2d_us(55_000) == pytest.approx(8.0 + 1.0)
    assert cm.d2h_us(cm.d2h_bytes(32)) == pytest.approx(8.0 + 256 / 55e9 * 1e6)
    assert cm.h2d_bytes(32, 32, 32, 100) == 32 * 12 + 32 * 12 + 100 * 4 + 32 * 8


def test_host_phases_and_launch():
    cfg = CbsimConfig()
    cfg.hardware.host = HostCosts(
        prepare=PhaseCost(100.0, 10.0, 0.5), stall_us=1000.0, stall_every_steps=4
    )
    cm = CostModel(cfg)
    assert cm.prepare_us(32, 64) == 100 + 320 + 32
    assert cm.launch_us(454, graph=True, copies=2, event_ops=5) == 10 + 8 + 5
    assert cm.launch_us(454, graph=False, copies=2, event_ops=5) == 454 * 5 + 8 + 5
    assert [cm.stall_us(i) for i in range(8)] == [0, 0, 0, 1000, 0, 0, 0, 1000]


def test_memory_terms():
    cfg = CbsimConfig()
    cfg.engine.mixed_graphs = "off"  # the decode graphs' pool, which grows with the batch
    cm = CostModel(cfg)
    one = cm.io_slot_bytes(32, 8192, 8448)
    assert one > 2 * 8192 * 12  # pinned + device copies of the largest inputs
    assert cm.graph_pool_bytes_per_slot(32) > cm.graph_pool_bytes_per_slot(8) > 0


def test_every_efficiency_slows_its_term_only():
    base = model().forward(decode(32, 2048), graph=True, carry_over=False)
    slow = model(attention_bandwidth_eff=0.25).forward(
        decode(32, 2048), graph=True, carry_over=False
    )
    assert slow.attention_us == pytest.approx(2 * base.attention_us)
    assert slow.linear_us == base.linear_us and slow.lm_head_us == base.lm_head_us
    assert (
        math.isclose(HardwareConfig().hbm_bandwidth, 4.27e12) and GpuCosts().attention_kv_pad == 1
    )


def seed8192(**gpu):
    """The seed_8192 shape: 32 x (256 + 8192), table 8448 tokens wide, with the
    decode kernel's launch rule of that build."""
    from cbsim.config.schema import DecodeLaunchConfig
    from cbsim.costs.decode_kernel import RULE_BEFORE

    cfg = CbsimConfig()
    cfg.workload.prompt_len, cfg.workload.gen_len = 256, 8192
    cfg.engine.decode_launch = DecodeLaunchConfig(**dataclasses.asdict(RULE_BEFORE))
    cfg.hardware.gpu = dataclasses.replace(cfg.hardware.gpu, **gpu)
    return CostModel(cfg)


def test_gemm_row_cost_is_on_the_memory_side_only():
    base, rows = model(), model(gemm_row_us=20.0)
    dec = (
        rows.forward(decode(32, 100), graph=True, carry_over=False).linear_us,
        base.forward(decode(32, 100), graph=True, carry_over=False).linear_us,
    )
    assert dec[0] - dec[1] == pytest.approx(32 * 20.0)
    # padded graph rows are computed, so they pay it too
    padded = rows.forward(decode(30, 100), graph=True, carry_over=False, padded_requests=32)
    assert padded.linear_us == pytest.approx(dec[0])
    # an 8K-token prefill is FLOP-bound: the per-row term stays under the FLOP time
    pre = Shape([8192], [8192], "prefill")
    assert rows.forward(pre, graph=False, carry_over=False).linear_us == pytest.approx(
        base.forward(pre, graph=False, carry_over=False).linear_us
    )


def test_split_k_partition_mirrors_the_runtime_kernel():
    pytest.importorskip("torch")
    from cbsim.runtime.kernels.paged_attention import pick_partition

    for prompt, gen in ((256, 8192), (256, 1024), (8192, 256), (100, 28)):
        cfg = CbsimConfig()
        cfg.workload.prompt_len, cfg.workload.gen_len = prompt, gen
        cm = CostModel(cfg)
        width = -(-(prompt + gen) // 16) * 16
        tile = 128 if width <= 2048 else 64
        for rows in (1, 4, 8, 32, 128):
            assert cm.partition(rows) == pick_partition(rows, 8, width, tile), (prompt, rows)


def test_attention_walk_follows_the_partition():
    # seed_8192 at batch 32: 4096-token partitions, so the longest walk stops growing at 4096
    walk, base = seed8192(attention_walk_us_per_token=0.5), seed8192()
    assert walk.partition(32) == 4096

    def extra(ctx):
        shape = decode(32, ctx)
        return (
            walk.forward(shape, graph=True, carry_over=False).attention_us
            - base.forward(shape, graph=True, carry_over=False).attention_us
        )

    assert extra(1000) == pytest.approx(500.0)
    assert extra(4096) == pytest.approx(2048.0) == pytest.approx(extra(8000))
    # prefill goes through another kernel
    pre = Shape([512], [512], "prefill")
    assert walk.forward(pre, graph=False, carry_over=False).attention_us == pytest.approx(
        base.forward(pre, graph=False, carry_over=False).attention_us
    )


def test_idle_slowdown_and_per_block_host_terms():
    cm = model(idle_slowdown=0.05)
    assert cm.idle_slowdown_us(400.0) == pytest.approx(20.0) and cm.idle_slowdown_us(-1.0) == 0
    assert model().idle_slowdown_us(1e6) == 0.0
    cfg = CbsimConfig()
    cfg.hardware.host = HostCosts(prepare=PhaseCost(100.0, 0.0, 0.0, 0.5), launch_per_block_us=0.2)
    cm = CostModel(cfg)
    blocks = cm.kv_blocks(32 * 1000, 32)
    assert blocks == 32 * 1000 // 16 + 32
    assert cm.prepare_us(32, 32, blocks) == pytest.approx(100 + 0.5 * blocks)
    assert cm.launch_us(454, graph=True, copies=2, event_ops=5, blocks=blocks) == pytest.approx(
        10 + 0.2 * blocks + 8 + 5
    )


@pytest.mark.parametrize("field", ["gemm_row_us", "attention_walk_us_per_token", "idle_slowdown"])
def test_new_gpu_terms_are_validated(field):
    from cbsim.config import ConfigError

    with pytest.raises(ConfigError, match=field):
        GpuCosts(**{field: -1.0})
    with pytest.raises(ConfigError, match="attention_tile_share"):
        GpuCosts(attention_tile_share=2.0)
    with pytest.raises(ConfigError, match="per_block_us"):
        HostCosts(update=PhaseCost(per_block_us=-1.0))
    with pytest.raises(ConfigError, match="launch_per_block_us"):
        HostCosts(launch_per_block_us=-1.0)


# the runtime's counts on Llama-3-8B (conf/hardware/h200_estimates.yaml, a diagnostic over the H200's recordings)
RUNTIME_COUNTS = dict(
    kernels_per_layer=14,
    kernels_extra=21,
    decode_kernels_per_layer=3,
    prefill_kernels_per_layer=8,
    prefill_kernels_extra=6,
    prefix_kernels_per_layer=13,
    prefix_kernels_extra=12,
)


def test_kernel_counts_follow_the_attention_groups_of_the_step():
    """Decode graph 565 nodes, prompt starts only 731, decode rows + prompt starts 827 (828 with
    the carry-over), + a chunk after a cached prefix 1255: as Kineto counted the runtime's."""
    cm = model(**RUNTIME_COUNTS)
    fwd = cm.forward
    assert fwd(decode(32, 300), graph=True, carry_over=False).kernels == 565
    assert fwd(decode(32, 300), graph=True, carry_over=True).kernels == 566
    prompt = Shape([8192], [8192], kind="prefill")
    assert fwd(prompt, graph=False, carry_over=False).kernels == 731
    mixed = Shape([1, 1, 500], [300, 301, 500], kind="mixed")
    assert fwd(mixed, graph=False, carry_over=True).kernels == 828
    all_three = Shape([1, 200, 300], [300, 700, 300], kind="mixed")  # 200 after 500 cached
    assert fwd(all_three, graph=False, carry_over=False).kernels == 1255
    continuation = Shape([200], [700], kind="prefill")  # a prefix chunk alone
    assert fwd(continuation, graph=False, carry_over=False).kernels == 21 + 32 * 27 + 12
    last_token = Shape([1, 1], [300, 700], kind="mixed")  # a prompt's last token: decode path
    assert fwd(last_token, graph=False, carry_over=False).kernels == 565
    fused = CbsimConfig()
    fused.hardware.gpu = dataclasses.replace(fused.hardware.gpu, **RUNTIME_COUNTS)
    # mode.fuse_epilogues: 4 kernels fewer per layer (Kineto: 565 -> 437 nodes a decode graph),
    # and mode.fuse_rope_kv one more
    assert CostModel(fused).forward(decode(32, 300), graph=True, carry_over=False).kernels == 405
    fused.mode.fuse_rope_kv = False
    assert CostModel(fused).forward(decode(32, 300), graph=True, carry_over=False).kernels == 437
    # the defaults (0): one count for every step, as before
    assert model().forward(prompt, graph=False, carry_over=False).kernels == 14 * 32 + 6


def test_launch_queue_frees_as_the_gpu_works_through_it():
    from cbsim.sim.streams import LaunchQueue

    assert LaunchQueue(0).push(0.0, 100.0, 10**6) == -math.inf  # unbounded
    q = LaunchQueue(4)
    assert q.push(0.0, 100.0, 4) == -math.inf  # fits
    # 6 more behind 4 pending: the host's last launch waits until 6 of the 10 completed, i.e.
    # all 4 of the first op (t=100) and 2 of 6 of the second (100 + 2/6 x 60)
    assert q.push(100.0, 160.0, 6) == pytest.approx(120.0)
    assert q.push(160.0, 170.0, 1) == pytest.approx(100.0 + 3 / 6 * 60)


def test_padded_groups_count_the_work_the_runtime_attention_does():
    """Prompt starts padded to the longest and causal; continuations padded to the longest and
    masked against the whole gathered table; decode rows their context."""
    exact, padded = model(), model(attention_padded_groups=True)
    step = Shape([1, 100, 300, 20], [500, 100, 300, 820], kind="mixed")  # the 20 after 800 cached
    work = padded.padded_attention_work(step)
    assert work == 500 + 2 * 300 * 301 / 2 + 1 * 20 * 832
    fwd = [m.forward(step, graph=False, carry_over=False).attention_us for m in (exact, padded)]
    assert fwd[1] > fwd[0]
    # one prompt from position 0 alone: the same work either way
    one = Shape([8192], [8192], kind="prefill")
    assert padded.padded_attention_work(one) == pytest.approx(8192 * 8193 / 2)
    # the 20 as decode rows (engine.continuation_decode_max >= 20): each its own context
    padded.short_max = 20
    assert padded.padded_attention_work(step) == 500 + 2 * 300 * 301 / 2 + sum(range(801, 821))
