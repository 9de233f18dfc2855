"""Checking a parsed trace object against format v1: every field a reader relies on has the
type it needs, so anything that passes can be measured and drawn without another error.

The event-level checks (``is_number``, ``check_timed``) are shared with the Kineto import.
"""

from __future__ import annotations

import math
from typing import Any

from cbsim.trace import schema as S
from cbsim.trace.errors import TraceError
from cbsim.trace.hardware import check_hardware
from cbsim.trace.merge import is_merged, split_merged
from cbsim.trace.model import Trace

# Spans on one stream lane may touch; they may not overlap by more than this (microseconds),
# which absorbs the nanosecond rounding of timestamps.
OVERLAP_TOLERANCE_US = 0.002
# The latest a timestamp or a duration may be (microseconds from the run's start, about 104 days):
# past 2^53 ns a float64 no longer holds the nanosecond a trace stores (round(t, 3)), and a span
# of a few microseconds would read as zero or thousands
MAX_TS_US = 2.0**53 / 1000
# otherData and metadata hold a run config: a few levels deep, never this many
MAX_DEPTH = 32
# span args that metrics group and sum by: integers (``kind`` a string)
INT_ARGS = ("step", "slot", "requests", "query_tokens", "kv_tokens", "new_tokens")
REQUEST_NAMES = S.REQUEST_EVENTS
INSTANT_PHASES = ("i", "I")
FLOW_PHASES = ("s", "t", "f")
ASYNC_PHASES = ("b", "n", "e")
TIMED_PHASES = ("X", "C", *INSTANT_PHASES, *FLOW_PHASES, *ASYNC_PHASES)


def is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def check_timed(e: dict[str, Any], i: int, what: str = "span") -> None:
    """A complete event's ts and dur: finite numbers, dur >= 0."""
    ts, dur = e.get("ts"), e.get("dur")
    if not (is_number(ts) and is_number(dur)):
        raise TraceError(f"{what} {i} ({e.get('name')!r}) needs numeric ts and dur")
    if dur < 0:
        raise TraceError(f"{what} {i} ({e.get('name')!r}) has a negative duration {dur}")


def check_in_range(e: dict[str, Any], i: int) -> None:
    """A cbsim trace's times are from the run's start and within MAX_TS_US of it."""
    ts, dur = e["ts"], e.get("dur", 0.0)
    if abs(ts) > MAX_TS_US or (is_number(dur) and dur > MAX_TS_US):
        raise TraceError(
            f"event {i} ({e.get('name')!r}) at ts={ts:.6g} dur={dur:.6g} us is beyond "
            f"{MAX_TS_US:.3g} us (104 days) from the run's start, where a float64 time no "
            "longer holds a nanosecond"
        )


def validate(obj: Any) -> Trace:
    """Check a parsed trace object against format v1 and return it as a Trace."""
    if not isinstance(obj, dict) or "traceEvents" not in obj:
        raise TraceError('not a trace: expected an object with "traceEvents"')
    events, other = obj["traceEvents"], obj.get("otherData")
    if not isinstance(events, list):
        raise TraceError('"traceEvents" must be a list')
    _check_other(other)
    metadata = obj.get("metadata")
    if metadata is not None:
        _check_tree(metadata, "metadata")
    lanes = _lanes(events)
    if is_merged(other):
        return _validate_merged(events, other)
    missing = [lane for lane in S.REQUIRED_LANES if lane not in lanes.values()]
    if missing:
        raise TraceError(
            f"missing lanes: {', '.join(missing)} (declare them with thread_name metadata)"
        )
    by_lane: dict[str, list[tuple[float, float, int]]] = {}
    for i, e in enumerate(events):
        ph = e["ph"]
        if ph == "X":
            lane = _check_span(e, i, lanes)
            if lane in S.STREAM_LANES:
                by_lane.setdefault(lane, []).append((e["ts"], e["ts"] + e["dur"], i))
        elif ph in TIMED_PHASES:
            _check_point(e, i)
    for lane, spans in by_lane.items():
        _no_overlap(lane, spans)
    return Trace(events=events, other_data=other)


