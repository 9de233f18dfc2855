"""Normalising a recorded runtime trace: the GPU's clock drift and the start of replayed graphs.

Both corrections are idempotent and leave simulated and imported traces alone. ``read_trace``
applies ``normalize`` to every trace it reads; the runtime applies it to the trace it has just
recorded, before that trace is written and measured, so a run's own metrics.json and a later
validation of its file see the same timings.
"""

from __future__ import annotations

import math
from typing import Any

from cbsim.trace import schema as S
from cbsim.trace.builder import span_times
from cbsim.trace.model import Trace
from cbsim.trace.perfetto import with_derived

# Host work inside a runtime launch after the graph is submitted (compute_done, the D2H wait and
# copy, d2h_done, the tracing events). The runtime measures it per run (otherData
# .post_graph_host_us, the median); a trace without it gets this default, above the medians
# measured on the H200 (61-113 us, runtime/README.md).
POST_GRAPH_HOST_US = 120.0
# Below this the drift is within the timestamps' resolution: nothing to spread (us).
MIN_DRIFT_US = 1.0


def normalize(trace: Trace) -> Trace:
    """Both corrections, in the order they were measured: drift first, then graph starts (a
    merged trace holds its runs as they were written, each normalised already)."""
    if isinstance(trace.other_data.get("merged"), dict):
        return trace
    return correct_graph_start(correct_drift(trace))


def correct_drift(trace: Trace) -> Trace:
    """Undo the GPU clock's drift against the host's over a runtime trace.

    The runtime maps CUDA event times to the host clock through one anchor at the start and
    measures at the end how far the two have drifted apart (otherData.clock_drift_us: the host's
    end time minus the mapped one; about 0.6 ms over 100 s on the H200 here). Spreading that
    linearly over the run puts each stream operation back where the host saw it; otherwise a
    long run's late steps look as if the host woke up hundreds of microseconds after their D2H.
    """
    drift = trace.other_data.get("clock_drift_us")
    if trace.other_data.get("clock_drift_corrected"):
        return trace
    if not isinstance(drift, (int, float)) or not math.isfinite(drift) or abs(drift) < MIN_DRIFT_US:
        return trace
    host_pid = S.LANE_IDS[S.HOST][0]
    xs = [e for e in trace.events if e.get("ph") == "X"]
    if not xs:
        return trace
    t0 = min(e["ts"] for e in xs)
    span = max(e["ts"] + e["dur"] for e in xs) - t0
    if span <= 0:
        return trace

    def fix(t: float) -> float:
        return t + drift * (t - t0) / span

    events = []
    for e in trace.events:
        if e.get("ph") == "X" and e.get("pid") != host_pid:
            ts, end = fix(e["ts"]), fix(e["ts"] + e["dur"])
            start, dur = span_times(ts, end - ts)
            e = {**e, "ts": start, "dur": dur}
        events.append(e)
    fixed = Trace(events=events, other_data={**trace.other_data, "clock_drift_corrected": True})
    return with_derived(fixed)


def correct_graph_start(trace: Trace, post_graph_host_us: float | None = None) -> Trace:
    """Start each replayed graph's span when its work can start.

    The runtime times a forward from a marker it records on the compute stream before the host
    launches the graph. On an idle stream (sync) the marker passes at once, and the span then
    also holds the rest of the host's launch, while the GPU waits for the graph: counted as
    busy, and as a slower forward. The graph is in at the latest ``post_graph_host_us`` before
    the launch span ends; a span that starts earlier is started there (only runtime traces; a
    simulated forward starts after its launch already). A piecewise replay (args.pieces > 1)
    is left as it is: its first piece runs while the host launches the rest."""
    if trace.source != "runtime":
        return trace
    if post_graph_host_us is None:
        post_graph_host_us = _post_graph_host_us(trace.other_data)
    host = S.LANE_IDS[S.HOST]
    launch_end: dict[Any, float] = {}
    for e in trace.events:
        if e.get("ph") == "X" and (e.get("pid"), e.get("tid")) == host and e["name"] == S.LAUNCH:
            step = e.get("args", {}).get("step")
            launch_end[step] = max(launch_end.get(step, -math.inf), e["ts"] + e["dur"])
    events, moved = [], 0
    for e in trace.events:
        whole = e.get("args", {}).get("pieces", 1) <= 1
        if e.get("ph") == "X" and e["name"] == S.GRAPH_REPLAY and whole:
            ready = launch_end.get(e.get("args", {}).get("step"), -math.inf) - post_graph_host_us
            end = e["ts"] + e["dur"]
            if e["ts"] < ready < end:
                start, dur = span_times(ready, end - ready)
                e = {**e, "ts": start, "dur": dur}
                moved += 1
        events.append(e)
    if not moved:
        return trace
    fixed = Trace(events=events, other_data={**trace.other_data, "graph_start_corrected": moved})
    return with_derived(fixed)


def _post_graph_host_us(other: dict[str, Any]) -> float:
    value = other.get("post_graph_host_us")
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok and value >= 0 else POST_GRAPH_HOST_US
