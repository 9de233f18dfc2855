"""Step-to-step host speed: a seeded stream of mean-one factors for the host phases.

A band's simulation (cbsim/bands.py) sets ``hardware.host.spread.jitter``; each schedule draws
the host's speed until the next one, exp(sigma Z - sigma^2 / 2) with Z standard normal, and that
schedule, the prepare and the update after it cost their mean times it: the run's mean host time
stays the fitted one while steps vary as ``hardware.host.spread.within_run`` says (measured per
step, the phases of a slow step being slow together). Drawn in blocks: one numpy call per 4096.
"""

from __future__ import annotations

import numpy as np

BLOCK = 4096


class HostJitter:
    def __init__(self, sigma: float, seed: int) -> None:
        self.sigma = float(sigma)
        self._rng = np.random.default_rng(seed)
        self._block: list[float] = []
        self._next = 0
        self.factor = 1.0  # the current step's

    def step(self) -> float:
        """A new step's factor (the schedule's), kept for the phases after it."""
        if self._next >= len(self._block):
            z = self._rng.standard_normal(BLOCK)
            self._block = np.exp(self.sigma * z - 0.5 * self.sigma**2).tolist()
            self._next = 0
        self._next += 1
        self.factor = self._block[self._next - 1]
        return self.factor
