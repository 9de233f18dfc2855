"""Step-to-step host speed: a seeded stream of mean-one factors for the host phases.

A band's simulation (cbsim/bands.py) sets ``hardware.host.spread.jitter``; each schedule,
prepare and update then costs its mean times the next factor, exp(sigma Z - sigma^2 / 2) with Z
standard normal, so the run's mean host time stays the fitted one while single steps vary as
``hardware.host.spread.within_run`` says. Drawn in blocks: one numpy call per 4096 phases.
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

    def __call__(self) -> float:
        if self._next >= len(self._block):
            z = self._rng.standard_normal(BLOCK)
            self._block = np.exp(self.sigma * z - 0.5 * self.sigma**2).tolist()
            self._next = 0
        self._next += 1
        return self._block[self._next - 1]
