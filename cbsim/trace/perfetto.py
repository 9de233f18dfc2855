"""Events derived from the spans and request instants a trace already holds, for Perfetto:

- **flows** (``ph`` "s" -> "f", category ``flow``), per step: ``h2d_done`` from its H2D copy to
  the forward that waited on it, ``compute_done`` from the forward to its D2H copy, ``d2h_done``
  from the D2H copy to the host's wait on it. Each end sits in the middle of its slice, so
  Perfetto binds it to that slice (``bp: "e"``) and draws the event waits as arrows.
- **request slices** (nestable async ``ph`` "b"/"e", category ``request_slice``, id = rid) on
  the requests process: ``request <rid>`` from arrival to finish, and inside it ``queued``
  (arrival -> scheduled), ``prefill`` (scheduled -> first token; ``queued + prefill`` when the
  trace has no ``scheduled`` instants) and ``decode`` (first token -> finish). The first two
  together are the request's TTFT. A request still running at the end of the trace (an
  interrupted run) ends at the trace's last time.

Both back ends get them because ``write_trace`` derives them (``with_derived``) from whatever
TraceBuilder built; normalising a trace moves spans, so it derives them again.
"""

from __future__ import annotations

import math
from typing import Any

from cbsim.trace import schema as S
from cbsim.trace.model import Trace

FLOW_CAT = "flow"
REQUEST_SLICE_CAT = "request_slice"

# the span each flow end binds to: (role, lane, span names); a step's first span of a role
ROLES = (
    ("h2d", S.H2D, (S.COPY_H2D,)),
    ("forward", S.COMPUTE, S.FORWARD_NAMES),
    ("d2h", S.D2H, (S.COPY_D2H,)),
    ("wait", S.HOST, (S.WAIT,)),
)
# (flow name, from role, to role)
FLOW_EDGES = (
    ("h2d_done", "h2d", "forward"),
    ("compute_done", "forward", "d2h"),
    ("d2h_done", "d2h", "wait"),
)


def is_derived(e: dict[str, Any]) -> bool:
    cat = e.get("cat")
    return (cat == FLOW_CAT and e.get("ph") in ("s", "f")) or (
        cat == REQUEST_SLICE_CAT and e.get("ph") in ("b", "e")
    )


def with_derived(trace: Trace) -> Trace:
    """The trace with its derived events made again from its (possibly moved) spans (a merged
    trace holds its runs' own: cbsim.trace.merge)."""
    if isinstance(trace.other_data.get("merged"), dict):
        return trace
    base = [e for e in trace.events if not is_derived(e)]
    return Trace(events=[*base, *derived_events(base)], other_data=trace.other_data)


def _collect(events: list[dict[str, Any]]) -> tuple[dict, dict, float]:
    """One pass: each step's first span per role, each request's lifecycle times, the end."""
    role_of = {(name, S.LANE_IDS[lane]): role for role, lane, names in ROLES for name in names}
    requests = S.LANE_IDS[S.REQUESTS]
    wanted = (S.ARRIVAL, S.SCHEDULED, *S.REQUEST_ENDS)
    first: dict[tuple[str, int], dict[str, Any]] = {}
    times: dict[int, dict[str, float]] = {}
    last = -math.inf
    for e in events:
        ph = e.get("ph")
        if ph == "X":
            ts = e["ts"]
            last = max(last, ts + e["dur"])
            role = role_of.get((e["name"], (e["pid"], e["tid"])))
            if role is None:
                continue
            step = (e.get("args") or {}).get("step", -1)
            if isinstance(step, int) and step >= 0:
                key = (role, step)
                prev = first.get(key)
                if prev is None or ts < prev["ts"]:
                    first[key] = e
        elif ph in ("i", "I"):
            ts = e["ts"]
            last = max(last, ts)
            rid = (e.get("args") or {}).get("rid")
            if (e["pid"], e["tid"]) == requests and isinstance(rid, int) and e["name"] in wanted:
                t = times.setdefault(rid, {})
                t[e["name"]] = min(t.get(e["name"], math.inf), ts)
    return first, times, last


def derived_events(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The flows and request slices of a trace's events (see the module docstring)."""
    first, times, last = _collect(events)
    out = []
    steps = sorted({step for (_, step) in first})
    for step in steps:
        for k, (name, src_role, dst_role) in enumerate(FLOW_EDGES):
            src, dst = first.get((src_role, step)), first.get((dst_role, step))
            if src is None or dst is None:
                continue
            fid = step * len(FLOW_EDGES) + k
            out.append(_flow_end("s", name, fid, src, step))
            out.append({**_flow_end("f", name, fid, dst, step), "bp": "e"})
    pid, tid = S.LANE_IDS[S.REQUESTS]
    for rid in sorted(times):
        if S.ARRIVAL in times[rid]:
            out.extend(_one_request(rid, times[rid], last, pid, tid))
    return out


def _flow_end(ph: str, name: str, fid: int, span: dict[str, Any], step: int) -> dict[str, Any]:
    return {
        "ph": ph,
        "name": name,
        "cat": FLOW_CAT,
        "id": fid,
        "pid": span["pid"],
        "tid": span["tid"],
        "ts": round(span["ts"] + span["dur"] / 2, 3),
        "args": {"step": step},
    }


def _one_request(rid: int, t: dict[str, float], last: float, pid: int, tid: int) -> list:
    """b/e pairs, outer first, children in time order (equal times keep this order)."""
    arrival, finish = t[S.ARRIVAL], t.get(S.FINISH, last)
    first, scheduled = t.get(S.FIRST_TOKEN), t.get(S.SCHEDULED)
    phases = []
    if scheduled is not None:
        phases.append(("queued", arrival, scheduled))
    start = arrival if scheduled is None else scheduled
    phases.append(("prefill" if scheduled is not None else "queued + prefill", start, first))
    if first is not None:
        phases.append(("decode", first, finish))
    out = [_slice("b", f"request {rid}", rid, arrival, pid, tid)]
    for name, begin, end in phases:
        end = finish if end is None else end
        out.append(_slice("b", name, rid, begin, pid, tid))
        out.append(_slice("e", name, rid, end, pid, tid))
    out.append(_slice("e", f"request {rid}", rid, finish, pid, tid))
    return out


def _slice(ph: str, name: str, rid: int, ts: float, pid: int, tid: int) -> dict[str, Any]:
    return {
        "ph": ph,
        "name": name,
        "cat": REQUEST_SLICE_CAT,
        "id": rid,
        "pid": pid,
        "tid": tid,
        "ts": round(ts, 3),
        "args": {"rid": rid},
    }
