"""Recording a run into the shared trace format, cheaply.

During the loop the Recorder only appends tuples (host phases: perf_counter pairs; stream ops:
CUDA events with timing, or perf_counter pairs on a CPU, where every op is synchronous). `build()`
turns them into TraceBuilder events at the end: each CUDA event becomes a host-clock time through
ONE anchor event, recorded on an idle stream at a known host time (t = anchor_host +
anchor.elapsed_time(event)); a second anchor at the end measures how far the two clocks drifted
(otherData.clock_drift_us). With tracing off nothing is appended and the engines record no timing
events, only the events they need to order the streams.
"""

from __future__ import annotations

from contextlib import nullcontext
from time import perf_counter
from typing import Any

import torch

from cbsim.trace import Trace, TraceBuilder
from cbsim.trace import schema as S


class Recorder:
    def __init__(self, enabled: bool, device: torch.device) -> None:
        self.enabled = enabled
        self.cuda = device.type == "cuda"
        self.t0 = perf_counter()
        self.host_spans: list[tuple] = []  # (name, start_s, end_s, args)
        self.ops: list[tuple] = []  # (lane, name, start, end, args, extra)
        self.instants: list[tuple] = []  # (name, t_s, rid, extra)
        self.counter_rows: list[tuple] = []  # (t_s, counters dict)
        self._anchor: tuple[torch.cuda.Event, float] | None = None
        self.drift_us: float | None = None

    def start(self, stream: torch.cuda.Stream | None = None) -> None:
        """Time zero of the trace; on CUDA also the anchor event (the GPU must be idle)."""
        self.t0 = perf_counter()
        if self.cuda and self.enabled:
            self._anchor = self._record_anchor(stream)

    def _record_anchor(self, stream) -> tuple[torch.cuda.Event, float]:
        torch.cuda.synchronize()
        ev = torch.cuda.Event(enable_timing=True)
        before = perf_counter()
        ev.record(stream)
        after = perf_counter()
        ev.synchronize()
        # the idle stream passes the event within microseconds of the record call
        return ev, 0.5 * (before + after)

    # ------------------------------------------------------------------ in the loop

    def now(self) -> float:
        return perf_counter()

    def host(self, name: str, start: float, end: float, args: tuple) -> None:
        if self.enabled:
            self.host_spans.append((name, start, end, args))

    def mark(self, stream: torch.cuda.Stream | None):
        """A timestamp on a stream: a timing event on CUDA, perf_counter on a CPU."""
        if not self.cuda:
            return perf_counter()
        ev = torch.cuda.Event(enable_timing=True)
        ev.record(stream)
        return ev

    def op(self, lane: str, name: str, start, end, args: tuple, **extra: Any) -> dict[str, Any]:
        """Record a stream op; returns its extra args (still editable until ``build``)."""
        if self.enabled:
            self.ops.append((lane, name, start, end, args, extra))
        return extra

    def request(self, name: str, t: float, rid: int, **extra: Any) -> None:
        if self.enabled:
            self.instants.append((name, t, rid, extra))

    def counters(self, t: float, values: dict[str, int]) -> None:
        if self.enabled:
            self.counter_rows.append((t, values))

    # ------------------------------------------------------------------ at the end

    def build(self, other_data: dict[str, Any]) -> Trace:
        tb = TraceBuilder("runtime", other_data)
        us = self._host_us
        for name, start, end, args in self.host_spans:
            tb.span(S.HOST, name, us(start), max(0.0, us(end) - us(start)), **_span_args(args))
        if self.ops:
            tb.declare_lane(S.H2D)
        to_us = self._event_us if self.cuda else us
        if self.cuda and self.ops:
            torch.cuda.synchronize()
            ev, host = self._anchor
            end_ev, end_host = self._record_anchor(None)
            predicted = host + ev.elapsed_time(end_ev) * 1e-3
            self.drift_us = (end_host - predicted) * 1e6
        for lane, name, start, end, args, extra in self.ops:
            ts = to_us(start)
            tb.span(lane, name, ts, max(0.0, to_us(end) - ts), **_span_args(args), **extra)
        for name, t, rid, extra in self.instants:
            tb.request_event(name, us(t), rid, **extra)
        for t, values in self.counter_rows:
            tb.counter(S.SCHEDULER_COUNTER, us(t), **values)
        if self.drift_us is not None:
            tb.other_data["clock_drift_us"] = round(self.drift_us, 3)
        return tb.build()

    def _host_us(self, t: float) -> float:
        return (t - self.t0) * 1e6

    def _event_us(self, ev: torch.cuda.Event) -> float:
        anchor, host = self._anchor
        return (host - self.t0) * 1e6 + anchor.elapsed_time(ev) * 1e3


_NULL = nullcontext()


def profiler_range(name: str):
    """A torch.profiler range (what the Kineto importer finds steps and host phases by) while a
    profiler runs; a no-op context otherwise."""
    if torch._C._autograd._profiler_enabled():
        return torch.profiler.record_function(name)
    return _NULL


def batch_args(batch, slot: int) -> tuple:
    return (
        int(batch.step),
        slot,
        len(batch),
        int(batch.query_tokens),
        int(batch.kv_tokens),
        batch.kind,
    )


def _span_args(args: tuple) -> dict[str, Any]:
    step, slot, requests, query_tokens, kv_tokens, kind = args
    return {
        "step": step,
        "slot": slot,
        "requests": requests,
        "query_tokens": query_tokens,
        "kv_tokens": kv_tokens,
        "kind": kind,
    }
