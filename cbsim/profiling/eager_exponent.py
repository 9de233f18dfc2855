"""How an eager launch follows the host's reading, from fresh runs (``hardware.host.level.
eager_exponent``).

Every host cost but an eager launch's own scales by a run's host reading over the profile's.
The eager launch (torch's dispatch of every kernel from Python) follows it only in part: fresh
processes of three H100 machines, reading x1.03-x2.43 the profile's host, launched eagerly that
ratio to the 0.30-0.95 (docs/validation.md). Each fresh run with eager launches gives one point,
the log of its eager launch factor against the log of its reading; the exponent is the
least-squares slope of those points (the level is the profile's eager factor, measured apart).
One machine's processes often read within a few percent of each other: then the slope is
noise, and the exponent is not measured.
"""

from __future__ import annotations

import math
import statistics

from cbsim.config.host_level import MAX_EAGER_EXPONENT

# fewer runs than this with eager launches and a reading measure no exponent
MIN_RUNS = 4
# readings whose logs spread less than this (standard deviation; 0.1: about 10%) cannot tell
# an exponent from the eager launches' own noise (about 0.2 in log between processes)
MIN_READING_SPREAD = 0.1


def fit_eager_exponent(
    readings: dict[str, float], eager: dict[str, float], python_us: float
) -> tuple[float | None, str]:
    """The exponent and what it rests on, or None and why not: ``readings`` and ``eager`` by
    run (a run's host reading at start, its eager launch factor), ``python_us`` the reading the
    profile's costs hold at."""
    runs = [r for r in eager if readings.get(r)]
    if python_us <= 0:
        return None, "the fresh runs carry no host reading"
    if len(runs) < MIN_RUNS:
        return (
            None,
            f"{len(runs)} fresh runs with eager launches and a reading (it takes {MIN_RUNS})",
        )
    xs = [math.log(readings[r] / python_us) for r in runs]
    spread = statistics.pstdev(xs)
    if spread < MIN_READING_SPREAD:
        return None, (
            f"the {len(runs)} fresh runs' readings spread {spread:.3f} in log (it takes "
            f"{MIN_READING_SPREAD}: runs of more machines, extra.fresh_from)"
        )
    ys = [math.log(eager[r]) for r in runs]
    slope = statistics.linear_regression(xs, ys).slope
    exponent = min(max(slope, 0.0), MAX_EAGER_EXPONENT)
    y0 = statistics.fmean(ys) - exponent * statistics.fmean(xs)
    rms = math.sqrt(statistics.fmean((y - y0 - exponent * x) ** 2 for x, y in zip(xs, ys)))
    return round(exponent, 3), (
        f"measured: the eager launch factors of {len(runs)} fresh runs against their readings "
        f"(spread {spread:.3f} in log), the least-squares slope of their logs "
        f"(slope {slope:.3f}, rms {rms:.3f})"
    )
