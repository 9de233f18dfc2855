"""The runtime's sync engine on the CPU with the tiny model: greedy tokens == transformers'
`model.generate`, token for token, over the workloads that exercise the scheduler's paths."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import assert_nests

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from cbsim.config.errors import ConfigError  # noqa: E402
from cbsim.runtime.engine import execute  # noqa: E402
from cbsim.runtime.model import build_model  # noqa: E402
from cbsim.trace import schema as S  # noqa: E402
from cbsim.trace import validate  # noqa: E402
from cbsim.workload import make_requests  # noqa: E402

BASE = ["mode=runtime", "mode.device=cpu", "model=tiny", "engine=sync", "mode.warmup_steps=1"]


@pytest.fixture(autouse=True)
def one_thread():
    # tiny matrices: extra threads only add contention on shared CI machines
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def reference_tokens(config, device: str = "cpu") -> dict[int, np.ndarray]:
    """Greedy tokens from transformers' own generate (sdpa attention, contiguous cache)."""
    dev = torch.device(device)
    model = build_model(config.model, dev, seed=config.workload.seed, attn_implementation="sdpa")
    out = {}
    for r in make_requests(config.workload, config.model.vocab_size):
        ids = torch.tensor(np.asarray(r.prompt_ids), dtype=torch.long, device=dev)[None]
        gen = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=r.max_new_tokens,
            min_new_tokens=r.max_new_tokens,
            do_sample=False,
        )
        out[r.rid] = gen[0, ids.shape[1] :].cpu().numpy()
    return out


def assert_same_tokens(result, ref) -> None:
    assert result.outputs.keys() == ref.keys()
    for rid, toks in ref.items():
        np.testing.assert_array_equal(result.outputs[rid], toks, err_msg=f"request {rid}")


