"""Metrics without a trace: the simulator's run folded as it runs gives the numbers
compute_metrics gives from its trace (to 1e-9), on random workloads with arrivals, EOS, chunked
prefill, preemption, stalls and the hazard what-ifs, folded in small chunks; the counts agree
exactly; and the memory of a run without a trace does not grow with its steps, nor with its
requests by more than a few hundred bytes each (no token id kept)."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys

import pytest
from conftest import REPO, make_config
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


def both_ways(cfg, engine: str, chunk: int = 50) -> tuple[dict, dict]:
    """The metrics of the trace, and of the same run folded without one ``chunk`` spans at a
    time (small: busy blocks, idle gaps and steps straddle the chunks)."""
    config = dataclasses.asdict(cfg)
    traced = simulate(cfg, engine, want_trace=True)
    traced.trace.other_data["config"] = config
    untraced = simulate(cfg, engine, want_trace=False, config_dict=config, chunk=chunk)
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


QUIET = ("output.print_table=false", "output.progress=false")
# a few chunks of spans each (cbsim.sim.recorder.CHUNK_SPANS): 5,000 steps of 8 spans
LONG = ("model=llama3_1b", "workload.batch_size=4", "workload.num_requests=8")


@pytest.mark.parametrize(
    "overrides",
    [
        ["engine=sync", *LONG, "workload.gen_len=2500", "output.report=false"],
        ["engine=async", *LONG, "workload.gen_len=2500", "output.report=true"],
        [
            "engine=compare",
            "output.report=true",
            "workload.arrival=poisson",
            "workload.rate=40",
            "workload.num_requests=96",
            "workload.gen_len=128",
            "workload.gen_spread=0.5",
            "workload.ignore_eos=false",
        ],
    ],
    ids=["sync", "async", "compare-poisson"],
)
def test_a_run_s_metrics_are_the_same_with_the_trace_kept_or_not(tmp_path, overrides):
    from cbsim.app import run_engines

    out = {}
    for keep in ("true", "false"):
        cfg = make_config([*overrides, "mode.bands=false", f"output.trace={keep}", *QUIET])
        (tmp_path / keep).mkdir()
        out[keep] = run_engines(cfg, dataclasses.asdict(cfg), tmp_path / keep)
    assert list((tmp_path / "true").glob("trace*.json.gz"))
    report = ["report.html"] if "output.report=true" in overrides else []
    assert [p.name for p in (tmp_path / "false").iterdir()] == report
    m = out["true"]
    runs = [m] if "steps" in m else [m["sync"], m["async"]]
    assert all(r["steps"] > 0 and r["p99_itl_ms"] > 0 for r in runs)
    assert_same(out["true"], out["false"])


MEMORY_SCRIPT = """
import json, sys
from sim_harness import make
from cbsim.metrics import MetricInputs, metrics_from
from cbsim.sim import simulate
cfg = make(**json.loads(sys.argv[1]))
r = simulate(cfg, "async", fast_forward=sys.argv[2] == "ff")
m = metrics_from(MetricInputs(**r.tables))
assert m["steps"] == r.counters["steps"]
assert m["requests_finished"] == r.counters["requests"] == cfg.workload.total_requests
# this process's own high-water mark: ru_maxrss keeps the forking parent's (a pytest worker's)
with open("/proc/self/status") as f:
    peak = next(line.split()[1] for line in f if line.startswith("VmHWM:"))
