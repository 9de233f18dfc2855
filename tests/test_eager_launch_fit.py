"""The eager launch's host costs as the profile fits them: a cost per counted kernel and, over
eager forwards of two model shapes, the forward's own Python (eager_forward_us); and the host's
speed levels read only where the phase model describes the code that ran (graphed decode)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import REPO, make_config

from cbsim.calibration.host import fit_eager_launch
from cbsim.calibration.recordings import load
from cbsim.calibration.regimes import decode_steps
from cbsim.calibration.result import Calibration

PROBES = REPO / "cbsim" / "profiles" / "h100_80gb_hbm3" / "probes"


def calibration() -> Calibration:
    return Calibration(make_config(["hardware=h100_80gb_hbm3"]).hardware, traces=[])


def test_two_model_shapes_tell_the_forwards_python_from_the_cost_per_kernel():
    rng = np.random.default_rng(0)
    kernels = np.repeat([229.0, 565.0], 50)
    body = (4000.0 + 20.0 * kernels) * rng.normal(1.0, 0.02, kernels.size)
    cal = calibration()
    fit_eager_launch(cal, body, kernels, ["1b"] * 50 + ["8b"] * 50)
    host = cal.hardware.host
    assert host.eager_forward_us == pytest.approx(4000.0, rel=0.1)
    assert host.kernel_launch_us == pytest.approx(20.0, rel=0.05)


def test_one_model_shape_keeps_the_forwards_python_and_says_so():
    cal = calibration()
    kept = cal.hardware.host.eager_forward_us
    kernels = np.full(40, 565.0)
    fit_eager_launch(cal, kept + 30.0 * kernels, kernels, ["8b"] * 40)
    assert cal.hardware.host.eager_forward_us == kept
    assert cal.hardware.host.kernel_launch_us == pytest.approx(30.0)
    assert any(n.startswith("eager_forward_us kept") for n in cal.notes)


def test_host_speed_levels_are_read_from_graphed_decode_steps_only():
    eager, graphed = (
        load([PROBES / name / "trace_sync.json.gz"], PROBES)[0]
        for name in ("eager_b32", "decode_b32")
    )
    assert not decode_steps(eager)  # an eager run's phases are its code path's, not a level
    assert len(decode_steps(graphed)) > 100
