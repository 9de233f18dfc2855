"""The simulator's GPU idle counts an eager forward's wait for its kernel launches; the runtime's
CUDA events count it busy. metrics carry that wait apart (gpu_launch_wait_fraction), so the
simulator's idle less it is what an event-timed recording shows, and a recording says it
did not measure it."""

from __future__ import annotations

import pytest
from conftest import make_config

from cbsim.calibration.simulated import event_timed
from cbsim.metrics import compute_metrics, format_table
from cbsim.sim import run
from cbsim.trace import Trace

ONLINE = [
    "engine.mixed_graphs=off",  # eager prompt steps, whose launches the GPU waits on
    "model=llama3_1b",
    "hardware=h200",
    "workload.batch_size=8",
    "workload.num_requests=16",
    "workload.prompt_len=256",
    "workload.gen_len=16",
    "workload.arrival=poisson",
    "workload.rate=40.0",
    "workload.max_batch_tokens=512",
]


def test_the_launch_wait_is_the_idle_an_event_timed_recording_does_not_see():
    trace = run(make_config([*ONLINE, "engine=sync"]), "sync")
    m = compute_metrics(trace)
    wait = m["gpu_launch_wait_fraction"]
    assert wait > 0.01, m  # eager prefill chunks of a small model wait on their launches
    timed = compute_metrics(event_timed(trace))
    assert timed["gpu_idle_fraction"] == pytest.approx(m["gpu_idle_fraction"] - wait, abs=1e-6)
    assert "launch waits" in format_table({"sync": m})


def test_a_recording_does_not_claim_a_launch_wait_it_cannot_measure():
    trace = run(make_config([*ONLINE, "engine=sync"]), "sync")
    recorded = Trace(trace.events, {**trace.other_data, "source": "runtime"})
    assert recorded.source == "runtime"
    assert compute_metrics(recorded)["gpu_launch_wait_fraction"] is None


def test_event_timed_view_counts_launch_bound_waits_as_busy():
    """A host-bound eager forward: the simulator shows the stream idle while the kernels are
    launched; the runtime's events time that wait inside the forward's span. The view used to
    compare them moves the wait into the span, the spans still never overlap."""
    from cbsim.trace import validate as validate_trace

    cfg = make_config(
        [
            "engine=sync",
            "engine.mixed_graphs=off",  # an eager prompt step, launch-bound
            "hardware.host.kernel_launch_us=400",
            "workload.batch_size=8",
            "workload.prompt_len=64",
            "workload.gen_len=4",
        ]
    )
    sim = run(cfg, "sync")
    waits = sim.span_frame({"launch_bound_us": 0.0}).launch_bound_us.sum()
    assert waits > 0
    timed = validate_trace(event_timed(sim).to_json_obj())
    busy = [t.spans[t.spans.lane == "compute"].dur.sum() for t in (sim, timed)]
    assert busy[1] - busy[0] == pytest.approx(waits)
    assert timed.spans.end.max() == pytest.approx(sim.spans.end.max())
