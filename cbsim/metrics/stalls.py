"""Host stalls: a host phase far longer than that phase usually takes (a garbage collection, a
page fault, the OS taking the core) leaves the GPU waiting, in the simulator and the runtime.

A stall is a host span (not ``wait``: that is the host blocked on the GPU) longer than
``STALL_FACTOR`` times the median of its phase in batches of its kind (a prefill's prepare is
not compared with a decode's) and at least ``STALL_MIN_US`` longer than that median.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pandas as pd

from cbsim.metrics.inputs import MetricInputs
from cbsim.trace import schema as S

STALL_FACTOR = 10.0
# below this excess a long phase is not worth a user's attention (us)
STALL_MIN_US = 1000.0


def is_stall(
    dur: np.ndarray, median: np.ndarray | float, factor: float, min_us: float
) -> np.ndarray:
    """Which durations are stalls against their phase's median."""
    return (dur > factor * median) & (dur - median >= min_us)


def stall_spans(
    spans: pd.DataFrame, factor: float = STALL_FACTOR, min_us: float = STALL_MIN_US
) -> pd.DataFrame:
    """The host spans that are stalls, with their phase median (column ``median_us``)."""
    host = spans[(spans.lane == S.HOST) & (spans.name != S.WAIT)]
    if host.empty:
        return host.assign(median_us=pd.Series(dtype=float))
    median = host.groupby(["name", "kind"])["dur"].transform("median")
    long = is_stall(host["dur"], median, factor, min_us)
    return host[long].assign(median_us=median[long])


def stall_metrics(inp: MetricInputs) -> dict[str, Any]:
    """``host_stalls`` (count), ``host_stall_ms`` (their total time) and by phase, from the
    folded durations of each phase (cbsim.trace.fold.TraceFold.host_work_us)."""
    count, stall_us, by_phase = 0, 0.0, Counter()
    for (name, _), dur in sorted(inp.fold.host_work_us().items()):
        long = dur[is_stall(dur, float(np.median(dur)), STALL_FACTOR, STALL_MIN_US)]
        count += len(long)
        stall_us += float(long.sum())
        if len(long):
            by_phase[name] += len(long)
    return {
        "host_stalls": count,
        "host_stall_ms": stall_us / 1e3,
        "host_stalls_by_phase": dict(by_phase.most_common()),
    }
