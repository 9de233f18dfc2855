"""Calibration reads the host's two speed levels from traces (cbsim/calibration/regimes.py).

The recordings are the simulator's own: runs whose host switches between a fast and a slow level
(one seeded realization of hardware.host.regimes per run, as a band's draw runs it), with known
host costs. The fit must find the slow factor and the dwell times, fit the host costs at the fast
level (not at the mixed average), leave the slow level out of the stalls, and read a host of
one level as one level.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import yaml
from conftest import compose_cfg, load_config
from omegaconf import OmegaConf

from cbsim.calibration.calibrate import calibrate
from cbsim.calibration.options import FitOptions
from cbsim.calibration.profile import profile_yaml
from cbsim.calibration.recordings import load
from cbsim.calibration.regimes import HostLevels, fit_host_levels, two_levels
from cbsim.calibration.result import Calibration
from cbsim.calibration.run_config import hardware_from
from cbsim.config.hardware import HostRegimes
from cbsim.sim import run
from cbsim.sim.host_speed import HostSpeed
from cbsim.trace import write_trace

HOST = {
    "hardware.host.schedule.fixed_us": 20.0,
    "hardware.host.schedule.per_request_us": 1.0,
    "hardware.host.prepare.fixed_us": 60.0,
    "hardware.host.prepare.per_request_us": 3.0,
    "hardware.host.update.fixed_us": 30.0,
    "hardware.host.update.per_request_us": 2.0,
    "hardware.host.graph_launch_us": 40.0,
    "hardware.host.stall_us": 0.0,
    "hardware.host.stall_every_steps": 0,
}
# dwell means well above the windows (50 ms): a stay shorter than about two windows merges
# into its neighbours (regimes.py), so means near 0.1 s would read long
SLOW_FACTOR, FAST_DWELL_S, SLOW_DWELL_S = 2.0, 0.6, 0.4
TWO_LEVELS = {
    "hardware.host.regimes.slow_factor": SLOW_FACTOR,
    "hardware.host.regimes.fast_dwell_s": FAST_DWELL_S,
    "hardware.host.regimes.slow_dwell_s": SLOW_DWELL_S,
    # a band's draw: one realization of the two-level process, no step jitter besides it
    "hardware.host.spread.jitter": "true",
    "hardware.host.spread.within_run": 0.0,
}
# a host of one level (the shipped profiles carry two)
ONE_LEVEL = {"hardware.host.regimes.slow_dwell_s": 0.0}
RUNS = [(4, "sync", 1), (16, "sync", 2), (8, "async", 3), (8, "sync", 4)]


def record(
    path: Path, batch: int, engine: str, seed: int, levels: dict, gen_len: int = 2500
) -> Path:
    overrides = [f"{k}={v}" for k, v in {**HOST, **levels}.items()] + [
        "model=llama3_1b",
        f"engine={engine}",
        f"workload.batch_size={batch}",
        "workload.prompt_len=128",
        f"workload.gen_len={gen_len}",
        f"hardware.host.spread.seed={seed}",
    ]
    cfg = compose_cfg(overrides)
    trace = run(load_config(cfg), engine)
    trace.other_data["config"] = OmegaConf.to_container(cfg, resolve=True)
    return write_trace(trace, path / f"trace_{engine}_bs{batch}_{seed}.json.gz")


@pytest.fixture(scope="module")
def two_level_runs(tmp_path_factory) -> list:
    d = tmp_path_factory.mktemp("two_levels")
    return load([record(d, b, e, s, TWO_LEVELS) for b, e, s in RUNS])


@pytest.fixture(scope="module")
def base():
    return load_config(compose_cfg([])).hardware


def fitted_host(recs, base) -> tuple[Calibration, HostLevels]:
    cal = Calibration(dataclasses.replace(base, host=dataclasses.replace(base.host)))
    levels = HostLevels()
    fit_host_levels(recs, cal, levels)
    return cal, levels


@pytest.fixture(scope="module")
def two_level_fit(two_level_runs, base) -> tuple[Calibration, HostLevels]:
    return fitted_host(two_level_runs, base)


def realized_dwells(recs) -> tuple[float, float, int]:
    """The realizations' own dwell means over the recorded spans (time at a level over the
    switches out of it), and the switches: what the estimate is to find."""
    regimes = HostRegimes(SLOW_FACTOR, FAST_DWELL_S, SLOW_DWELL_S)
    time, exits = [0.0, 0.0], [0, 0]
    for rec, (_, _, seed) in zip(recs, RUNS):
        speed, t, end = HostSpeed(regimes, realize=True, seed=seed), 0.0, rec.spans.end.max()
        while t < end:
            slow = int(speed.factor_at(t) > 1.0)
            nxt = speed.next_switch(t)
            time[slow] += min(nxt, end) - t
            exits[slow] += nxt < end
            t = nxt
    return time[0] / exits[0] / 1e6, time[1] / exits[1] / 1e6, sum(exits)


def test_two_levels_are_found_with_their_factor_and_dwell_times(two_level_runs, two_level_fit):
    cal, levels = two_level_fit
    regimes = cal.hardware.host.regimes
    assert regimes.slow_factor == pytest.approx(SLOW_FACTOR, rel=0.03)
    fast, slow, switches = realized_dwells(two_level_runs)
    assert switches >= 15
    assert regimes.fast_dwell_s == pytest.approx(fast, rel=0.2)
    assert regimes.slow_dwell_s == pytest.approx(slow, rel=0.2)
    assert any("host regimes" in r.what for r in cal.rows)
    # the profile carries them, commented, and reads back
    text = profile_yaml(cal, "h200")
    assert "  regimes:\n    slow_factor: " in text
    back_hw = hardware_from(yaml.safe_load(text))
    assert back_hw.provenance["host.regimes.slow_factor"].startswith("fitted: host regimes")
    back = back_hw.host.regimes
    assert back.slow_factor == pytest.approx(regimes.slow_factor, rel=1e-5)
    assert back.slow_dwell_s == pytest.approx(regimes.slow_dwell_s, rel=1e-5)
    # the steps' factors: 1 at the fast level, the slow factor at the slow one, both present
    rec = two_level_runs[0]
    f = levels.at(rec, rec.forward.step.to_numpy())
    assert set(np.round(f, 1)) == {1.0, round(levels.runs[rec.path].factor, 1)}


def test_host_costs_are_fitted_at_the_fast_level(two_level_fit):
    cal, _ = two_level_fit
    host = cal.hardware.host
    # at batch 8: what the fast level charges (the mixed average is x1.4 of it)
    for phase in ("schedule", "prepare", "update"):
        cost = getattr(host, phase)
        truth = (
            HOST[f"hardware.host.{phase}.fixed_us"]
            + 8 * HOST[f"hardware.host.{phase}.per_request_us"]
        )
        assert cost.cost(8, 8, 0) == pytest.approx(truth, rel=0.04), phase
    # the slow level is not taken for a stall
    assert not any(r.what == "host stalls" for r in cal.rows)


def test_wait_launch_and_spread_are_at_the_fast_level(two_level_runs, base):
    cal = calibrate(two_level_runs, base, "h200_levels", FitOptions(forward_samples=60, starts=1))
    host = cal.hardware.host
    assert host.graph_launch_us + 2 * host.copy_launch_us + 5 * host.event_us == pytest.approx(
        HOST["hardware.host.graph_launch_us"]
        + 2 * base.host.copy_launch_us
        + 5 * base.host.event_us,
        rel=0.05,
    )
    # no step jitter inside a level: what is left is the windows that straddle a switch
    assert host.spread.within_run < 0.1


def test_a_host_of_one_level_is_read_as_one_level(tmp_path, base):
    recs = load(
        [record(tmp_path, b, e, s, ONE_LEVEL, 600) for b, e, s in ((8, "sync", 5), (4, "async", 6))]
    )
    cal, levels = fitted_host(recs, base)
    regimes = cal.hardware.host.regimes
    assert regimes.slow_factor == 1.0 and regimes.slow_dwell_s == 0.0
    assert not regimes.switching and levels.runs == {}
    assert cal.hardware.host.prepare.cost(8, 8, 0) == pytest.approx(60.0 + 8 * 3.0, rel=0.02)


def test_two_means_tell_two_levels_from_one_noisy_level():
    rng = np.random.default_rng(0)
    one = rng.normal(0.0, 0.1, 400)
    assert two_levels(one, np.ones(400)) is None
    two = np.concatenate([rng.normal(0.0, 0.05, 300), rng.normal(np.log(2.0), 0.05, 100)])
    fast, slow = two_levels(two, np.ones(400))
    assert np.exp(slow - fast) == pytest.approx(2.0, rel=0.03)