def _validate_merged(events: list[dict[str, Any]], other: dict[str, Any]) -> Trace:
    """A merged trace (cbsim.trace.merge): each of its runs is a valid trace of its own."""
    for i, e in enumerate(events):
        if e["ph"] != "M":
            _check_ids(e, i)
    trace = Trace(events=events, other_data=other)
    for label, part in split_merged(trace).items():
        try:
            validate(part.to_json_obj())
        except TraceError as exc:
            raise TraceError(f"merged run {label!r}: {exc}") from None
    return trace


def _check_other(other: Any) -> None:
    if not isinstance(other, dict):
        raise TraceError(
            '"otherData" missing: it holds the schema version and source (a raw torch.profiler '
            "trace? import it first: python -m cbsim.trace.kineto IN OUT.json.gz)"
        )
    if other.get("schema") != S.SCHEMA_NAME:
        raise TraceError(f"otherData.schema is {other.get('schema')!r}, expected {S.SCHEMA_NAME!r}")
    if other.get("version") != S.SCHEMA_VERSION:
        raise TraceError(
            f"unsupported schema version {other.get('version')!r}; this reader reads version "
            f"{S.SCHEMA_VERSION}"
        )
    if other.get("source") not in S.SOURCES:
        raise TraceError(
            f"otherData.source {other.get('source')!r}; allowed: {', '.join(S.SOURCES)}"
        )
    if not isinstance(other.get("engine", ""), str):
        raise TraceError("otherData.engine must be a string")
    for key in ("config", "memory", "counters", "kineto"):
        if other.get(key) is not None and not isinstance(other[key], dict):
            raise TraceError(f"otherData.{key} must be an object")
    check_hardware(other.get("hardware"))
    _check_tree(other, "otherData")


def _check_tree(obj: Any, where: str) -> None:
    """Nesting at most MAX_DEPTH deep (iteratively: a deep tree cannot exhaust the stack)."""
    stack = [(obj, 0)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise TraceError(f"{where} is nested more than {MAX_DEPTH} levels deep")
        if isinstance(node, dict):
            stack.extend((v, depth + 1) for v in node.values())
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node)


def _lanes(events: list[Any]) -> dict[tuple[int, int], str]:
    """Every event is an object with a string ph; thread_name metadata names the lanes."""
    lanes: dict[tuple[int, int], str] = {}
    for i, e in enumerate(events):
        if not isinstance(e, dict) or not isinstance(e.get("ph"), str):
            raise TraceError(f"event {i} is not an event object with a 'ph' field")
        if "args" in e and not isinstance(e["args"], dict):
            raise TraceError(f"event {i} ({e.get('name')!r}): args must be an object")
        if e["ph"] != "M":
            continue
        if not isinstance(e.get("name"), str):
            raise TraceError(f"metadata event {i} needs a string name")
        if e["name"] in ("thread_name", "process_name"):
            _check_ids(e, i)
            name = e.get("args", {}).get("name")
            if not isinstance(name, str):
                raise TraceError(f"metadata event {i} ({e['name']}) needs a string args.name")
            if e["name"] == "thread_name":
                lanes[(e["pid"], e["tid"])] = name
    return lanes


def _check_ids(e: dict[str, Any], i: int) -> None:
    if not (is_int(e.get("pid")) and is_int(e.get("tid"))):
        raise TraceError(
            f"event {i} ({e.get('name')!r}) needs integer pid and tid, got "
            f"{e.get('pid')!r}/{e.get('tid')!r}"
        )


