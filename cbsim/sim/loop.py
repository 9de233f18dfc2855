"""The host thread: the two continuous-batching loops, as the brief draws them.

Each is a SimPy process; every ``yield from`` is one host phase (host_phases.HostPhases), and the
only place the host can block on the GPU is ``wait``. Read them beside BRIEF.md's "The loop"
(runtime/loop.py is the same two loops on the GPU).
"""

from __future__ import annotations

from collections.abc import Generator

from cbsim.sim.host_phases import HostPhases


def run_sync(sim: HostPhases) -> Generator:
    """Synchronous: the host and the GPU take turns. Prepare batch N (its decode inputs are real
    tokens), launch it, block until its tokens are back, update, and only then build N+1."""
    yield from sim.loop_start()
    while sim.sched.has_unfinished():
        yield from sim.steady_stretch(None)  # many identical steps at once, or none
        batch = yield from sim.schedule()
        if batch is None:
            yield from sim.idle_until_arrival()
            continue
        slot = sim.next_slot()
        yield from sim.prepare(batch, slot)
        step = yield from sim.launch(batch, slot, prev=None)
        yield from sim.wait(step)
        yield from sim.update(step)


def run_async(sim: HostPhases) -> Generator:
    """Asynchronous: while the GPU runs batch N, build batch N+1 in the other IO slot (placeholders
    where N's tokens go, a carry-over index saying which), enqueue it behind N (H2D -> compute ->
    D2H, ordered by events), then block once on N's D2H event and update with N's tokens."""
    inflight = None  # batch N: launched, tokens not back yet
    yield from sim.loop_start()
    while sim.sched.has_unfinished():
        inflight = yield from sim.steady_stretch(inflight)  # identical steps at once, or none
        batch = yield from sim.schedule()  # batch N+1, built before N's tokens exist
        launched = None
        if batch is not None:
            slot = sim.next_slot()
            yield from sim.prepare(batch, slot, prev=inflight)
            launched = yield from sim.launch(batch, slot, prev=inflight)
        elif inflight is None:
            yield from sim.idle_until_arrival()
            continue
        if inflight is not None:
            yield from sim.wait(inflight)  # the one block per step: N's d2h_done
            yield from sim.update(inflight)
        inflight = launched
    if inflight is not None:  # with EOS the last request may retire while N+1 is in flight
        yield from sim.wait(inflight)
        yield from sim.update(inflight)


LOOPS = {"sync": run_sync, "async": run_async}
