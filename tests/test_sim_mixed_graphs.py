"""engine.mixed_graphs: steps with prompt tokens replayed from graphs per token bucket, piecewise or
whole (cbsim/costs/mixed_graphs.py); the runtime's side is tests/test_runtime_mixed_graphs.py and
tests/test_runtime_full_graphs.py."""

from __future__ import annotations

import dataclasses

import pytest
from conftest import make_config
from cost_shapes import Shape
from sim_harness import make

from cbsim.config import ConfigError
from cbsim.config.schema import EngineConfig
from cbsim.costs import CostModel
from cbsim.costs.mixed_graphs import piece_activation_bytes, token_buckets
from cbsim.metrics import compute_metrics
from cbsim.sim import run

# the runtime's attention-group kernel counts (hardware=h200), so the pieces leave work eager
GROUP_KERNELS = dict(
    decode_kernels_per_layer=3,
    prefill_kernels_per_layer=8,
    prefill_kernels_extra=6,
    prefix_kernels_per_layer=13,
    prefix_kernels_extra=12,
)


def config(mixed_graphs: str, **workload):
    wl = {"prompt_len": 300, "gen_len": 6, "max_batch_tokens": 256, **workload}
    cfg = make("llama3_1b", {"name": "sync", "mixed_graphs": mixed_graphs}, **wl)
    gpu = dataclasses.replace(cfg.hardware.gpu, **GROUP_KERNELS)
    return dataclasses.replace(cfg, hardware=dataclasses.replace(cfg.hardware, gpu=gpu))


def launches(cfg) -> dict[str, list[float]]:
    """The host's launch spans (us) by step kind."""
    s = run(cfg, "sync").spans
    s = s[s.name == "launch"]
    return {k: list(g.dur) for k, g in s.groupby("kind")}


def test_a_step_with_prompt_tokens_launches_its_pieces_and_only_its_attention_eagerly():
    off, on = config("off"), config("buckets")
    host, gpu, layers = on.hardware.host, on.hardware.gpu, on.model.num_layers
    l_off, l_on = launches(off), launches(on)
    assert {"prefill", "mixed"} <= set(l_on)
    # a decode step is one graph launch plus the copies and events every launch has
    rest = l_on["decode"][0] - host.graph_launch_us
    pieces = (layers + 1) * host.graph_launch_us
    per_layer = gpu.decode_kernels_per_layer + gpu.prefill_kernels_per_layer
    per_layer += gpu.prefix_kernels_per_layer
    attention = layers * per_layer + gpu.prefill_kernels_extra + gpu.prefix_kernels_extra
    for kind in ("prefill", "mixed"):
        for us in l_on[kind]:
            assert rest + pieces <= us + 1e-6
            assert us <= rest + pieces + attention * host.kernel_launch_us + 1e-6
        # eager: at least the layers' own kernels and those once per forward, one launch each
        own = CostModel(off).kernels
        assert min(l_off[kind]) >= rest + own * host.kernel_launch_us
        # step for step (the same batches: offline, sync), the layers' own launches become the
        # pieces' graph launches
        saved = own * host.kernel_launch_us - pieces
        assert [a - b for a, b in zip(l_off[kind], l_on[kind])] == pytest.approx(
            [saved] * len(l_on[kind])
        )


def test_a_step_is_padded_to_the_smallest_bucket_that_holds_it():
    ladder = [64, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192]
    assert token_buckets(64, 8192) == ladder
    assert token_buckets(64, 2000) == [64, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048]
    costs = CostModel(config("buckets", max_batch_tokens=2048))
    assert costs.token_buckets[-1] == 2048
    assert CostModel(config("off")).token_buckets == []


def test_the_gpu_forward_of_a_bucketed_step_is_at_least_its_unpadded_one():
    costs = CostModel(config("buckets", max_batch_tokens=2048))
    step = Shape([700, 1, 1], [700, 90, 40], kind="mixed")  # 702 tokens: bucket 768
    padded = costs.forward(step, graph=True, carry_over=False, padded_tokens=768)
    exact = costs.forward(step, graph=True, carry_over=False, padded_tokens=702)
    assert padded.linear_us > exact.linear_us
    assert padded.total_us > exact.total_us
    assert padded.attention_us == exact.attention_us  # attention runs over the real rows
    # the pieces' kernels pay the node gap, the eager attention the eager gap
    gpu = costs.gpu
    eager = costs.forward(step, graph=False, carry_over=False)
    gaps = gpu.graph_node_gap_us * (padded.kernels - padded.eager_kernels)
    gaps += gpu.eager_kernel_gap_us * padded.eager_kernels
    assert padded.overhead_us == pytest.approx(gpu.forward_fixed_us + gaps)
    assert eager.overhead_us == pytest.approx(
        gpu.forward_fixed_us + gpu.eager_kernel_gap_us * eager.kernels
    )
    assert padded.pieces == costs.layers + 1 and eager.kernels == padded.kernels


