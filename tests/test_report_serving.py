"""The online report: when arrivals outrun an engine it says so first, in vLLM's names."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import make_config

from cbsim.metrics import compute_metrics
from cbsim.report import write_run_report
from cbsim.report.serving import cdf_figure, overload_sentence, queue_figure, serving_values
from cbsim.sim import run

# 48 requests at 40/s on the reported stack: sync falls behind, async keeps up better
ONLINE = [
    "+experiment=online",
    "model=tiny",
    "workload.num_requests=48",
    "workload.batch_size=8",
    "workload.prompt_len=64",
    "workload.gen_len=32",
    "workload.rate=40",
]


@pytest.fixture(scope="module")
def online_runs():
    config = make_config(ONLINE)
    runs = {}
    for engine in ("sync", "async"):
        trace = run(config, engine)
        runs[engine] = (trace, compute_metrics(trace))
    return config, runs


def test_latency_values_are_the_metrics_values(online_runs):
    _, runs = online_runs
    for trace, m in runs.values():
        v = serving_values(trace)
        assert len(v["ttft"]) == m["requests_finished"] == 48
        for key in ("ttft", "tpot", "itl", "e2el"):
            assert np.median(v[key]) == pytest.approx(m[f"median_{key}_ms"])
            assert np.std(v[key]) == pytest.approx(m[f"std_{key}_ms"])
            for q in (90, 95, 99):
                assert np.percentile(v[key], q) == pytest.approx(m[f"p{q}_{key}_ms"])
        arrivals = trace.instants[trace.instants.name == "arrival"]
        assert m["total_input_tokens"] == arrivals.prompt_len.sum() and m["completed"] == 48


def test_overload_leads_and_names_the_rates():
    metrics = {
        "sync": {
            "overloaded": True,
            "offered_request_rate": 6.0,
            "sustained_request_rate": 3.5,
            "median_ttft_ms": 3173.4,
        },
        "async": {"overloaded": False, "offered_request_rate": 6.0, "median_ttft_ms": 27.5},
    }
    text = overload_sentence(metrics)
    assert text.startswith("sync cannot sustain the offered 6.00 req/s (it starts 3.50")
    assert "sync 3,173 ms" in text and "async 27.5 ms" in text
    assert overload_sentence({"async": metrics["async"]}) is None


def test_online_report_has_the_serving_section(online_runs, tmp_path):
    config, runs = online_runs
    cdf = cdf_figure({e: serving_values(t) for e, (t, _) in runs.items()})
    assert [a.text for a in cdf.layout.annotations][0].startswith("TTFT")
    assert {t.name for t in cdf.data} == {"sync", "async"} and len(cdf.data) == 8
    queue = queue_figure({e: t for e, (t, _) in runs.items()})
    assert {t.name for t in queue.data} >= {"sync: queued", "async: running"}
    from cbsim.report.serving import queue_curve

    for trace, m in runs.values():
        ms, queued = queue_curve(trace)
        assert queued.min() >= 0 and queued[-1] == 0  # every arrival got its first token
        assert queued.max() <= m["requests_finished"]
    html = write_run_report(runs, config, tmp_path / "report.html").read_text()
    for label in (
        "Successful requests",
        "Total input tokens",
        "Total token throughput (tok/s)",
        "Median TTFT (ms)",
        "Std TPOT (ms)",
        "P95 ITL (ms)",
        "Mean E2EL (ms)",
    ):
        assert label in html
    # one label for a figure everywhere: the summary table and the serving table agree
    assert "TTFT p50" not in html and "TPOT p50" not in html
    assert "Serving: latency and the queue" in html


def test_an_online_verdict_leads_with_the_latencies():
    from cbsim.report.tables import verdict

    base = {"total_time_s": 74.0, "gpu_idle_fraction": 0.45, "offered_request_rate": 5.8}
    s = {**base, "median_ttft_ms": 3173.41, "median_tpot_ms": 19.36}
    a = {**base, "total_time_s": 53.4, "gpu_idle_fraction": 0.02, "median_ttft_ms": 27.5}
    a["median_tpot_ms"] = 8.86
    assert verdict({"sync": s, "async": a}).startswith(
        "Async batching pays: median TTFT 3,173.4 → 27.5 ms, median TPOT 19.4 → 8.9 ms; "
        "total time x1.386"
    )
    offline = {k: v for k, v in s.items() if k != "offered_request_rate"}
    assert verdict({"sync": offline, "async": a}).startswith("Async batching pays: x1.386")
