"""Serving metrics in vLLM's names, goodput under an SLO, offered load, host stalls: on
hand-built traces whose answers are known exactly."""

from __future__ import annotations

import numpy as np
import pytest

from cbsim.metrics import compute_metrics, stall_spans
from cbsim.trace import TraceBuilder
from cbsim.trace import schema as S


def served(slo=None, arrivals=(0.0, 500.0), step_us=1000.0, steps=11):
    """Steps of step_us; request 0 (a 7-token prompt) arrives at 0, gets its first token after
    step 0 and 10 more tokens; request 1 (5 tokens) arrives at 500, first token after step 2, 2
    more tokens."""
    b = TraceBuilder("sim", {"config": {"slo": slo}} if slo else {})
    tokens = {s: 1 for s in range(steps)}
    tokens[2] = tokens[3] = tokens[4] = 2
    for s in range(steps):
        b.span(S.COMPUTE, S.FORWARD, s * step_us, step_us, step=s, new_tokens=tokens[s])
    for rid, (arr, first, fin, n, prompt) in enumerate(
        [(arrivals[0], 1000.0, 11000.0, 11, 7), (arrivals[1], 3000.0, 5000.0, 3, 5)]
    ):
        b.request_event(S.ARRIVAL, arr, rid=rid, prompt_len=prompt)
        b.request_event(S.FIRST_TOKEN, first, rid=rid)
        b.request_event(S.FINISH, fin, rid=rid, tokens=n)
    return b.build()


def test_latencies_in_vllm_names():
    m = compute_metrics(served())
    assert m["mean_ttft_ms"] == pytest.approx((1.0 + 2.5) / 2)
    assert m["median_ttft_ms"] == m["ttft_ms_p50"]
    assert m["p99_ttft_ms"] == pytest.approx(1.0 + 0.99 * 1.5)
    assert m["mean_tpot_ms"] == pytest.approx(1.0)
    assert m["mean_e2el_ms"] == pytest.approx((11.0 + 4.5) / 2)
    # 14 tokens in all, 2 of them first tokens: 12 inter-token gaps, each one 1 ms step
    assert m["median_itl_ms"] == pytest.approx(1.0) and m["p99_itl_ms"] == pytest.approx(1.0)
    assert m["std_itl_ms"] == pytest.approx(0.0)


def test_every_latency_has_vllms_six_statistics_as_numpy_computes_them():
    m = compute_metrics(served())
    e2el = np.array([11.0, 4.5])
    for stat, value in {
        "mean": e2el.mean(),
        "median": np.median(e2el),
        "std": e2el.std(),  # population, as vLLM's np.std
        "p90": np.percentile(e2el, 90),
        "p95": np.percentile(e2el, 95),
        "p99": np.percentile(e2el, 99),
    }.items():
        assert m[f"{stat}_e2el_ms"] == pytest.approx(value), stat
    for key in ("ttft", "tpot", "itl", "e2el"):
        for stat in ("mean", "median", "std", "p90", "p95", "p99"):
            assert m[f"{stat}_{key}_ms"] is not None, (stat, key)


def test_counts_tokens_duration_and_throughputs_as_vllm_does():
    m = compute_metrics(served())
    assert m["completed"] == 2 and m["duration"] == pytest.approx(0.011)
    assert m["total_input_tokens"] == 12 and m["total_output_tokens"] == 14
    assert m["request_throughput"] == pytest.approx(2 / 0.011)
    assert m["output_throughput"] == pytest.approx(14 / 0.011)
    assert m["total_token_throughput"] == pytest.approx((12 + 14) / 0.011)


def test_a_trace_without_prompt_lengths_has_no_input_token_figures():
    trace = served()
    for e in trace.events:
        if e.get("name") == S.ARRIVAL:
            e["args"].pop("prompt_len")
    m = compute_metrics(trace)
    assert m["total_input_tokens"] is None and m["total_token_throughput"] is None
    assert m["total_output_tokens"] == 14


def test_goodput_counts_requests_meeting_every_bound():
    assert compute_metrics(served())["request_goodput"] is None  # no SLO: no goodput
    m = compute_metrics(served({"ttft_ms": 2.0}))
    assert m["request_goodput"] == pytest.approx(1 / 0.011) and m["slo_met_fraction"] == 0.5
    m = compute_metrics(served({"ttft_ms": 3.0, "e2el_ms": 5.0}))
    assert m["slo_met_fraction"] == 0.5  # request 0 meets TTFT but not E2EL
    assert compute_metrics(served({"tpot_ms": 1.0}))["slo_met_fraction"] == 1.0


def test_offered_load_over_what_the_engine_sustains():
    online = compute_metrics(served(arrivals=(0.0, 500.0)))
    # arrivals 0.5 ms apart, first tokens 2 ms apart (finishes, 6 ms apart, do not enter):
    # offered 4x what the engine took on
    assert online["offered_load_ratio"] == pytest.approx(2000.0 / 500.0)
    assert online["overloaded"] is True
    relaxed = compute_metrics(served({"overload_ratio": 5.0}, arrivals=(0.0, 500.0)))
    assert relaxed["overloaded"] is False
    offline = compute_metrics(served(arrivals=(0.0, 0.0)))
    assert offline["offered_load_ratio"] is None and offline["overloaded"] is None


def stalled():
    b = TraceBuilder("runtime")
    for s in range(20):
        t = s * 10_000.0
        dur = 150_000.0 if s == 7 else 100.0  # a collector pause inside step 7's prepare
        b.span(S.HOST, S.PREPARE, t, dur, step=s, kind="decode")
        b.span(S.HOST, S.WAIT, t + dur, 9000.0, step=s, kind="decode")
        b.span(S.COMPUTE, S.FORWARD, t + dur, 9000.0, step=s, kind="decode")
    b.span(S.HOST, S.PREPARE, 200_000.0, 5000.0, step=20, kind="prefill")  # one prefill: its own
    return b.build()


def test_host_stalls_are_phases_ten_times_their_median():
    m = compute_metrics(stalled())
    assert m["host_stalls"] == 1 and m["host_stall_ms"] == pytest.approx(150.0)
    assert m["host_stalls_by_phase"] == {S.PREPARE: 1}
    spans = stall_spans(stalled().spans)
    assert list(spans.step) == [7] and spans.median_us.iloc[0] == pytest.approx(100.0)
    assert compute_metrics(served())["host_stalls"] == 0


@pytest.mark.parametrize("q", [0, 1, 37.5, 50, 90, 99, 100])
def test_weighted_percentile_equals_the_percentile_of_the_repeated_values(q):

    from cbsim.metrics.serving import weighted_pct

    rng = np.random.default_rng(int(q))
    values = rng.exponential(5.0, 40)
    weights = rng.integers(0, 9, 40)
    expect = np.percentile(np.repeat(values, weights), q)
    assert weighted_pct(values, weights, q) == pytest.approx(expect, rel=1e-12)
