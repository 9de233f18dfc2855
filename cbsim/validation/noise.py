"""The held-out means' own error, and whether the misses are larger than it.

A workload's truth is the mean of its repeats, and that mean carries the repeats' noise over the
square root of their count. Where one workload moves by 19 points between calls (an eager 1B) a
predictor of every workload's true mean still scores an RMSE of a few points against nine
repeats' means; where the misses share a sign and each is several times its mean's error, the
model is wrong, not the noise. Both are said beside the RMSE so a reader can tell the two apart.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def chi2_sf(x: float, dof: int) -> float:
    """P(chi-square with ``dof`` degrees of freedom >= x): the regularized upper incomplete
    gamma Q(dof/2, x/2), by its recurrence from Q(1/2) = erfc(sqrt(y)) or Q(1) = exp(-y)."""
    if dof < 1:
        raise ValueError(f"dof must be >= 1, got {dof}")
    y = max(0.0, x) / 2.0
    a, q = (0.5, math.erfc(math.sqrt(y))) if dof % 2 else (1.0, math.exp(-y))
    while a < dof / 2.0:
        # Q(a + 1, y) = Q(a, y) + y^a e^-y / Gamma(a + 1)
        if y > 0:
            q += math.exp(a * math.log(y) - y - math.lgamma(a + 1.0))
        a += 1.0
    return min(1.0, max(0.0, q))


def mean_error(std: float | None, n: int) -> float | None:
    """The standard error of a mean of ``n`` repeats with sample std ``std`` (None under 2)."""
    return std / math.sqrt(n) if std is not None and n > 1 else None


def means_noise(errors_points: list[float | None], stds: list[float | None], ns: list[int]):
    """Per workload the miss over its mean's own error (z), and over the workloads: the RMSE a
    predictor of every true mean would expect against these means (points), and the chi-square
    of the z's with its p-value (small: the misses are larger than the means' noise)."""
    sem = [mean_error(s, n) for s, n in zip(stds, ns)]
    z = [e / (100.0 * s) if e is not None and s else None for e, s in zip(errors_points, sem)]
    got_sem = [s for s in sem if s is not None]
    got_z = [v for v in z if v is not None]
    out: dict[str, Any] = {
        "rmse_points": 100.0 * float(np.sqrt(np.mean(np.square(got_sem)))) if got_sem else None,
        "z": z,
        "chi2": None,
        "dof": len(got_z),
        "p": None,
    }
    if got_z:
        chi2 = float(np.sum(np.square(got_z)))
        out.update(chi2=chi2, p=chi2_sf(chi2, len(got_z)))
    return out
