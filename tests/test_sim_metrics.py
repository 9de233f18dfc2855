"""Metrics without a trace: the simulator's own tables give the numbers compute_metrics gives
from its trace (to 1e-9), on random workloads with arrivals, EOS, chunked prefill, preemption,
stalls and the hazard what-ifs; and the counts agree exactly."""

from __future__ import annotations

import dataclasses
import math

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from sim_harness import long_workloads, make

from cbsim.metrics import MetricInputs, compute_metrics, metrics_from
from cbsim.sim import simulate

SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def assert_same(a, b, path: str = "metrics") -> None:
    """Equal, floats to 1e-9 (relative), NaN equal to NaN, dicts key by key."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), (path, set(a) ^ set(b))
        for k in a:
            assert_same(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, float) or isinstance(b, float):
        assert a is not None and b is not None, (path, a, b)
        if math.isnan(a) or math.isnan(b):
            assert math.isnan(a) and math.isnan(b), (path, a, b)
        else:
            assert math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12), (path, a, b)
    else:
        assert a == b, (path, a, b)


def both_ways(cfg, engine: str) -> tuple[dict, dict]:
    config = dataclasses.asdict(cfg)
    traced = simulate(cfg, engine, want_trace=True)
    traced.trace.other_data["config"] = config
    untraced = simulate(cfg, engine, want_trace=False, config_dict=config)
    assert untraced.trace is None
    assert untraced.counters == traced.counters  # the same run, event counts included
    assert untraced.memory == traced.memory
    return compute_metrics(traced.trace), metrics_from(MetricInputs(**untraced.tables))


@SETTINGS
@given(
    long_workloads(),
    st.sampled_from(["tiny", "llama3_1b", "llama3_8b"]),
    st.fixed_dictionaries(
        {
            "io_slots": st.sampled_from([2, 2, 1]),
            "streams": st.sampled_from(["three", "three", "one", "default"]),
            "event_waits": st.sampled_from([True, True, False]),
            "cuda_graphs": st.booleans(),
        }
    ),
    st.sampled_from([0, 6]),
)
def test_metrics_without_a_trace_are_the_trace_s(wl, model, eng, stall_every):
    try:
        cfg = make(model, engine=eng, **wl)
    except ValueError:
        assume(False)
    host = cfg.hardware.host
    cfg.hardware = dataclasses.replace(
        cfg.hardware,
        host=dataclasses.replace(host, stall_us=2000.0, stall_every_steps=stall_every),
    )
    for engine in ("sync", "async"):
        try:
            traced, untraced = both_ways(cfg, engine)
        except ValueError:  # a drawn request that can never run: refused both ways
            assume(False)
        assert_same(traced, untraced)


def test_hazards_and_eos_drops_are_counted_without_a_trace():
    cfg = make(engine={"io_slots": 1}, batch_size=3, gen_len=30, ignore_eos=False)
    traced, untraced = both_ways(cfg, "async")
    assert traced["hazards"] > 0 and traced["generated_tokens"] > 0
    assert_same(traced, untraced)


def test_simulate_many_gives_each_config_s_engines_their_metrics():
    from cbsim.sim import simulate_many

    configs = [
        make(batch_size=2, gen_len=20),
        make(engine={"name": "sync"}, batch_size=3, gen_len=12),
        make("tiny", arrival="poisson", rate=200.0, num_requests=6, gen_len=15),
    ]
    configs[0] = dataclasses.replace(
        configs[0], engine=dataclasses.replace(configs[0].engine, name="compare")
    )
    got = simulate_many(configs, lambda tables: metrics_from(MetricInputs(**tables)))
    assert [sorted(g) for g in got] == [["async", "sync"], ["sync"], ["async"]]
    for cfg, per_engine in zip(configs, got):
        for engine, metrics in per_engine.items():
            trace = simulate(cfg, engine, want_trace=True).trace
            trace.other_data["config"] = dataclasses.asdict(cfg)
            assert_same(compute_metrics(trace), metrics)
