"""The host's two speed levels (hardware.host.regimes): one level changes nothing, a plain run is
the run at the expected factor, a draw's realization spends the stationary share of its time
slow, and the fast-forward stays exact across switches."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from conftest import REPO, make_config, run_cli
from sim_harness import make

from cbsim.bands import level_quantiles, scaled_host
from cbsim.config import ConfigError
from cbsim.config.hardware import HostRegimes, HostSpread
from cbsim.metrics import compute_metrics
from cbsim.sim.engine import run
from cbsim.sim.host_speed import HostSpeed

TWO_LEVELS = HostRegimes(slow_factor=2.0, fast_dwell_s=0.03, slow_dwell_s=0.02)


def with_host(cfg, **host):
    hw = cfg.hardware
    return dataclasses.replace(
        cfg, hardware=dataclasses.replace(hw, host=dataclasses.replace(hw.host, **host))
    )


def a_draw(cfg, regimes: HostRegimes, seed: int = 3):
    """``cfg`` as a band's draw runs it: the regimes realized (seeded), no other spread."""
    spread = dataclasses.replace(cfg.hardware.host.spread, jitter=True, within_run=0.0, seed=seed)
    return with_host(cfg, regimes=regimes, spread=spread)


@pytest.mark.parametrize(
    "kwargs, key",
    [
        ({"slow_factor": 0.9}, "slow_factor"),
        ({"slow_factor": float("nan")}, "slow_factor"),
        ({"fast_dwell_s": 0.0}, "fast_dwell_s"),
        ({"slow_dwell_s": -0.5}, "slow_dwell_s"),
        ({"slow_dwell_s": float("inf")}, "slow_dwell_s"),
    ],
)
def test_a_bad_regime_names_its_key(kwargs, key):
    with pytest.raises(ConfigError, match=rf"hardware\.host\.regimes\.{key}="):
        HostRegimes(**kwargs)


def test_the_regimes_are_set_from_the_command_line_and_refused_in_one_line():
    cfg = make_config(
        [
            "hardware.host.regimes.slow_factor=2",
            "hardware.host.regimes.fast_dwell_s=1",
            "hardware.host.regimes.slow_dwell_s=0.5",
        ]
    )
    assert cfg.hardware.host.regimes.slow_factor == 2.0
    assert cfg.hardware.host.regimes.expected_factor == pytest.approx(1 + 0.5 / 1.5)
    bad = run_cli(["hardware.host.regimes.slow_factor=0.5"], cwd=REPO, timeout=120)
    assert bad.returncode != 0
    assert bad.stderr.strip().splitlines()[-1] == (
        "cbsim: config error: hardware.host.regimes.slow_factor=0.5 is out of range; "
        "allowed: 1.0 to 100.0"
    )
    assert "Traceback" not in bad.stderr


@pytest.mark.parametrize(
    "regimes",
    [
        HostRegimes(slow_factor=3.0, slow_dwell_s=0.0),
        HostRegimes(slow_factor=1.0, slow_dwell_s=0.7),
    ],
)
def test_one_level_is_the_run_without_regimes_bit_for_bit(regimes):
    """A slow level never in force, or no slower: the plain run and a band's draw alike."""
    cfg = make("llama3_1b", batch_size=4, prompt_len=64, gen_len=300)
    assert regimes.expected_factor == 1.0
    for engine in ("sync", "async"):
        base = run(cfg, engine)
        assert run(with_host(cfg, regimes=regimes), engine).events == base.events
        draw_base = run(a_draw(cfg, HostRegimes()), engine)
        assert run(a_draw(cfg, regimes), engine).events == draw_base.events


