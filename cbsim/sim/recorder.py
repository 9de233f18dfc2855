"""What the simulator records of one run: every span, counter sample, request event and hazard.

The events go to a TraceBuilder through its hot-path writer (``add_span``, ``host_span``,
``add_counter``: a ready args dict, one per step, shared by that step's spans; the trace is
read-only once built). runtime/recorder.py is the runtime's counterpart.
"""

from __future__ import annotations

from typing import Any

from cbsim.trace import TraceBuilder


class Recorder:
    """The run's trace writer, lanes declared up front."""

    def __init__(self, builder: TraceBuilder, lanes: tuple[str, ...]) -> None:
        self.builder = builder
        for lane in lanes:
            builder.declare_lane(lane)
        self.span = builder.add_span
        self.host_span = builder.host_span
        self.counter = builder.add_counter

    def request_event(self, name: str, ts: float, rid: int, **args: Any) -> None:
        self.builder.request_event(name, ts, rid, **args)

    def hazard(self, lane: str, ts: float, kind: str, step: int, slot: int, detail: str) -> None:
        self.builder.hazard(lane, ts, kind, step, slot, detail)

    @property
    def num_events(self) -> int:
        return len(self.builder.events)
