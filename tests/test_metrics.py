"""Metrics on hand-built traces whose answers are known exactly, and the GPU idle split as
Holistic Trace Analysis names it (host wait, kernel wait, other) on every kind of trace."""

from __future__ import annotations

import pytest
from conftest import REPO
from synthetic_trace import loop_trace as engine_loop

from cbsim.metrics import compare_metrics, compute_metrics, format_table
from cbsim.metrics.idle import KERNEL_WAIT_MAX_US
from cbsim.trace import TraceBuilder, read_trace
from cbsim.trace import schema as S


def loop_trace(steps: int, cpu_us: float, gpu_us: float, asynchronous: bool):
    """A steady loop: sync alternates CPU then GPU; async overlaps them (GPU-bound)."""
    b = TraceBuilder("sim", {"engine": "async" if asynchronous else "sync"})
    t = 0.0
    for step in range(steps):
        if asynchronous:
            gpu_start = t if step == 0 else t
            b.span(
                S.COMPUTE, S.GRAPH_REPLAY, gpu_start, gpu_us, step=step, requests=4, new_tokens=4
            )
            b.span(S.HOST, S.PREPARE, gpu_start, cpu_us, step=step + 1)
            b.span(S.HOST, S.WAIT, gpu_start + cpu_us, gpu_us - cpu_us, step=step)
            t = gpu_start + gpu_us
        else:
            b.span(S.HOST, S.PREPARE, t, cpu_us, step=step)
            b.span(S.COMPUTE, S.FORWARD, t + cpu_us, gpu_us, step=step, requests=4, new_tokens=4)
            b.span(S.HOST, S.WAIT, t + cpu_us, gpu_us, step=step)
            t += cpu_us + gpu_us
    return b.build()


def test_sync_idle_is_exactly_the_cpu_share():
    m = compute_metrics(loop_trace(100, cpu_us=24.0, gpu_us=76.0, asynchronous=False))
    assert m["gpu_idle_fraction"] == pytest.approx(0.24)
    assert m["total_time_s"] == pytest.approx(100 * 100e-6)
    assert m["steps"] == 100
    assert m["generated_tokens"] == 400
    assert m["tokens_per_s"] == pytest.approx(400 / 0.01)
    assert m["cpu_blocks_per_step"] == pytest.approx(1.0)
    assert m["cpu_blocked_fraction"] == pytest.approx(0.76)
    assert m["step_time_ms_p50"] == pytest.approx(0.1)
    assert m["lane_busy"][S.HOST] == pytest.approx(1.0)


def test_async_hides_the_cpu():
    m = compute_metrics(loop_trace(100, cpu_us=24.0, gpu_us=76.0, asynchronous=True))
    assert m["gpu_idle_fraction"] == pytest.approx(0.0, abs=1e-9)
    assert m["step_time_ms_p50"] == pytest.approx(0.076)
    s = compute_metrics(loop_trace(100, cpu_us=24.0, gpu_us=76.0, asynchronous=False))
    c = compare_metrics(s, m)
    assert c["speedup"] == pytest.approx(100 / 76)
    assert c["idle_recovered_fraction"] == pytest.approx(1.0)
    table = format_table({"sync": s, "async": m})
    assert "GPU idle" in table and "24.00%" in table


def test_request_latencies():
    b = TraceBuilder("sim")
    b.span(S.COMPUTE, S.FORWARD, 0.0, 1000.0, step=0, new_tokens=1)
    for rid, (arr, first, fin, tokens) in enumerate([(0, 1000, 11000, 11), (500, 3000, 5000, 3)]):
        b.request_event(S.ARRIVAL, arr, rid=rid)
        b.request_event(S.FIRST_TOKEN, first, rid=rid)
        b.request_event(S.FINISH, fin, rid=rid, tokens=tokens)
    m = compute_metrics(b.build())
    assert m["requests_finished"] == 2
    assert m["ttft_ms_p50"] == pytest.approx((1.0 + 2.5) / 2)
    assert m["tpot_ms_p50"] == pytest.approx((1.0 + 1.0) / 2)


def test_union_of_overlapping_host_spans_and_hazards():
    b = TraceBuilder("sim")
    b.span(S.HOST, S.PREPARE, 0.0, 10.0)
    b.span(S.HOST, S.LAUNCH, 5.0, 10.0)  # nested/overlapping host spans count once
    b.span(S.COMPUTE, S.FORWARD, 0.0, 20.0, step=0)
    b.hazard(S.COMPUTE, 3.0, "slot_overwrite", step=0, slot=0)
    m = compute_metrics(b.build())
    assert m["lane_busy"][S.HOST] == pytest.approx(15 / 20)
    assert m["hazards"] == 1 and m["hazards_by_kind"] == {"slot_overwrite": 1}