def test_a_plain_run_charges_the_host_at_the_expected_factor():
    """Within float round-off of every host coefficient scaled by the expected factor (the
    scaled profile multiplies each coefficient, the run each phase's sum)."""
    cfg = make("llama3_1b", batch_size=2, prompt_len=64, gen_len=400)
    regimes = HostRegimes(slow_factor=2.2, fast_dwell_s=1.0, slow_dwell_s=0.6)
    factor = regimes.expected_factor
    assert factor == pytest.approx(1.45)
    scaled = scaled_host(cfg.hardware.host, factor, seed=0)
    scaled = dataclasses.replace(scaled, spread=cfg.hardware.host.spread)  # no draw
    for engine in ("sync", "async"):
        got = compute_metrics(run(with_host(cfg, regimes=regimes), engine))
        hw = dataclasses.replace(cfg.hardware, host=scaled)
        want = compute_metrics(run(dataclasses.replace(cfg, hardware=hw), engine))
        plain = compute_metrics(run(cfg, engine))
        for key in ("total_time_s", "gpu_idle_fraction", "host_ms_per_step"):
            assert got[key] == pytest.approx(want[key], rel=1e-9, abs=1e-12), (engine, key)
        assert got["total_time_s"] > plain["total_time_s"]


def test_a_realization_spends_the_stationary_share_of_its_time_slow():
    """Over 10^4 mean stays the slow share is within 2% of slow / (fast + slow); seeded."""
    regimes = HostRegimes(slow_factor=2.5, fast_dwell_s=1.0, slow_dwell_s=0.6)
    speed = HostSpeed(regimes, realize=True, seed=11)
    t = np.linspace(0.0, 8000e6, 400_001)  # 8000 s, every 20 ms
    factors = np.array([speed.factor_at(x) for x in t])
    assert set(np.unique(factors)) == {1.0, 2.5}
    assert np.mean(factors == 2.5) == pytest.approx(regimes.slow_share, abs=0.02)
    switches = np.count_nonzero(np.diff(factors))
    assert switches == pytest.approx(8000 / 0.8, rel=0.1)  # one switch per mean stay
    again = HostSpeed(regimes, realize=True, seed=11)
    assert [again.factor_at(x) for x in t[:1000]] == factors[:1000].tolist()
    assert speed.next_switch(5e6) > 5e6 and HostSpeed(regimes).next_switch(0.0) == float("inf")


@pytest.mark.parametrize("graphs", [True, False])
def test_the_fast_forward_is_exact_across_switches(graphs):
    """Steady stretches cut where the level switches: the trace of the stepped run."""
    cfg = make(
        "llama3_1b", engine={"cuda_graphs": graphs}, batch_size=3, prompt_len=32, gen_len=900
    )
    cfg = with_host(a_draw(cfg, TWO_LEVELS), stall_us=200.0, stall_every_steps=97)
    for engine in ("sync", "async"):
        fast, slow = run(cfg, engine), run(cfg, engine, fast_forward=False)
        assert fast.events == slow.events
        assert (
            fast.other_data["sim_counters"]["simpy_events"] * 3
            < (slow.other_data["sim_counters"]["simpy_events"])
        )
        sp = slow.spans
        launch = sp[(sp.name == "launch") & (sp.kind == "decode")].dur.to_numpy()
        # both levels seen, and every host cost doubles in the slow one: an eager launch's own
        # (kernels and forward, at the profile's eager level) as much as its copies and events
        assert launch.max() / launch.min() == pytest.approx(2.0, rel=1e-5)


def test_a_bands_draws_start_slow_in_the_slow_share_of_them():
    """Stratified over the starting level: of 20 draws, 8 start slow at a slow share of 0.4."""
    quantiles = level_quantiles(20, seed=4)
    assert sorted(int(q * 20) for q in quantiles) == list(range(20))  # one in each stratum
    starts = [
        HostSpeed(TWO_LEVELS, True, seed=i, quantile=q).factor_at(0.0)
        for i, q in enumerate(quantiles)
    ]
    assert starts.count(2.0) == 8
    with pytest.raises(ConfigError, match=r"hardware\.host\.spread\.level_quantile="):
        HostSpread(level_quantile=1.5)
