"""Anchored validation: each device call's reference workload measures that call's machine.

Across calls of one GPU machine the host's speed moves by a third and the GPU's by a few
percent (the H200's repeated reference runs), more than the targets allow, so
one profile's point prediction is its own calls' machine. A short reference workload run in
every call (the reference case, 1.5 s an engine) measures the call's
machine: its async run the GPU (the recorded over the simulated decode time: a factor on every
forward, ``hardware.gpu.spread.forward_scale``), then its sync run the host (the factor on every
host cost that puts the simulated sync total on the recorded one, with that forward). The call's
other runs are predicted with both factors and judged as held out (their workloads never seen);
the reference runs are the probe and are not judged. ``extra.holdout=anchored``,
``extra.anchor``: the reference's case name.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict

from cbsim.bands import host_times_scaled
from cbsim.calibration.recordings import Recorded, label
from cbsim.config.errors import ConfigError
from cbsim.config.schema import HardwareConfig
from cbsim.validation.measure import measure, simulate_like
from cbsim.validation.runs import RunResult, validate_run

DEFAULT_ANCHOR = "ref_8b_16x512+256"
# a host or GPU factor outside it is a broken probe, not a machine: separate processes on the
# H200 ran their host phases x2.2-x4.4 slower than h200_profiled's in-process probes (the
# reference runs of six recorded sessions), so a host a tenth or ten times the profile's is
# still a machine
FACTOR_RANGE = (0.1, 10.0)


HOST_MODELS = ("none", "factor", "wake")


@dataclasses.dataclass(frozen=True)
class CallMachine:
    """A call's machine against the profile's: a multiplier on every forward, and either one on
    every host cost (``host``) or microseconds more per host wake-up from a blocking wait
    (``wake_us``)."""

    forward: float
    host: float = 1.0
    wake_us: float = 0.0

    def profile(self, hw: HardwareConfig) -> HardwareConfig:
        spread = dataclasses.replace(
            hw.gpu.spread, forward_scale=hw.gpu.spread.forward_scale * self.forward
        )
        gpu = dataclasses.replace(hw.gpu, spread=spread)
        host = host_times_scaled(hw.host, self.host)
        host = dataclasses.replace(host, sync_wake_us=max(0.0, host.sync_wake_us + self.wake_us))
        return dataclasses.replace(hw, gpu=gpu, host=host)


def _in_range(x: float, what: str, name: str) -> float:
    lo, hi = FACTOR_RANGE
    if not lo <= x <= hi:
        raise ConfigError(
            f"extra.anchor: {name}'s {what} factor {x:.3g} is outside {lo}-{hi}; the reference "
            "run is not a probe of this machine (allowed: a complete reference run per call)"
        )
    return x


def measure_call(
    sync: Recorded, async_: Recorded, hw: HardwareConfig, host_model: str = "factor"
) -> CallMachine:
    """The call's machine from its reference runs (two simulations of each)."""
    real, sim = measure(async_.trace), measure(simulate_like(async_, hw))
    forward = _in_range(real["decode_time_s"] / sim["decode_time_s"], "forward", async_.name)
    if host_model == "none":
        return CallMachine(forward)
    real_total = measure(sync.trace)["total_time_s"]
    probe = {"factor": ("host", 1.0, 2.0), "wake": ("wake_us", 0.0, 100.0)}[host_model]
    key, a, b = probe
    at = [CallMachine(forward, **{key: x}) for x in (a, b)]
    one, two = (measure(simulate_like(sync, m.profile(hw)))["total_time_s"] for m in at)
    # the sync total is the forwards plus the host's exposed time: linear in either term
    slope = (two - one) / (b - a)
    value = a + (real_total - one) / slope if slope > 0 else a
    if host_model == "factor":
        return CallMachine(forward, host=_in_range(value, "host", sync.name))
    return CallMachine(forward, wake_us=value)


def anchored_results(
    recs: list[Recorded], hw: HardwareConfig, anchor: str, host_model: str = "factor"
) -> list[RunResult]:
    """Every run simulated with its call's machine; the anchor's runs marked in sample."""
    by_call: dict[str, list[Recorded]] = defaultdict(list)
    for r in recs:
        by_call[r.call].append(r)
    out = []
    for call, runs in by_call.items():
        probe = {r.engine: r for r in runs if anchor in r.name}
        if set(probe) != {"sync", "async"}:
            raise ConfigError(
                f"extra.holdout=anchored: call {call!r} has no sync and async run named "
                f"{anchor!r} (extra.anchor); allowed: calls that ran the reference workload"
            )
        machine = measure_call(probe["sync"], probe["async"], hw, host_model)
        called = machine.profile(hw)
        for r in runs:
            # a run the profile was fitted on stays in sample
            held = anchor not in r.name and label(r.path, r.root) not in hw.source
            result = validate_run(r, called, held, [probe["sync"].name, probe["async"].name])
            result.held_out_by = "anchored" if held else ""
            result.machine = machine
            out.append(result)
    return out
