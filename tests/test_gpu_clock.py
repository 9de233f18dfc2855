"""The SM clock under sustained decode load (hardware.gpu.clock, cbsim/costs/clock.py): a decode
step heavy in GEMMs stretches its GEMMs' compute-bound time over the settled clock ratio; a
light decode step and a step with prompt tokens run at the tables' boost clock."""

from __future__ import annotations

import numpy as np
import pytest

from cbsim.api import compose
from cbsim.calibration.steps import StepShape
from cbsim.config.errors import ConfigError
from cbsim.config.hardware import GpuClock
from cbsim.costs import CostModel
from cbsim.costs.clock import settled_ratio


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
        compose("hardware=h200_kernels_calibrated", override)


def _decode(cm: CostModel, n: int, ctx: int):
    pad = cm.graph_size(n)
    shape = StepShape(n, n, n * ctx, n, "decode")
    return cm.forward(shape, graph=True, carry_over=True, padded_requests=pad)


def test_heavy_decode_runs_at_the_settled_clock_and_light_decode_at_boost():
    on = CostModel(compose("model=llama3_8b", "hardware=h200_kernels_calibrated"))
    off = CostModel(
        compose(
            "model=llama3_8b", "hardware=h200_kernels_calibrated", "hardware.gpu.clock.min_ratio=1"
        )
    )
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


def test_a_step_with_prompt_tokens_stays_at_the_tables_clock():
    cm = CostModel(compose("model=llama3_8b", "hardware=h200_kernels_calibrated"))
    prefill = cm.forward(StepShape(16, 8192, 8192, 16, "prefill"), graph=False, carry_over=False)
    assert prefill.clock_ratio == 1.0 and prefill.throttle_us == 0.0
