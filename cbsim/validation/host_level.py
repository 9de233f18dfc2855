"""Each recording predicted for the host it ran on (``extra.host_level=recorded``).

Separate processes of one GPU machine run their host phases at levels up to 3x apart, and
machines differ more (the H100's held-out set: a process's host phases at x0.8-x3.8 of the
profile's level over three machines). The runtime reads its host at start (``host_python_us``,
cbsim/host.py) before any workload runs, so a user has the same reading before asking: each
recording is predicted with ``hardware.host.level.machine_python_us`` set to its own reading,
against the reading the profile's costs hold at (``hardware.host.level.python_us``). Nothing
of the recording's outcome enters.
"""

from __future__ import annotations

import dataclasses

from cbsim.calibration.recordings import Recorded
from cbsim.config.errors import ConfigError
from cbsim.config.schema import HardwareConfig

HOST_LEVELS = ("recorded", "profile")


def host_level_choice(value: object) -> str:
    """extra.host_level, checked."""
    if value not in HOST_LEVELS:
        raise ConfigError(f"extra.host_level={value!r}; allowed: {', '.join(HOST_LEVELS)}")
    return str(value)


def at_recorded_hosts(recs: list[Recorded], hw: HardwareConfig) -> list[HardwareConfig]:
    """Per recording, ``hw`` predicting for the host the recording read at its start; one
    profile per reading, so both engines of one process share it (a band's speedup is drawn
    from one profile). ``hw`` as it is where the profile or the trace has no reading, or where
    the command line names the host already (machine_python_us set)."""
    level = hw.host.level
    if level.python_us <= 0 or level.machine_python_us > 0:
        return [hw] * len(recs)
    by_reading: dict[float, HardwareConfig] = {}
    out = []
    for rec in recs:
        reading = rec.host_python_us
        if reading is None:
            out.append(hw)
            continue
        if reading not in by_reading:
            moved = dataclasses.replace(level, machine_python_us=reading)
            by_reading[reading] = dataclasses.replace(
                hw, host=dataclasses.replace(hw.host, level=moved)
            )
        out.append(by_reading[reading])
    return out


def host_level_line(hosts: list[HardwareConfig], base: HardwareConfig) -> str | None:
    """What the validation did with the hosts, in one line (None when every run kept the
    profile's host)."""
    factors = [h.host.level.factor for h in hosts if h is not base]
    if not factors:
        return None
    return (
        f"host level: {len(factors)} of {len(hosts)} runs predicted for the host they read at "
        f"start (x{min(factors):.2f}-x{max(factors):.2f} the profile's "
        f"{base.host.level.python_us:g} us; extra.host_level=profile keeps the profile's)"
    )
