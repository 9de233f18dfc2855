"""The steady-state fast-forward is exact: a run that fast-forwards writes the very trace and
counters of the run that steps (only SimPy's own event count differs: fewer events is the point),
on random workloads with arrivals, EOS, chunked prefill, preemption, stalls, idle slowdown, a
band's jitter, graph replays and eager launches, the SM clock throttled or not."""

from __future__ import annotations

import dataclasses

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from sim_harness import long_workloads, make

from cbsim.config.hardware import GpuClock
from cbsim.sim.engine import run

SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _same(cfg, engine: str) -> None:
    fast, slow = run(cfg, engine, fast_forward=True), run(cfg, engine, fast_forward=False)
    cf, cs = fast.other_data["sim_counters"], slow.other_data["sim_counters"]
    assert cf.pop("simpy_events") <= cs.pop("simpy_events")
    assert fast.events == slow.events
    assert fast.other_data == slow.other_data


@SETTINGS
@given(
    long_workloads(),
    st.sampled_from(["tiny", "llama3_1b", "llama3_8b"]),
    st.sampled_from([(0.0, 0.0), (0.05, 1.73)]),  # idle slowdown, the device's gap between forwards
    st.sampled_from([0, 7]),
    st.sampled_from([(0.0, 1.0), (0.2, 0.97)]),
    st.sampled_from([None, [1, 2, 4], []]),  # graphs as configured, up to 4 rows, none
    st.sampled_from([0.0, 1.6]),  # a graph's first launch: us more per graph node
    # the SM clock: at boost, or every decode step throttled by its GEMM rate
    st.sampled_from([GpuClock(), GpuClock(min_ratio=0.8, throttle_from=0.0, throttle_full=0.05)]),
)
def test_fast_forward_writes_the_trace_stepping_writes(
    wl, model, device, stall_every, band, graphs, first_replay, clock
):
    slowdown, forward_gap = device
    engine = {} if graphs is None else {"cuda_graphs": bool(graphs)}
    if graphs:
        engine["graph_batch_sizes"] = graphs
    engine["upload_graphs"] = not first_replay  # a cost only graphs first launched in a step pay
    try:
        cfg = make(model, engine=engine, **wl)
    except ValueError:
        assume(False)
    hw = cfg.hardware
    jitter, scale = band  # a band's draw: host speed step to step, the forward model's error
    spread = dataclasses.replace(hw.host.spread, jitter=bool(jitter), within_run=jitter, seed=5)
    cfg.hardware = dataclasses.replace(
        hw,
        gpu=dataclasses.replace(
            hw.gpu,
            idle_slowdown=slowdown,
            forward_gap_us=forward_gap,
            spread=dataclasses.replace(hw.gpu.spread, forward_scale=scale),
            clock=clock,
        ),
        host=dataclasses.replace(
            hw.host,
            stall_us=300.0,
            stall_every_steps=stall_every,
            spread=spread,
            graph_first_replay_us_per_kernel=first_replay,
        ),
    )
    for engine in ("sync", "async"):
        try:
            _same(cfg, engine)
        except ValueError:  # a drawn request that can never run: refused by both
            assume(False)


def test_a_long_steady_decode_is_fast_forwarded():
    plain = make("llama3_8b", batch_size=8, prompt_len=64, gen_len=600)
    eager = make("llama3_8b", engine={"cuda_graphs": False}, batch_size=8, gen_len=600)
    hw = plain.hardware
    jittery = dataclasses.replace(hw.host.spread, jitter=True, within_run=0.3)
    banded = dataclasses.replace(
        plain,
        hardware=dataclasses.replace(hw, host=dataclasses.replace(hw.host, spread=jittery)),
    )
    for cfg in (plain, banded, eager):
        for engine in ("sync", "async"):
            fast, slow = run(cfg, engine), run(cfg, engine, fast_forward=False)
            events = fast.other_data["sim_counters"]["simpy_events"]
            assert events * 20 < slow.other_data["sim_counters"]["simpy_events"]
            assert fast.events == slow.events


def test_a_decode_across_table_width_classes_is_fast_forwarded_exactly():
    """The longest request outgrows its graph's table (engine.graph_width_classes) at 1024, 2048
    and 4096 tokens: each crossing replays another graph, whose first launch costs more; the
    stretches stop there, and the trace is the one stepping writes."""
    cfg = make("llama3_8b", batch_size=32, prompt_len=900, gen_len=3400)
    cfg.engine = dataclasses.replace(cfg.engine, upload_graphs=False)
    host = dataclasses.replace(cfg.hardware.host, graph_first_replay_us_per_kernel=1.6)
    cfg.hardware = dataclasses.replace(cfg.hardware, host=host)
    for engine in ("sync", "async"):
        fast, slow = run(cfg, engine), run(cfg, engine, fast_forward=False)
        assert fast.events == slow.events
        events = fast.other_data["sim_counters"]["simpy_events"]
        assert events * 20 < slow.other_data["sim_counters"]["simpy_events"]
