"""CUDA streams, events and the happens-before order between them.

A stream is an in-order queue: an operation starts when the host has enqueued it, the stream's
previous operation has ended and every event it waits on has completed. The host enqueues in
program order and can only wait on an event already recorded, so every one of those times is
known when the operation is enqueued: the stream computes its start and end right then, and only
the host (the one actor that decides anything) needs SimPy's clock. That keeps a 16K-step run
well under a second without changing a single timestamp.

Ordering is tracked with vector clocks, one component per stream: ``vc[k]`` = how many of stream
k's operations are known complete. A stream learns what the host knew when it enqueued (program
order), what an event knew when it waits on it; the host learns an event's knowledge when it
synchronises on it. An access A happens before an access B iff ``B.vc[A.stream] >= A.seq``:
that is what the IO slots check for hazards, independently of how the timing happened to fall.

``engine.streams=default`` puts every operation on one stream, the legacy default stream, so
copies and compute serialise; and reading the sampled tokens there is a device-wide sync (the
host waits for everything enqueued so far, the next batch included): all overlap is lost.
``engine.streams=one`` puts them on one ordinary stream, as the runtime's sync engine does: the
copies wait for the forward before them, the host still waits on its own event only, and each
operation keeps its own lane in the trace (the runtime writes its lanes by operation too).
"""

from __future__ import annotations

from dataclasses import dataclass

from cbsim.trace import schema as S


@dataclass(slots=True)
class CudaEvent:
    """Recorded on a stream after its last enqueued op: completes when that op ends."""

    time: float
    vc: tuple[int, ...]


@dataclass(slots=True)
class Op:
    """One stream operation; ``vc`` is what is known complete when it starts."""

    stream: int
    seq: int
    lane: str
    name: str
    start: float
    end: float
    vc: tuple[int, ...]


def happens_before(op: Op | None, vc: tuple[int, ...] | list[int]) -> bool:
    """Is ``op`` ordered before an access that knows ``vc``? None = a host access (program order
    puts it before anything the host enqueues later)."""
    return op is None or vc[op.stream] >= op.seq


class Stream:
    """An in-order queue on the GPU (a lane in the trace)."""

    __slots__ = ("index", "lane", "tail", "seq", "vc", "busy_us", "gap")

    def __init__(self, index: int, lane: str, width: int, gap: float = 0.0) -> None:
        self.index, self.lane = index, lane
        self.tail = 0.0  # end of the last enqueued op
        self.gap = gap  # idle the device keeps between two ops queued back to back
        self.seq = 0  # ops enqueued so far
        self.vc = [0] * width  # what is known complete after the last enqueued op
        self.busy_us = 0.0

    def enqueue(
        self,
        name: str,
        now: float,
        dur: float,
        host_vc: list[int],
        waits: tuple[CudaEvent, ...] = (),
        not_before_end: float = 0.0,
        lane: str | None = None,
    ) -> Op:
        """Enqueue an op at host time ``now``; ``not_before_end``: it cannot end earlier (eager
        kernels are still being launched); ``lane``: the trace lane, if not the stream's."""
        ready = self.tail + self.gap if self.seq else self.tail
        start = now if now > ready else ready
        vc = list(map(max, self.vc, host_vc))
        for ev in waits:
            if ev.time > start:
                start = ev.time
            vc = list(map(max, vc, ev.vc))
        end = start + dur
        if not_before_end > end:
            end = not_before_end
        self.seq += 1
        op = Op(self.index, self.seq, lane or self.lane, name, start, end, tuple(vc))
        vc[self.index] = self.seq
        self.vc = vc
        self.tail = end
        self.busy_us += end - start
        return op

    def record(self) -> CudaEvent:
        return CudaEvent(self.tail, tuple(self.vc))


class LaneView:
    """One stream seen under another lane: the H2D and D2H copies of ``engine.streams=one``
    queue on the compute stream and are drawn on their own lanes."""

    __slots__ = ("stream", "lane")

    def __init__(self, stream: Stream, lane: str) -> None:
        self.stream, self.lane = stream, lane

    def __getattr__(self, name: str):
        return getattr(self.stream, name)

    def enqueue(self, name: str, now: float, dur: float, host_vc: list[int], *args, **kw) -> Op:
        return self.stream.enqueue(name, now, dur, host_vc, *args, lane=self.lane, **kw)


class LaunchQueue:
    """The driver's queue of launched, unfinished kernels on the compute stream: at most
    ``depth`` of them; one more launch blocks the host until the oldest completes. Each
    forward's kernels are taken to run back to back at equal length over its span (a graph
    replay is one entry)."""

    __slots__ = ("depth", "ops")

    def __init__(self, depth: int) -> None:
        self.depth = depth
        self.ops: list[tuple[float, float, int]] = []  # (start, end, entries), oldest first

    def push(self, start: float, end: float, entries: int) -> float:
        """Enqueue an op's entries; returns the time the host's last launch of them can
        return (-inf when the queue never fills)."""
        if not self.depth:
            return float("-inf")
        self.ops.append((start, end, entries))
        del self.ops[:-8]  # two steps in flight at most: older ops are long done
        room = self.depth
        for op_start, op_end, n in reversed(self.ops):
            if n > room:  # the (n - room)-th entry of this op must have completed
                return op_start + (op_end - op_start) * (n - room) / n
            room -= n
        return float("-inf")


class Device:
    """The three streams (or one, or the legacy default stream) and the host's knowledge of them."""

    def __init__(self, mode: str, forward_gap_us: float = 0.0) -> None:
        if mode == "three":
            self.h2d = Stream(0, S.H2D, 3)
            self.compute = Stream(1, S.COMPUTE, 3, forward_gap_us)
            self.d2h = Stream(2, S.D2H, 3)
            self.streams = (self.h2d, self.compute, self.d2h)
        elif mode == "one":
            self.compute = Stream(0, S.COMPUTE, 1, forward_gap_us)
            self.h2d, self.d2h = LaneView(self.compute, S.H2D), LaneView(self.compute, S.D2H)
            self.streams = (self.compute,)
        else:
            default = Stream(0, S.DEFAULT, 1)
            self.h2d = self.compute = self.d2h = default
            self.streams = (default,)
        self.default_stream = mode == "default"
        self.lanes = tuple(dict.fromkeys(st.lane for st in (self.h2d, self.compute, self.d2h)))
        self.host_vc = [0] * len(self.streams)
        # the SM clock as the last forward left it, a ratio of boost (cbsim/costs/clock.py)
        self.clock_ratio = 1.0

    def sync_point(self, event: CudaEvent) -> CudaEvent:
        """What the host really waits for when it synchronises on ``event``: the event itself,
        or on the legacy default stream everything enqueued so far (a device-wide sync)."""
        if self.default_stream:
            return self.compute.record()
        return event

    def host_learns(self, event: CudaEvent) -> None:
        self.host_vc = list(map(max, self.host_vc, event.vc))
