"""Collects trace events in memory; both back ends write through this one class."""

from __future__ import annotations

from typing import Any

from cbsim.trace import schema as S
from cbsim.trace.model import Trace


def _round(t: float) -> float:
    # nanosecond resolution keeps traces byte-identical across runs and platforms
    return round(float(t), 3)


class TraceBuilder:
    """Appends Chrome trace events; lanes are declared up front so empty lanes still exist."""

    def __init__(self, source: str, other_data: dict[str, Any] | None = None) -> None:
        if source not in S.SOURCES:
            raise ValueError(f"trace source {source!r}; allowed: {', '.join(S.SOURCES)}")
        self.events: list[dict[str, Any]] = []
        self.other_data: dict[str, Any] = {
            "schema": S.SCHEMA_NAME,
            "version": S.SCHEMA_VERSION,
            "source": source,
            **(other_data or {}),
        }
        self._declared: set[str] = set()
        for lane in (*S.REQUIRED_LANES, S.REQUESTS):
            self.declare_lane(lane)

    def declare_lane(self, lane: str) -> None:
        if lane in self._declared:
            return
        pid, tid = S.LANE_IDS[lane]
        if not any(S.LANE_IDS[d][0] == pid for d in self._declared):
            self.events.append(
                {
                    "ph": "M",
                    "name": "process_name",
                    "pid": pid,
                    "tid": 0,
                    "args": {"name": S.PROCESS_NAMES[pid]},
                }
            )
        self.events.append(
            {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": lane}}
        )
        self._declared.add(lane)

    def span(
        self,
        lane: str,
        name: str,
        ts: float,
        dur: float,
        *,
        step: int = -1,
        slot: int = -1,
        requests: int = 0,
        query_tokens: int = 0,
        kv_tokens: int = 0,
        kind: str = "",
        **extra: Any,
    ) -> None:
        """A complete ("X") event: a host phase or a stream operation."""
        if lane not in self._declared:
            self.declare_lane(lane)
        pid, tid = S.LANE_IDS[lane]
        cat = "host" if lane == S.HOST else "gpu"
        args = {
            "step": step,
            "slot": slot,
            "requests": requests,
            "query_tokens": query_tokens,
            "kv_tokens": kv_tokens,
            "kind": kind,
        }
        if extra:
            args.update(extra)
        self.events.append(
            {
                "ph": "X",
                "name": name,
                "cat": cat,
                "pid": pid,
                "tid": tid,
                "ts": _round(ts),
                "dur": _round(dur),
                "args": args,
            }
        )

    def instant(self, lane: str, name: str, ts: float, cat: str = "request", **args: Any) -> None:
        if lane not in self._declared:
            self.declare_lane(lane)
        pid, tid = S.LANE_IDS[lane]
        self.events.append(
            {
                "ph": "i",
                "s": "t",
                "name": name,
                "cat": cat,
                "pid": pid,
                "tid": tid,
                "ts": _round(ts),
                "args": args,
            }
        )

    def request_event(self, name: str, ts: float, rid: int, **args: Any) -> None:
        self.instant(S.REQUESTS, name, ts, cat="request", rid=rid, **args)

    def hazard(
        self, lane: str, ts: float, kind: str, step: int, slot: int, detail: str = ""
    ) -> None:
        if kind not in S.HAZARD_KINDS:
            raise ValueError(f"hazard kind {kind!r}; allowed: {', '.join(S.HAZARD_KINDS)}")
        self.instant(
            lane, S.HAZARD, ts, cat="hazard", kind=kind, step=step, slot=slot, detail=detail
        )

    def counter(self, name: str, ts: float, **values: float) -> None:
        pid, _ = S.LANE_IDS[S.HOST]
        self.events.append(
            {"ph": "C", "name": name, "pid": pid, "tid": 0, "ts": _round(ts), "args": values}
        )

    def build(self) -> Trace:
        return Trace(events=self.events, other_data=self.other_data)