def test_a_full_step_launches_one_graph_with_its_attention_inside():
    """engine.mixed_graphs=full: a step with prompt tokens launches as a decode step does (one
    graph), and its GPU forward is the piecewise one's without the eager attention's gaps."""
    pieces, full = config("buckets"), config("full")
    host = full.hardware.host
    l_pieces, l_full = launches(pieces), launches(full)
    rest = l_full["decode"][0] - host.graph_launch_us
    for kind in ("prefill", "mixed"):
        assert l_full[kind] == pytest.approx([rest + host.graph_launch_us] * len(l_full[kind]))
        assert max(l_full[kind]) < min(l_pieces[kind])
    step = Shape([700, 1, 1], [700, 90, 40], kind="mixed")
    on = [
        CostModel(config(mg, max_batch_tokens=2048)).forward(
            step, graph=True, carry_over=False, padded_tokens=768
        )
        for mg in ("buckets", "full")
    ]
    assert on[1].pieces == 1 and on[1].eager_kernels == 0 < on[0].eager_kernels
    assert on[1].linear_us == on[0].linear_us and on[1].attention_us == on[0].attention_us
    gpu = full.hardware.gpu
    saved = (gpu.eager_kernel_gap_us - gpu.graph_node_gap_us) * on[0].eager_kernels
    assert on[0].overhead_us - on[1].overhead_us == pytest.approx(saved * gpu.spread.forward_scale)


def test_decode_steps_and_decode_only_workloads_are_unchanged_by_the_switch():
    # one-token prompts: every step replays a decode graph
    a = compute_metrics(run(config("off", prompt_len=1), "sync"))
    b = compute_metrics(run(config("buckets", prompt_len=1), "sync"))
    assert a["total_time_s"] == b["total_time_s"] and a["steps"] == b["steps"]
    # and the decode steps of a workload with prompts keep their launch and forward
    spans = {}
    for mg in ("off", "buckets"):
        s = run(config(mg), "sync").spans
        s = s[(s.kind == "decode") & s.name.isin(["launch", "graph_replay"])]
        spans[mg] = sorted(zip(s.name, s.step, s.dur.round(6)))
    assert spans["off"] == spans["buckets"]


def test_the_runtime_refuses_mixed_graphs_in_one_line_naming_the_key():
    from cbsim.runtime.engine import check_device

    cfg = make_config(["mode=runtime", "mode.device=cpu", "engine.mixed_graphs=buckets"])
    with pytest.raises(ConfigError, match=r"^engine\.mixed_graphs=buckets .*allowed") as exc:
        check_device(cfg, "sync")
    assert "\n" not in str(exc.value)


def test_a_bad_mixed_graphs_value_names_the_key_and_what_is_allowed():
    with pytest.raises(ConfigError, match=r"engine\.mixed_graphs.*auto.*full.*buckets.*off"):
        EngineConfig(mixed_graphs="pieces")
    with pytest.raises(ConfigError, match=r"engine\.mixed_graphs"):
        make_config(["engine.mixed_graphs=on"])


def test_the_graph_pool_holds_the_largest_buckets_pieces_and_no_more():
    off = CostModel(config("off", max_batch_tokens=2048))
    on = CostModel(config("buckets", max_batch_tokens=2048))
    pieces = piece_activation_bytes(on.model, 2048)
    assert off.graph_pool_bytes_per_slot(4) < pieces
    assert on.graph_pool_bytes_per_slot(4) == pieces


@pytest.mark.parametrize(
    "overrides, mode",
    [
        ([], "full"),
        (["engine.cuda_graphs=false"], "off"),
        (["mode.attention=torch"], "off"),
        (["mode.device=cpu"], "off"),
        (["engine.mixed_graphs=buckets"], "buckets"),
        (["engine.mixed_graphs=off"], "off"),
    ],
)
def test_auto_is_full_where_the_runtime_replays_graphs_with_triton_attention(overrides, mode):
    """engine.mixed_graphs defaults to auto: the whole forward of a step with prompt tokens
    from one graph per bucket where CUDA graphs run with the Triton attention, eager elsewhere;
    an explicit value is kept."""
    from cbsim.costs.mixed_graphs import mixed_graphs_mode

    cfg = make_config(overrides)
    assert mixed_graphs_mode(cfg) == mode
    assert bool(CostModel(cfg).token_buckets) == (mode != "off")


def test_a_recording_runs_the_mixed_graphs_its_build_says_and_older_ones_ran_eagerly():
    """otherData.mixed_graphs is what the runtime ran (auto resolved on its device); a build
    that did not record it ran every step with prompt tokens eagerly."""
    from conftest import REPO

    from cbsim.calibration.recordings import load

    root = REPO / "experiments" / "recordings"
    old = root / "h200" / "fit_a" / "ref_8b_16x512+256" / "trace_sync.json.gz"
    new = root / "h100" / "heldout" / "r6" / "8b_poisson_16" / "trace_sync.json.gz"
    got = {}
    for rec in load([old, new], root):
        other = rec.trace.other_data.get("mixed_graphs")
        got[rec.name] = (other, rec.config.engine.mixed_graphs)
    assert got == {
        "h200/fit_a/ref_8b_16x512+256/trace_sync": (None, "off"),
        "h100/heldout/r6/8b_poisson_16/trace_sync": ("off", "off"),
    }
