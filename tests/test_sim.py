"""The simulator's mechanisms, one switch at a time, each visible in the trace and the metrics.

Helpers here (``make``, ``check_trace``) are shared with test_sim_properties.py.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from cbsim.config.schema import CbsimConfig, EngineConfig, ModelConfig, WorkloadConfig
from cbsim.metrics import compute_metrics
from cbsim.sim import run
from cbsim.trace import TraceBuilder, validate, write_trace
from cbsim.trace import schema as S
from cbsim.workload import make_requests

TINY = ModelConfig(
    name="tiny",
    hidden_size=64,
    intermediate_size=128,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    vocab_size=256,
    max_position_embeddings=4096,
    dtype="float32",
)
MODELS = {
    "tiny": TINY,
    "llama3_1b": ModelConfig(
        name="llama3_1b",
        hidden_size=2048,
        intermediate_size=8192,
        num_layers=16,
        num_heads=32,
        num_kv_heads=8,
        head_dim=64,
        tie_word_embeddings=True,
    ),
    "llama3_8b": ModelConfig(),
}


def make(model: str = "llama3_1b", engine: dict | None = None, **workload) -> CbsimConfig:
    """A config built from the dataclasses (no Hydra: fast enough for property tests)."""
    eng = {"name": "async", **(engine or {})}
    if eng["name"] == "sync":
        eng.setdefault("io_slots", 1)
        eng.setdefault("carry_over", False)
    wl = {"batch_size": 4, "prompt_len": 32, "gen_len": 16, **workload}
    return CbsimConfig(
        model=MODELS[model], engine=EngineConfig(**eng), workload=WorkloadConfig(**wl)
    )


def spans(trace, lane=None, name=None):
    df = trace.spans
    if lane is not None:
        df = df[df.lane == lane]
    if name is not None:
        df = df[df.name.isin([name] if isinstance(name, str) else name)]
    return df


def step_times(trace) -> np.ndarray:
    """Per step, as the metrics define it: between consecutive forward ends."""
    fwd = trace.spans[trace.spans.name.isin(S.FORWARD_NAMES)]
    ends = np.sort(fwd.groupby("step")["end"].max().to_numpy())
    return np.diff(np.concatenate([[0.0], ends]))


def check_trace(trace, cfg: CbsimConfig, ordered: bool = True) -> dict:
    """Everything that must hold of any simulated trace; returns its metrics."""
    validate(json.loads(json.dumps(trace.to_json_obj())))  # also: no overlap on a stream lane
    c = trace.other_data["sim_counters"]
    m = compute_metrics(trace)
    sp = trace.spans
    # every stream lane executes one op at a time
    for lane in S.STREAM_LANES:
        lane_sp = sp[sp.lane == lane].sort_values("ts")
        assert (lane_sp.ts.to_numpy()[1:] >= lane_sp.end.to_numpy()[:-1] - 0.002).all(), lane
    if ordered:  # events order H2D -> compute -> D2H within every step
        gpu = sp[sp.cat == "gpu"]
        h2d_end = gpu[gpu.name == S.COPY_H2D].groupby("step").end.max()
        d2h_ts = gpu[gpu.name == S.COPY_D2H].groupby("step").ts.min()
        comp = gpu[gpu.name.isin([*S.FORWARD_NAMES, S.CARRY_OVER])].groupby("step")
        comp_ts, comp_end = comp.ts.min(), comp.end.max()
        assert (comp_ts >= h2d_end.reindex(comp_ts.index) - 0.002).all()
        assert (d2h_ts.reindex(comp_end.index) >= comp_end - 0.002).all()
    # every request receives exactly its tokens
    reqs = make_requests(cfg.workload, cfg.model.vocab_size)
    inst = trace.instants
    fin = inst[inst.name == S.FINISH].set_index("rid")
    assert sorted(fin.index) == [r.rid for r in reqs]
    assert all(fin.at[r.rid, "tokens"] == r.max_new_tokens for r in reqs)
    want = sum(r.max_new_tokens for r in reqs)
    # metrics from the trace agree with the simulator's own counters
    assert m["steps"] == c["steps"]
    assert m["generated_tokens"] == c["generated_tokens"] == want
    assert m["requests_finished"] == c["requests_finished"] == len(reqs)
    # times are rounded to the nanosecond in the trace: allow that much per span
    ns = 0.001 * (len(sp) + 1)
    assert m["total_time_s"] * 1e6 == pytest.approx(c["total_us"], abs=ns)
    busy_us = (1.0 - m["gpu_idle_fraction"]) * m["total_time_s"] * 1e6
    assert busy_us == pytest.approx(c["gpu_busy_us"], abs=ns)
    assert m["cpu_blocks_per_step"] == pytest.approx(c["host_blocks_per_step"])
    blocked_us = m["cpu_blocked_fraction"] * m["total_time_s"] * 1e6
    assert blocked_us == pytest.approx(c["host_blocked_us"], abs=ns)
    assert m["hazards"] == c["hazards"]
    assert m["hazards_by_kind"] == c["hazards_by_kind"]
    return m


# ---- engines ------------------------------------------------------------------------------
def test_async_overlaps_the_host_and_blocks_once_per_step():
    cfg = make("llama3_8b", batch_size=32, prompt_len=256, gen_len=64)
    sync, asyn = run(cfg, "sync"), run(cfg, "async")
    ms, ma = check_trace(sync, cfg), check_trace(asyn, cfg)
    assert ms["cpu_blocks_per_step"] == ma["cpu_blocks_per_step"] == 1.0
    assert ma["total_time_s"] < ms["total_time_s"]
    assert ma["gpu_idle_fraction"] < ms["gpu_idle_fraction"]
    assert ms["hazards"] == ma["hazards"] == 0
    assert sync.other_data["engine"] == "sync" and asyn.other_data["engine"] == "async"
    assert asyn.other_data["hardware"]["name"] == "h200"
    # sync: the host waits while the GPU computes, and the GPU waits while the host works
    host = spans(sync, S.HOST)
    assert host[host.name == S.WAIT].dur.sum() > 0.5 * ms["total_time_s"] * 1e6
    # async: batch N+1 is launched before the host waits on batch N
    h = spans(asyn, S.HOST)
    launch1 = h[(h.name == S.LAUNCH) & (h.step == 1)].ts.iloc[0]
    wait0 = h[(h.name == S.WAIT) & (h.step == 0)].ts.iloc[0]
    assert launch1 < wait0
    assert asyn.other_data["sim_counters"]["carry_over_steps"] == ma["steps"] - 1


def test_compare_uses_one_slot_and_no_carry_over_for_sync():
    cfg = make(engine={"io_slots": 2})
    tr = run(cfg, "sync")
    assert tr.other_data["memory"]["io_slots"] == 1
    assert set(spans(tr, S.HOST).slot.unique()) <= {-1, 0}
    assert tr.other_data["sim_counters"]["carry_over_steps"] == 0


def test_same_config_gives_byte_identical_traces(tmp_path):
    cfg = make(
        batch_size=3,
        num_requests=7,
        prompt_dist="lognormal",
        prompt_spread=0.5,
        gen_dist="uniform",
        gen_spread=0.5,
        arrival="poisson",
        rate=500.0,
    )
    paths = [write_trace(run(cfg, "async"), tmp_path / f"t{i}.json") for i in range(2)]
    assert paths[0].read_bytes() == paths[1].read_bytes()


def test_recorder_writes_what_trace_builder_writes():
    from cbsim.sim.recorder import Recorder

    a, b = TraceBuilder("sim"), TraceBuilder("sim")
    args = {
        "step": 3,
        "slot": 1,
        "requests": 4,
        "query_tokens": 4,
        "kv_tokens": 99,
        "kind": "decode",
    }
    rec = Recorder(b, (S.HOST, S.COMPUTE))
    a.span(S.HOST, S.WAIT, 12.3456789, 0.1234567, **args)
    rec.span(S.HOST, S.WAIT, 12.3456789, 0.1234567, args)
    a.span(S.COMPUTE, S.FORWARD, 1.0, 2.0, **args, new_tokens=4)
    rec.span(S.COMPUTE, S.FORWARD, 1.0, 2.0, {**args, "new_tokens": 4})
    a.counter("scheduler", 5.0, waiting=1, running=2)
    rec.counter("scheduler", 5.0, {"waiting": 1, "running": 2})
    assert a.events == b.events


# ---- switches -----------------------------------------------------------------------------
def test_one_slot_async_hazards_two_slots_never():
    cfg = make(batch_size=4, gen_len=12)
    two = run(cfg, "async")
    one_cfg = dataclasses.replace(cfg, engine=dataclasses.replace(cfg.engine, io_slots=1))
    one = run(one_cfg, "async")
    assert check_trace(two, cfg)["hazards"] == 0
    m = check_trace(one, one_cfg)
    assert m["hazards_by_kind"].get("slot_overwrite", 0) >= m["steps"] - 1
    hz = one.instants[one.instants.name == S.HAZARD]
    assert (hz.cat == "hazard").all() and hz.detail.str.contains("slot 0").all()
    # the timeline is the same (the GPU does not stop): only the hazards tell
    assert m["total_time_s"] == pytest.approx(compute_metrics(two)["total_time_s"], rel=0.01)


def test_missing_event_waits_are_reported():
    cfg = make(engine={"event_waits": False}, gen_len=8)
    m = check_trace(run(cfg, "async"), cfg, ordered=False)
    assert m["hazards_by_kind"].get("missing_event_wait", 0) >= m["steps"]
    scfg = make(engine={"name": "sync", "event_waits": False}, gen_len=8)
    ms = check_trace(run(scfg, "sync"), scfg, ordered=False)
    # the host reads tokens whose forward it never waited for
    assert ms["hazards_by_kind"].get("carry_over_before_ready", 0) >= 1


def test_default_stream_serialises_everything():
    cfg = make(
        "llama3_8b", engine={"streams": "default"}, batch_size=32, prompt_len=256, gen_len=32
    )
    tr = run(cfg, "async")
    m = check_trace(tr, cfg)
    assert S.DEFAULT in tr.lanes
    assert spans(tr, S.COMPUTE).empty and not spans(tr, S.DEFAULT).empty
    three = compute_metrics(
        run(make("llama3_8b", batch_size=32, prompt_len=256, gen_len=32), "async")
    )
    sync = compute_metrics(run(cfg, "sync"))
    # all overlap lost: async on the default stream is no faster than sync
    assert m["total_time_s"] > three["total_time_s"]
    assert m["total_time_s"] >= 0.99 * sync["total_time_s"]
    assert m["hazards"] == 0


def test_cuda_graphs_off_launches_every_kernel():
    on_cfg, off_cfg = make(), make(engine={"cuda_graphs": False})
    on, off = run(on_cfg, "async"), run(off_cfg, "async")
    m_on, m_off = check_trace(on, on_cfg), check_trace(off, off_cfg)
    c_on, c_off = on.other_data["sim_counters"], off.other_data["sim_counters"]
    assert c_on["graph_steps"] == m_on["steps"] - 1  # the prefill runs eagerly
    assert c_off["graph_steps"] == 0 and c_off["kernels_launched"] > 200 * m_off["steps"]
    assert m_off["host_ms_per_step"]["launch"] > 5 * m_on["host_ms_per_step"]["launch"]
    assert not spans(off, S.COMPUTE, S.GRAPH_REPLAY).shape[0]
    assert spans(off, S.COMPUTE, S.CARRY_OVER).shape[0] == m_off["steps"] - 1
    mem_on, mem_off = on.other_data["memory"], off.other_data["memory"]
    assert mem_on["graph_pool_bytes_unshared"] == 2 * mem_on["graph_pool_bytes"] > 0
    assert mem_off["graph_pool_bytes"] == 0
    assert mem_on["io_buffer_bytes"] == 2 * mem_on["io_buffer_bytes_per_slot"]


def test_eager_launch_bound_small_model_shows_gpu_gaps():
    cfg = make("tiny", engine={"cuda_graphs": False}, batch_size=2, gen_len=8)
    tr = run(cfg, "sync")
    c = tr.other_data["sim_counters"]
    assert c["launch_wait_us"] > 0  # the GPU waited for the host to launch kernels
    fwd = spans(tr, S.COMPUTE, S.FORWARD)
    assert (fwd.dur < 40 * 5.0).all()  # busy time, not the launch-bound stretch


def test_online_arrivals_ttft_tpot_and_idle_host():
    cfg = make(
        num_requests=12,
        arrival="poisson",
        rate=50.0,
        prompt_dist="lognormal",
        prompt_spread=0.5,
        gen_dist="lognormal",
        gen_spread=0.5,
    )
    tr = run(cfg, "async")
    m = check_trace(tr, cfg)
    assert m["ttft_ms_p50"] > 0 and m["tpot_ms_p50"] > 0
    assert tr.other_data["sim_counters"]["host_idle_us"] > 0  # waited for arrivals
    arr = tr.instants[tr.instants.name == S.ARRIVAL]
    assert arr.ts.is_monotonic_increasing and arr.ts.iloc[-1] > 0


def test_paged_kv_capacity_preempts_and_still_finishes_everything():
    cfg = make(
        batch_size=6, num_requests=10, prompt_len=40, gen_len=60, kv_block_size=8, kv_num_blocks=30
    )
    for engine in ("sync", "async"):
        tr = run(cfg, engine)
        check_trace(tr, cfg)
        assert tr.other_data["sim_counters"]["preemptions"] > 0
        assert not tr.counters.empty and (tr.counters.kv_blocks_used <= 30).all()


def test_chunked_prefill_splits_long_prompts():
    cfg = make(batch_size=2, prompt_len=300, gen_len=4, max_batch_tokens=128)
    tr = run(cfg, "async")
    check_trace(tr, cfg)
    fwd = spans(tr, S.COMPUTE, S.FORWARD_NAMES)
    assert (fwd.query_tokens <= 128).all() and (fwd.kind != "decode").sum() >= 5


def test_stall_shows_in_the_update_span():
    cfg = make(gen_len=20)
    cfg.hardware.host = dataclasses.replace(cfg.hardware.host, stall_us=500.0, stall_every_steps=5)
    tr = run(cfg, "sync")
    up = spans(tr, S.HOST, S.UPDATE)
    assert tr.other_data["sim_counters"]["host_stalls"] == len(up) // 5
    assert up.dur.max() >= 500 and (up.dur > 0).sum() == len(up) // 5


def test_unknown_engine_is_refused():
    with pytest.raises(ValueError, match="allowed: sync, async"):
        run(make(), "compare")
    with pytest.raises(ValueError, match="engine.name=sync"):
        run(make(engine={"name": "sync"}), "async")


def test_simulator_never_imports_torch():
    import subprocess
    import sys

    code = (
        "import sys, cbsim.sim, cbsim.costs; from cbsim.sim import run;"
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_lengths_from_a_file(tmp_path):
    lengths = tmp_path / "gen.txt"
    lengths.write_text("# generation lengths\n3\n9\n1\n")
    cfg = make(num_requests=5, gen_dist="file", gen_file=str(lengths))
    m = check_trace(run(cfg, "async"), cfg)
    assert m["generated_tokens"] == 3 + 9 + 1 + 3 + 9


def test_eos_on_async_computes_and_drops_one_token_per_request():
    cfg = make(batch_size=4, num_requests=6, gen_dist="uniform", gen_spread=0.5, ignore_eos=False)
    ms = check_trace(run(cfg, "sync"), cfg)
    ta = run(cfg, "async")
    ma = check_trace(ta, cfg)
    fin = ta.instants[ta.instants.name == S.FINISH]
    assert (fin.reason == "eos").all()
    c = ta.other_data["sim_counters"]
    assert 1 <= c["dropped_tokens"] <= 6 and ms["generated_tokens"] == ma["generated_tokens"]


def test_idle_compute_stream_slows_its_next_forward():
    """hardware.gpu.idle_slowdown: each forward after an idle gap takes that share of the gap
    longer (sync idles every step; async hardly ever)."""
    base, slow = make(gen_len=12), make(gen_len=12)
    slow.hardware.gpu = dataclasses.replace(slow.hardware.gpu, idle_slowdown=0.1)
    for engine in ("sync", "async"):
        a, b = run(base, engine), run(slow, engine)
        check_trace(b, slow)
        fa = spans(a, S.COMPUTE, S.FORWARD_NAMES).sort_values("ts")
        fb = spans(b, S.COMPUTE, S.FORWARD_NAMES).sort_values("ts")
        # the gap before each forward in the slowed run, and what it added
        gap = fb.ts.to_numpy()[1:] - fb.end.to_numpy()[:-1]
        extra = fb.dur.to_numpy()[1:] - fa.dur.to_numpy()[1:]
        assert extra == pytest.approx(0.1 * np.maximum(gap, 0.0), abs=3e-3), engine
        if engine == "sync":
            assert (extra > 0).all()
    assert run(slow, "sync").to_json_obj() == run(slow, "sync").to_json_obj()  # deterministic


def test_per_block_host_costs_grow_with_the_context():
    cfg = make(gen_len=40)
    host = cfg.hardware.host
    cfg.hardware.host = dataclasses.replace(
        host,
        prepare=dataclasses.replace(host.prepare, per_block_us=5.0),
        launch_per_block_us=3.0,
    )
    tr, plain = run(cfg, "sync"), run(make(gen_len=40), "sync")
    check_trace(tr, cfg)
    for name, per in ((S.PREPARE, 5.0), (S.LAUNCH, 3.0)):
        a = spans(tr, S.HOST, name).set_index("step")
        b = spans(plain, S.HOST, name).set_index("step")
        blocks = a.kv_tokens // cfg.workload.kv_block_size + a.requests
        assert (a.dur - b.dur).to_numpy() == pytest.approx(per * blocks.to_numpy(), abs=1e-3)


def test_device_memory_fit_is_reported():
    """A what-if larger than the device still runs, and says it would not fit."""
    from conftest import make_config

    from cbsim.sim import run as simulate

    small = ["workload.gen_len=4", "workload.batch_size=2", "engine=async"]
    big = simulate(make_config(["model=llama3_70b", *small]), "async").other_data["memory"]
    assert big["fits_device"] is False and big["device_bytes_needed"] > 141e9
    ok = simulate(make_config(small), "async").other_data["memory"]
    assert ok["fits_device"] is True


def test_a_full_launch_queue_holds_the_host_inside_the_launch():
    """Long eager prefills launched back to back (async) fill the driver's launch queue: the
    host's launch of the next one returns only as the GPU works down the previous one, as the
    runtime showed (h200_run7/long_prompt async: launch ~ the forward). Unbounded: launches are
    the host's own time. The GPU's timeline is the same either way."""
    cfg = make("llama3_8b", batch_size=4, prompt_len=4096, gen_len=4, max_batch_tokens=4096)
    gpu = dict(
        kernels_per_layer=14,
        kernels_extra=21,
        prefill_kernels_per_layer=8,
        prefill_kernels_extra=6,
        decode_kernels_per_layer=3,
    )
    runs = {}
    for depth in (0, 1021):
        hw = dataclasses.replace(
            cfg.hardware,
            gpu=dataclasses.replace(cfg.hardware.gpu, launch_queue_depth=depth, **gpu),
        )
        trace = run(dataclasses.replace(cfg, hardware=hw), "async")
        launch = spans(trace, S.HOST, S.LAUNCH).set_index("step").dur
        fwd = spans(trace, S.COMPUTE, S.FORWARD_NAMES).set_index("step")
        runs[depth] = (launch, fwd)
    (free, fwd0), (held, fwd1) = runs[0], runs[1021]
    prefill = [s for s in fwd1.index if fwd1.kind[s] != "decode" and s > 0]
    assert prefill
    for s in prefill:  # 2 x 741 kernels: the host waits for 461 of the previous forward's
        assert held[s] > free[s] + 0.3 * fwd1.dur[s - 1]
    assert np.allclose(fwd0.end, fwd1.end)
