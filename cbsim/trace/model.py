"""A trace in memory, with tabular views for metrics and reports."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import pandas as pd

STANDARD_ARG_DEFAULTS: dict[str, Any] = {
    "step": -1,
    "slot": -1,
    "requests": 0,
    "query_tokens": 0,
    "kv_tokens": 0,
    "kind": "",
    "new_tokens": 0,
    # the simulator's eager forwards: how long the stream waited inside the span for the host's
    # kernel launches (idle on the GPU; a CUDA event around the forward counts it busy)
    "launch_bound_us": 0.0,
}
SPAN_COLUMNS = ["lane", "name", "cat", "ts", "dur", "end", *STANDARD_ARG_DEFAULTS]


@dataclass
class Trace:
    """Chrome trace events plus otherData; views are built once and cached."""

    events: list[dict[str, Any]]
    other_data: dict[str, Any] = field(default_factory=dict)

    @cached_property
    def lane_of(self) -> dict[tuple[int, int], str]:
        return {
            (e["pid"], e["tid"]): e["args"]["name"]
            for e in self.events
            if e.get("ph") == "M" and e.get("name") == "thread_name"
        }

    @property
    def lanes(self) -> list[str]:
        return list(self.lane_of.values())

    @cached_property
    def spans(self) -> pd.DataFrame:
        """One row per complete event: lane, name, cat, ts, dur, end and the standard args."""
        return self.span_frame()

    def span_frame(self, extra_args: dict[str, Any] | None = None) -> pd.DataFrame:
        """The span table with further args as columns (name -> value when a span lacks it)."""
        lane_of = self.lane_of
        defaults = {**STANDARD_ARG_DEFAULTS, **(extra_args or {})}
        rows = []
        for e in self.events:
            if e.get("ph") != "X":
                continue
            a = e.get("args", {})
            ts, dur = float(e["ts"]), float(e["dur"])
            rows.append(
                (
                    lane_of.get((e["pid"], e["tid"]), "?"),
                    e["name"],
                    e.get("cat", ""),
                    ts,
                    dur,
                    ts + dur,
                    *(a.get(k, d) for k, d in defaults.items()),
                )
            )
        return pd.DataFrame(rows, columns=[*SPAN_COLUMNS[:6], *defaults])

    @cached_property
    def instants(self) -> pd.DataFrame:
        """Instant events (requests, hazards): lane, name, cat, ts and their args flattened."""
        lane_of = self.lane_of
        rows = [
            {
                "lane": lane_of.get((e["pid"], e["tid"]), "?"),
                "name": e["name"],
                "cat": e.get("cat", ""),
                "ts": e["ts"],
                **e.get("args", {}),
            }
            for e in self.events
            if e.get("ph") in ("i", "I")
        ]
        return pd.DataFrame(rows, columns=None if rows else ["lane", "name", "cat", "ts"])

    @cached_property
    def counters(self) -> pd.DataFrame:
        rows = [
            {"name": e["name"], "ts": e["ts"], **e.get("args", {})}
            for e in self.events
            if e.get("ph") == "C"
        ]
        return pd.DataFrame(rows, columns=None if rows else ["name", "ts"])

    @property
    def source(self) -> str:
        return self.other_data.get("source", "")

    @property
    def engine(self) -> str:
        return self.other_data.get("engine", "")

    @property
    def incomplete(self) -> bool:
        """An interrupted run's trace so far (otherData.incomplete: the reason)."""
        return bool(self.other_data.get("incomplete"))

    def mark_incomplete(self, reason: str) -> Trace:
        """The same events, marked as the trace so far of a run that did not finish."""
        return Trace(events=self.events, other_data={**self.other_data, "incomplete": reason})

    @property
    def metadata(self) -> dict[str, Any]:
        """The top-level ``metadata`` block Perfetto shows (Info and stats): otherData's plain
        values; otherData stays the full record."""
        return {
            k: v
            for k, v in self.other_data.items()
            if isinstance(v, (str, int, float, bool)) or v is None
        }

    def to_json_obj(self) -> dict[str, Any]:
        return {"traceEvents": self.events, "otherData": self.other_data, "metadata": self.metadata}
