"""One trace file holding several runs (sync and async of a compare run), each run one named
Perfetto process, so the two timelines sit one above the other on one time axis.

In the merged trace run k (0-based, in the order given) is process ``k + 1`` named by its label,
and each of its lanes is a thread of that process (``MERGED_TIDS``); flow and async ids are
offset by ``k << 32`` so runs never share one. ``otherData.runs`` lists the labels in process
order and ``otherData.merged`` maps each label to that run's own otherData, which is what
``split_merged`` needs to give the runs back as they were.
"""

from __future__ import annotations

from typing import Any

from cbsim.trace import schema as S
from cbsim.trace.builder import lane_metadata
from cbsim.trace.errors import TraceError
from cbsim.trace.model import Trace
from cbsim.trace.perfetto import with_derived

MERGED_TIDS = {S.HOST: 1, S.H2D: 2, S.COMPUTE: 3, S.D2H: 4, S.DEFAULT: 5, S.REQUESTS: 6}
FIRST_EXTRA_TID = 16
ID_STRIDE = 1 << 32


def merge_traces(traces: dict[str, Trace]) -> Trace:
    """One trace of the runs, labelled (for example {"sync": ..., "async": ...})."""
    if not traces:
        raise ValueError("merge_traces needs at least one trace")
    events: list[dict[str, Any]] = []
    for k, (label, trace) in enumerate(traces.items()):
        events.extend(_as_process(with_derived(trace), label, k + 1, k * ID_STRIDE))
    first = next(iter(traces.values())).other_data
    other = {
        "schema": S.SCHEMA_NAME,
        "version": S.SCHEMA_VERSION,
        "source": first.get("source", ""),
        "engine": "+".join(traces),
        # the runs in process order (a JSON object's keys are written sorted)
        "runs": list(traces),
        "merged": {label: t.other_data for label, t in traces.items()},
    }
    return Trace(events=events, other_data=other)


def _as_process(trace: Trace, label: str, pid: int, id_offset: int) -> list[dict[str, Any]]:
    lane_of = trace.lane_of
    tids = dict(MERGED_TIDS)
    for lane in lane_of.values():
        tids.setdefault(lane, FIRST_EXTRA_TID + len(tids) - len(MERGED_TIDS))
    out = [_meta("process_name", pid, 0, label), _meta("process_sort_index", pid, 0, pid)]
    for lane in dict.fromkeys(lane_of.values()):
        out.extend(lane_metadata("thread", pid, tids[lane], lane, tids[lane]))
    for e in trace.events:
        if e.get("ph") == "M":
            continue
        # a counter on the host process has tid 0, no lane: it keeps tid 0
        lane = lane_of.get((e.get("pid"), e.get("tid")))
        moved = {**e, "pid": pid, "tid": tids[lane] if lane else 0}
        if "id" in e and isinstance(e["id"], int):
            moved["id"] = e["id"] + id_offset
        out.append(moved)
    return out


def _meta(name: str, pid: int, tid: int, value: Any) -> dict[str, Any]:
    key = "sort_index" if name.endswith("sort_index") else "name"
    return {"ph": "M", "name": name, "pid": pid, "tid": tid, "args": {key: value}}


def is_merged(other_data: dict[str, Any]) -> bool:
    return isinstance(other_data.get("merged"), dict)


def split_merged(trace: Trace) -> dict[str, Trace]:
    """The runs of a merged trace, each with its own lanes and otherData (a trace that is not
    merged comes back as the one run, under its engine's name)."""
    if not is_merged(trace.other_data):
        return {trace.engine or trace.source: trace}
    merged = trace.other_data["merged"]
    runs = trace.other_data.get("runs")
    if not isinstance(runs, list) or sorted(map(str, runs)) != sorted(merged):
        raise TraceError("otherData.runs must list the labels of otherData.merged, in order")
    parts = {}
    for k, label in enumerate(runs):
        if not isinstance(merged[label], dict):
            raise TraceError(f"otherData.merged.{label} must be an object")
        parts[label] = _from_process(trace, k + 1, k * ID_STRIDE, merged[label])
    return parts


def _from_process(trace: Trace, pid: int, id_offset: int, other: dict[str, Any]) -> Trace:
    lane_of = {tid: name for (p, tid), name in trace.lane_of.items() if p == pid}
    events: list[dict[str, Any]] = []
    declared: set[int] = set()
    for lane in lane_of.values():
        if lane not in S.LANE_IDS:
            raise TraceError(f"merged process {pid}: lane {lane!r} is not a trace format v1 lane")
        p, t = S.LANE_IDS[lane]
        if p not in declared:
            events.extend(lane_metadata("process", p, 0, S.PROCESS_NAMES[p], p))
            declared.add(p)
        events.extend(lane_metadata("thread", p, t, lane, t))
    for e in trace.events:
        if e.get("ph") == "M" or e.get("pid") != pid:
            continue
        lane = lane_of.get(e.get("tid"))
        p, t = S.LANE_IDS[lane] if lane else (S.LANE_IDS[S.HOST][0], 0)
        back = {**e, "pid": p, "tid": t}
        if isinstance(e.get("id"), int):
            back["id"] = e["id"] - id_offset
        events.append(back)
    return Trace(events=events, other_data=other)
