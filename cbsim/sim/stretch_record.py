"""A steady stretch's events and counts: what the step-by-step phases would have recorded.

``record`` writes every step's counter sample, spans and args in the order host_phases.py writes
them (a trace of a fast-forwarded run is the trace of the stepped run); ``count`` adds the
stretch to the host's counters with the same additions, in the same order.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from cbsim.sim.host_state import HostState
from cbsim.sim.stretch import StretchCosts, Timeline
from cbsim.trace import schema as S


def step_args(step: int, slot: int, n: int, kv_tokens: int) -> dict[str, Any]:
    """cbsim.trace.batch_args of a steady decode batch."""
    return {
        "step": step,
        "slot": slot,
        "requests": n,
        "query_tokens": n,
        "kv_tokens": kv_tokens,
        "kind": "decode",
    }


def record(
    host: HostState,
    tl: Timeline,
    c: StretchCosts,
    step0: int,
    first_args: dict[str, Any] | None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Write the stretch's events; ``step0`` is the first launched step, ``first_args`` the
    in-flight batch's args (async; its wait and update open the stretch). Returns the last
    step's args and forward args (the in-flight batch's, for its Launched)."""
    rec, sched = host.rec, host.sched
    if not rec.tracing:
        return _columns(host, tl, c, step0, first_args)
    n = int(sched.run.size)
    carry = first_args is not None
    d2h_bytes = host.costs.d2h_bytes(n)
    waiting, running = sched.num_waiting, sched.num_running
    used = sched.kv.num_used
    last = host._last_counters
    slots = len(host.slots.slots)
    launches = host.launches
    prev_args = first_args
    args = fwd_args = {}
    for j in range(tl.steps):
        used += int(c.opened[j])
        values = {"waiting": waiting, "running": running, "kv_blocks_used": used}
        if values != last:
            rec.counter(S.SCHEDULER_COUNTER, tl.sched[j], values)
            last = values
        step, kv = step0 + j, c.kv_tokens[j]
        rec.host_span(S.SCHEDULE, tl.sched[j], c.schedule[j], step_args(step, -1, n, kv))
        args = step_args(step, (launches + j) % slots, n, kv)
        rec.host_span(S.PREPARE, tl.prep[j], c.prepare[j], args)
        fwd_args = _launch_spans(host, tl, c, j, args, carry, d2h_bytes)
        rec.host_span(S.LAUNCH, tl.launch[j], tl.launch_dur[j], args)
        waited = args if prev_args is None else prev_args
        rec.host_span(S.WAIT, tl.wait[j], tl.wait_dur[j], waited)
        stall = tl.stall[j]
        rec.host_span(
            S.UPDATE,
            tl.update[j],
            tl.update_dur[j],
            {**waited, "stall_us": stall} if stall else waited,
        )
        if carry:
            prev_args = args
    host._last_counters = last
    return args, fwd_args


