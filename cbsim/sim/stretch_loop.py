"""The host's timing recurrence over a steady stretch: the loops of loop.py with the arithmetic
of host_phases.py and launch.py written out for a steady step, nothing else.

Every float operation is the one the step-by-step path performs, in its order (a SimPy timeout
of ``d`` moves the clock to ``now + d``; a stream op starts at the latest of the host's enqueue,
the stream's tail and the event it waits on), so the times are bit-identical. The caller
(fast_forward.py) has checked that no step of the stretch can do anything else.
"""

from __future__ import annotations

from cbsim.sim.host_state import HostState
from cbsim.sim.launch import launch_host
from cbsim.sim.stretch import StretchCosts, Timeline


class StepLaunch:
    """launch.py's enqueue of one steady step (H2D; compute waiting on h2d_done, idle slowdown
    applied, one graph replay or every kernel launched eagerly, the driver's launch queue; D2H
    waiting on compute_done), as plain float arithmetic."""

    def __init__(self, host: HostState, c: StretchCosts) -> None:
        costs, hs = host.costs, launch_host(host, c.factor)
        self.ev, self.cl = hs.event, hs.copy
        self.evcl = hs.event + hs.copy
        self.d2h_us = costs.d2h_us(costs.d2h_bytes(int(host.sched.run.size)))
        self.slowdown = costs.idle_slowdown
        self.graph, self.kernels = c.graph, c.kernels
        self.kl = hs.eager_kernel(c.kernels)  # an eager forward's first kernel is out by then
        self.body = hs.graph if c.graph else self.kl * c.kernels
        self.queue = host.launch_queue  # the real one: it holds what stepping leaves in it
        self.gap = host.device.compute.gap  # the device's idle between queued forwards
        self.entries = 1 if c.graph else c.kernels

    def enqueue(
        self, now: float, stage: float, h2d_us: float, fwd: float, tails: list[float]
    ) -> tuple[float, float, float, float, float]:
        """From host time ``now``, with the streams' ``tails`` [h2d, compute, d2h] (updated):
        (h2d start, compute start, forward busy time, d2h start, host time after)."""
        ev = self.ev
        h_tail, c_tail, d_tail = tails
        c_ready = c_tail + self.gap
        t = now + stage + self.cl
        h_start = t if t > h_tail else h_tail
        h_tail = h_start + h2d_us
        t += ev
        t += ev
        if self.slowdown:
            begin = max(t + (self.body if self.graph else self.kl), c_ready)
            if h_tail > begin:
                begin = h_tail
            idle = begin - c_tail
            slow = self.slowdown * idle if idle > 0 else 0.0
            if slow:
                fwd += slow
        if self.graph:
            t += self.body
            c_start = t if t > c_ready else c_ready
            if h_tail > c_start:
                c_start = h_tail
            c_tail = c_start + fwd
        else:
            first = t + self.kl
            t += self.body
            c_start = first if first > c_ready else c_ready
            if h_tail > c_start:
                c_start = h_tail
            c_tail = c_start + fwd
            not_before_end = t + fwd / self.kernels  # the last kernel is launched by then
            if not_before_end > c_tail:
                c_tail = not_before_end
        t = max(t, self.queue.push(c_start, c_tail, self.entries))
        t += ev
        t += self.evcl
        d_start = t if t > d_tail else d_tail
        if c_tail > d_start:
            d_start = c_tail
        d_tail = d_start + self.d2h_us
        t += ev
        tails[0], tails[1], tails[2] = h_tail, c_tail, d_tail
        return h_start, c_start, fwd, d_start, t


def run_stretch(
    host: HostState,
    k: int,
    c: StretchCosts,
    first_wait: float | None,
    admit_at: float,
    updates0: int,
    switch_at: float = float("inf"),
) -> Timeline:
    """Up to ``k`` iterations of the host loop from ``host.env.now``; stops before the one whose
    schedule would see ``admit_at`` arrived, or that starts once the host's speed switches at
    ``switch_at`` (the caller drops the iterations with a phase past it). ``first_wait``: the
    in-flight batch's D2H event time (async; each later wait is on the batch the iteration
    before launched), None for the sync loop (each iteration waits on its own batch)."""
    costs, hc, dev, f = host.costs, host.costs.host, host.device, c.factor
    ev, wake = f * hc.event_us, f * hc.sync_wake_us
    launch = StepLaunch(host, c)
    tails = [dev.h2d.tail, dev.compute.tail, dev.d2h.tail]
    tl = Timeline()
    now = host.env.now
    pending = first_wait  # the D2H the next wait blocks on (async)
    for j in range(k):
        if admit_at <= now * 1e-6 * (1.0 + 1e-15) + 1e-12 or now >= switch_at:
            break
        tl.sched.append(now)
        now += c.schedule[j]
        tl.prep.append(now)
        now += c.prepare[j]
        h_start, c_start, fwd, d_start, t = launch.enqueue(
            now, c.stage[j], c.h2d[j], c.forward[j], tails
        )
        tl.h2d.append((h_start, tails[0]))
        tl.compute.append((c_start, tails[1]))
        tl.forward.append(fwd)
        tl.d2h.append((d_start, tails[2]))
        tl.launch.append(now)
        tl.launch_dur.append(t - now)
        now = now + (t - now)
        # wait: the one block per step, on the D2H of the batch it updates
        target = tails[2] if pending is None else pending
        pending = None if first_wait is None else tails[2]
        blocked = target - now
        dur = blocked + wake if blocked > 0 else ev
        tl.wait.append(now)
        tl.wait_dur.append(dur)
        now += dur
        stall = costs.stall_us(updates0 + j) * f
        tl.stall.append(stall)
        dur = c.update[j] + stall
        tl.update.append(now)
        tl.update_dur.append(dur)
        now += dur
    tl.now = now
    return tl
