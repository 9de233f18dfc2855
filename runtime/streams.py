"""Streams, events and the launch of one step: H2D copy -> forward -> D2H copy.

Both engines launch a step the same way; they differ in the streams they pass and in the loop
around it. The async engine passes three non-default streams (H2D, compute, D2H) ordered by
events: H2D records `h2d_done`, compute waits on it and records `compute_done`, D2H waits on that
and records `d2h_done`, on which the host later blocks. The sync engine passes one non-default
stream as all three (the waits are then no-ops). On a CPU there are no streams: every op runs
synchronously and is timed with perf_counter.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .runner import ModelRunner, StepPlan
from .recorder import Recorder, batch_args, profiler_range
from cbsim.trace import schema as S


@dataclass
class Streams:
    h2d: torch.cuda.Stream | None
    compute: torch.cuda.Stream | None
    d2h: torch.cuda.Stream | None

    @classmethod
    def create(cls, device: torch.device, three: bool) -> Streams:
        if device.type != "cuda":
            return cls(None, None, None)
        if not three:
            one = torch.cuda.Stream(device)
            return cls(one, one, one)
        return cls(*(torch.cuda.Stream(device) for _ in range(3)))

    @property
    def cuda(self) -> bool:
        return self.compute is not None


class SlotEvents:
    """Reusable ordering events per slot (tracing off: no timing, nothing allocated per step)."""

    def __init__(self, n: int) -> None:
        self.events = [tuple(torch.cuda.Event() for _ in range(3)) for _ in range(n)]


def launch(
    runner: ModelRunner, plan: StepPlan, st: Streams, rec: Recorder, slot_events: SlotEvents | None
):
    """Enqueue the step; returns the event the host waits on (None on a CPU: already done)."""
    slot = plan.slot
    args = batch_args(plan.batch, slot.index)
    fwd = S.GRAPH_REPLAY if plan.bucket is not None else S.FORWARD
    nsample = plan.layout.num_sample
    if not st.cuda:
        t0 = rec.now()
        runner.copy_in(plan)
        t1 = rec.now()
        with profiler_range(f"{fwd}#{plan.batch.step}"):
            runner.compute(plan)
        t2 = rec.now()
        runner.copy_out(plan)
        t3 = rec.now()
        rec.op(S.H2D, S.COPY_H2D, t0, t1, args, bytes=plan.num_entries * 8)
        plan.forward_args = rec.op(S.COMPUTE, fwd, t1, t2, args, new_tokens=nsample)
        rec.op(S.D2H, S.COPY_D2H, t2, t3, args, bytes=nsample * 8)
        return None
    timing = rec.enabled
    if timing:
        h2d_done, compute_done, d2h_done = (torch.cuda.Event(enable_timing=True) for _ in range(3))
    else:
        h2d_done, compute_done, d2h_done = slot_events.events[slot.index]
    with torch.cuda.stream(st.h2d):
        if slot.last_compute_done is not None and st.h2d is not st.compute:
            st.h2d.wait_event(slot.last_compute_done)  # the last forward that read this slot
        a = rec.mark(st.h2d) if timing else None
        runner.copy_in(plan)
        h2d_done.record(st.h2d)
    with torch.cuda.stream(st.compute):
        st.compute.wait_event(h2d_done)
        b = rec.mark(st.compute) if timing else None
        with profiler_range(f"{fwd}#{plan.batch.step}"):
            runner.compute(plan)
        compute_done.record(st.compute)
    with torch.cuda.stream(st.d2h):
        st.d2h.wait_event(compute_done)
        c = rec.mark(st.d2h) if timing else None
        runner.copy_out(plan)
        d2h_done.record(st.d2h)
    slot.last_compute_done = compute_done
    if timing:
        rec.op(S.H2D, S.COPY_H2D, a, h2d_done, args, bytes=plan.num_entries * 8)
        plan.forward_args = rec.op(S.COMPUTE, fwd, b, compute_done, args, new_tokens=nsample)
        rec.op(S.D2H, S.COPY_D2H, c, d2h_done, args, bytes=nsample * 8)
    return d2h_done
