"""The GPU side of the Kineto import (cbsim.trace.kineto): streams to lanes, kernels to steps,
one span per step on the compute lane, and the per-kernel GPU time of each kind of step."""

from __future__ import annotations

import bisect
import math
from collections import Counter, defaultdict
from typing import Any

import numpy as np

from cbsim.trace import schema as S
from cbsim.trace.builder import TraceBuilder
from cbsim.trace.kernel_category import kernel_category

GRAPH_LAUNCH = "cudaGraphLaunch"
MAX_NAME = 120
# overlap of two operations on one stream that is clock jitter, not a wrong mapping (us)
OVERLAP_TOLERANCE_US = 1.0
# the per-kernel table (otherData.kineto.kernels): how many names per kind of step, how long
TOP_KERNELS = 20
# what a step or a stream spends GPU time on: kernels and the profiler's copies
GPU_WORK = ("kernel", "gpu_memcpy", "gpu_memset")
MAX_KERNEL_NAME = 240
OUTSIDE_STEPS = "outside steps"
EXTRA_LANE_PREFIX = "stream:"
EXTRA_TID = 16


def graph_launch(e: dict[str, Any], graph_calls: set) -> bool:
    return e["cat"] in ("cuda_runtime", "cuda_driver") and (
        e["name"] == GRAPH_LAUNCH or e.get("args", {}).get("correlation") in graph_calls
    )


def stream_lanes(gpu: list[dict[str, Any]]) -> dict[int, str]:
    kernels = Counter(e["args"].get("stream") for e in gpu if e["cat"] == "kernel")
    h2d = Counter(e["args"].get("stream") for e in gpu if "HtoD" in e["name"])
    d2h = Counter(e["args"].get("stream") for e in gpu if "DtoH" in e["name"])
    lanes: dict[int, str] = {}
    if kernels:
        lanes[kernels.most_common(1)[0][0]] = S.COMPUTE
    for counter, lane in ((h2d, S.H2D), (d2h, S.D2H)):
        for stream, _ in counter.most_common():
            if stream not in lanes:
                lanes[stream] = lane
                break
    for e in gpu:
        stream = e["args"].get("stream")
        if stream not in lanes:
            lanes[stream] = _extra_lane(stream)
    return lanes


def _extra_lane(stream: Any) -> str:
    """A lane of its own for a stream that is none of the three (``declare_extra_lanes``)."""
    return f"{EXTRA_LANE_PREFIX}{stream}"


def declare_extra_lanes(b: TraceBuilder, lanes: dict[Any, str]) -> None:
    """Name the lanes of the other streams, on the gpu process: thread 16 + the stream's
    number (CUDA stream ids are integers), or past 1000 for a stream named otherwise."""
    pid = S.LANE_IDS[S.COMPUTE][0]
    others = [(s, lane) for s, lane in lanes.items() if lane.startswith(EXTRA_LANE_PREFIX)]
    for i, (stream, lane) in enumerate(others):
        tid = EXTRA_TID + (stream if isinstance(stream, int) and stream >= 0 else 1000 + i)
        b.declare_lane(lane, (pid, tid))


def _step_of(ts: float, markers: list[tuple[float, float]]) -> int:
    """Index of the marker enclosing a host time, -1 when none does (markers are sorted)."""
    lo, hi = 0, len(markers) - 1
    while lo <= hi:
        mid = (lo + hi) // 2
        s, e = markers[mid]
        if ts < s:
            hi = mid - 1
        elif ts > e:
            lo = mid + 1
        else:
            return mid
    return -1


def gpu_spans(
    b: TraceBuilder, gpu, lanes, markers, launch_of, t0, group_eager: bool, graph_calls: set
) -> int:
    """One span per step on the compute lane; everything else kernel by kernel. With graph
    launches as the only markers, the compute kernels launched eagerly between two of them form
    one eager forward when there are enough of them (a quarter of a replay's kernels)."""
    declare_extra_lanes(b, lanes)
    steps: dict[Any, dict[str, Any]] = defaultdict(
        lambda: {"start": math.inf, "end": -math.inf, "busy": 0.0, "kernels": 0, "graph": False}
    )
    loose = []
    starts = [m[0] for m in markers]
    for e in gpu:
        lane, args = lanes[e["args"].get("stream")], e["args"]
        launch = launch_of.get(args.get("correlation"))
        step = _step_of(launch["ts"], markers) if launch is not None else -1
        key: Any = step
        if step < 0 and group_eager and launch is not None and lane == S.COMPUTE:
            key = ("eager", bisect.bisect_right(starts, launch["ts"]))
        if lane == S.COMPUTE and e["cat"] == "kernel" and key != -1:
            f = steps[key]
            f["start"], f["end"] = min(f["start"], e["ts"]), max(f["end"], e["ts"] + e["dur"])
            f["busy"] += e["dur"]
            f["kernels"] += 1
            f["graph"] |= graph_launch(launch, graph_calls)
            f.setdefault("members", []).append(e)
            continue
        loose.append((e, lane, step))
    replays = [f["kernels"] for k, f in steps.items() if not isinstance(k, tuple)]
    least = max(0.25 * float(np.median(replays)), 2) if replays else 2
    for k in [k for k, f in steps.items() if isinstance(k, tuple) and f["kernels"] < least]:
        loose += [(e, S.COMPUTE, -1) for e in steps.pop(k)["members"]]
    ordered = sorted(steps.values(), key=lambda f: f["start"])
    loose = _absorb(ordered, loose)
    spans = [
        (
            S.COMPUTE,
            S.GRAPH_REPLAY if f["graph"] else S.FORWARD,
            f["start"] - t0,
            f["end"] - f["start"],
            {"step": i, "kernels": f["kernels"], "kernel_busy_us": round(f["busy"], 3)},
        )
        for i, f in enumerate(ordered)
    ]
    for e, lane, step in loose:
        extra = {"bytes": e["args"]["bytes"]} if "bytes" in e["args"] else {}
        spans.append((lane, _gpu_name(e), e["ts"] - t0, e["dur"], {"step": step, **extra}))
    for lane, name, ts, dur, args in _settle(spans):
        b.span(lane, name, ts, dur, **args)
    b.other_data["kineto"]["kernels"] = kernel_table(ordered, loose)
    return len(ordered)


