"""Recording a run into the shared trace format with no objects per span.

During the loop the Recorder writes numbers into arrays preallocated per step (row = the batch's
step): the batch's shape, the five host phases' perf_counter pairs, the scheduler counters, the
stream ops' times. Stream ops are timed with CUDA events from a ring reused step after step
(runtime/streams.py): once the host has waited on a step's `d2h_done` its events are complete and
`resolve` turns them into host times. Each step's first event is measured from the previous
step's (intervals of milliseconds keep the events' float32 milliseconds precise over long runs),
the first one from an anchor recorded on an idle stream at a known host time; a second anchor at
the end measures how far the chained GPU times drifted from the host clock
(otherData.clock_drift_us), which `cbsim.trace.normalize.correct_drift` spreads over the run.
`build()` turns the arrays into trace events after the loop. With tracing off the host phases
are still counted (the run's summary) but no timing event is recorded and no span is written.
"""

from __future__ import annotations

from contextlib import nullcontext
from time import perf_counter
from typing import Any, NamedTuple

import numpy as np
import torch

from cbsim.trace import Trace, TraceBuilder, batch_args, normalize
from cbsim.trace import schema as S

# host phase columns; a step's schedule, prepare, launch, wait, update spans
PH = {name: i for i, name in enumerate(S.HOST_PHASES)}
OPS = ((S.H2D, S.COPY_H2D), (S.COMPUTE, None), (S.D2H, S.COPY_D2H))
FINISH_REASONS = ("", "length", "eos")
_NULL = nullcontext()


class _Row(NamedTuple):
    """A recorded step as `batch_args` reads a batch."""

    step: int
    slot: int
    num_requests: int
    query_tokens: int
    kv_tokens: int
    kind_code: int

    @property
    def kind(self) -> str:
        return S.BATCH_KINDS[self.kind_code]


