"""Regressions found in review: each test failed before its fix (see the commit that added it)."""

from __future__ import annotations

from cbsim.sim import run
from tests.test_sim import make


def test_poisson_arrivals_late_in_a_long_run_do_not_stop_the_simulator():
    # Arrivals past ~1.7e4 s: arrival_s * 1e6 * 1e-6 rounds below arrival_s by more than the
    # 1 ps slack the simulator gave the scheduler, so after sleeping until the arrival the
    # scheduler still saw nobody arrived and the run died ("no request still to arrive").
    cfg = make(
        "tiny",
        batch_size=2,
        prompt_len=2,
        gen_len=1,
        arrival="poisson",
        rate=0.001,
        num_requests=40,
    )
    trace = run(cfg, "async")
    c = trace.other_data["sim_counters"]
    assert c["requests_finished"] == 40