print(m["steps"], r.counters["trace_events"], peak)
"""


def peak_rss(gen_len: int) -> tuple[int, int, int]:
    """(steps, trace events, peak RSS bytes) of an async run without a trace, stepped one step
    at a time (every span written by itself, none at once by the fast-forward), in a fresh
    interpreter."""
    return run_peak_rss({"batch_size": 4, "num_requests": 4, "gen_len": gen_len}, False)


def run_peak_rss(workload: dict, fast_forward: bool) -> tuple[int, int, int]:
    """(steps, trace events, peak RSS bytes) of an async run of ``workload`` (sim_harness.make)
    without a trace, in a fresh interpreter."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join((str(REPO), str(REPO / "tests")))}
    args = [json.dumps(workload), "ff" if fast_forward else "step"]
    res = subprocess.run(
        [sys.executable, "-c", MEMORY_SCRIPT, *args],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    steps, events, kib = map(int, res.stdout.split())
    return steps, events, kib * 1024


def test_a_run_without_a_trace_holds_no_span_however_many_steps_it_has():
    """4x the steps: the peak memory grows by the few numbers a step the percentiles and the
    stalls' medians keep (about 110 bytes a step), not by the step's eight spans (kept to the
    run's end as columns of Python objects, a step's spans take 4 KB)."""
    short, long = peak_rss(20_000), peak_rss(80_000)
    steps, events = long[0] - short[0], long[1] - short[1]
    assert steps >= 60_000 and events >= 8 * steps
    grew = long[2] - short[2]
    assert grew < 400 * steps, f"{grew / steps:.0f} bytes a step"


@pytest.mark.slow
def test_a_run_without_a_trace_holds_a_few_hundred_bytes_a_request_and_no_token_id():
    """4x the requests (short ones in large batches: few steps, 16 + 4 tokens each): the peak
    grows by each request's scheduler row, Request and folded row, under 1 KB a request
    (benchmarks/bench_sim_memory.py: about 540), not by its prompt's and outputs' token ids
    or its four request instants (1.7 KB a request while they were kept)."""
    wl = {"prompt_len": 16, "gen_len": 4, "batch_size": 4096, "max_batch_tokens": 65536}
    small, large = (run_peak_rss({**wl, "num_requests": n}, True) for n in (20_000, 80_000))
    grew = large[2] - small[2]
    assert large[0] < 200  # steps: what grows is the requests
    assert grew < 1000 * 60_000, f"{grew / 60_000:.0f} bytes a request"


REPORT_MEMORY_SCRIPT = """
import dataclasses, sys, tempfile
from pathlib import Path
from cbsim.api import compose
from cbsim.app import run_engines
gen_len, trace = sys.argv[1:]
cfg = compose(
    "model=llama3_1b", "engine=async", "mode.bands=false", "workload.batch_size=4",
    "workload.num_requests=4", "workload.prompt_len=32", f"workload.gen_len={gen_len}",
    f"output.trace={trace}", "output.report=true", "output.print_table=false",
    "output.progress=false",
)
out = Path(tempfile.mkdtemp())
m = run_engines(cfg, dataclasses.asdict(cfg), out)
assert (out / "report.html").stat().st_size > 1e6
# this process's own high-water mark: ru_maxrss keeps the forking parent's (a pytest worker's)
with open("/proc/self/status") as f:
    print(m["steps"], next(line.split()[1] for line in f if line.startswith("VmHWM:")))
"""


def report_rss(gen_len: int, trace: bool) -> tuple[int, int]:
    """(steps, peak RSS bytes) of an async run and its report (python -m cbsim's path), its
    trace kept or not, in a fresh interpreter."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    args = [sys.executable, "-c", REPORT_MEMORY_SCRIPT, str(gen_len), str(trace).lower()]
    res = subprocess.run(args, env=env, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    steps, kib = map(int, res.stdout.split())
    return steps, kib * 1024


def test_a_run_without_a_trace_draws_its_report_in_a_few_numbers_a_step():
    """output.trace=false with the report on: 4x the steps grow the peak memory by the fold's
    and the per-step charts' few numbers a step (about 300 bytes), where the trace kept grows
    it by every span, its metric tables and the report's frames (about 10 KB a step)."""
    (s0, r0), (s1, r1) = report_rss(20_000, False), report_rss(80_000, False)
    (t0, k0), (t1, k1) = report_rss(2_000, True), report_rss(8_000, True)
    assert s1 - s0 >= 60_000 and t1 - t0 >= 6_000
    without, kept = (r1 - r0) / (s1 - s0), (k1 - k0) / (t1 - t0)
    print(f"peak RSS a step: {without:.0f} bytes without a trace, {kept:.0f} with it kept")
    assert without < 600 and without < kept / 10
