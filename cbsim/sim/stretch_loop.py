"""The host's timing recurrence over a steady stretch: the loops of loop.py with the arithmetic
of host_phases.py and launch.py written out for one graph replay per step, nothing else.

Every float operation is the one the step-by-step path performs, in its order (a SimPy timeout
of ``d`` moves the clock to ``now + d``; a stream op starts at the latest of the host's enqueue,
the stream's tail and the event it waits on), so the times are bit-identical. The caller
(fast_forward.py) has checked that no step of the stretch can do anything else.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cbsim.sim.fast_forward import StretchCosts
    from cbsim.sim.host_phases import HostPhases


@dataclass
class Timeline:
    """What each step of the stretch did, in step order (microseconds)."""

    sched: list[float] = field(default_factory=list)  # schedule starts
    prep: list[float] = field(default_factory=list)
    launch: list[float] = field(default_factory=list)
    launch_dur: list[float] = field(default_factory=list)
    wait: list[float] = field(default_factory=list)
    wait_dur: list[float] = field(default_factory=list)
    update: list[float] = field(default_factory=list)
    update_dur: list[float] = field(default_factory=list)  # update cost + stall
    stall: list[float] = field(default_factory=list)
    h2d: list[tuple[float, float]] = field(default_factory=list)  # (start, end)
    compute: list[tuple[float, float]] = field(default_factory=list)
    forward: list[float] = field(default_factory=list)  # busy time on the stream
    d2h: list[tuple[float, float]] = field(default_factory=list)
    now: float = 0.0  # the host's clock after the stretch

    @property
    def steps(self) -> int:
        return len(self.sched)

    def truncate(self, k: int) -> None:
        """Keep the first ``k`` steps (the clock after them)."""
        if k == self.steps:
            return
        self.now = self.sched[k]  # where the first dropped step would have started
        for name in ("sched", "prep", "launch", "launch_dur", "wait", "wait_dur", "update"):
            del getattr(self, name)[k:]
        for name in ("update_dur", "stall", "h2d", "compute", "forward", "d2h"):
            del getattr(self, name)[k:]


def run_stretch(
    host: HostPhases,
    k: int,
    c: StretchCosts,
    first_wait: float | None,
    admit_at: float,
    updates0: int,
) -> Timeline:
    """Up to ``k`` iterations of the host loop from ``host.env.now``; stops before the one whose
    schedule would see ``admit_at`` arrived. ``first_wait``: the in-flight batch's D2H event
    time (async; each later wait is on the batch the iteration before launched), None for the
    sync loop (each iteration waits on its own batch)."""
    costs, hc, dev = host.costs, host.costs.host, host.device
    ev, cl, gl, wake = hc.event_us, hc.copy_launch_us, hc.graph_launch_us, hc.sync_wake_us
    evcl = hc.event_us + hc.copy_launch_us
    d2h_us = costs.d2h_us(costs.d2h_bytes(int(host.sched.run.size)))
    slowdown = costs.idle_slowdown
    h_tail, c_tail, d_tail = dev.h2d.tail, dev.compute.tail, dev.d2h.tail
    tl = Timeline()
    now = host.env.now
    pending = first_wait  # the D2H the next wait blocks on (async)
    for j in range(k):
        if admit_at <= now * 1e-6 * (1.0 + 1e-15) + 1e-12:
            break
        tl.sched.append(now)
        now += c.schedule[j]
        tl.prep.append(now)
        now += c.prepare[j]
        # launch: H2D, compute (graph replay) waiting on h2d_done, D2H waiting on compute_done
        launch0 = now
        t = now + c.stage[j] + cl
        h_start = t if t > h_tail else h_tail
        h_tail = h_start + c.h2d[j]
        t += ev
        t += ev
        fwd = c.forward[j]
        if slowdown:
            begin = max(t + gl, c_tail)
            if h_tail > begin:
                begin = h_tail
            idle = begin - c_tail
            slow = slowdown * idle if idle > 0 else 0.0
            if slow:
                fwd += slow
        t += gl
        c_start = t if t > c_tail else c_tail
        if h_tail > c_start:
            c_start = h_tail
        c_tail = c_start + fwd
        t += ev
        t += evcl
        d_start = t if t > d_tail else d_tail
        if c_tail > d_start:
            d_start = c_tail
        d_tail = d_start + d2h_us
        t += ev
        tl.h2d.append((h_start, h_tail))
        tl.compute.append((c_start, c_tail))
        tl.forward.append(fwd)
        tl.d2h.append((d_start, d_tail))
        tl.launch.append(launch0)
        tl.launch_dur.append(t - launch0)
        now = launch0 + (t - launch0)
        # wait: the one block per step, on the D2H of the batch it updates
        target = d_tail if pending is None else pending
        pending = None if first_wait is None else d_tail
        blocked = target - now
        dur = blocked + wake if blocked > 0 else ev
        tl.wait.append(now)
        tl.wait_dur.append(dur)
        now += dur
        stall = costs.stall_us(updates0 + j)
        tl.stall.append(stall)
        dur = c.update[j] + stall
        tl.update.append(now)
        tl.update_dur.append(dur)
        now += dur
    tl.now = now
    return tl
