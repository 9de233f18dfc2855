"""The SM clock under sustained GEMM load (hardware.gpu.clock, cbsim/costs/clock.py): a forward
heavy in GEMMs stretches its GEMMs' compute-bound time over the clock ratio its load settles at,
a light decode step runs at the tables' boost clock, and in the simulator a step with prompt
tokens starts from the clock the forward before it left."""

from __future__ import annotations

import numpy as np
import pytest

from cbsim.api import compose, simulate
from cbsim.calibration.steps import StepShape
from cbsim.config.errors import ConfigError
from cbsim.config.hardware import GpuClock
from cbsim.costs import CostModel
from cbsim.costs.clock import lagged, settled_ratio
from cbsim.trace import schema as S


def test_the_settled_ratio_falls_linearly_between_its_two_rates():
    clock = GpuClock(min_ratio=0.89, throttle_from=0.3, throttle_full=0.5)
    rates = np.array([0.0, 0.3, 0.4, 0.5, 0.9])
    ratios = settled_ratio(clock, rates)
    assert ratios == pytest.approx([1.0, 1.0, 0.945, 0.89, 0.89])
    # a number gives what the array gives elementwise, bit for bit (the fast-forward's path)
    assert [settled_ratio(clock, float(r)) for r in rates] == list(ratios)


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("hardware.gpu.clock.throttle_full=0.2", "hardware.gpu.clock.throttle_full"),
        ("hardware.gpu.clock.min_ratio=1.5", "hardware.gpu.clock.min_ratio"),
    ],
)
def test_a_clock_that_cannot_be_is_refused_by_key(override, key):
    with pytest.raises(ConfigError, match=key):
        compose("hardware=h200", override)


def _decode(cm: CostModel, n: int, ctx: int):
    pad = cm.graph_size(n)
    shape = StepShape(n, n, n * ctx, n, "decode")
    return cm.forward(shape, graph=True, carry_over=True, padded_requests=pad)


def test_heavy_decode_runs_at_the_settled_clock_and_light_decode_at_boost():
    on = CostModel(compose("model=llama3_8b", "hardware=h200"))
    off = CostModel(compose("model=llama3_8b", "hardware=h200", "hardware.gpu.clock.min_ratio=1"))
    heavy, heavy_boost = _decode(on, 256, 256), _decode(off, 256, 256)
    # the profile's floor: the batch-256 8B decode measured at 0.89 of boost (h200_clock)
    assert heavy.clock_ratio == pytest.approx(0.89)
    assert heavy.clocked_us <= heavy.linear_us + heavy.lm_head_us
    assert heavy.throttle_us == pytest.approx(heavy.clocked_us * (1 / 0.89 - 1))
    assert heavy.total_us == pytest.approx(heavy_boost.total_us + heavy.throttle_us)
    assert 0.04 < heavy.throttle_us / heavy_boost.total_us < 0.09
    light = _decode(on, 32, 1024)
    assert light.clock_ratio == 1.0 and light.throttle_us == 0.0
    assert light.total_us == _decode(off, 32, 1024).total_us


def test_a_prompt_step_lags_from_the_clock_before_it():
    clock = GpuClock(min_ratio=0.89, throttle_from=0.3, throttle_full=0.48, tau_ms=100.0)
    clocked, step = 150e3, 190e3  # an 8B 8192-token prompt step's GEMMs, its time at boost
    settled = clocked * (1 / 0.89 - 1)
    first, after = lagged(clock, 0.89, clocked, step, before=1.0, idle_us=5e6)
    # from boost: part of the way down in one step, the clock left lower for the next
    assert 0.2 * settled < first < 0.8 * settled and 0.89 < after < 0.92
    second, _ = lagged(clock, 0.89, clocked, step, before=after, idle_us=0.0)
    assert first < second < settled
    # a long idle before it lets the clock recover: as from boost
    rested, _ = lagged(clock, 0.89, clocked, step, before=after, idle_us=5e6)
    assert rested == pytest.approx(first)
    # no time constant: at once
    assert lagged(GpuClock(min_ratio=0.89), 0.89, clocked, step, 1.0, 0.0)[0] == settled


def test_the_simulated_prompt_stream_slows_towards_the_settled_clock():
    def prompt_steps(*overrides):
        cfg = compose(
            "model=llama3_8b",
            "hardware=h200",
            "workload.batch_size=64",
            "workload.prompt_len=1024",
            "workload.gen_len=4",
            "engine=sync",
            "engine.mixed_graphs=off",  # eager prompt steps: the forward span is the kernels'
            *overrides,
        )
        sp = simulate(config=cfg).spans
        fwd = sp[(sp.name == S.FORWARD) & (sp.query_tokens == 8192)].sort_values("ts_ms")
        return fwd.dur_ms.to_numpy()

    on, boost = prompt_steps(), prompt_steps("hardware.gpu.clock.min_ratio=1")
    slower = on / boost - 1
    assert len(on) == 8 and np.all(slower > 0)
    # the first step from boost part of the way (tau 50 ms against a ~190 ms step), the next
    # ones down at the settled 0.89
    assert 0.4 * slower[1:].min() < slower[0] < 0.85 * slower[1:].min()
    assert slower[1:].max() < 0.14
