"""GPU idle split as Holistic Trace Analysis names it: host wait, kernel wait, other. The parts
add up to the GPU idle fraction on every kind of trace, and each lands where the timeline says."""

from __future__ import annotations

import pytest
from conftest import REPO
from synthetic_trace import loop_trace

from cbsim.metrics import compute_metrics
from cbsim.metrics.idle import KERNEL_WAIT_MAX_US
from cbsim.trace import TraceBuilder, read_trace
from cbsim.trace import schema as S

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
    m = compute_metrics(loop_trace(engine, steps=40, cpu_us=900.0, gpu_us=2800.0))
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
