"""GPU idle split the way Holistic Trace Analysis names it: host wait, kernel wait, other.

Every idle stretch of the compute lane ends where the next GPU span starts. Where that span had
not been enqueued yet when the lane went idle, the GPU was waiting on the host: *host wait*, up
to the moment it was enqueued. What is left of the stretch was spent with the work queued: a
short rest is the overhead of starting queued work (an event wait, a graph launch reaching the
GPU): *kernel wait*; a long one waited on something else (a copy, a synchronisation): *other*.

When a span was enqueued is the end of the host's ``launch`` span of its step (the simulator and
the runtime record one). A trace without launch spans (an import of another engine) counts the
part of a stretch the host spent working (any host span but ``wait``) as host wait. The same
code splits sim, runtime and imported traces, so the three read alike.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from cbsim.metrics.inputs import MetricInputs
from cbsim.metrics.timeline import gpu_lane, time_range, union_us
from cbsim.trace import schema as S

# the longest rest between two queued GPU spans still read as the cost of starting the second
# (an event wait and a graph launch reaching the GPU take 5-30 us on Hopper): longer is "other"
KERNEL_WAIT_MAX_US = 50.0
SPLIT = ("host_wait", "kernel_wait", "other")


def idle_split_metrics(inp: MetricInputs) -> dict[str, Any]:
    """``gpu_idle_<part>_fraction`` of the total time for each part of SPLIT (None without a
    GPU lane), summing to the GPU idle fraction."""
    out: dict[str, Any] = {f"gpu_idle_{p}_fraction": None for p in SPLIT}
    spans = inp.spans
    if spans.empty:
        return out
    lane = spans[spans.lane == gpu_lane(spans)].sort_values("ts")
    if lane.empty:
        return out
    start, end = time_range(inp)
    total = end - start
    if total <= 0:
        return out
    parts = dict.fromkeys(SPLIT, 0.0)
    queued = _queued_at(spans)
    busy = _host_busy(spans)
    running_end = start
    for ts, e, step in zip(lane["ts"], lane["end"], lane["step"], strict=True):
        if ts > running_end:
            _split_gap(parts, running_end, ts, queued.get(int(step)) if step >= 0 else None, busy)
        running_end = max(running_end, e)
    if end > running_end:  # after the last span: the host finishing up
        parts["host_wait"] += end - running_end
    for p in SPLIT:
        out[f"gpu_idle_{p}_fraction"] = parts[p] / total
    return out


def _split_gap(
    parts: dict[str, float], idle_from: float, idle_to: float, queued: float | None, busy
) -> None:
    gap = idle_to - idle_from
    if queued is not None:
        host = min(max(queued - idle_from, 0.0), gap)
    else:
        host = busy(idle_from, idle_to)
    parts["host_wait"] += host
    rest = gap - host
    if rest <= 0:
        return
    parts["kernel_wait" if rest <= KERNEL_WAIT_MAX_US else "other"] += rest


def _queued_at(spans: pd.DataFrame) -> dict[int, float]:
    """The end of each step's host launch: from then on its GPU work is queued."""
    launch = spans[(spans.lane == S.HOST) & (spans.name == S.LAUNCH) & (spans.step >= 0)]
    if launch.empty:
        return {}
    return {int(k): float(v) for k, v in launch.groupby("step")["end"].max().items()}


def _host_busy(spans: pd.DataFrame):
    """A function giving the host's working time (spans but ``wait``) inside [a, b)."""
    host = spans[(spans.lane == S.HOST) & (spans.name != S.WAIT)].sort_values("ts")
    ts, ends = host["ts"].to_numpy(), host["end"].to_numpy()

    def busy(a: float, b: float) -> float:
        lo, hi = np.searchsorted(ends, a, side="right"), np.searchsorted(ts, b, side="left")
        if hi <= lo:
            return 0.0
        window = pd.DataFrame({"ts": np.clip(ts[lo:hi], a, b), "end": np.clip(ends[lo:hi], a, b)})
        return union_us(window)

    return busy