def _columns(
    host: HostState, tl: Timeline, c: StretchCosts, step0: int, first_args: dict | None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``record`` without a trace: the spans' columns at once (metrics read no order), the
    counter samples counted; the last step's args built as ``record`` builds them."""
    rec, sched = host.rec, host.sched
    n, k = int(sched.run.size), tl.steps
    carry = first_args is not None
    steps = list(range(step0, step0 + k))
    kv = c.kv_tokens[:k]
    slots = len(host.slots.slots)
    slot = [(host.launches + j) % slots for j in range(k)]
    batch = {"step": steps, "requests": n, "query_tokens": n, "kv_tokens": kv, "kind": "decode"}
    batch["slot"] = slot
    # the batch each wait and update is of: the one before in the async loop
    upd = {**batch, "step": [s - carry for s in steps], "kv_tokens": kv}
    if carry:
        upd["kv_tokens"] = [first_args["kv_tokens"], *kv[:-1]]
        upd["slot"] = [first_args["slot"], *slot[:-1]]
    rec.extend(S.HOST, S.SCHEDULE, tl.sched, c.schedule[:k], **{**batch, "slot": -1})
    rec.extend(S.HOST, S.PREPARE, tl.prep, c.prepare[:k], **batch)
    rec.extend(S.H2D, S.COPY_H2D, [s for s, _ in tl.h2d], [e - s for s, e in tl.h2d], **batch)
    busy = [e - f for (_, e), f in zip(tl.compute, tl.forward)]
    split = c.carry_us if not c.graph else 0.0  # an eager carry-over is a span of its own
    if carry and not c.graph:
        rec.extend(S.COMPUTE, S.CARRY_OVER, busy, [c.carry_us] * k, **batch)
    # as _launch_spans: the stream's wait inside each forward for the host's launches
    waits = [
        w if w > 0.5 else 0.0 for w in ((e - s) - f for (s, e), f in zip(tl.compute, tl.forward))
    ]
    rec.extend(
        S.COMPUTE,
        S.GRAPH_REPLAY if c.graph else S.FORWARD,
        [b + split for b in busy] if not (carry and c.graph) else busy,
        [f - split for f in tl.forward] if not (carry and c.graph) else tl.forward,
        new_tokens=n,
        launch_bound_us=waits,
        **batch,
    )
    rec.extend(S.D2H, S.COPY_D2H, [s for s, _ in tl.d2h], [e - s for s, e in tl.d2h], **batch)
    rec.extend(S.HOST, S.LAUNCH, tl.launch, tl.launch_dur, **batch)
    rec.extend(S.HOST, S.WAIT, tl.wait, tl.wait_dur, **upd)
    rec.extend(S.HOST, S.UPDATE, tl.update, tl.update_dur, **upd)
    waiting, running, used = sched.num_waiting, sched.num_running, sched.kv.num_used
    opened = c.opened[:k]
    first = {"waiting": waiting, "running": running, "kv_blocks_used": used + int(opened[0])}
    rec.samples += int(first != host._last_counters) + int(np.count_nonzero(opened[1:]))
    host._last_counters = {**first, "kv_blocks_used": used + int(opened.sum())}
    args = step_args(steps[-1], slot[-1], n, kv[-1])
    fwd_args = {**args, "new_tokens": n}
    if waits[-1]:
        fwd_args["launch_bound_us"] = waits[-1]
    if carry and c.graph:
        fwd_args["carry_over_us"] = c.carry_us
    return args, fwd_args


def _launch_spans(
    host: HostState, tl: Timeline, c: StretchCosts, j: int, args: dict, carry: bool, d2h: int
) -> dict[str, Any]:
    """The step's GPU spans (launch.py's order and args); returns the forward's args."""
    rec = host.rec
    h_start, h_end = tl.h2d[j]
    rec.span(S.H2D, S.COPY_H2D, h_start, h_end - h_start, {**args, "bytes": c.h2d_bytes[j]})
    c_start, c_end = tl.compute[j]
    fwd = tl.forward[j]
    busy_start = c_end - fwd
    fwd_args = {**args, "new_tokens": args["requests"]}
    if c_end - c_start - fwd > 0.5:
        fwd_args["launch_bound_us"] = c_end - c_start - fwd
    if carry and c.graph:  # captured in the graph: part of the replay, an arg
        fwd_args["carry_over_us"] = c.carry_us
        rec.span(S.COMPUTE, S.GRAPH_REPLAY, busy_start, fwd, fwd_args)
    else:
        if carry:  # eagerly, its own kernel just before the forward's
            rec.span(S.COMPUTE, S.CARRY_OVER, busy_start, c.carry_us, args)
        name = S.GRAPH_REPLAY if c.graph else S.FORWARD
        rec.span(S.COMPUTE, name, busy_start + c.carry_us, fwd - c.carry_us, fwd_args)
    d_start, d_end = tl.d2h[j]
    rec.span(S.D2H, S.COPY_D2H, d_start, d_end - d_start, {**args, "bytes": d2h})
    return fwd_args


def count(host: HostState, tl: Timeline, c: StretchCosts, carry: bool) -> None:
    """Add the stretch to the host's counters (each sum in step order, as stepping adds)."""
    n, hu, lb = host.n, host.host_us, host.lane_busy_us
    dev = host.device
    k = tl.steps
    hu[S.SCHEDULE] = _sum(hu[S.SCHEDULE], c.schedule[:k])
    hu[S.PREPARE] = _sum(hu[S.PREPARE], c.prepare[:k])
    hu[S.LAUNCH] = _sum(hu[S.LAUNCH], tl.launch_dur)
    hu[S.WAIT] = _sum(hu[S.WAIT], tl.wait_dur)
    hu[S.UPDATE] = _sum(hu[S.UPDATE], tl.update_dur)
    n["host_blocked_us"] = _sum(n["host_blocked_us"], tl.wait_dur)
    h2d = [e - s for s, e in tl.h2d]
    comp = [e - s for s, e in tl.compute]
    d2h = [e - s for s, e in tl.d2h]
    dev.h2d.busy_us = _sum(dev.h2d.busy_us, h2d)
    dev.compute.busy_us = _sum(dev.compute.busy_us, comp)
    dev.d2h.busy_us = _sum(dev.d2h.busy_us, d2h)
    lb[S.H2D] = _sum(lb[S.H2D], h2d)
    if carry and c.graph:
        lb[S.COMPUTE] = _sum(lb[S.COMPUTE], tl.forward)
    else:
        carried = [c.carry_us] * k if carry else []  # eager: the carry-over's span, then the rest
        busy = [x for f in tl.forward for x in (*carried[:1], f - c.carry_us)]
        lb[S.COMPUTE] = _sum(lb[S.COMPUTE], busy)
    lb[S.D2H] = _sum(lb[S.D2H], d2h)
    n["launch_wait_us"] = _sum(n["launch_wait_us"], [w - f for w, f in zip(comp, tl.forward)])
    stalls = [x for x in tl.stall if x]
    if stalls:
        n["host_stalls"] += len(stalls)
        n["host_stall_us"] = _sum(n["host_stall_us"], stalls)
    n["steps"] += k
    n["graph_steps" if c.graph else "eager_steps"] += k
    n["kernels_launched"] += 0 if c.graph else c.kernels * k
    n["carry_over_steps"] += k if carry else 0
    n["host_blocks"] += k
    n["generated_tokens"] += int(host.sched.run.size) * k
    n["updates"] += k
    host.launches += k


def _sum(total: float, values: list[float]) -> float:
    """``total += v`` for each value in order (the step path's running sum, not a pairwise one)."""
    for v in values:
        total += v
    return total
