"""Capacity: the highest Poisson rate meeting a TTFT/TPOT SLO, per engine, by bisection over
simulations (the real simulator, a tiny workload)."""

from __future__ import annotations

import json

import pytest
from conftest import make_config, run_cli

from cbsim.capacity import CapacityOptions, Probe, answer_line, capacity, meets
from cbsim.config import ConfigError

TINY = [
    "+experiment=capacity",
    "model=tiny",
    "workload.num_requests=24",
    "workload.batch_size=4",
    "workload.prompt_len=64",
    "workload.gen_len=24",
    "workload.max_batch_tokens=256",
    "slo.ttft_ms=50",
    "slo.tpot_ms=20",
    "extra.rate_min=1",
    "extra.rate_max=2000",
    "extra.tolerance=0.05",
    "extra.curve_points=3",
]


@pytest.mark.parametrize("engine", ["sync", "async"])
def test_the_capacity_passes_and_a_rate_just_above_it_misses(engine):
    config = make_config(TINY)
    opts = CapacityOptions.from_extra(dict(config.extra))
    probe = Probe(config, engine, opts)
    rate, at_least = capacity(probe)
    assert rate is not None and not at_least
    points = probe.curve()
    assert probe.points[float(f"{rate:.6g}")]["meets_slo"]
    above = [p["rate"] for p in points if p["rate"] > rate]
    assert above and not probe.points[min(above)]["meets_slo"]
    assert (min(above) - rate) / min(above) <= opts.tolerance
    # nothing below the capacity that was tried missed, nothing above it passed
    assert all(p["meets_slo"] == (p["rate"] <= rate) for p in points)


def test_meets_needs_every_request_and_every_bound():
    m = {"requests_finished": 10, "p99_ttft_ms": 100.0, "p99_tpot_ms": 20.0}
    bounds = {"ttft": 200.0, "tpot": 20.0}
    assert meets(m, bounds, "p99", 10)
    assert not meets(m, bounds, "p99", 11)
    assert not meets({**m, "p99_tpot_ms": 20.5}, bounds, "p99", 10)
    assert not meets({**m, "p99_ttft_ms": None}, bounds, "p99", 10)


def test_the_answer_is_one_line_with_the_range_over_seeds_and_whose_costs():
    result = {
        "stat": "p99",
        "slo": {"ttft": 1000.0, "tpot": 40.0},
        "hardware": "h200",
        "engines": {
            "sync": {
                "capacity_rate": 8.0,
                "band": [8.0, 8.0],
                "seed_rates": [8.0] * 3,
                "at_least": False,
            },  # fmt: skip
            "async": {
                "capacity_rate": 15.6,
                "band": [14.1, 16.2],
                "seed_rates": [15.6, 14.1, 16.2],
                "at_least": False,
            },  # fmt: skip
        },
    }
    assert answer_line(result) == (
        "capacity under p99 TTFT <= 1000 ms and p99 TPOT <= 40 ms: sync 8 req/s, "
        "async 15.6 req/s (14.1-16.2 over 3 seeds) (async/sync x1.95); costs of hardware=h200"
    )


@pytest.mark.parametrize(
    "extra, message",
    [
        ({"stat": "p50"}, "extra.stat=p50; allowed: mean, median, p99"),
        ({"rate_min": 10, "rate_max": 5}, "extra.rate_min=10 must be below extra.rate_max=5"),
        ({"tolerance": 0}, "extra.tolerance=0 must be a finite number > 0"),
        ({"rates": 3}, "extra.rates=3 is not a setting of task=capacity"),
    ],
)
def test_bad_options_name_their_key(extra, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        CapacityOptions.from_extra(extra)


def test_the_cli_writes_the_curve_and_prints_the_answer(tmp_path):
    r = run_cli([*TINY, f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    result = json.loads((tmp_path / "run" / "capacity.json").read_text())
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("capacity under"))
    assert line == result["answer"] and "sync" in line and "async" in line
    assert set(result["engines"]) == {"sync", "async"}
    assert len(result["engines"]["sync"]["curve"]) >= 3 + 2
    seeds = result["seeds"]
    for e in result["engines"].values():
        assert len(e["seed_rates"]) == len(seeds) >= 2
        assert e["band"][0] <= e["capacity_rate"] <= e["band"][1]
    html = (tmp_path / "run" / "capacity.html").read_text()
    assert result["answer"] in html.replace("&lt;", "<")
    assert "range over the seeds" in html and f"hardware={result['hardware']}" in html
    assert r.stdout.strip().splitlines()[-1].endswith("capacity.html")
    assert "P99 TTFT (ms)" in html  # vLLM's label, as in the run report's serving table


def test_an_offline_workload_or_no_slo_is_refused(tmp_path):
    for extra, message in (
        (["workload.arrival=offline"], "allowed: workload.arrival=poisson"),
        (["slo.ttft_ms=null", "slo.tpot_ms=null"], "task=capacity needs an SLO"),
    ):
        run = tmp_path / extra[0].replace("=", "_")
        r = run_cli([*TINY, *extra, f"hydra.run.dir={run}"], cwd=tmp_path, timeout=120)
        assert r.returncode == 2 and message in r.stderr, r.stderr[-2000:]
        assert "Traceback" not in r.stderr
