"""A steady stretch's events and counts: what the step-by-step phases would have recorded.

``record`` writes every step's counter sample, spans and args in the order host_phases.py writes
them (a trace of a fast-forwarded run is the trace of the stepped run); ``count`` adds the
stretch to the host's counters with the same additions, in the same order.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cbsim.trace import schema as S

if TYPE_CHECKING:
    from cbsim.sim.fast_forward import StretchCosts
    from cbsim.sim.host_phases import HostPhases
    from cbsim.sim.stretch_loop import Timeline


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
    host: HostPhases,
    tl: Timeline,
    c: StretchCosts,
    step0: int,
    first_args: dict[str, Any] | None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Write the stretch's events; ``step0`` is the first launched step, ``first_args`` the
    in-flight batch's args (async; its wait and update open the stretch). Returns the last
    step's args and forward args (the in-flight batch's, for its Launched)."""
    rec, sched = host.rec, host.sched
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
        fwd_args = _launch_spans(host, tl, j, args, carry, c.h2d_bytes[j], d2h_bytes)
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


def _launch_spans(
    host: HostPhases, tl: Timeline, j: int, args: dict, carry: bool, h2d_bytes: int, d2h_bytes: int
) -> dict[str, Any]:
    """The step's three GPU spans (launch.py's order and args); returns the forward's args."""
    rec = host.rec
    h_start, h_end = tl.h2d[j]
    rec.span(S.H2D, S.COPY_H2D, h_start, h_end - h_start, {**args, "bytes": h2d_bytes})
    c_start, c_end = tl.compute[j]
    fwd = tl.forward[j]
    fwd_args = {**args, "new_tokens": args["requests"]}
    if c_end - c_start - fwd > 0.5:
        fwd_args["launch_bound_us"] = c_end - c_start - fwd
    if carry:
        fwd_args["carry_over_us"] = host.costs.gpu.carry_over_us
        rec.span(S.COMPUTE, S.GRAPH_REPLAY, c_end - fwd, fwd, fwd_args)
    else:
        rec.span(S.COMPUTE, S.GRAPH_REPLAY, c_end - fwd + 0.0, fwd - 0.0, fwd_args)
    d_start, d_end = tl.d2h[j]
    rec.span(S.D2H, S.COPY_D2H, d_start, d_end - d_start, {**args, "bytes": d2h_bytes})
    return fwd_args


def count(host: HostPhases, tl: Timeline, c: StretchCosts, carry: bool) -> None:
    """Add the stretch to the host's counters (each sum in step order, as stepping adds)."""
    n, hu, lb = host.n, host.host_us, host.lane_busy_us
    dev = host.device
    req = int(host.sched.run.size)
    for j in range(tl.steps):
        hu[S.SCHEDULE] += c.schedule[j]
        hu[S.PREPARE] += c.prepare[j]
        (h_start, h_end), (c_start, c_end), (d_start, d_end) = tl.h2d[j], tl.compute[j], tl.d2h[j]
        fwd = tl.forward[j]
        dev.h2d.busy_us += h_end - h_start
        dev.compute.busy_us += c_end - c_start
        dev.d2h.busy_us += d_end - d_start
        lb[S.H2D] += h_end - h_start
        lb[S.COMPUTE] += fwd if carry else fwd - 0.0
        lb[S.D2H] += d_end - d_start
        n["launch_wait_us"] += c_end - c_start - fwd
        hu[S.LAUNCH] += tl.launch_dur[j]
        n["host_blocked_us"] += tl.wait_dur[j]
        hu[S.WAIT] += tl.wait_dur[j]
        if tl.stall[j]:
            n["host_stalls"] += 1
            n["host_stall_us"] += tl.stall[j]
        hu[S.UPDATE] += tl.update_dur[j]
    k = tl.steps
    n["steps"] += k
    n["graph_steps"] += k
    n["carry_over_steps"] += k if carry else 0
    n["host_blocks"] += k
    n["generated_tokens"] += req * k
    n["updates"] += k
    host.launches += k