CASES = {
    # staggered generation lengths: requests retire at different steps, others are admitted
    "staggered": [
        "workload.batch_size=4",
        "workload.num_requests=7",
        "workload.prompt_len=12",
        "workload.prompt_dist=uniform",
        "workload.prompt_spread=0.5",
        "workload.gen_len=10",
        "workload.gen_dist=uniform",
        "workload.gen_spread=0.8",
    ],
    # prompts longer than the token budget: chunked prefill over several steps, mixed batches
    "chunked": [
        "workload.batch_size=3",
        "workload.num_requests=4",
        "workload.prompt_len=40",
        "workload.gen_len=6",
        "workload.max_batch_tokens=16",
    ],
    # poisson arrivals: requests join a running batch mid-run
    "poisson": [
        "workload.batch_size=4",
        "workload.num_requests=6",
        "workload.prompt_len=9",
        "workload.gen_len=8",
        "workload.arrival=poisson",
        "workload.rate=200",
    ],
    # a KV cache too small for everyone: preemption by recompute, then the same tokens
    "preempt": [
        "workload.batch_size=4",
        "workload.num_requests=4",
        "workload.prompt_len=14",
        "workload.gen_len=20",
        "workload.kv_block_size=4",
        "workload.kv_num_blocks=20",
    ],
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_sync_matches_generate(config_factory, case):
    config = config_factory(BASE + CASES[case])
    result = execute(config, "sync")
    assert_same_tokens(result, reference_tokens(config))
    summary = result.summary
    assert summary["generated_tokens"] == sum(len(t) for t in result.outputs.values())
    if case == "preempt":
        assert summary["preemptions"] > 0
    if case == "chunked":
        kinds = set(result.trace.spans["kind"])
        assert {"prefill", "mixed"} <= kinds or "mixed" in kinds


@pytest.mark.parametrize("multiple", [1, 64])
def test_padded_eager_steps_give_the_same_tokens(config_factory, multiple):
    """engine.eager_token_multiple pads steps with prompt tokens (every step here but the
    decodes); the padding rows change no token, and the trace says how the build padded."""
    config = config_factory(BASE + CASES["chunked"] + [f"engine.eager_token_multiple={multiple}"])
    result = execute(config, "sync")
    assert_same_tokens(result, reference_tokens(config))
    assert result.trace.other_data["eager_token_multiple"] == multiple


@pytest.mark.parametrize("short_max", [0, 8])
def test_short_continuations_as_decode_rows_give_the_same_tokens(config_factory, short_max):
    """engine.continuation_decode_max: the chunked case's continuations are 16 and 8 tokens; at 8
    the last chunk of each prompt attends as decode rows, at 0 every chunk through the masked
    path; the tokens are generate's either way, and the trace says what the build did."""
    config = config_factory(
        BASE + CASES["chunked"] + [f"engine.continuation_decode_max={short_max}"]
    )
    result = execute(config, "sync")
    assert_same_tokens(result, reference_tokens(config))
    assert result.trace.other_data["continuation_decode_max"] == short_max


def test_trace_has_every_lane_phase_and_request_event(config_factory):
    config = config_factory(BASE + CASES["staggered"])
    result = execute(config, "sync")
    trace = validate(result.trace.to_json_obj())
    od = trace.other_data
    assert od["source"] == "runtime" and od["engine"] == "sync"
    assert {"torch", "transformers", "name"} <= od["hardware"].keys()
    assert {"io_buffer_bytes", "graph_pool_bytes", "graph_pool_bytes_single_slot"} <= od[
        "memory"
    ].keys()
    spans = trace.spans
    steps = result.summary["steps"]
    host = spans[spans.lane == S.HOST]
    for phase in S.HOST_PHASES:
        assert (host.name == phase).sum() == steps, phase
    fwd = spans[spans.lane == S.COMPUTE]
    assert len(fwd) == steps and set(fwd.name) == {S.FORWARD}
    assert fwd.new_tokens.sum() == result.summary["generated_tokens"]
    assert (spans[spans.lane == S.H2D].name == S.COPY_H2D).all()
    assert (spans[spans.lane == S.D2H].name == S.COPY_D2H).all()
    assert sorted(fwd.step) == list(range(steps))
    inst = trace.instants
    n = config.workload.total_requests
    for name in (S.ARRIVAL, S.FIRST_TOKEN, S.FINISH):
        assert (inst.name == name).sum() == n, name
    assert len(trace.counters) == steps
    # every span lies on the one host clock, in order: a step's forward after its launch began
    launch = host[host.name == S.LAUNCH].set_index("step")
    f = fwd.set_index("step")
    assert (f.ts >= launch.ts.reindex(f.index) - 1e-3).all()
    assert_nests(trace)


def test_tracing_off_records_no_events_but_counts(config_factory):
    config = config_factory(BASE + CASES["poisson"] + ["mode.tracing=false"])
    result = execute(config, "sync")
    assert result.trace.spans.empty
    assert result.summary["generated_tokens"] == 6 * 8
    assert result.trace.other_data["tracing"] is False


def test_async_needs_cuda(config_factory):
    config = config_factory(BASE + ["engine=async"])
    with pytest.raises(ConfigError, match="engine=async needs CUDA"):
        execute(config, "async")


def test_request_longer_than_kv_cache_fails_before_running(config_factory):
    config = config_factory(
        BASE + ["workload.prompt_len=100", "workload.gen_len=50", "workload.kv_num_blocks=4"]
    )
    with pytest.raises(ConfigError, match="KV cache capacity"):
        execute(config, "sync")


def test_request_longer_than_context_fails_before_running(config_factory):
    config = config_factory(
        BASE
        + [
            "workload.prompt_len=100",
            "workload.gen_len=50",
            "workload.prompt_dist=uniform",
            "workload.prompt_spread=0.5",
            "model.max_position_embeddings=120",
        ]
    )
    with pytest.raises(ConfigError, match="model context"):
        execute(config, "sync")


def test_token_ids_outside_vocab_fail_before_running(config_factory, monkeypatch):
    import cbsim.run_setup as setup
    import cbsim.runtime.engine as eng

    config = config_factory(BASE + ["workload.batch_size=2"])
    real = setup.make_requests

    def bad_requests(workload, vocab_size):
        reqs = real(workload, vocab_size)
        reqs[1].prompt_ids = reqs[1].prompt_ids.copy()
        reqs[1].prompt_ids[3] = vocab_size + 5
        return reqs

    monkeypatch.setattr(setup, "make_requests", bad_requests)
    monkeypatch.setattr(eng, "ModelRunner", None)  # nothing may be built
    with pytest.raises(ConfigError, match="outside the vocabulary"):
        execute(config, "sync")


def test_ctrl_c_keeps_the_trace_so_far(config_factory, monkeypatch):
    from cbsim.runtime.engine import Interrupted
    from cbsim.scheduler import Scheduler

    config = config_factory(BASE + CASES["staggered"])
    real = Scheduler.update
    calls = {"n": 0}

    def update(self, batch, tokens):
        calls["n"] += 1
        if calls["n"] == 5:
            raise KeyboardInterrupt
        return real(self, batch, tokens)

    monkeypatch.setattr(Scheduler, "update", update)
    with pytest.raises(Interrupted) as info:
        execute(config, "sync")
    trace = validate(info.value.trace.to_json_obj())
    assert trace.other_data["interrupted"] is True
    assert 4 <= (trace.spans.name == S.FORWARD).sum() <= 5


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("engine", ["sync", "async"])
def test_cpu_emulation_of_async_order_and_graph_buckets(config_factory, case, engine):
    """The async loop's order (placeholders filled by the in-step carry-over from the other
    slot's outputs) and the padded graph-bucket layouts, run eagerly on a CPU: same tokens."""
    config = config_factory(
        BASE + CASES[case] + ["engine.graph_batch_sizes=[1,2,4]", f"engine={engine}"]
    )
    result = execute(config, engine, cpu_emulation=True)
    assert_same_tokens(result, reference_tokens(config))
    assert result.summary["graph_steps"] > 0
    assert result.trace.other_data["io_slots"] == (2 if engine == "async" else 1)
    assert result.trace.other_data["streams"] is None  # a CPU has none
    names = set(result.trace.spans[result.trace.spans.lane == S.COMPUTE].name)
    assert S.GRAPH_REPLAY in names
    assert_nests(result.trace)


def test_out_of_memory_at_start_names_the_values_to_lower(config_factory, monkeypatch):
    import cbsim.runtime.engine as eng

    def oom(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 80.00 GiB")

    monkeypatch.setattr(eng, "ModelRunner", oom)
    config = config_factory(BASE + ["workload.batch_size=2"])
    with pytest.raises(ConfigError) as info:
        execute(config, "sync")
    msg = str(info.value)
    for key in (
        "workload.kv_num_blocks",
        "workload.batch_size",
        "workload.max_batch_tokens",
        "engine.graph_batch_sizes",
        "model=",
    ):
        assert key in msg


def test_model_loaded_offline_from_a_checkpoint(config_factory, tmp_path):
    """model.path: the same weights saved and loaded back give the same tokens."""
    over = BASE + CASES["staggered"]
    config = config_factory(over)
    build_model(config.model, torch.device("cpu"), seed=config.workload.seed).save_pretrained(
        tmp_path
    )
    loaded = execute(config_factory(over + [f"model.path={tmp_path}"]), "sync")
    assert_same_tokens(loaded, reference_tokens(config))


@pytest.mark.parametrize("engine", ["sync", "async"])
def test_eos_counts_only_the_tokens_kept(config_factory, engine):
    """With EOS on, the async loop has already launched the step after a request's EOS when it
    sees it; that output is computed and dropped, and not counted as generated (summary and the
    forward span's new_tokens), as in the simulator and the docs: "sampled and kept"."""
    from cbsim.metrics import compute_metrics

    config = config_factory(
        BASE
        + [
            "workload.batch_size=3",
            "workload.prompt_len=5",
            "workload.gen_len=12",
            "workload.ignore_eos=false",
            "engine.graph_batch_sizes=[1,2,4]",
            f"engine={engine}",
        ]
    )
    ref = reference_tokens(config)
    eos = int(ref[0][3])  # request 0 stops after 4 tokens
    model = build_model(config.model, torch.device("cpu"), seed=config.workload.seed)
    model.config.eos_token_id = eos
    result = execute(config, engine, cpu_emulation=True, model=model)
    kept = sum(len(t) for t in result.outputs.values())
    assert len(result.outputs[0]) == 4 and result.outputs[0][-1] == eos
    assert result.summary["generated_tokens"] == kept
    assert compute_metrics(result.trace)["generated_tokens"] == kept


def test_metrics_of_an_untraced_run_are_its_counts_not_zeros(config_factory):
    """mode.tracing=false: metrics.json said 0 steps, 0 tokens, 0 s and GPU idle 0.00% (a claim
    nothing measured); the counts come from the run's own counters, the shares are NaN."""
    import math

    from cbsim.metrics import compute_metrics

    config = config_factory(BASE + CASES["poisson"] + ["mode.tracing=false"])
    result = execute(config, "sync")
    m = compute_metrics(result.trace)
    assert m["steps"] == result.summary["steps"] > 0
    assert m["generated_tokens"] == 6 * 8
    assert m["total_time_s"] == pytest.approx(result.summary["wall_s"])
    assert m["tokens_per_s"] == pytest.approx(6 * 8 / result.summary["wall_s"])
    assert math.isnan(m["gpu_idle_fraction"]) and math.isnan(m["cpu_blocked_fraction"])


def test_the_loop_runs_with_the_collector_frozen_and_off(config_factory, monkeypatch):
    """Nothing is collected inside the timed loop (a full collection of a built model takes
    100-270 ms): the collector is off and the heap frozen while the scheduler is driven, and
    both are restored afterwards."""
    import gc

    from cbsim.scheduler import Scheduler

    seen = []
    real = Scheduler.update

    def update(self, batch, tokens):
        seen.append((gc.isenabled(), gc.get_freeze_count()))
        return real(self, batch, tokens)

    monkeypatch.setattr(Scheduler, "update", update)
    assert gc.isenabled()
    result = execute(config_factory(BASE + CASES["staggered"]), "sync")
    assert seen and all(not enabled and frozen > 0 for enabled, frozen in seen)
    assert gc.isenabled() and gc.get_freeze_count() == 0
    assert result.summary["gc_collections_in_loop"] == 0


def test_a_run_longer_than_the_recorders_estimate_is_recorded_whole(config_factory, monkeypatch):
    """The recorder's per-step arrays grow when a run outlasts their estimate (preemption,
    arrivals): every step still has its five host phases and three stream ops."""
    import cbsim.runtime.engine as eng

    monkeypatch.setattr(eng, "estimate_steps", lambda workload, requests: 1)
    config = config_factory(BASE + CASES["preempt"])
    result = execute(config, "sync")
    steps = result.summary["steps"]
    assert steps > 16  # past the recorder's smallest allocation
    spans = validate(result.trace.to_json_obj()).spans
    assert (spans.name == S.FORWARD).sum() == steps
    assert (spans.name == S.UPDATE).sum() == steps
    assert_same_tokens(result, reference_tokens(config))
