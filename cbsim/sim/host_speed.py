"""The host's speed over simulated time: the factor every host cost is charged at (an eager
launch's own, its kernels and its forward's Python, at its own level times this factor over the
run's mean one: launch.py).

The GPU machine's host switches between a fast and a slow level (hardware.host.regimes: a
VM-level effect, an H200 recording). A plain simulation charges every host
phase at the expected factor, a constant: the point prediction. A band's draw
(hardware.host.spread.jitter, seeded by hardware.host.spread.seed) runs one realization of the
two-state continuous-time Markov process instead: exponential dwell times of the two means,
starting from the stationary distribution (the level at t = 0 is slow with the slow share; by
memorylessness the first dwell is a full one; a band's draws stratified over that level). A
host phase pays the factor in force when it starts, times the host's level (hardware.host.level:
the host predicted for over the profile's). Times are the simulator's, microseconds.
"""

from __future__ import annotations

import math
from bisect import bisect_right

import numpy as np

from cbsim.config.hardware import HostCosts, HostRegimes

# mixed into the draw's seed: the realization is independent of the step jitter's stream
SEED_SALT = 0x5EED_4057
# a gap with no host phase longer than this many mean cycles (a fast and a slow stay) is not
# walked stay by stay: the level after it is drawn afresh from the stationary distribution
# (its memory of the level before fades as exp(-gap / mixing time), here below e^-64)
GAP_CYCLES = 64


class HostSpeed:
    """The host-cost factor at each simulated time: constant, or one seeded realization."""

    def __init__(
        self,
        regimes: HostRegimes,
        realize: bool = False,
        seed: int = 0,
        quantile: float = -1.0,
        level: float = 1.0,
    ) -> None:
        """``quantile`` in [0, 1): where the level at t = 0 falls (slow below the slow share;
        a band stratifies its draws over it); -1: drawn from the seed. ``level``: the host
        predicted for over the profile's (hardware.host.level), on every factor."""
        self.constant = not (realize and regimes.switching)
        self.level = level
        self.factor = regimes.expected_factor * level  # a plain run's, for every phase
        if self.constant:
            return
        self._slow_factor = regimes.slow_factor * level
        self._dwell_us = (regimes.fast_dwell_s * 1e6, regimes.slow_dwell_s * 1e6)
        self._rng = np.random.default_rng((seed, SEED_SALT))
        u = self._rng.random()
        self._slow0 = bool((quantile if quantile >= 0 else u) < regimes.slow_share)
        self._ends: list[float] = []  # the end of each level's stay, in order; levels alternate
        self._extend(0.0)

    @classmethod
    def of(cls, host: HostCosts) -> HostSpeed:
        """A run's host speed: a band's draw realizes the regimes, a plain run takes the mean."""
        sp = host.spread
        return cls(
            host.regimes,
            realize=sp.jitter,
            seed=sp.seed,
            quantile=sp.level_quantile,
            level=host.level.factor,
        )

    def _extend(self, t_us: float) -> None:
        """Draw stays until one ends after ``t_us``; past a long idle gap, one or two stays:
        the level at ``t_us`` drawn from the stationary distribution, held for a fresh dwell
        (memoryless), so a run of sparse arrivals draws as many stays as it has busy time."""
        ends = self._ends
        if ends and t_us - ends[-1] > GAP_CYCLES * sum(self._dwell_us):
            self._jump(t_us)
            return
        while not ends or ends[-1] <= t_us:
            slow = self._slow0 ^ (len(ends) % 2 == 1)
            start = ends[-1] if ends else 0.0
            ends.append(start + self._rng.exponential(self._dwell_us[slow]))

    def _jump(self, t_us: float) -> None:
        """The stay after the last one drawn lasts until ``t_us`` (or past it, when its level
        is the one drawn for ``t_us``); the level drawn holds for a fresh dwell from there."""
        ends = self._ends
        slow_next = self._slow0 ^ (len(ends) % 2 == 1)
        share = self._dwell_us[1] / sum(self._dwell_us)
        slow = bool(self._rng.random() < share)
        if slow != slow_next:
            ends.append(t_us)  # the stay of the other level ends where the drawn one starts
        ends.append(t_us + self._rng.exponential(self._dwell_us[slow]))

    def _stay(self, t_us: float) -> int:
        """The index of the stay in force at ``t_us`` (a switch at t belongs to the new one)."""
        if self._ends[-1] <= t_us:
            self._extend(t_us)
        return bisect_right(self._ends, t_us)

    def factor_at(self, t_us: float) -> float:
        """The factor a host phase starting at ``t_us`` pays."""
        if self.constant:
            return self.factor
        slow = self._slow0 ^ (self._stay(t_us) % 2 == 1)
        return self._slow_factor if slow else self.level

    def next_switch(self, t_us: float) -> float:
        """When the level in force at ``t_us`` ends (inf: it never does)."""
        if self.constant:
            return math.inf
        return self._ends[self._stay(t_us)]
