"""The runtime on CUDA (marker gpu; skipped without CUDA; run on the H200, log in
its log beside a recorded set): async == sync == generate, graphs, streams, the shared graph pool
and the piecewise graphs of steps with prompt tokens (engine.mixed_graphs=buckets)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

from test_runtime_sync import CASES, assert_same_tokens, reference_tokens  # noqa: E402

from cbsim.costs.decode_kernel import LaunchRule, launch_classes  # noqa: E402
from cbsim.runtime.engine import execute  # noqa: E402
from cbsim.trace import schema as S  # noqa: E402
from cbsim.trace import validate  # noqa: E402

GPU = ["mode=runtime", "mode.device=cuda", "model=tiny", "mode.warmup_steps=1"]


MID = [
    "model.hidden_size=1024",
    "model.intermediate_size=4096",
    "model.num_layers=4",
    "model.num_heads=8",
    "model.num_kv_heads=2",
    "model.head_dim=128",
    "model.vocab_size=32000",
    "model.dtype=bfloat16",
]


@pytest.mark.parametrize("attention", ["torch", "auto"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_async_equals_sync_equals_generate(config_factory, case, attention):
    over = GPU + CASES[case] + [f"mode.attention={attention}", "engine.graph_batch_sizes=[1,2,4]"]
    sync = execute(config_factory(over + ["engine=sync"]), "sync")
    asyn = execute(config_factory(over + ["engine=async"]), "async")
    assert asyn.summary["graph_steps"] > 0
    assert_same_tokens(asyn, {k: v for k, v in sync.outputs.items()})
    ref = reference_tokens(config_factory(over), device="cuda")
    if attention == "torch":
        assert_same_tokens(sync, ref)
    else:
        # the Triton kernel's float32 dot may run in tf32: allow a rare late argmax flip
        same = [np.array_equal(sync.outputs[k], v) for k, v in ref.items()]
        assert np.mean(same) >= 0.75, same
    for res in (sync, asyn):
        trace = validate(res.trace.to_json_obj())  # no overlap on any stream lane
        host = trace.spans[trace.spans.lane == S.HOST]
        # the host blocks once per step
        assert (host.name == S.WAIT).sum() == res.summary["steps"]


@pytest.mark.parametrize("attention", ["torch", "triton"])
def test_short_continuations_as_decode_rows_on_the_gpu(config_factory, attention):
    """engine.continuation_decode_max=16: every continuation of the chunked case attends as
    decode rows through the decode kernel (Triton or the torch path); async == sync, and the
    torch path's tokens are generate's."""
    over = (
        GPU + CASES["chunked"] + [f"mode.attention={attention}", "engine.graph_batch_sizes=[1,2,4]"]
    )
    over += ["engine.continuation_decode_max=16"]
    sync = execute(config_factory(over + ["engine=sync"]), "sync")
    asyn = execute(config_factory(over + ["engine=async"]), "async")
    assert_same_tokens(asyn, sync.outputs)
    assert sync.trace.other_data["continuation_decode_max"] == 16
    if attention == "torch":
        assert_same_tokens(sync, reference_tokens(config_factory(over), device="cuda"))


@pytest.mark.parametrize("case", sorted(CASES))
def test_async_on_one_stream_equals_sync(config_factory, case):
    """engine.streams=one: the async loop's copies and forwards on one stream, its host still
    ahead (batch N+1 launched before N's forward ends), its tokens the sync engine's."""
    over = GPU + CASES[case] + ["mode.attention=auto", "engine.graph_batch_sizes=[1,2,4]"]
    sync = execute(config_factory(over + ["engine=sync"]), "sync")
    one = execute(config_factory(over + ["engine=async", "engine.streams=one"]), "async")
    assert one.trace.other_data["streams"] == "one" and sync.trace.other_data["streams"] == "one"
    assert one.summary["graph_steps"] > 0
    assert_same_tokens(one, sync.outputs)
    trace = validate(one.trace.to_json_obj())
    gpu = trace.spans[trace.spans.lane.isin([S.H2D, S.COMPUTE, S.D2H])].sort_values("ts")
    # one queue: no GPU operation starts before the one enqueued ahead of it has ended
    assert (gpu.ts.to_numpy()[1:] >= (gpu.ts + gpu.dur).to_numpy()[:-1] - 1.0).all()


def test_every_run_of_the_process_issues_its_forwards_to_one_stream():
    """The streams belong to the process: sync, async on one stream and async on three share
    the compute stream; three streams add two copy streams, the same for every run."""
    import torch

    from cbsim.runtime.streams import Streams

    dev = torch.device("cuda")
    one, three, again = (Streams.create(dev, t) for t in (False, True, True))
    assert one.h2d is one.compute is one.d2h is three.compute
    assert len({id(three.h2d), id(three.compute), id(three.d2h)}) == 3
    assert (again.h2d, again.d2h) == (three.h2d, three.d2h)
    assert Streams.create(torch.device("cuda:0"), False).compute is one.compute


def test_async_overlaps_host_and_gpu_and_shares_the_graph_pool(config_factory):
    """Batch N+1 is launched before batch N's forward ends; two slots' graphs in one pool cost
    about one slot's, not double."""
    # 32 layers: the forward (8x the 4-layer one) above the host's step (0.5-0.8 ms: it varies
    # 2x between device calls, runtime/README.md), so the GPU sets the pace
    mid = [o for o in MID if not o.startswith("model.num_layers=")] + ["model.num_layers=32"]
    over = (
        GPU
        + mid
        + [
            "engine=async",
            "workload.batch_size=32",
            "workload.prompt_len=64",
            "workload.gen_len=48",
            # the decode graphs' pool (test_full_mixed_graphs_replay_the_eager_tokens: the
            # prompt steps' graphs, whose activations the pool holds beside them)
            "engine.mixed_graphs=off",
        ]
    )
    res = execute(config_factory(over), "async")
    spans = res.trace.spans
    comp = spans[spans.lane == S.COMPUTE].set_index("step")
    launches = spans[(spans.lane == S.HOST) & (spans.name == S.LAUNCH)].set_index("step").ts
    ahead = sum(launches[s + 1] < comp.end[s] for s in comp.index if s + 1 in launches.index)
    print(f"launched ahead of the previous forward's end: {ahead} of {len(comp)} steps")
    assert ahead > 0.5 * len(comp)
    assert res.summary["gc_collections_in_loop"] == 0  # the collector is off inside the loop
    assert set(comp.name) == {S.GRAPH_REPLAY, S.FORWARD}
    mem = res.trace.other_data["memory"]
    one, both = mem["graph_pool_bytes_single_slot"], mem["graph_pool_bytes"]
    print(f"graph pool: one slot {one} B, two slots {both} B, graphs {mem['graphs']}")
    assert one > 0
    assert both <= 1.25 * one


def test_graphs_per_table_width_replay_the_tokens_of_one_width(config_factory):
    """A graph per launch class of the decode kernel (engine.graph_width_classes): the contexts
    cross 1024 tokens, so the 4-request steps replay two widths; the tokens are those of graphs
    that all hold the longest request's table."""
    over = GPU + [
        "mode.attention=auto",
        "engine=async",
        "engine.graph_batch_sizes=[1,2,4]",
        "workload.batch_size=4",
        "workload.prompt_len=1000",
        "workload.gen_len=64",
    ]
    runs = {
        on: execute(config_factory(over + [f"engine.graph_width_classes={on}"]), "async")
        for on in ("true", "false")
    }
    classes, one = (runs[on].trace.other_data for on in ("true", "false"))
    assert classes["graph_width_classes"] is True and one["graph_width_classes"] is False
    # the rule's launch classes up to 1064 tokens (67 blocks), 1024 tokens (64) among them
    rule = LaunchRule.of()
    kv_heads = config_factory(over).model.num_kv_heads
    widths = {b: launch_classes(rule, b, kv_heads, 67, 16) for b in (1, 2, 4)}
    assert classes["graph_widths"]["4"] == widths[4] and widths[4][-2:] == [64, 67]
    assert one["graph_widths"]["4"] == [67]
    per_width = one["memory"]["graphs"] // 3  # graphs of one bucket at one width (its slots)
    assert classes["memory"]["graphs"] == per_width * sum(len(w) for w in widths.values())
    assert runs["true"].summary["graph_steps"] == runs["false"].summary["graph_steps"] > 0
    assert_same_tokens(runs["true"], runs["false"].outputs)


@pytest.mark.parametrize("case", sorted(CASES))
def test_mixed_graphs_replay_the_eager_tokens(config_factory, case):
    """engine.mixed_graphs=buckets on CUDA (runtime/piecewise.py): the pieces captured per
    (slot, bucket) on the shared pool, with the fusions the build applies, replayed with
    attention eager between them: sync == async == the switch off == generate; layers + 1
    graphs per (slot, bucket)."""
    over = GPU + CASES[case] + ["mode.attention=torch", "engine.graph_batch_sizes=[1,2,4]"]
    over += ["engine.eager_token_multiple=8"]
    on = over + ["engine.mixed_graphs=buckets"]
    off = execute(config_factory(over + ["engine=sync"]), "sync")
    sync = execute(config_factory(on + ["engine=sync"]), "sync")
    asyn = execute(config_factory(on + ["engine=async"]), "async")
    assert_same_tokens(sync, off.outputs)
    assert_same_tokens(asyn, off.outputs)
    assert_same_tokens(sync, reference_tokens(config_factory(over), device="cuda"))
    layers = config_factory(over).model.num_layers
    for res, slots in ((sync, 1), (asyn, 2)):
        od = res.trace.other_data
        mem = od["memory"]
        print(f"{case} {od['engine']}: {mem}")
        want = {"projections": True, "norm_rope": True, "epilogues": True, "rope_kv": True}
        assert od["fused"] == want
        assert mem["mixed_graph_steps"] == slots * len(od["mixed_graph_buckets"])
        assert mem["mixed_graphs"] == mem["mixed_graph_steps"] * (layers + 1)
        assert res.summary["mixed_graph_steps"] > 0
        fwd = validate(res.trace.to_json_obj()).span_frame({"pieces": 0})
        fwd = fwd[fwd.lane == S.COMPUTE]
        prompt = fwd.query_tokens > fwd.requests
        assert (fwd.pieces[prompt] == layers + 1).all()


@pytest.mark.parametrize("case", sorted(CASES))
def test_full_mixed_graphs_replay_the_eager_tokens(config_factory, case):
    """engine.mixed_graphs=full on CUDA (runtime/full_graphs.py), what the default (auto) runs
    there: one graph per (slot, bucket) on the shared pool, attention inside it (the varlen
    Triton kernel), replayed over each step's metadata: sync == async == the switch off ==
    generate; a step is one graph."""
    over = GPU + CASES[case] + ["mode.attention=triton", "engine.graph_batch_sizes=[1,2,4]"]
    over += ["engine.eager_token_multiple=8"]
    on = over  # engine.mixed_graphs=auto
    off = execute(config_factory(over + ["engine=sync", "engine.mixed_graphs=off"]), "sync")
    assert off.trace.other_data["mixed_graphs"] == "off"
    sync = execute(config_factory(on + ["engine=sync"]), "sync")
    asyn = execute(config_factory(on + ["engine=async"]), "async")
    assert_same_tokens(sync, off.outputs)
    assert_same_tokens(asyn, off.outputs)
    assert_same_tokens(sync, reference_tokens(config_factory(over), device="cuda"))
    for res, slots in ((sync, 1), (asyn, 2)):
        od = res.trace.other_data
        mem = od["memory"]
        print(f"{case} {od['engine']}: {mem}")
        assert od["mixed_graphs"] == "full"
        assert (
            mem["mixed_graph_steps"]
            == mem["mixed_graphs"]
            == slots * len(od["mixed_graph_buckets"])
        )
        assert res.summary["mixed_graph_steps"] > 0
        fwd = validate(res.trace.to_json_obj()).span_frame({"pieces": 0})
        fwd = fwd[fwd.lane == S.COMPUTE]
        assert (fwd.name == S.GRAPH_REPLAY).all() and (fwd.pieces == 0).all()
