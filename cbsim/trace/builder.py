"""Collects trace events in memory: the one writer of trace events for every producer.

``span``/``instant``/``counter`` take keyword args and check the lane; the hot path of a
simulator (about 150K spans for a 16K-step run) uses ``add_span``/``host_span``/``add_counter``,
which take a ready args dict (one per step, shared by that step's spans: a built trace is
read-only) and write the identical events.
"""

from __future__ import annotations

from typing import Any

from cbsim.trace import schema as S
from cbsim.trace.model import STANDARD_ARG_DEFAULTS, Trace

# args of a span that belongs to no batch (a schedule that found nothing to run): the standard
# args at the defaults a trace's span table fills in for them
NO_BATCH: dict[str, Any] = {key: STANDARD_ARG_DEFAULTS[key] for key in S.SPAN_ARGS}


def batch_args(batch: Any = None, *, slot: int = -1, **extra: Any) -> dict[str, Any]:
    """The standard span args of a scheduler batch (S.SPAN_ARGS), plus ``extra``.

    Every writer (simulator, runtime, tests) builds a span's args here, so the keys and their
    types are the same in every trace. ``batch`` is a cbsim.scheduler.Batch, or None for a span
    that belongs to no batch."""
    if batch is None:
        return {**NO_BATCH, "slot": int(slot), **extra}
    return {
        "step": int(batch.step),
        "slot": int(slot),
        "requests": int(batch.num_requests),
        "query_tokens": int(batch.query_tokens),
        "kv_tokens": int(batch.kv_tokens),
        "kind": str(batch.kind),
        **extra,
    }


def _round(t: float) -> float:
    # nanosecond resolution keeps traces byte-identical across runs and platforms
    return round(t, 3)


def span_times(ts: float, dur: float) -> tuple[float, float]:
    """A span's written ts and dur (us, to the nanosecond): the rounded start, and the rounded
    end minus it. Rounding the duration by itself would put a span's end up to a nanosecond
    past the next span's start, and Perfetto would nest the next span inside it."""
    start = round(ts, 3)
    return start, round(round(ts + dur, 3) - start, 3)


def lane_metadata(kind: str, pid: int, tid: int, name: str, order: int) -> list[dict[str, Any]]:
    """A process's or a thread's name and sort index: Perfetto orders processes and lanes by
    their index (cpu, gpu, requests; host, H2D, compute, D2H), not by when they first appear."""
    return [
        {"ph": "M", "name": f"{kind}_name", "pid": pid, "tid": tid, "args": {"name": name}},
        {
            "ph": "M",
            "name": f"{kind}_sort_index",
            "pid": pid,
            "tid": tid,
            "args": {"sort_index": order},
        },
    ]


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
        self._ids: dict[str, tuple[int, int]] = {}
        self._host_pid, self._host_tid = S.LANE_IDS[S.HOST]
        for lane in (*S.REQUIRED_LANES, S.REQUESTS):
            self.declare_lane(lane)

    def declare_lane(self, lane: str, ids: tuple[int, int] | None = None) -> None:
        """Name a lane (thread_name metadata; process_name for the first lane of a process).
        ``ids``: the (pid, tid) of a lane the format does not name (a Kineto import's other
        streams); the format's lanes have theirs in S.LANE_IDS."""
        if lane in self._ids:
            return
        pid, tid = ids if ids is not None else S.LANE_IDS[lane]
        if not any(p == pid for p, _ in self._ids.values()):
            self.events.extend(lane_metadata("process", pid, 0, S.PROCESS_NAMES[pid], pid))
        self.events.extend(lane_metadata("thread", pid, tid, lane, tid))
        self._ids[lane] = (pid, tid)

    # ---- keyword API --------------------------------------------------------------------
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
        self.declare_lane(lane)
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
        self.add_span(lane, name, float(ts), float(dur), args)

    def instant(self, lane: str, name: str, ts: float, cat: str = "request", **args: Any) -> None:
        self.declare_lane(lane)
        pid, tid = self._ids[lane]
        self.events.append(
            {
                "ph": "i",
                "s": "t",
                "name": name,
                "cat": cat,
                "pid": pid,
                "tid": tid,
                "ts": _round(float(ts)),
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
        self.add_counter(name, float(ts), values)

    # ---- hot path: a ready args dict, lanes declared beforehand ----------------------------
    def add_span(self, lane: str, name: str, ts: float, dur: float, args: dict[str, Any]) -> None:
        """span() with its args dict built by the caller (``batch_args``); ``lane`` must be
        declared. The dict is stored as it is: do not change it afterwards unless on purpose."""
        pid, tid = self._ids[lane]
        start = round(ts, 3)  # span_times, inline: a call per span is a tenth of its cost
        self.events.append(
            {
                "ph": "X",
                "name": name,
                "cat": "host" if pid == self._host_pid else "gpu",
                "pid": pid,
                "tid": tid,
                "ts": start,
                "dur": round(round(ts + dur, 3) - start, 3),
                "args": args,
            }
        )

    def host_span(self, name: str, ts: float, dur: float, args: dict[str, Any]) -> None:
        """add_span() on the host lane (the hottest call: five per step)."""
        start = round(ts, 3)  # span_times, inline
        self.events.append(
            {
                "ph": "X",
                "name": name,
                "cat": "host",
                "pid": self._host_pid,
                "tid": self._host_tid,
                "ts": start,
                "dur": round(round(ts + dur, 3) - start, 3),
                "args": args,
            }
        )

    def add_counter(self, name: str, ts: float, values: dict[str, Any]) -> None:
        """A counter ("C") sample on the host process (the scheduler's track)."""
        self.events.append(
            {
                "ph": "C",
                "name": name,
                "pid": self._host_pid,
                "tid": 0,
                "ts": _round(ts),
                "args": values,
            }
        )

    def build(self) -> Trace:
        """The trace (its flows and request slices are derived when it is written)."""
        return Trace(events=self.events, other_data=self.other_data)
