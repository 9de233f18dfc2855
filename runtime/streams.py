"""Streams, events and the launch of one step: H2D copy -> forward -> D2H copy.

Both engines launch a step the same way; they differ in the streams they pass and in the loop
around it. The async engine passes three non-default streams (H2D, compute, D2H) ordered by
events: H2D records `h2d_done`, compute waits on it and records `compute_done`, D2H waits on that
and records `d2h_done`, on which the host later blocks. The sync engine passes one non-default
stream as all three (the waits are then no-ops), as async does with engine.streams=one. The
streams belong to the process, not the run: every run's forward goes to the same stream. On a
CPU there are no streams: every op runs synchronously and is timed with perf_counter.

The events come from a ring made before the loop and reused step after step, so a launch
allocates nothing; with tracing on each step also marks the start of each op (six timing
events per step), with tracing off only the three ordering events are recorded.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from time import perf_counter

import torch

from cbsim.trace import schema as S

from .recorder import Recorder, profiling
from .runner import ModelRunner, StepPlan

# (device index, role) -> the stream every run of this process issues that role's work to
_PROCESS_STREAMS: dict[tuple[int, str], torch.cuda.Stream] = {}
# steps whose events may be alive at once: the step resolved, the one in flight, the step the
# next resolution is chained from, and the one being launched
RING = 4


@dataclass
class Streams:
    h2d: torch.cuda.Stream | None
    compute: torch.cuda.Stream | None
    d2h: torch.cuda.Stream | None

    @classmethod
    def create(cls, device: torch.device, three: bool) -> Streams:
        """The process's streams on ``device``: one compute stream that every run's forward
        goes to, whichever engine, and on three streams two copy streams beside it, each made
        by the first run that needs it: a run on stream objects the process had not used
        before (the async run after a sync one, as engine=compare runs them) had a decode
        forward 37-177 us longer on the H200 (an H200 recording)."""
        if device.type != "cuda":
            return cls(None, None, None)
        compute = process_stream(device, "compute")
        if not three:
            return cls(compute, compute, compute)
        return cls(process_stream(device, "h2d"), compute, process_stream(device, "d2h"))

    @property
    def cuda(self) -> bool:
        return self.compute is not None

    @property
    def mode(self) -> str | None:
        """engine.streams' word for what the loop runs on; None on a CPU."""
        if not self.cuda:
            return None
        return "one" if self.h2d is self.compute else "three"


def process_stream(device: torch.device, role: str) -> torch.cuda.Stream:
    index = device.index if device.index is not None else torch.cuda.current_device()
    key = (index, role)
    if key not in _PROCESS_STREAMS:
        _PROCESS_STREAMS[key] = torch.cuda.Stream(index)
    return _PROCESS_STREAMS[key]


class EventRing:
    """Per step: (h2d start, h2d_done, compute start, compute_done, d2h start, d2h_done); the
    start marks are None with tracing off."""

    def __init__(self, timing: bool) -> None:
        self.timing = timing
        self.sets = [_event_set(timing) for _ in range(RING)]

    def get(self, step: int) -> tuple:
        return self.sets[step % RING]


def _event_set(timing: bool) -> tuple:
    if timing:
        return tuple(torch.cuda.Event(enable_timing=True) for _ in range(6))
    return (None, torch.cuda.Event(), None, torch.cuda.Event(), None, torch.cuda.Event())


def launch(
    runner: ModelRunner, plan: StepPlan, st: Streams, ev: tuple | None, rec: Recorder, row: int
) -> torch.cuda.Event | None:
    """Enqueue the step; returns the event the host waits on (None on a CPU: already done)."""
    fwd = S.GRAPH_REPLAY if plan.pieces else S.FORWARD
    if not st.cuda:
        t0 = perf_counter()
        runner.copy_in(plan)
        t1 = perf_counter()
        _compute(runner, plan, fwd)
        t2 = perf_counter()
        rec.forward_submitted(row, t2)
        runner.copy_out(plan)
        rec.cpu_ops(row, t0, t1, t2, perf_counter())
        return None
    a, h2d_done, b, compute_done, c, d2h_done = ev
    slot = plan.slot
    three = st.h2d is not st.compute

    def forward() -> None:
        _compute(runner, plan, fwd)
        rec.forward_submitted(row, perf_counter())

    # the loop runs with the compute stream current; the copies switch to their own. The H2D
    # copy waits for the last forward that read this slot
    _stage(st.h2d, three, slot.last_compute_done, a, h2d_done, lambda: runner.copy_in(plan))
    _stage(st.compute, three, h2d_done, b, compute_done, forward)
    _stage(st.d2h, three, compute_done, c, d2h_done, lambda: runner.copy_out(plan))
    if three:
        torch.cuda.set_stream(st.compute)
    slot.last_compute_done = compute_done
    return d2h_done


def _stage(
    stream: torch.cuda.Stream,
    three: bool,
    after: torch.cuda.Event | None,
    start: torch.cuda.Event | None,
    done: torch.cuda.Event,
    work: Callable[[], None],
) -> None:
    """One op of the step, the same for all three: on three streams, switch to its stream and
    wait for the event of what it reads (one stream keeps order by itself); mark its start when
    tracing, enqueue it, record its end."""
    if three:
        torch.cuda.set_stream(stream)
        if after is not None:
            stream.wait_event(after)
    if start is not None:
        start.record(stream)
    work()
    done.record(stream)


def _compute(runner: ModelRunner, plan: StepPlan, fwd: str) -> None:
    """The forward; inside a torch.profiler range `forward#N` / `graph_replay#N` while one runs
    (what the Kineto importer finds steps by)."""
    if profiling():
        with torch.profiler.record_function(f"{fwd}#{plan.batch.step}"):
            runner.compute(plan)
    else:
        runner.compute(plan)
