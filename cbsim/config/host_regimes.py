"""The host's two speed levels over time (``hardware.host.regimes``), beside the host costs of
hardware.py (which re-exports it): the fitted host costs are the fast level."""

from __future__ import annotations

from dataclasses import dataclass

from cbsim.config.errors import check_positive, check_range


@dataclass
class HostRegimes:
    """The host's speed switching between two levels over time (a VM-level effect, invisible to
    the guest: an H200 recording): the fitted host costs are the fast level, and while the host
    is slow every host cost is ``slow_factor`` times longer (an eager launch's own, which a
    plain run charges at its own level, by the same ratio about that level: cbsim/sim/launch.py).
    The level is a two-state continuous-time Markov process with exponential dwell times of
    these means. A plain simulation runs the host at the expected factor; a band's draw
    (cbsim/bands.py) draws one realization (cbsim/sim/host_speed.py). Not frozen: Hydra
    overrides a frozen node not at all."""

    # every host cost times this while the host is slow (1 = one level)
    slow_factor: float = 1.0
    # mean seconds at the fast level before the host turns slow
    fast_dwell_s: float = 1.0
    # mean seconds at the slow level before it turns fast again (0 = never slow)
    slow_dwell_s: float = 0.0

    def __post_init__(self) -> None:
        check_range("hardware.host.regimes.slow_factor", self.slow_factor, 1.0, 100.0)
        check_positive("hardware.host.regimes.fast_dwell_s", self.fast_dwell_s)
        check_range("hardware.host.regimes.fast_dwell_s", self.fast_dwell_s, 0.0, 1e6)
        check_range("hardware.host.regimes.slow_dwell_s", self.slow_dwell_s, 0.0, 1e6)

    @property
    def switching(self) -> bool:
        """Whether there are two levels at all (a slow level that is slower and ever in force)."""
        return self.slow_factor > 1.0 and self.slow_dwell_s > 0.0

    @property
    def slow_share(self) -> float:
        """The stationary share of time at the slow level."""
        return self.slow_dwell_s / (self.fast_dwell_s + self.slow_dwell_s)

    @property
    def expected_factor(self) -> float:
        """The time-average host-cost factor: what a plain (point) simulation charges (exactly
        1 with one level)."""
        share = self.slow_share
        return self.slow_factor * share + (1.0 - share) if self.switching else 1.0
