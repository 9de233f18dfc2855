"""A recorded run re-simulated: its config in the simulator with a given profile, the simulated
trace timed as the runtime's CUDA events time it, so the two traces compare span for span
(validation measures both; calibration fits what only a whole simulated run shows)."""

from __future__ import annotations

import dataclasses

from cbsim.calibration.recordings import Recorded
from cbsim.config.schema import HardwareConfig
from cbsim.sim import run
from cbsim.trace import Trace
from cbsim.trace import schema as S


def simulate_like(rec: Recorded, hw: HardwareConfig) -> Trace:
    """The recorded run's config, in the simulator, with ``hw``, timed as the runtime times it."""
    cfg = rec.config
    cfg = dataclasses.replace(cfg, hardware=hw, mode=dataclasses.replace(cfg.mode, name="sim"))
    trace = run(cfg, rec.engine)
    return event_timed(trace) if rec.trace.source == "runtime" else trace


def event_timed(trace: Trace) -> Trace:
    """The simulated trace as the runtime's CUDA events would have timed it: an eager forward's
    span starts at its marker, before the host has launched its kernels, so the time the stream
    waited for those launches (``launch_bound_us``) is inside the span, not idle before it."""
    lane = {k: v for k, v in trace.lane_of.items() if v == S.COMPUTE}
    events = [dict(e) for e in trace.events]
    first: dict[int, dict] = {}  # step -> its first span on the compute lane
    for e in events:
        if e.get("ph") == "X" and (e["pid"], e["tid"]) in lane:
            step = e.get("args", {}).get("step")
            if step is not None and (step not in first or e["ts"] < first[step]["ts"]):
                first[step] = e
    for e in events:
        wait = e.get("args", {}).get("launch_bound_us") if e.get("ph") == "X" else None
        if wait and (e["pid"], e["tid"]) in lane:
            head = first[e["args"]["step"]]
            head["ts"] -= wait
            head["dur"] += wait
    return Trace(events, trace.other_data)
