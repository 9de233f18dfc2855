"""The simulator's what-if switches, one at a time, each visible in the trace and the metrics:
IO slots, event waits, one stream, the default stream, CUDA graphs, launch costs, stalls, idle
slowdown, the launch queue."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest
from sim_harness import check_trace, make, spans

from cbsim.metrics import compute_metrics
from cbsim.sim import run
from cbsim.trace import schema as S


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


def _slow_host(cfg):
    """1 ms of scheduling a step: the sync engine then idles the GPU about a sixth of the time."""
    hw = cfg.hardware
    schedule = dataclasses.replace(hw.host.schedule, fixed_us=1000.0)
    cfg.hardware = dataclasses.replace(hw, host=dataclasses.replace(hw.host, schedule=schedule))
    return cfg


def test_one_stream_serialises_the_copies_and_keeps_the_overlap():
    shape = dict(batch_size=32, prompt_len=256, gen_len=32)
    cfg = _slow_host(make("llama3_8b", engine={"streams": "one"}, **shape))
    tr = run(cfg, "async")
    m = check_trace(tr, cfg)
    assert {S.H2D, S.COMPUTE, S.D2H} <= set(tr.lanes) and S.DEFAULT not in tr.lanes
    gpu = pd.concat([spans(tr, lane) for lane in (S.H2D, S.COMPUTE, S.D2H)]).sort_values("ts")
    # one queue: no two GPU operations overlap, each H2D waits for the forward before it
    assert (gpu.ts.to_numpy()[1:] >= (gpu.ts + gpu.dur).to_numpy()[:-1] - 0.01).all()  # ns
    three = compute_metrics(run(_slow_host(make("llama3_8b", **shape)), "async"))
    sync = compute_metrics(
        run(_slow_host(make("llama3_8b", engine={"name": "sync"}, **shape)), "sync")
    )
    # the copies now wait for the forwards; the host still runs ahead: far from sync
    assert three["total_time_s"] <= m["total_time_s"] < 0.95 * sync["total_time_s"]
    assert m["gpu_idle_fraction"] < 0.2 * sync["gpu_idle_fraction"]
    assert m["hazards"] == 0


def test_cuda_graphs_off_launches_every_kernel():
    on_cfg, off_cfg = make(), make(engine={"cuda_graphs": False})
    on, off = run(on_cfg, "async"), run(off_cfg, "async")
    m_on, m_off = check_trace(on, on_cfg), check_trace(off, off_cfg)
    c_on, c_off = on.other_data["sim_counters"], off.other_data["sim_counters"]
    # the prefill replays its token bucket's graph too (engine.mixed_graphs=auto)
    assert c_on["graph_steps"] == m_on["steps"]
    # the 1B shape's 16 layers at 9 kernels each (fused epilogues, rope in the K/V write) and
    # the per-forward ones
    assert c_off["graph_steps"] == 0 and c_off["kernels_launched"] > 144 * m_off["steps"]
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


def test_stall_shows_in_the_update_span():
    cfg = make(gen_len=20)
    cfg.hardware.host = dataclasses.replace(cfg.hardware.host, stall_us=500.0, stall_every_steps=5)
    tr = run(cfg, "sync")
    up = spans(tr, S.HOST, S.UPDATE)
    assert tr.other_data["sim_counters"]["host_stalls"] == len(up) // 5
    assert up.dur.max() >= 500 and (up.dur > 0).sum() == len(up) // 5


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


def test_a_full_launch_queue_holds_the_host_inside_the_launch():
    """Long eager prefills launched back to back (async) fill the driver's launch queue: the
    host's launch of the next one returns only as the GPU works down the previous one, as the
    runtime showed (an H200 long_prompt recording, async: launch ~ the forward). Unbounded: launches are
    the host's own time. The GPU's timeline is the same either way."""
    cfg = make(
        "llama3_8b",
        {"mixed_graphs": "off"},  # eager prefills, as that recording ran them
        batch_size=4,
        prompt_len=4096,
        gen_len=4,
        max_batch_tokens=4096,
    )
    cfg.mode.fuse_epilogues = False  # the build that recording ran, whose counts these are
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
