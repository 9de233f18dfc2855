"""How an eager launch follows the host's reading (hardware.host.level.eager_exponent): the
simulator charges it, the profile command measures it where its fresh runs' readings spread."""

import dataclasses

import pytest

from cbsim.config.errors import ConfigError
from cbsim.config.hardware import HostLevel
from cbsim.profiling.eager_exponent import MIN_READING_SPREAD, fit_eager_exponent
from cbsim.sim.engine import run
from cbsim.sim.launch import LaunchHost
from tests.sim_harness import make


def at_level(cfg, exponent: float, ratio: float = 2.0):
    hw = cfg.hardware
    level = HostLevel(python_us=1500.0, machine_python_us=1500.0 * ratio, eager_exponent=exponent)
    return dataclasses.replace(
        cfg, hardware=dataclasses.replace(hw, host=dataclasses.replace(hw.host, level=level))
    )


def eager_launch_us(trace) -> float:
    sp = trace.spans
    return float(sp[(sp.lane == "host") & (sp.name == "launch")].dur.sum())


def test_an_eager_launch_follows_the_reading_to_its_exponent():
    """A host read twice as slow: the eager launch's own costs x1 at exponent 0, x2**0.5 at 0.5,
    x2 at 1; its copies and events x2 at every exponent."""
    hc = HostLevel(python_us=1500.0, machine_python_us=3000.0, eager_exponent=0.5)
    assert hc.eager_factor == pytest.approx(2**0.5)
    assert HostLevel(python_us=1500.0, eager_exponent=1.0).eager_factor == 1.0  # no reading
    cfg = make("llama3_1b", engine={"cuda_graphs": False}, batch_size=4, prompt_len=32, gen_len=40)
    host = cfg.hardware.host
    for exponent in (0.0, 0.5, 1.0):
        level = at_level(cfg, exponent).hardware.host.level
        got = LaunchHost.at(dataclasses.replace(host, level=level), 2.0)
        assert got.kernel == pytest.approx(2**exponent * host.kernel_launch_us)
        assert got.forward == pytest.approx(2**exponent * host.eager_forward_us)
        assert got.event == pytest.approx(2.0 * host.event_us)
    launches = [eager_launch_us(run(at_level(cfg, e), "sync")) for e in (0.0, 0.5, 1.0)]
    assert launches[0] < launches[1] < launches[2]


def test_a_plain_run_with_a_graph_does_not_move_with_the_exponent():
    cfg = make("llama3_1b", batch_size=4, prompt_len=32, gen_len=40)
    a, b = run(at_level(cfg, 0.0), "async"), run(at_level(cfg, 1.5), "async")
    decode = [
        t.spans[(t.spans.name == "launch") & (t.spans.kind == "decode")].dur.sum() for t in (a, b)
    ]
    assert decode[0] == pytest.approx(decode[1], rel=1e-12)


def test_a_bad_exponent_names_its_key():
    with pytest.raises(
        ConfigError, match=r"hardware\.host\.level\.eager_exponent=-0\.5 is out of range"
    ):
        HostLevel(eager_exponent=-0.5)
    with pytest.raises(ConfigError, match=r"eager_exponent=3\.0 is out of range; allowed: 0"):
        HostLevel(eager_exponent=3.0)


def test_the_exponent_is_the_slope_of_eager_over_reading_through_the_middle():
    readings = {f"r{i}": 1500.0 * k for i, k in enumerate((1.0, 1.2, 1.6, 2.0, 2.4))}
    eager = {r: 1.3 * (x / 1500.0) ** 0.6 for r, x in readings.items()}
    exponent, why = fit_eager_exponent(readings, eager, 1500.0)
    assert exponent == pytest.approx(0.6, abs=0.02) and why.startswith("measured: the eager")


@pytest.mark.parametrize(
    "readings, python_us, words",
    [
        ({f"r{i}": 1460.0 + i for i in range(6)}, 1460.0, "readings spread"),
        ({"r0": 1500.0, "r1": 3000.0}, 1500.0, "2 fresh runs with eager launches"),
        ({f"r{i}": 1500.0 * (1 + i) for i in range(6)}, 0.0, "no host reading"),
    ],
)
def test_readings_that_do_not_spread_measure_no_exponent(readings, python_us, words):
    eager = {r: 1.0 + 0.1 * i for i, r in enumerate(readings)}
    exponent, why = fit_eager_exponent(readings, eager, python_us)
    assert exponent is None and words in why
    assert MIN_READING_SPREAD > 0
