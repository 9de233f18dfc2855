"""A trace in memory, with tabular views for metrics and reports."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import pandas as pd

from cbsim.trace import schema as S

SPAN_COLUMNS = ["lane", "name", "cat", "ts", "dur", "end", *S.SPAN_ARGS, "new_tokens"]


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
        lane_of = self.lane_of
        rows = []
        for e in self.events:
            if e.get("ph") != "X":
                continue
            a = e.get("args", {})
            rows.append(
                (
                    lane_of.get((e["pid"], e["tid"]), "?"),
                    e["name"],
                    e.get("cat", ""),
                    e["ts"],
                    e["dur"],
                    e["ts"] + e["dur"],
                    a.get("step", -1),
                    a.get("slot", -1),
                    a.get("requests", 0),
                    a.get("query_tokens", 0),
                    a.get("kv_tokens", 0),
                    a.get("kind", ""),
                    a.get("new_tokens", 0),
                )
            )
        return pd.DataFrame(rows, columns=SPAN_COLUMNS)

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

    def to_json_obj(self) -> dict[str, Any]:
        return {"traceEvents": self.events, "otherData": self.other_data}