def _check_span(e: dict[str, Any], i: int, lanes: dict[tuple[int, int], str]) -> str:
    check_timed(e, i)
    check_in_range(e, i)
    if not isinstance(e.get("name"), str):
        raise TraceError(f"span {i} needs a string name")
    _check_ids(e, i)
    lane = lanes.get((e["pid"], e["tid"]))
    if lane is None:
        raise TraceError(
            f"span {i} ({e['name']!r}) is on pid/tid {e['pid']}/{e['tid']}, "
            "which no thread_name metadata names"
        )
    args = e.get("args")
    if args:
        for key in INT_ARGS:
            if key in args and not is_int(args[key]):
                raise TraceError(f"span {i} ({e['name']!r}): args.{key} must be an integer")
        if not isinstance(args.get("kind", ""), str):
            raise TraceError(f"span {i} ({e['name']!r}): args.kind must be a string")
    return lane


def _check_point(e: dict[str, Any], i: int) -> None:
    """Instants, counters, flow and async events: a numeric ts, ids, the args readers use."""
    ph = e["ph"]
    if not is_number(e.get("ts")):
        raise TraceError(f"event {i} ({e.get('name')!r}) has no numeric ts")
    check_in_range(e, i)
    if not isinstance(e.get("name"), str):
        raise TraceError(f"event {i} (ph {ph!r}) needs a string name")
    _check_ids(e, i)
    args = e.get("args", {})
    if ph == "C" and not all(is_number(v) for v in args.values()):
        raise TraceError(f"counter {i} ({e['name']!r}): every value must be a number")
    if ph in INSTANT_PHASES and e["name"] in REQUEST_NAMES:
        if not is_int(args.get("rid")):
            raise TraceError(f"request event {i} ({e['name']!r}) needs an integer args.rid")
        if "tokens" in args and not is_int(args["tokens"]):
            raise TraceError(f"request event {i} ({e['name']!r}): args.tokens must be an integer")
    if ph in INSTANT_PHASES and e["name"] == S.HAZARD and not isinstance(args.get("kind"), str):
        raise TraceError(f"hazard {i} needs a string args.kind")
    if ph in (*FLOW_PHASES, *ASYNC_PHASES) and not (
        is_int(e.get("id")) or isinstance(e.get("id"), str)
    ):
        raise TraceError(f"event {i} ({e['name']!r}, ph {ph!r}) needs an id")


def _no_overlap(lane: str, spans: list[tuple[float, float, int]]) -> None:
    spans.sort()
    _s0, e0, i0 = spans[0]
    for s1, e1, i1 in spans[1:]:
        if s1 < e0 - OVERLAP_TOLERANCE_US:
            raise TraceError(
                f"spans {i0} and {i1} overlap on stream lane {lane!r} ({s1} < {e0}); a stream "
                "executes one operation at a time"
            )
        if e1 > e0:
            e0, i0 = e1, i1


def badly_nested(events: list[dict[str, Any]], limit: int = 10) -> list[str]:
    """Complete events that cross another on their lane (start inside it, end past it), in
    integer nanoseconds as Perfetto reads them: Perfetto makes such a span a child of the one
    it starts in and draws it wrong. Up to ``limit`` descriptions; [] when every lane nests."""
    by_lane: dict[tuple[Any, Any], list[tuple[int, int, int]]] = {}
    for i, e in enumerate(events):
        if e.get("ph") == "X":
            start = round(e["ts"] * 1000)
            by_lane.setdefault((e.get("pid"), e.get("tid")), []).append(
                (start, -(start + round(e["dur"] * 1000)), i)
            )
    out: list[str] = []
    for (pid, tid), spans in by_lane.items():
        spans.sort()
        stack: list[tuple[int, int]] = []  # (end, event index) of the open enclosing spans
        for start, neg_end, i in spans:
            while stack and stack[-1][0] <= start:
                stack.pop()
            if stack and -neg_end > stack[-1][0]:
                j = stack[-1][1]
                out.append(
                    f"pid/tid {pid}/{tid}: span {i} ({events[i]['name']!r}) starts inside span "
                    f"{j} ({events[j]['name']!r}) and ends {-neg_end - stack[-1][0]} ns after it"
                )
                if len(out) >= limit:
                    return out
                continue
            stack.append((-neg_end, i))
    return out
