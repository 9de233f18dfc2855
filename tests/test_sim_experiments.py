"""The shipped experiments (conf/experiment/), composed through Hydra as the CLI does."""

from __future__ import annotations

import functools

import pytest
from conftest import make_config
from test_sim import check_trace

from cbsim.metrics import compare_metrics, compute_metrics
from cbsim.sim import run

REPORTED = {"sync": (300.6, 0.24), "async": (234.5, 0.006)}


@functools.cache
def both(experiment: str, *overrides: str):
    cfg = make_config([f"+experiment={experiment}", *overrides])
    traces = {e: run(cfg, e) for e in ("sync", "async")}
    return cfg, traces, {e: compute_metrics(t) for e, t in traces.items()}


def test_seed_repro_reproduces_the_reported_table_within_3_percent():
    cfg, traces, m = both("seed_repro")
    for engine, (total_s, idle) in REPORTED.items():
        got = m[engine]
        assert got["steps"] == 8192 and got["generated_tokens"] == 32 * 8192
        assert got["total_time_s"] == pytest.approx(total_s, rel=0.03), engine
        assert got["gpu_idle_fraction"] == pytest.approx(idle, rel=0.03), engine
        assert got["cpu_blocks_per_step"] == 1.0
        assert got["hazards"] == 0
    assert traces["sync"].other_data["hardware"]["name"] == "reported_stack"
    mem = traces["async"].other_data["memory"]
    assert mem["io_buffer_bytes"] == 2 * traces["sync"].other_data["memory"]["io_buffer_bytes"]
    assert mem["graph_pool_bytes_unshared"] == 2 * mem["graph_pool_bytes"]


def test_long_generations_save_more_time_and_recover_more_idle():
    _, _, seed = both("seed_repro")
    _, _, long = both("long_seq")  # (soundness of big traces: test_sim_properties.py)
    c_seed = compare_metrics(seed["sync"], seed["async"])
    c_long = compare_metrics(long["sync"], long["async"])
    saved = {
        k: m["sync"]["total_time_s"] - m["async"]["total_time_s"]
        for k, m in (("seed", seed), ("long", long))
    }
    assert saved["long"] > 1.8 * saved["seed"]
    assert c_long["idle_recovered_fraction"] > c_seed["idle_recovered_fraction"]
    assert long["async"]["gpu_idle_fraction"] < seed["async"]["gpu_idle_fraction"]


@pytest.mark.parametrize("experiment", ["small_batch", "cpu_bound"])
def test_cpu_bound_runs_gain_little_and_the_metrics_say_why(experiment):
    cfg, traces, m = both(experiment)
    for t in traces.values():
        check_trace(t, cfg)
    s, a = m["sync"], m["async"]
    c = compare_metrics(s, a)
    # async hides only the GPU's share of a step: the host is the bottleneck
    assert c["time_saved_fraction"] < 0.25
    assert a["gpu_idle_fraction"] > 0.6  # the GPU still waits for the host most of the time
    assert a["cpu_blocked_fraction"] < 0.02  # and the host never waits for the GPU
    host_ms = sum(v for k, v in a["host_ms_per_step"].items() if k != "wait")
    assert a["step_time_ms_p50"] == pytest.approx(host_ms, rel=0.1)
    # the GPU-bound seed shape, by contrast, saves most of its idle time
    assert c["idle_recovered_fraction"] < 0.3


def test_online_poisson_ttft_and_tpot_improve_with_async():
    cfg, traces, m = both("online")
    for t in traces.values():
        check_trace(t, cfg)
    s, a = m["sync"], m["async"]
    assert s["requests_finished"] == a["requests_finished"] == 256
    assert a["tpot_ms_p50"] < s["tpot_ms_p50"]
    assert a["ttft_ms_p50"] <= s["ttft_ms_p50"]