def kernel_table(ordered: list[dict[str, Any]], loose: list, top: int = TOP_KERNELS) -> dict:
    """GPU time per kernel name, per kind of step (``graph_replay`` / ``forward``: how the step
    ran) and ``outside steps`` (kernels on any stream no step holds): for each kind its steps,
    its kernel time, the ``top`` kernels by time with their share of that kind's time, and the
    GPU time (kernels and copies) by category (kernel_category.py)."""
    groups: dict[str, dict[str, Any]] = {}
    for f in ordered:
        kind = S.GRAPH_REPLAY if f["graph"] else S.FORWARD
        g = groups.setdefault(kind, {"steps": 0, "kernels": []})
        g["steps"] += 1
        g["kernels"].extend(e for e in f.get("members", []) if e["cat"] in GPU_WORK)
    rest = [e for e, _lane, _step in loose if e["cat"] in GPU_WORK]
    if rest:
        groups[OUTSIDE_STEPS] = {"steps": 0, "kernels": rest}
    out = {}
    for kind, g in groups.items():
        time_by: Counter[str] = Counter()
        calls: Counter[str] = Counter()
        categories: Counter[str] = Counter()
        for e in g["kernels"]:
            categories[kernel_category(e["name"], e["cat"])] += e["dur"]
            if e["cat"] != "kernel":
                continue
            name = e["name"][:MAX_KERNEL_NAME]
            time_by[name] += e["dur"]
            calls[name] += 1
        busy = sum(time_by.values())
        out[kind] = {
            "steps": g["steps"],
            "kernel_us": round(busy, 3),
            "categories": {c: round(us, 3) for c, us in categories.most_common()},
            "top": [
                {
                    "name": name,
                    "us": round(us, 3),
                    "share": round(us / busy, 6) if busy > 0 else 0.0,
                    "calls": calls[name],
                }
                for name, us in time_by.most_common(top)
            ],
        }
    return out


def _settle(spans: list[tuple]) -> list[tuple]:
    """CUPTI's timestamps of back-to-back operations on one stream can overlap by a few tens of
    nanoseconds (transformers' generate_batch on the H200: a memset 32 ns into the kernel before
    it): the later one starts where the earlier ended. A larger overlap stays, and is rejected."""
    out, end = [], {}
    for lane, name, ts, dur, args in sorted(spans, key=lambda s: (s[0], s[2])):
        prev = end.get(lane, -math.inf)
        if ts < prev <= ts + OVERLAP_TOLERANCE_US:
            dur, ts = max(0.0, dur - (prev - ts)), prev
        end[lane] = max(prev, ts + dur)
        out.append((lane, name, ts, dur, args))
    return out


def _absorb(ordered: list[dict[str, Any]], loose: list) -> list:
    """A compute kernel that ran inside a step's span (its launch was not matched) is part of it:
    a stream runs one thing at a time, so it cannot be a span of its own there."""
    starts = [f["start"] for f in ordered]
    keep = []
    for e, lane, step in loose:
        i = bisect.bisect_right(starts, e["ts"]) - 1
        if lane == S.COMPUTE and i >= 0 and e["ts"] + e["dur"] <= ordered[i]["end"]:
            ordered[i]["kernels"] += 1
            ordered[i]["busy"] += e["dur"]
            ordered[i].setdefault("members", []).append(e)
            continue
        keep.append((e, lane, step))
    return keep


def _gpu_name(e: dict[str, Any]) -> str:
    if e["cat"] == "gpu_memcpy":
        if "HtoD" in e["name"]:
            return S.COPY_H2D
        if "DtoH" in e["name"]:
            return S.COPY_D2H
    return e["name"][:MAX_NAME]
