"""The simulator's own error added to a band (``hardware.model_error``), and the error that
would have held a set of held-out runs inside theirs.

A band's draws (cbsim/bands.py) vary what the profile says varies: host speed, the host's
levels, step jitter, the forward model's error. What the model itself gets wrong on runs no fit
has seen is a further error; each half of a P5-P95 interval grows by it in quadrature, on the
metric's own scale: log of time and speedup, logit of the GPU idle fraction (log of idle over
busy time, so a near-zero idle gets a narrow band in points and a large idle a wide one).
Measuring it is split conformal prediction: on held-out runs, the smallest error with which a
share of them (0.9) lies inside its widened band; a profile carries values measured on other
runs than those it is judged on.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import NormalDist

import numpy as np

from cbsim.config.model_error import ModelError

# a P95 (and a P5) of a normal error: 1.645 standard deviations from the median
Z95 = NormalDist().inv_cdf(0.95)
# idle fractions are kept inside (EPS, 1 - EPS) on the logit scale (a GPU-bound run idles 0)
EPS = 1e-5
# a band's metric -> the hardware.model_error key that widens it
ERROR_OF = {
    "total_time_s": "total_time",
    "gpu_idle_fraction": "gpu_idle",
    "speedup": "speedup",
}


def to_scale(metric: str, value: float) -> float:
    if metric == "gpu_idle_fraction":
        p = min(max(value, EPS), 1.0 - EPS)
        return math.log(p / (1.0 - p))
    return math.log(max(value, 1e-12))


def from_scale(metric: str, x: float) -> float:
    if metric == "gpu_idle_fraction":
        return 1.0 / (1.0 + math.exp(-x))
    return math.exp(x)


def widen(
    metric: str, value: float, lo: float, hi: float, error: ModelError
) -> tuple[float, float]:
    """(lo, hi) around ``value`` with each half grown in quadrature by the model's error for
    ``metric`` (unchanged when that error is 0 or the metric has none)."""
    sigma = getattr(error, ERROR_OF[metric]) if metric in ERROR_OF else 0.0
    if sigma <= 0:
        return lo, hi
    c = to_scale(metric, value)
    extra = (Z95 * sigma) ** 2
    down = math.sqrt(max(c - to_scale(metric, lo), 0.0) ** 2 + extra)
    up = math.sqrt(max(to_scale(metric, hi) - c, 0.0) ** 2 + extra)
    return from_scale(metric, c - down), from_scale(metric, c + up)


def needed_error(metric: str, recorded: float, value: float, lo: float, hi: float) -> float:
    """The smallest model error with which ``recorded`` lies inside the band (lo, hi) of
    ``value`` once widened: 0 when it already does."""
    c, r = to_scale(metric, value), to_scale(metric, recorded)
    half = max(to_scale(metric, hi) - c, 0.0) if r > c else max(c - to_scale(metric, lo), 0.0)
    miss = abs(r - c)
    return 0.0 if miss <= half else math.sqrt(miss**2 - half**2) / Z95


def run_needed(
    real: dict[str, float | None], sim: dict[str, float], draw_band: dict[str, Sequence[float]]
) -> dict[str, float]:
    """Per banded metric of one run, ``needed_error`` of its recorded value against the
    draws' own band (the metrics the recording has)."""
    return {
        m: needed_error(m, real[m], sim[m], *band)
        for m, band in draw_band.items()
        if real.get(m) is not None
    }


def covering_error(
    needed: Sequence[dict[str, float]], share: float = 0.9
) -> dict[str, float] | None:
    """Per metric, the error that holds ``share`` of the runs inside their bands in every metric
    at once: each metric's needed errors taken at one common quantile, the lowest that covers
    ``share`` of the runs jointly. ``needed``: per run, metric -> needed_error. None without runs."""
    if not needed:
        return None
    metrics = sorted({m for n in needed for m in n})
    table = np.array([[n.get(m, 0.0) for m in metrics] for n in needed])
    for q in np.linspace(share, 1.0, 101):
        cut = np.quantile(table, q, axis=0, method="higher")
        if np.mean(np.all(table <= cut + 1e-12, axis=1)) >= share:
            return {ERROR_OF[m]: float(c) for m, c in zip(metrics, cut)}
    return {ERROR_OF[m]: float(c) for m, c in zip(metrics, table.max(axis=0))}