class Recorder:
    """Per-step arrays (grown by doubling if a run outlasts its estimate) and per-request times."""

    def __init__(self, enabled: bool, device: torch.device, steps: int, requests: int) -> None:
        self.enabled = enabled
        self.cuda = device.type == "cuda"
        self.t0 = perf_counter()
        self.rows = 0  # steps scheduled so far (the highest row + 1)
        n = max(16, steps)
        self.shape = np.zeros((n, 6), np.int64)  # step, slot, requests, query, kv, kind
        self.host = np.zeros((n, len(S.HOST_PHASES), 2))  # perf_counter start, end
        self.ops = np.zeros((n, 3, 2))  # h2d, compute, d2h: start, end (perf_counter seconds)
        self.op_info = np.zeros((n, 4), np.int64)  # graph replay, new tokens, h2d bytes, d2h bytes
        self.count = np.zeros((n, 3), np.int64)  # waiting, running, kv_blocks_used
        self.timed = np.zeros(n, bool)  # the step's stream ops are recorded
        self.submitted = np.zeros(n)  # perf_counter when the host had submitted the forward
        self.arrival = np.zeros(requests)
        self.admit = np.full((requests, 2), np.nan)  # first admission: time, step
        self.first = np.full((requests, 2), np.nan)  # time, step
        self.finish = np.full((requests, 4), np.nan)  # time, step, tokens, reason
        self.prompt_max = np.zeros((requests, 2), np.int64)
        self._anchor: tuple[torch.cuda.Event, float] | None = None
        self._ref: tuple[torch.cuda.Event, float] | None = None  # last resolved first event
        self._lane_end = [0.0, 0.0, 0.0]  # the last resolved end per stream lane
        self.drift_us: float | None = None

    def start(self, stream: torch.cuda.Stream | None, requests: list) -> None:
        """Time zero of the trace; on CUDA also the anchor event (the GPU must be idle)."""
        self.t0 = perf_counter()
        for r in requests:
            self.arrival[r.rid] = self.t0 + r.arrival_s
            self.prompt_max[r.rid] = (r.prompt_len, r.max_new_tokens)
        if self.cuda and self.enabled:
            self._anchor = self._ref = _record_anchor(stream)

    # ------------------------------------------------------------------ in the loop

    def scheduled(self, batch, t0: float, t1: float, sched) -> int:
        """A batch came out of the scheduler: its row, shape, schedule span and counters."""
        row = int(batch.step)
        if row >= len(self.shape):
            self._grow(row)
        self.rows = row + 1
        sh = self.shape[row]
        sh[0] = row
        sh[1] = -1
        sh[2] = batch.num_requests
        sh[3] = batch.query_tokens
        sh[4] = batch.kv_tokens
        sh[5] = S.BATCH_KINDS.index(batch.kind)
        self.host[row, 0] = t0, t1
        c = self.count[row]
        c[0] = sched.num_waiting
        c[1] = sched.num_running
        c[2] = sched.kv_blocks_used
        if batch.num_prefill:  # a request's first admission ends its queue time
            first = batch.rids[(batch.start_pos == 0) & np.isnan(self.admit[batch.rids, 0])]
            self.admit[first] = t0, row
        return row

    def launched(self, row: int, slot: int, t0: float, t1: float, t2: float, plan) -> None:
        self.shape[row, 1] = slot
        self.host[row, 1] = t0, t1
        self.host[row, 2] = t1, t2
        info = self.op_info[row]
        info[0] = plan.pieces  # 0 eager, 1 a decode graph, layers + 1 a piecewise replay
        info[1] = plan.layout.num_sample
        info[2] = 8 * plan.num_entries
        info[3] = 8 * (plan.bucket or plan.layout.num_sample)  # a graph step copies its bucket

    def updated(self, row: int, t0: float, t1: float, t2: float, kept: int) -> None:
        self.host[row, 3] = t0, t1
        self.host[row, 4] = t1, t2
        self.op_info[row, 1] = kept  # outputs sampled after a request's EOS are dropped

    def forward_submitted(self, row: int, t: float) -> None:
        self.submitted[row] = t

    def cpu_ops(self, row: int, t0: float, t1: float, t2: float, t3: float) -> None:
        """A CPU run's stream ops, synchronous: perf_counter times."""
        self.ops[row] = (t0, t1), (t1, t2), (t2, t3)
        self.timed[row] = True

    def resolve(self, row: int, events) -> None:
        """A step's six timing events (start and end of each op, complete) as host times. Ops
        on one stream are in order: a start a nanosecond before the lane's last end is the
        events' float rounding, and starts at that end."""
        ref, t_ref = self._ref
        a = events[0]
        t_a = t_ref + ref.elapsed_time(a) * 1e-3
        o, last = self.ops[row], self._lane_end
        for lane in range(3):
            start = t_a if lane == 0 else t_a + a.elapsed_time(events[2 * lane]) * 1e-3
            end = t_a + a.elapsed_time(events[2 * lane + 1]) * 1e-3
            start = max(start, last[lane])
            o[lane, 0] = start
            o[lane, 1] = last[lane] = max(start, end)
        self.timed[row] = True
        self._ref = (a, t_a)

    def first_token(self, t: float, rids: list[int], step: int) -> None:
        for rid in rids:
            self.first[rid] = t, step

    def finished(self, t: float, rid: int, step: int, tokens: int, reason: str | None) -> None:
        self.finish[rid] = t, step, tokens, FINISH_REASONS.index(reason or "")

    def _grow(self, row: int) -> None:
        n = max(2 * len(self.shape), row + 1)
        for name in ("shape", "host", "ops", "op_info", "count", "timed", "submitted"):
            old = getattr(self, name)
            new = np.zeros((n, *old.shape[1:]), old.dtype)
            new[: len(old)] = old
            setattr(self, name, new)

    # ------------------------------------------------------------------ after the loop

    def host_phase_s(self) -> dict[str, float]:
        """Seconds per host phase over the run (tracing on or off)."""
        d = self.host[: self.rows, :, 1] - self.host[: self.rows, :, 0]
        return {name: float(d[:, i].sum()) for name, i in PH.items()}

    def measure_drift(self) -> None:
        """The end anchor against the chained GPU times (the GPU must be idle)."""
        if self._anchor is None or self.rows == 0:
            return
        torch.cuda.synchronize()
        end_ev, end_host = _record_anchor(None)
        ref, t_ref = self._ref
        self.drift_us = (end_host - (t_ref + ref.elapsed_time(end_ev) * 1e-3)) * 1e6

    def build(self, other_data: dict[str, Any]) -> Trace:
        """The trace: every phase that ended and every step whose stream ops were timed (a run
        interrupted mid-step ends at the last step the host waited for), normalised as
        `cbsim.trace.read_trace` normalises a recorded trace (drift, graph starts), so this
        run's metrics and a later reading of its file agree."""
        tb = TraceBuilder("runtime", other_data)
        if not self.enabled:
            return tb.build()
        us = self._us
        rows = [_Row(*(int(x) for x in self.shape[r])) for r in range(self.rows)]
        for row, b in enumerate(rows):
            args = batch_args(b, slot=b.slot)
            for name, i in PH.items():
                start, end = self.host[row, i]
                if end > 0:
                    tb.host_span(name, us(start), max(0.0, (end - start) * 1e6), args)
        if self.rows:
            tb.declare_lane(S.H2D)
        for row in np.flatnonzero(self.timed[: self.rows]).tolist():
            b = rows[row]
            pieces, new_tokens, h2d_bytes, d2h_bytes = (int(x) for x in self.op_info[row])
            fwd_args = {"new_tokens": new_tokens}
            if pieces > 1:  # a piecewise replay: its graphs, attention eager between them
                fwd_args["pieces"] = pieces
            extras = ({"bytes": h2d_bytes}, fwd_args, {"bytes": d2h_bytes})
            fwd = S.GRAPH_REPLAY if pieces else S.FORWARD
            for (lane, name), (start, end), extra in zip(OPS, self.ops[row], extras):
                ts = us(start)
                tb.add_span(
                    lane,
                    name or fwd,
                    ts,
                    max(0.0, us(end) - ts),
                    batch_args(b, slot=b.slot, **extra),
                )
        self._request_events(tb)
        for row in range(self.rows):
            waiting, running, used = (int(x) for x in self.count[row])
            tb.add_counter(
                S.SCHEDULER_COUNTER,
                us(self.host[row, 0, 1]),
                {"waiting": waiting, "running": running, "kv_blocks_used": used},
            )
        if self.drift_us is not None:
            tb.other_data["clock_drift_us"] = round(self.drift_us, 3)
        post = self._post_graph_host_us()
        if post is not None:
            tb.other_data["post_graph_host_us"] = post
        return normalize(tb.build())

    def _post_graph_host_us(self) -> float | None:
        """Median host time from a graph's submission to the end of its launch (the D2H enqueue
        and the events): how long before the launch ends a replayed graph is in at the latest
        (whole graphs only: a piecewise replay's host launches attention between its pieces)."""
        n = self.rows
        graph = (self.op_info[:n, 0] == 1) & (self.submitted[:n] > 0) & (self.host[:n, 2, 1] > 0)
        if not graph.any():
            return None
        return round(
            float(np.median(self.host[:n, 2, 1][graph] - self.submitted[:n][graph])) * 1e6, 3
        )

    def _request_events(self, tb: TraceBuilder) -> None:
        us = self._us
        for rid in range(len(self.arrival)):
            plen, max_new = (int(x) for x in self.prompt_max[rid])
            tb.request_event(
                S.ARRIVAL, us(self.arrival[rid]), rid, prompt_len=plen, max_new_tokens=max_new
            )
        for rid in np.flatnonzero(~np.isnan(self.admit[:, 0])).tolist():
            t, step = self.admit[rid]
            tb.request_event(S.SCHEDULED, us(t), rid, step=int(step))
        for rid in np.flatnonzero(~np.isnan(self.first[:, 0])).tolist():
            t, step = self.first[rid]
            tb.request_event(S.FIRST_TOKEN, us(t), rid, step=int(step))
        for rid in np.flatnonzero(~np.isnan(self.finish[:, 0])).tolist():
            t, step, tokens, reason = self.finish[rid]
            tb.request_event(
                S.FINISH,
                us(t),
                rid,
                tokens=int(tokens),
                reason=FINISH_REASONS[int(reason)],
                step=int(step),
            )

    def _us(self, t: float) -> float:
        return (t - self.t0) * 1e6


def _record_anchor(stream) -> tuple[torch.cuda.Event, float]:
    torch.cuda.synchronize()
    ev = torch.cuda.Event(enable_timing=True)
    before = perf_counter()
    ev.record(stream)
    after = perf_counter()
    ev.synchronize()
    # the idle stream passes the event within microseconds of the record call
    return ev, 0.5 * (before + after)


def profiling() -> bool:
    """A torch.profiler is running (the loop then marks its phases as profiler ranges)."""
    return torch._C._autograd._profiler_enabled()


def profiler_range(name: str):
    """A torch.profiler range (what the Kineto importer finds steps and host phases by) while a
    profiler runs; a no-op context otherwise."""
    if torch._C._autograd._profiler_enabled():
        return torch.profiler.record_function(name)
    return _NULL