def test_default_stream_counts_as_the_gpu_when_compute_is_empty():
    b = TraceBuilder("sim")
    b.span(S.DEFAULT, S.FORWARD, 10.0, 30.0, step=0)
    b.span(S.HOST, S.PREPARE, 0.0, 10.0)
    m = compute_metrics(b.build())
    assert m["gpu_idle_fraction"] == pytest.approx(0.25)


def test_hbm_bandwidth_against_the_floor():
    from dataclasses import asdict

    from cbsim.config.schema import ModelConfig
    from cbsim.metrics import weight_bytes_read_per_step

    model = asdict(ModelConfig())  # the Llama-3-8B shape
    weights = weight_bytes_read_per_step(model)
    assert weights == pytest.approx(15.01e9, rel=0.01)  # 16.06 GB less the embedding table
    kv = 1000 * 128 * 1024
    b = TraceBuilder("sim", {"config": {"model": model, "hardware": {"hbm_bandwidth": 4.0e12}}})
    b.span(S.COMPUTE, S.FORWARD, 0.0, 10_000.0, step=0, kv_tokens=1000)  # 10 ms
    m = compute_metrics(b.build())
    assert m["hbm_tbps_mean"] == pytest.approx((weights + kv) / 0.01 / 1e12)
    assert m["hbm_floor_fraction"] == pytest.approx((weights + kv) / 4.0e12 / 0.01)
    assert m["hbm_floor_basis"] == "profile" and m["hbm_floor_tbps"] == pytest.approx(4.0)
    assert compute_metrics(small_config_free_trace())["hbm_tbps_mean"] is None


def test_the_hbm_floor_is_the_measured_copy_rate_when_the_recording_has_one():
    # an H100 recorded with an H200 profile: the floor is the H100's own 3.03 TB/s copy rate,
    # not the profile's fitted 5.63 TB/s
    from dataclasses import asdict

    from cbsim.config.schema import ModelConfig
    from cbsim.metrics import weight_bytes_read_per_step

    model = asdict(ModelConfig())
    moved = weight_bytes_read_per_step(model)
    config = {"model": model, "hardware": {"hbm_bandwidth": 5.63e12}}

    def floor(hardware):
        b = TraceBuilder("runtime", {"config": config, "hardware": hardware})
        b.span(S.COMPUTE, S.FORWARD, 0.0, 6_000.0, step=0)  # 6 ms
        return compute_metrics(b.build())

    h100 = {"basis": "device", "name": "NVIDIA H100 80GB HBM3", "copy_bytes_per_s": 3.03e12}
    m = floor(h100)
    assert m["hbm_floor_basis"] == "measured copy rate"
    assert m["hbm_floor_fraction"] == pytest.approx(moved / 3.03e12 / 0.006)
    assert m["hbm_floor_tbps"] == pytest.approx(3.03)
    # a profile's figures (a simulation) or a recording without a measurement: the profile's
    for hw in ({**h100, "basis": "profile"}, {"name": "NVIDIA H100 80GB HBM3"}):
        assert floor(hw)["hbm_floor_basis"] == "profile"
        assert floor(hw)["hbm_floor_fraction"] == pytest.approx(moved / 5.63e12 / 0.006)


def small_config_free_trace():
    b = TraceBuilder("sim")
    b.span(S.COMPUTE, S.FORWARD, 0.0, 10.0, step=0)
    return b.build()


def test_metrics_from_tables_equal_metrics_from_the_trace():
    """A back end that builds the metric tables itself gets the trace's numbers exactly."""
    import pandas as pd

    from cbsim.metrics import MetricInputs, inputs_from_trace, metrics_from

    trace = loop_trace(20, cpu_us=24.0, gpu_us=76.0, asynchronous=False)
    rows = [e for e in trace.events if e["ph"] == "X"]
    lane = {(1, 1): S.HOST, (2, 2): S.COMPUTE}
    spans = pd.DataFrame(
        {
            "lane": [lane[(e["pid"], e["tid"])] for e in rows],
            "name": [e["name"] for e in rows],
            "ts": [e["ts"] for e in rows],
            "dur": [e["dur"] for e in rows],
            "step": [e["args"]["step"] for e in rows],
            "requests": [e["args"]["requests"] for e in rows],
            "new_tokens": [e["args"].get("new_tokens", 0) for e in rows],
        }
    )
    direct = MetricInputs(
        spans=spans,
        instants=pd.DataFrame({"lane": [], "name": [], "ts": []}),
        lanes=[S.HOST, S.H2D, S.COMPUTE, S.D2H],
        source="sim",
        engine="sync",
    )
    assert metrics_from(direct) == metrics_from(inputs_from_trace(trace)) == compute_metrics(trace)


