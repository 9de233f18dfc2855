"""The host's speed as one reading (``hardware.host.level``), beside the host costs of
hardware.py (which re-exports it): which host the costs hold on, and which host a prediction is
for.

Separate processes of one GPU machine run their host phases at levels up to 3x apart, and the
runtime reads its host at start (``host_python_us`` in every trace's hardware: cbsim/host.py's
fixed scheduler-like Python, in microseconds). A profile records the reading its host costs
hold at; a prediction for another host sets that host's reading, and every host cost but an
eager launch's own scales by the ratio (the simulator's host speed, cbsim/sim/host_speed.py).
An eager launch's own costs follow the ratio to a power of their own (cbsim/sim/launch.py):
other machines' processes that read a host 1-2.4x slower launched eagerly about that ratio to
the 0.3-0.95 (docs/validation.md), so the profile measures the power where its fresh runs'
readings spread, and keeps 0 (the profile's eager level whatever the reading) where they don't.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from cbsim.config.errors import ConfigError

# an eager launch slower than the square of the host's reading is not a host effect
MAX_EAGER_EXPONENT = 2.0


@dataclass
class HostLevel:
    """Two readings of ``cbsim.host.python_speed_us`` (microseconds; lower is faster). Not
    frozen: Hydra overrides a frozen node not at all."""

    # the reading at which the host costs hold: +experiment=profile_machine writes its fresh
    # runs' median, +experiment=calibrate its traces' median. 0 = not measured
    python_us: float = 0.0
    # the host the prediction is for, by the same reading (a runtime trace's
    # otherData.hardware.host_python_us, or `python -c "from cbsim.host import
    # python_speed_us; print(python_speed_us())"` on that host): every host cost but an eager
    # launch's own times machine_python_us / python_us. 0 = the profile's own host
    machine_python_us: float = 0.0
    # how an eager launch's own costs (kernel_launch_us, eager_forward_us) follow the reading:
    # times factor ** eager_exponent (0: at the profile's eager level whatever the reading; 1: as
    # every other host cost); +experiment=profile_machine measures it from fresh runs whose
    # readings spread (cbsim/profiling/eager_exponent.py)
    eager_exponent: float = 0.0

    def __post_init__(self) -> None:
        for key in ("python_us", "machine_python_us"):
            value = getattr(self, key)
            if not (math.isfinite(value) and 0.0 <= value <= 1e7):
                raise ConfigError(
                    f"hardware.host.level.{key}={value} is out of range; allowed: 0 (unknown) "
                    "or a reading in microseconds up to 1e7"
                )
        e = self.eager_exponent
        if not (math.isfinite(e) and 0.0 <= e <= MAX_EAGER_EXPONENT):
            raise ConfigError(
                f"hardware.host.level.eager_exponent={e} is out of range; allowed: 0 (the "
                f"profile's eager level at any reading) to {MAX_EAGER_EXPONENT}"
            )
        if self.machine_python_us > 0 and self.python_us <= 0:
            raise ConfigError(
                "hardware.host.level.machine_python_us is set but the profile has no reading "
                "of its own host (hardware.host.level.python_us=0); allowed: a profile made by "
                "+experiment=profile_machine, or set both"
            )

    @property
    def factor(self) -> float:
        """Every host cost's multiplier: the machine's reading over the profile's (1 when
        either is unknown)."""
        if self.python_us > 0 and self.machine_python_us > 0:
            return self.machine_python_us / self.python_us
        return 1.0

    @property
    def eager_factor(self) -> float:
        """An eager launch's own costs' multiplier: the factor to ``eager_exponent``."""
        return self.factor**self.eager_exponent
