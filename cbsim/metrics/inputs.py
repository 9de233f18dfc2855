"""What every metric is computed from: a trace's fold (cbsim.trace.fold) and the run's metadata.

A trace gives its tables through ``inputs_from_trace``, folded at once; a back end can build
the same tables directly (``MetricInputs(spans=..., instants=..., ...)``), or fold them as it
runs and hand over the fold alone (``MetricInputs(fold=..., ...)``: a simulation without a
trace, in memory that does not grow with its steps). Times are microseconds, rounded to the
nanosecond as a trace stores them (``round(t, 3)``), so every route gives the same numbers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from cbsim.trace import schema as S
from cbsim.trace.errors import TraceError
from cbsim.trace.fold import TraceFold, in_time_order
from cbsim.trace.merge import is_merged
from cbsim.trace.model import Trace

# spans: one row per complete event (host phase or stream op); a span without a batch has
# step -1, requests/tokens 0 and kind ""
SPAN_FIELDS: dict[str, Any] = {
    "lane": "",
    "name": "",
    "ts": 0.0,
    "dur": 0.0,
    "step": -1,
    "requests": 0,
    "query_tokens": 0,
    "kv_tokens": 0,
    "kind": "",
    "new_tokens": 0,
    "launch_bound_us": 0.0,
}
# instants: request lifecycle events (lane "requests": arrival, first_token, finish with the
# request's rid, arrival also with its prompt_len, finish with its tokens) and hazards (name
# "hazard", with their kind)
INSTANT_FIELDS: dict[str, Any] = {
    "lane": "",
    "name": "",
    "ts": 0.0,
    "rid": np.nan,
    "tokens": np.nan,
    "prompt_len": np.nan,
    "kind": "",
}


@dataclass
class MetricInputs:
    """The tables metrics read (columns: SPAN_FIELDS and INSTANT_FIELDS; ``end`` = ts + dur is
    added when missing), folded (``fold``: given, or the tables' own), and the run's metadata
    (a trace's otherData)."""

    spans: pd.DataFrame | None = None
    instants: pd.DataFrame | None = None
    # every lane the run declared: a declared lane with no spans is busy 0%
    lanes: list[str] = field(default_factory=list)
    source: str = ""
    engine: str = ""
    # otherData.memory, .config (the resolved run config as a dict), .counters
    memory: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] | None = None
    counters: dict[str, Any] | None = None
    # otherData.hardware: the machine a recording measured (its copy rate), or the profile
    hardware: dict[str, Any] | None = None
    # what metrics read: the tables' fold when not given
    fold: TraceFold | None = None

    def __post_init__(self) -> None:
        spans = with_columns(self.spans, SPAN_FIELDS)
        if "end" not in spans:
            spans = spans.assign(end=spans["ts"] + spans["dur"])
        self.spans = in_time_order(spans)
        self.instants = with_columns(self.instants, INSTANT_FIELDS)
        if self.fold is None:
            self.fold = TraceFold.of(self.spans, self.instants)


def with_columns(
    frame: pd.DataFrame | dict[str, Any] | None, fields: dict[str, Any]
) -> pd.DataFrame:
    """A frame (or dict of columns, or none) with every field present (missing ones at their
    default)."""
    if frame is None:
        frame = {k: [] for k in fields}
    frame = pd.DataFrame(frame) if not isinstance(frame, pd.DataFrame) else frame
    missing = {k: d for k, d in fields.items() if k not in frame}
    if missing:
        frame = frame.assign(**{k: [d] * len(frame) for k, d in missing.items()})
    return frame


def inputs_from_trace(trace: Trace) -> MetricInputs:
    """The metric tables of a trace (its cached span and instant views); a merged trace holds
    several runs, each measured on its own (cbsim.trace.split_merged)."""
    other = trace.other_data
    if is_merged(other):
        raise TraceError(
            f"a merged trace of {', '.join(map(str, other.get('runs', [])))}: measure each run "
            "(cbsim.trace.read_traces / split_merged)"
        )
    inst = trace.instants
    keep = [c for c in INSTANT_FIELDS if c in inst]
    memory = other.get("memory")
    config = other.get("config")
    counters = other.get("counters")
    hardware = other.get("hardware")
    return MetricInputs(
        spans=trace.spans,
        instants=inst[keep],
        lanes=[lane for lane in trace.lanes if lane != S.REQUESTS],
        source=trace.source,
        engine=trace.engine,
        memory=memory if isinstance(memory, dict) else {},
        config=config if isinstance(config, dict) else None,
        counters=counters if isinstance(counters, dict) else None,
        hardware=hardware if isinstance(hardware, dict) else None,
    )