def test_metrics_do_not_depend_on_the_order_of_the_table_rows():
    """A back end may build its tables in any row order: float sums still run in one order."""
    import numpy as np

    from cbsim.metrics import MetricInputs, inputs_from_trace, metrics_from

    rng = np.random.default_rng(3)
    b = TraceBuilder("sim", {"engine": "sync"})
    t = 0.0
    for step in range(300):
        cpu, gpu = rng.uniform(1, 50), rng.uniform(50, 500)
        b.span(S.HOST, S.PREPARE, t, cpu, step=step)
        b.span(S.COMPUTE, S.FORWARD, t + cpu, gpu, step=step, kv_tokens=step, new_tokens=4)
        b.span(S.HOST, S.WAIT, t + cpu, gpu, step=step)
        t += round(cpu + gpu, 3) + rng.uniform(0, 3)
    inp = inputs_from_trace(b.build())
    shuffled = inp.spans.sample(frac=1.0, random_state=7).reset_index(drop=True)
    again = MetricInputs(
        spans=shuffled.drop(columns=["end"]),
        instants=inp.instants.iloc[::-1],
        lanes=inp.lanes,
        source=inp.source,
        engine=inp.engine,
    )
    assert metrics_from(again) == metrics_from(inp)


PARTS = ("host_wait", "kernel_wait", "other")


def split(m: dict) -> dict[str, float]:
    return {p: m[f"gpu_idle_{p}_fraction"] for p in PARTS}


def test_each_gap_is_split_by_when_its_work_was_queued():
    """Three forwards of 100 us after a gap each: the second's launch ends 30 us into its
    gap (30 us host wait, then a 20 us rest: kernel wait); the third was queued before its gap
    began, which lasts longer than a launch's overhead (other)."""
    b = TraceBuilder("sim", {"engine": "async"})
    b.span(S.HOST, S.LAUNCH, 0.0, 10.0, step=0)
    b.span(S.COMPUTE, S.GRAPH_REPLAY, 10.0, 100.0, step=0)  # 10 us host wait before it
    b.span(S.HOST, S.LAUNCH, 100.0, 40.0, step=1)  # queued at 140, the GPU idle from 110
    b.span(S.COMPUTE, S.GRAPH_REPLAY, 160.0, 100.0, step=1)
    b.span(S.HOST, S.LAUNCH, 200.0, 10.0, step=2)  # queued at 210, before the gap at 260
    gap = KERNEL_WAIT_MAX_US + 40.0
    b.span(S.COMPUTE, S.GRAPH_REPLAY, 260.0 + gap, 100.0, step=2)
    m = compute_metrics(b.build())
    total = m["total_time_s"] * 1e6
    got = {p: v * total for p, v in split(m).items()}
    assert got == pytest.approx({"host_wait": 10.0 + 30.0, "kernel_wait": 20.0, "other": gap})


@pytest.mark.parametrize("engine", ["sync", "async"])
def test_the_parts_add_up_to_the_gpu_idle_of_a_loop(engine):
    m = compute_metrics(engine_loop(engine, steps=40, cpu_us=900.0, gpu_us=2800.0))
    assert sum(split(m).values()) == pytest.approx(m["gpu_idle_fraction"], abs=1e-9)
    if engine == "sync":  # the host launches a step only once the GPU is done: host wait, then
        # the 20 us copy ahead of each forward with the forward queued: kernel wait
        steps = 40
        assert split(m)["kernel_wait"] * m["total_time_s"] * 1e6 == pytest.approx(20.0 * steps)
        assert split(m)["host_wait"] > 0.9 * m["gpu_idle_fraction"]


def test_a_recorded_async_run_waits_mostly_on_queued_work_and_its_sync_on_the_host():
    run = REPO / "experiments" / "recordings" / "h200" / "heldout_default" / "1b_2x512+3072"
    sync = compute_metrics(read_trace(run / "trace_sync.json.gz"))
    asyn = compute_metrics(read_trace(run / "trace_async.json.gz"))
    for m in (sync, asyn):
        assert sum(split(m).values()) == pytest.approx(m["gpu_idle_fraction"], abs=1e-9)
    assert split(sync)["host_wait"] > 0.95 * sync["gpu_idle_fraction"] > 0.05
    assert split(asyn)["kernel_wait"] > split(asyn)["host_wait"]


def test_an_import_without_launch_spans_counts_the_host_working_as_host_wait():
    b = TraceBuilder("kineto", {"engine": ""})
    b.span(S.COMPUTE, S.FORWARD, 0.0, 100.0, step=0)
    b.span(S.HOST, "aten::index_select", 100.0, 60.0, step=1)  # the host works 60 of the gap
    b.span(S.HOST, S.WAIT, 160.0, 100.0, step=1)  # then waits on the GPU: not host wait
    b.span(S.COMPUTE, S.FORWARD, 200.0, 100.0, step=1)
    got = split(compute_metrics(b.build()))
    assert got["host_wait"] * 300.0 == pytest.approx(60.0)
    assert got["kernel_wait"] * 300.0 == pytest.approx(40.0)
