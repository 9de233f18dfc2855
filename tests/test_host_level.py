"""The host a prediction is for (hardware.host.level): a reading of the host's speed against the
one the profile's costs hold at scales every host cost, the validation predicts each recording
for the host it read at its start, and the profile commands write the reading they hold at."""

from __future__ import annotations

import dataclasses

import pytest
from conftest import REPO, make_config, recorded, run_cli
from sim_harness import make

from cbsim.api import compose
from cbsim.bands import host_times_scaled
from cbsim.calibration.calibrate import recorded_host_level
from cbsim.calibration.result import Calibration
from cbsim.config import ConfigError
from cbsim.config.hardware import HostLevel
from cbsim.metrics import compute_metrics
from cbsim.sim.engine import run
from cbsim.validation.host_level import at_recorded_hosts, host_level_choice

HELD_OUT = "h100/heldout"


def at_level(cfg, python_us: float, machine_python_us: float):
    hw = cfg.hardware
    level = HostLevel(python_us=python_us, machine_python_us=machine_python_us)
    host = dataclasses.replace(hw.host, level=level)
    return dataclasses.replace(cfg, hardware=dataclasses.replace(hw, host=host))


def host_ms(metrics: dict) -> float:
    """Host ms per step in the phases the host works in (not its waits)."""
    return sum(v for k, v in metrics["host_ms_per_step"].items() if k != "wait")


def test_a_host_read_twice_as_slow_is_every_host_cost_doubled():
    """Within float round-off of host_times_scaled(host, 2): the level is one factor on every
    host cost the simulator charges, its two speed levels included; the same reading as the
    profile's is the plain run."""
    hw = compose("hardware=h100_80gb_hbm3").hardware
    cfg = dataclasses.replace(
        make("llama3_1b", batch_size=8, prompt_len=64, gen_len=300), hardware=hw
    )
    doubled = dataclasses.replace(
        cfg, hardware=dataclasses.replace(hw, host=host_times_scaled(hw.host, 2))
    )
    for engine in ("sync", "async"):
        got = compute_metrics(run(at_level(cfg, 1500.0, 3000.0), engine))
        want = compute_metrics(run(doubled, engine))
        same = compute_metrics(run(at_level(cfg, 1500.0, 1500.0), engine))
        plain = compute_metrics(run(cfg, engine))
        for key in ("total_time_s", "gpu_idle_fraction"):
            assert got[key] == pytest.approx(want[key], rel=1e-9, abs=1e-12), (engine, key)
            assert same[key] == pytest.approx(plain[key], rel=1e-12, abs=1e-15), (engine, key)
        assert host_ms(got) == pytest.approx(2 * host_ms(plain), rel=0.02), engine
        assert got["total_time_s"] > plain["total_time_s"]


def test_either_reading_unknown_leaves_the_host_as_profiled():
    assert HostLevel().factor == 1.0
    assert HostLevel(python_us=1460.0).factor == 1.0
    assert HostLevel(python_us=1460.0, machine_python_us=2920.0).factor == pytest.approx(2.0)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"python_us": -1.0}, r"hardware\.host\.level\.python_us=-1\.0 is out of range"),
        ({"python_us": float("nan")}, r"hardware\.host\.level\.python_us=nan"),
        ({"machine_python_us": 2900.0}, r"machine_python_us is set but the profile has no"),
    ],
)
def test_a_bad_reading_names_its_key(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        HostLevel(**kwargs)


def test_the_level_is_set_from_the_command_line_and_refused_in_one_line():
    cfg = make_config(["hardware=h100_80gb_hbm3", "hardware.host.level.machine_python_us=2920"])
    assert cfg.hardware.host.level.factor == pytest.approx(2920 / cfg.hardware.host.level.python_us)
    bad = run_cli(["hardware.host.level.machine_python_us=2900"], cwd=REPO, timeout=120)
    assert bad.returncode != 0
    assert "hardware.host.level.machine_python_us is set but" in bad.stderr.strip().splitlines()[-1]
    assert "Traceback" not in bad.stderr


def test_the_one_commands_h100_profile_says_which_host_its_costs_hold_on():
    hw = compose("hardware=h100_80gb_hbm3").hardware
    assert 1400 < hw.host.level.python_us < 1500  # its fresh runs read 1453-1484 us
    assert hw.host.level.machine_python_us == 0.0
    assert hw.provenance["host.level.python_us"].startswith("measured: the median start-of-run")


def test_each_recording_is_predicted_for_the_host_it_read_and_one_process_shares_a_profile():
    hw = compose("hardware=h100_80gb_hbm3").hardware
    recs = [
        recorded(f"{HELD_OUT}/{rep}/8b_1x128+512/trace_{engine}.json.gz")
        for rep in ("r1", "r4")
        for engine in ("sync", "async")
    ]
    r1_sync, r1_async, r4_sync, r4_async = at_recorded_hosts(recs, hw)
    assert r1_sync is hw and r1_async is hw  # r1 predates the reading: the profile's host
    assert r4_sync is r4_async  # one process: one reading, one profile for both engines
    assert r4_sync.host.level.machine_python_us == recs[2].host_python_us == 2945.6
    assert r4_sync.host.level.factor == pytest.approx(2945.6 / hw.host.level.python_us)
    # a profile that does not know its own host, or a host named on the command line, stays
    unknown = dataclasses.replace(hw, host=dataclasses.replace(hw.host, level=HostLevel()))
    assert all(h is unknown for h in at_recorded_hosts(recs, unknown))
    named = dataclasses.replace(
        hw, host=dataclasses.replace(hw.host, level=HostLevel(1460.0, 2000.0))
    )
    assert all(h is named for h in at_recorded_hosts(recs, named))
    with pytest.raises(ConfigError, match="extra.host_level='probe'; allowed: recorded, profile"):
        host_level_choice("probe")


def test_a_slow_host_read_at_start_predicts_a_larger_async_speedup(tmp_path):
    """The sync engine waits out its host, the async one hides it: the r4 reading (x2 the
    profile's) raises the predicted speedup of a host-bound 1B workload over the profile's host."""
    from conftest import validate_recorded

    trace = f"{HELD_OUT}/r4/1b_128x128+384/trace_*.json.gz"
    got = {
        how: validate_recorded(
            tmp_path / how, trace, "extra.bands=false", f"extra.host_level={how}"
        )["speedups"][0]["predicted"]
        for how in ("recorded", "profile")
    }
    assert got["recorded"] > got["profile"] + 0.02


def test_calibrate_writes_the_median_reading_of_its_traces():
    base = compose("hardware=h100_80gb_hbm3").hardware
    with_reading = [
        recorded(f"{HELD_OUT}/{rep}/8b_1x128+512/trace_sync.json.gz") for rep in ("r2", "r3", "r4")
    ]
    cal = Calibration(dataclasses.replace(base, host=dataclasses.replace(base.host)))
    recorded_host_level(with_reading, cal, base.name)
    assert cal.hardware.host.level == HostLevel(python_us=1437.0)  # 1393.6, 1437.0, 2945.6
    assert cal.provenance["host.level.python_us"].startswith("measured: the median")
    # one trace without a reading: the fitted costs' host is not known by it
    cal = Calibration(dataclasses.replace(base, host=dataclasses.replace(base.host)))
    recorded_host_level(
        [*with_reading, recorded(f"{HELD_OUT}/r1/8b_1x128+512/trace_sync.json.gz")], cal, base.name
    )
    assert cal.hardware.host.level == HostLevel()
    assert cal.provenance["host.level.python_us"].startswith("from hardware=h100_80gb_hbm3")
