"""holdout=anchored: each call's reference runs move the profile to that call's machine (the
forward and the host), its other runs are judged held out, and a call without the reference is
refused naming the key."""

from __future__ import annotations

import dataclasses

import pytest
from conftest import make_config, validate_recorded

from cbsim.config import ConfigError
from cbsim.validation.anchor import CallMachine

HELD_OUT = "h200/heldout_padded"


def test_a_call_machine_moves_every_forward_and_every_host_cost():
    hw = make_config(["hardware=h200"]).hardware
    moved = CallMachine(forward=1.05, host=2.0, wake_us=10.0).profile(hw)
    assert moved.gpu.spread.forward_scale == pytest.approx(1.05 * hw.gpu.spread.forward_scale)
    assert moved.host.schedule.fixed_us == pytest.approx(2.0 * hw.host.schedule.fixed_us)
    assert moved.host.graph_launch_us == pytest.approx(2.0 * hw.host.graph_launch_us)
    assert moved.host.sync_wake_us == pytest.approx(2.0 * hw.host.sync_wake_us + 10.0)
    assert dataclasses.replace(moved, gpu=hw.gpu, host=hw.host) == hw  # nothing else


def test_the_reference_runs_move_the_profile_to_the_calls_machine(tmp_path):
    """On a held-out set: the reference pair is the probe (its own speedup lands on the recorded
    one), every other run is judged held out, and the machine factors are a plausible move of
    the H200 profile (the forward within 8%, the host slower or faster by less than 2.6x)."""
    args = ("hardware=h200", "extra.bands=false")
    out = validate_recorded(tmp_path / "a", f"{HELD_OUT}/**/trace_*.json.gz",
                            "extra.holdout=anchored", *args)  # fmt: skip
    held = [s for s in out["speedups"] if s["held_out"]]
    probe = [s for s in out["speedups"] if not s["held_out"]]
    assert len(held) == 7 and len(probe) == 1  # the reference is the probe, not judged
    assert abs(probe[0]["error_points"]) < 0.5, probe
    machine = next(r["call_machine"] for r in out["runs"])
    assert 0.95 < machine["forward"] < 1.08 and 1 / 2.6 < machine["host"] < 2.6, machine


def test_a_call_without_its_reference_is_refused_naming_the_key(tmp_path):
    with pytest.raises(ConfigError, match=r"no sync and async run named 'ref_8b_16x512\+256' "
                       r"\(extra.anchor\)"):  # fmt: skip
        validate_recorded(tmp_path, f"{HELD_OUT}/8b_poisson_48/trace_*.json.gz",
                          "extra.holdout=anchored", "hardware=h200")  # fmt: skip
    with pytest.raises(ConfigError, match=r"extra.anchor_host='spin'; allowed: none, factor, wake"):
        validate_recorded(tmp_path, f"{HELD_OUT}/**/trace_*.json.gz",
                          "extra.holdout=anchored", "extra.anchor_host=spin")  # fmt: skip
