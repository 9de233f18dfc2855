"""Host stalls: a host phase far longer than that phase usually takes (a garbage collection, a
page fault, the OS taking the core) leaves the GPU waiting, in the simulator and the runtime.

A stall is a host span (not ``wait``: that is the host blocked on the GPU) longer than
``STALL_FACTOR`` times the median of its phase in batches of its kind (a prefill's prepare is
not compared with a decode's) and at least ``STALL_MIN_US`` longer than that median.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from cbsim.metrics.inputs import MetricInputs
from cbsim.trace import schema as S

STALL_FACTOR = 10.0
# below this excess a long phase is not worth a user's attention (us)
STALL_MIN_US = 1000.0


def stall_spans(
    spans: pd.DataFrame, factor: float = STALL_FACTOR, min_us: float = STALL_MIN_US
) -> pd.DataFrame:
    """The host spans that are stalls, with their phase median (column ``median_us``)."""
    host = spans[(spans.lane == S.HOST) & (spans.name != S.WAIT)]
    if host.empty:
        return host.assign(median_us=pd.Series(dtype=float))
    median = host.groupby(["name", "kind"])["dur"].transform("median")
    long = (host["dur"] > factor * median) & (host["dur"] - median >= min_us)
    return host[long].assign(median_us=median[long])


def stall_metrics(inp: MetricInputs) -> dict[str, Any]:
    """``host_stalls`` (count), ``host_stall_ms`` (their total time) and by phase."""
    stalls = stall_spans(inp.spans)
    return {
        "host_stalls": int(len(stalls)),
        "host_stall_ms": float(stalls["dur"].sum()) / 1e3,
        "host_stalls_by_phase": {str(k): int(v) for k, v in stalls["name"].value_counts().items()},
    }
