"""The loop's cold start (hardware.host.loop_start_us): the first step reaches the GPU that much
later (times the host's speed factor), every later step as before; calibration recovers it
(tests/test_validation.py's synthetic recordings carry one) and a band's draws scale it."""

from __future__ import annotations

import pytest

from cbsim.api import compose
from cbsim.bands import drawn_profiles
from cbsim.calibration.loop_start import head_us
from cbsim.config.errors import ConfigError
from cbsim.sim import run
from cbsim.trace import schema as S

BASE = ("model=llama3_1b", "workload.batch_size=8", "workload.gen_len=24")


def _run(engine: str, *extra: str):
    cfg = compose(*BASE, f"engine={engine}", "hardware=h200", *extra)
    return cfg, run(cfg, engine)


@pytest.mark.parametrize("engine", ["sync", "async"])
def test_the_first_step_waits_out_the_cold_start_and_nothing_else_moves(engine):
    cfg, cold = _run(engine, "hardware.host.loop_start_us=2000")
    _, warm = _run(engine, "hardware.host.loop_start_us=0")
    shift = 2000 * cfg.hardware.host.regimes.expected_factor
    assert head_us(cold) - head_us(warm) == pytest.approx(shift)
    # no span of its own: the first schedule starts after it, every span shifted by as much
    for trace, start in ((cold, shift), (warm, 0.0)):
        host = trace.spans[trace.spans.lane == S.HOST].sort_values("ts")
        assert host.iloc[0]["name"] == S.SCHEDULE and host.iloc[0].ts == pytest.approx(start)
    assert cold.spans.end.max() - warm.spans.end.max() == pytest.approx(shift)


def test_a_band_draws_the_cold_start_with_the_host_speed():
    hw = compose(*BASE, "hardware=h200").hardware
    assert hw.host.loop_start_us > 0  # fitted on the H200's recordings (calibration/loop_start.py)
    draws = drawn_profiles(hw)
    ratios = {round(d.host.loop_start_us / hw.host.loop_start_us, 9) for d in draws}
    phases = {round(d.host.schedule.fixed_us / hw.host.schedule.fixed_us, 9) for d in draws}
    assert ratios == phases and len(ratios) == len(draws)


def test_a_negative_cold_start_is_refused_by_key():
    with pytest.raises(ConfigError, match="hardware.host.loop_start_us"):
        compose(*BASE, "hardware.host.loop_start_us=-5")
