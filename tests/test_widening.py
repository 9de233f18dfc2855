"""The model's own error in a band (hardware.model_error, cbsim.widening): zero changes nothing,
a positive error widens each half in quadrature on the metric's scale (log of time, logit of
idle), and the error measured on held-out runs (split conformal) is the smallest that covers the
asked share of them in every metric at once."""

from __future__ import annotations

import dataclasses
import math

import pytest
from conftest import UNFITTED, make_config
from hypothesis import given
from hypothesis import strategies as st

from cbsim.api import compose
from cbsim.bands import format_bands, predict_bands
from cbsim.config import ConfigError
from cbsim.config.model_error import ModelError
from cbsim.widening import Z95, covering_error, needed_error, widen

SMALL = ["model=tiny", "workload.batch_size=4", "workload.prompt_len=32", "workload.gen_len=48"]


def test_no_error_leaves_the_band_as_drawn():
    assert widen("total_time_s", 10.0, 9.0, 11.5, ModelError()) == (9.0, 11.5)
    assert widen("gpu_idle_fraction", 0.05, 0.04, 0.06, ModelError(total_time=0.1)) == (0.04, 0.06)


def test_a_point_band_widens_to_the_error_alone():
    lo, hi = widen("total_time_s", 10.0, 10.0, 10.0, ModelError(total_time=0.02))
    assert lo == pytest.approx(10.0 * math.exp(-Z95 * 0.02))
    assert hi == pytest.approx(10.0 * math.exp(Z95 * 0.02))


def test_the_idle_band_is_narrow_in_points_near_zero_and_wide_at_large_idle():
    err = ModelError(gpu_idle=0.4)
    lo1, hi1 = widen("gpu_idle_fraction", 0.001, 0.001, 0.001, err)
    lo2, hi2 = widen("gpu_idle_fraction", 0.10, 0.10, 0.10, err)
    assert 0 < lo1 < 0.001 < hi1 < 0.003
    assert hi2 - lo2 > 50 * (hi1 - lo1)
    assert 0.0 < lo2 < hi2 < 1.0


@given(
    value=st.floats(0.01, 0.5),
    lo_gap=st.floats(0.0, 0.5),
    hi_gap=st.floats(0.0, 0.5),
    sigma=st.floats(0.01, 2.0),
)
def test_widening_only_grows_and_needed_error_is_exactly_enough(value, lo_gap, hi_gap, sigma):
    lo, hi = value * (1 - lo_gap), min(value * (1 + hi_gap), 0.99)
    wlo, whi = widen("gpu_idle_fraction", value, lo, hi, ModelError(gpu_idle=sigma))
    assert wlo < lo and whi > hi
    # a recording at the widened edge needs exactly this error, one inside the drawn band none
    for edge in (wlo, whi):
        assert needed_error("gpu_idle_fraction", edge, value, lo, hi) == pytest.approx(
            sigma, rel=1e-6
        )
    assert needed_error("gpu_idle_fraction", value, value, lo, hi) == 0.0


def test_needed_error_is_zero_inside_and_grows_outside():
    assert needed_error("total_time_s", 10.5, 10.0, 9.0, 11.0) == 0.0
    small = needed_error("total_time_s", 11.2, 10.0, 9.0, 11.0)
    large = needed_error("total_time_s", 13.0, 10.0, 9.0, 11.0)
    assert 0 < small < large


def test_the_covering_error_holds_the_share_of_runs_jointly():
    needed = [{"total_time_s": 0.01 * i, "gpu_idle_fraction": 0.1 * (19 - i)} for i in range(20)]
    cut = covering_error(needed, 0.9)
    inside = [
        n["total_time_s"] <= cut["total_time"] and n["gpu_idle_fraction"] <= cut["gpu_idle"]
        for n in needed
    ]
    assert sum(inside) >= 18
    assert covering_error([], 0.9) is None
    # nothing needed: nothing added
    assert covering_error([{"speedup": 0.0}] * 5, 0.9) == {"speedup": 0.0}


def test_predict_bands_carries_and_applies_the_model_error():
    cfg = make_config([*UNFITTED, *SMALL])  # no model error of its own
    plain = predict_bands(cfg)
    err = ModelError(total_time=0.05, gpu_idle=0.5, speedup=0.02)
    wide = predict_bands(
        dataclasses.replace(cfg, hardware=dataclasses.replace(cfg.hardware, model_error=err))
    )
    assert "model_error" not in plain and wide["model_error"]["gpu_idle"] == 0.5
    for engine in ("sync", "async"):
        for metric in ("total_time_s", "gpu_idle_fraction"):
            p, w = plain[engine][metric], wide[engine][metric]
            assert w["median"] == p["median"]
            assert w["p5"] < p["p5"] or p["p5"] == 0 and w["p5"] <= p["p5"]
            assert w["p95"] > p["p95"]
    assert wide["speedup"]["p95"] > plain["speedup"]["p95"]
    assert "widened by the model's error on held-out runs" in format_bands(wide)


def test_a_bad_model_error_names_the_key():
    with pytest.raises(ConfigError, match=r"hardware\.model_error\.gpu_idle=-0\.1.*0\.0 to 5\.0"):
        compose(*SMALL, "hardware.model_error.gpu_idle=-0.1")
    with pytest.raises(ConfigError, match="hardware.model_error.idle is not a key"):
        compose(*SMALL, "hardware.model_error.idle=0.1")
