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
    waited for those launches (``launch_bound_us``) is inside the span, not idle before it. Only
    the spans that move are copied; the others are shared with ``trace`` (read-only)."""
    lane_of = trace.lane_of
    lane = {k for k, v in lane_of.items() if v == S.COMPUTE}
    events = list(trace.events)
    first: dict[int, int] = {}  # step -> the index of its first span on the compute lane
    waits: list[tuple[int, float]] = []  # (step, launch_bound_us) in event order
    for i, e in enumerate(events):
        if e.get("ph") != "X" or (e["pid"], e["tid"]) not in lane:
            continue
        args = e.get("args", {})
        step = args.get("step")
        if step is not None and (step not in first or e["ts"] < events[first[step]]["ts"]):
            first[step] = i
        wait = args.get("launch_bound_us")
        if wait:
            waits.append((args["step"], wait))
    for step, wait in waits:
        i = first[step]
        head = events[i]
        if head is trace.events[i]:
            head = events[i] = dict(head)
        head["ts"] -= wait
        head["dur"] += wait
    timed = Trace(events, trace.other_data)
    timed.__dict__["lane_of"] = lane_of  # the same lane metadata: not scanned again
    return timed
