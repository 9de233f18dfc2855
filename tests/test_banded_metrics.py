"""The band draws' two metrics, read off a trace's events (cbsim.validation.measure.banded_metrics),
are compute_metrics' to the last bit: on recordings of both GPUs and engines, and on simulated runs
of every step kind, the eager default stream included."""

from __future__ import annotations

import pytest
from conftest import REPO, make_config

from cbsim.metrics import compute_metrics
from cbsim.sim import run
from cbsim.trace import read_trace
from cbsim.validation.measure import banded_metrics, event_timed

RECORDED = REPO / "experiments" / "recordings"


@pytest.mark.parametrize(
    "path",
    [
        "h100/heldout/r2/8b_poisson_16/trace_sync.json.gz",
        "h100/heldout/r2/1b_eager_32x128+256/trace_async.json.gz",
        "h200/fit_a/ref_8b_16x512+256/trace_async.json.gz",
    ],
)
def test_recordings_measure_the_same(path):
    trace = read_trace(RECORDED / path)
    full = compute_metrics(trace)
    assert banded_metrics(trace) == {k: full[k] for k in ("total_time_s", "gpu_idle_fraction")}


@pytest.mark.parametrize("engine", ["sync", "async"])
@pytest.mark.parametrize("extra", [[], ["engine.cuda_graphs=false"], ["engine.streams=default"]])
def test_simulated_runs_measure_the_same(engine, extra):
    cfg = make_config(
        [
            "model=llama3_1b",
            "workload.num_requests=12",
            "workload.batch_size=4",
            "workload.prompt_len=300",
            "workload.gen_len=20",
            "workload.arrival=poisson",
            "workload.rate=40",
            *extra,
        ]
    )
    trace = event_timed(run(cfg, engine))
    full = compute_metrics(trace)
    assert banded_metrics(trace) == {k: full[k] for k in ("total_time_s", "gpu_idle_fraction")}
