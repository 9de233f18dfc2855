"""The GPU side of the Kineto import (cbsim.trace.kineto): streams to lanes, kernels to steps,
one span per step on the compute lane, and the per-kernel GPU time of each kind of step."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from cbsim.trace import schema as S
from cbsim.trace.builder import TraceBuilder
from cbsim.trace.kernel_category import kernel_category
from cbsim.trace.kineto_events import (
    ABSENT,
    GPU_CATS,
    KERNEL,
    ODD_BYTES,
    RUNTIME,
    Table,
    first_appearance,
    most_common,
    name_table,
    ordered_sums,
)

GRAPH_LAUNCH = "cudaGraphLaunch"
MAX_NAME = 120
# overlap of two operations on one stream that is clock jitter, not a wrong mapping (us)
OVERLAP_TOLERANCE_US = 1.0
# the per-kernel table (otherData.kineto.kernels): how many names per kind of step, how long
TOP_KERNELS = 20
MAX_KERNEL_NAME = 240
OUTSIDE_STEPS = "outside steps"
EXTRA_LANE_PREFIX = "stream:"
EXTRA_TID = 16


@dataclass
class Launch:
    """Per GPU operation (in GPU order), the host call that launched it, matched by correlation
    id: whether there is one, when it started, and whether it is a graph launch."""

    found: np.ndarray
    ts: np.ndarray
    graph: np.ndarray


def launches(host: Table, graph: np.ndarray, gpu: Table) -> Launch:
    """The launching call of each GPU operation: the runtime or driver call of the host thread
    with its correlation id (the last one in host order, where ids repeat)."""
    sel = np.flatnonzero(np.isin(host.cat, RUNTIME) & (host.corr != ABSENT))
    order = np.argsort(host.corr[sel], kind="stable")
    keys, pos = host.corr[sel][order], sel[order]
    last = np.append(keys[1:] != keys[:-1], True) if len(keys) else np.empty(0, bool)
    keys, pos = keys[last], pos[last]
    if not len(keys):
        none = np.zeros(len(gpu.ts), bool)
        return Launch(none, np.zeros(len(gpu.ts)), none)
    i = np.minimum(np.searchsorted(keys, gpu.corr), len(keys) - 1)
    found = (keys[i] == gpu.corr) & (gpu.corr != ABSENT)
    at = np.where(found, pos[i], 0)
    return Launch(found, host.ts[at], found & graph[at])


def stream_lanes(gpu: Table, names: list[str]) -> dict[int | None, str]:
    """The lane of each CUDA stream (None: operations without one), in the order they are
    assigned: compute, h2d, d2h, then the others as they first appear."""
    streams = gpu.key
    lanes: dict[int | None, str] = {}
    kernels = streams[gpu.cat == KERNEL]
    if len(kernels):
        lanes[_stream(most_common(kernels)[0][0])] = S.COMPUTE
    for marker, lane in (("HtoD", S.H2D), ("DtoH", S.D2H)):
        copies = streams[name_table(names, lambda n, m=marker: m in n)[gpu.name]]
        for stream in most_common(copies)[0].tolist():
            if _stream(stream) not in lanes:
                lanes[_stream(stream)] = lane
                break
    for stream in first_appearance(streams).tolist():
        lanes.setdefault(_stream(stream), _extra_lane(_stream(stream)))
    return lanes


def _stream(v: int) -> int | None:
    return None if v == ABSENT else int(v)


def _lane_codes(gpu: Table, lanes: dict[int | None, str]) -> np.ndarray:
    """Per GPU operation, the index of its lane in ``lanes``."""
    keys = np.array([ABSENT if s is None else s for s in lanes], np.int64)
    order = np.argsort(keys)
    return order[np.searchsorted(keys[order], gpu.key)]


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


def steps_of(ts: np.ndarray, markers: list[tuple[float, float]]) -> np.ndarray:
    """``_step_of`` of many times: markers are sorted and do not overlap, so the one enclosing
    a time is the last started at or before it; where two touch at that very time, the one
    the binary search meets."""
    if not markers:
        return np.full(len(ts), -1)
    starts, ends = (np.array(m, np.float64) for m in zip(*markers))
    i = np.searchsorted(starts, ts, "right") - 1
    out = np.where((i >= 0) & (ts <= ends[np.maximum(i, 0)]), i, -1)
    for j in np.flatnonzero((out > 0) & (ends[np.maximum(out - 1, 0)] >= ts)):
        out[j] = _step_of(float(ts[j]), markers)
    return out


@dataclass
class Steps:
    """The steps on the compute lane, in time order: their first start, last end and kind,
    and their operations (``member``, GPU positions) grouped by step (``of``), each step's in
    the order they add up: its own kernels, then those absorbed."""

    start: np.ndarray
    end: np.ndarray
    graph: np.ndarray
    member: np.ndarray
    of: np.ndarray


def gpu_spans(
    b: TraceBuilder,
    gpu: Table,
    lanes: dict[int | None, str],
    markers: list[tuple[float, float]],
    launch: Launch,
    t0: float,
    group_eager: bool,
    names: list[str],
    odd_bytes: dict[int, Any],
) -> int:
    """One span per step on the compute lane; everything else operation by operation. With
    graph launches as the only markers, the compute kernels launched eagerly between two of
    them form one eager forward when there are enough of them (a quarter of a replay's
    kernels)."""
    declare_extra_lanes(b, lanes)
    lane_names = list(lanes.values())
    lane = _lane_codes(gpu, lanes)
    compute = lane == lane_names.index(S.COMPUTE) if S.COMPUTE in lane_names else lane < 0
    step = np.full(len(gpu.ts), -1)
    step[launch.found] = steps_of(launch.ts[launch.found], markers)
    key = step.copy()
    if group_eager:
        eager = (step < 0) & launch.found & compute
        starts = np.array([m[0] for m in markers], np.float64)
        key[eager] = len(markers) + np.searchsorted(starts, launch.ts[eager], "right")
    in_step = compute & (gpu.cat == KERNEL) & (key != -1)
    steps, loose = _group(gpu, key, in_step, launch.graph, len(markers))
    steps, loose = _absorb(gpu, steps, loose, compute)
    spans = [
        (
            S.COMPUTE,
            S.GRAPH_REPLAY if g else S.FORWARD,
            s - t0,
            e - s,
            {"step": i, "kernels": n, "kernel_busy_us": round(busy, 3)},
        )
        for i, (s, e, g, n, busy) in enumerate(_step_rows(gpu, steps))
    ]
    for j in loose.tolist():
        args: dict[str, Any] = {"step": int(step[j])}
        if gpu.nbytes[j] != ABSENT:
            nbytes = gpu.nbytes[j]
            args["bytes"] = odd_bytes[int(gpu.row[j])] if nbytes == ODD_BYTES else int(nbytes)
        ts, dur = float(gpu.ts[j]), float(gpu.dur[j])
        spans.append((lane_names[lane[j]], _gpu_name(names, gpu, j), ts - t0, dur, args))
    for lane_name, name, ts, dur, args in _settle(spans):
        b.span(lane_name, name, ts, dur, **args)
    b.other_data["kineto"]["kernels"] = kernel_table(gpu, names, _kinds(steps, loose))
    return len(steps.start)


def _group(
    gpu: Table, key: np.ndarray, in_step: np.ndarray, graph: np.ndarray, n_markers: int
) -> tuple[Steps, np.ndarray]:
    """The steps of the kernels with a key (a marker's index, or past the markers an eager
    group's), and the operations outside them, in the order they are drawn. An eager group of
    fewer than a quarter of a replay's kernels (at least 2) is no step."""
    mem = np.flatnonzero(in_step)
    uniq, first, inv = np.unique(key[mem], return_index=True, return_inverse=True)
    rank = np.argsort(np.argsort(first, kind="stable"), kind="stable")  # in order of appearance
    g = rank[inv.reshape(-1)]
    order = np.argsort(g, kind="stable")
    mem, g = mem[order], g[order]
    bounds = np.flatnonzero(np.diff(g, prepend=-1))
    counts = np.diff(np.append(bounds, len(g)))
    gkey = key[mem[bounds]] if len(mem) else np.empty(0, np.int64)
    replays = counts[gkey < n_markers]
    least = max(0.25 * float(np.median(replays)), 2) if len(replays) else 2
    dropped = (gkey >= n_markers) & (counts < least)
    loose = np.concatenate((np.flatnonzero(~in_step), mem[dropped[g]]))
    kept = ~dropped[g]
    mem, g = mem[kept], g[kept]
    ts, end = gpu.ts[mem], gpu.ts[mem] + gpu.dur[mem]
    bounds = np.flatnonzero(np.diff(g, prepend=-1))
    start = np.minimum.reduceat(ts, bounds) if len(mem) else ts
    stop = np.maximum.reduceat(end, bounds) if len(mem) else end
    graphs = np.logical_or.reduceat(graph[mem], bounds) if len(mem) else graph[mem]
    by_start = np.argsort(start, kind="stable")
    index = np.empty_like(by_start)
    index[by_start] = np.arange(len(by_start))
    of = index[np.cumsum(np.diff(g, prepend=-1) != 0) - 1] if len(mem) else g
    return Steps(start[by_start], stop[by_start], graphs[by_start], mem, of), loose


def _absorb(
    gpu: Table, steps: Steps, loose: np.ndarray, compute: np.ndarray
) -> tuple[Steps, np.ndarray]:
    """A compute operation that ran inside a step's span (its launch was not matched) is part
    of it: a stream runs one thing at a time, so it cannot be a span of its own there. It
    joins the last step started at or before it, after that step's own kernels."""
    ts = gpu.ts[loose]
    i = np.searchsorted(steps.start, ts, "right") - 1
    inside = np.zeros(len(loose), bool)
    if len(steps.start):
        inside = compute[loose] & (i >= 0) & (ts + gpu.dur[loose] <= steps.end[np.maximum(i, 0)])
    member = np.concatenate((steps.member, loose[inside]))
    of = np.concatenate((steps.of, i[inside]))
    order = np.argsort(of, kind="stable")
    grouped = Steps(steps.start, steps.end, steps.graph, member[order], of[order])
    return grouped, loose[~inside]


def _step_rows(gpu: Table, steps: Steps) -> list[tuple[float, float, bool, int, float]]:
    """Per step: start, end, graph-launched, operations, and their GPU time as a running
    total over them in order gives it (``ordered_sums``)."""
    _, busy, counts = ordered_sums(steps.of, gpu.dur[steps.member])
    return list(zip(steps.start.tolist(), steps.end.tolist(), steps.graph.tolist(), counts, busy))


def _kinds(steps: Steps, loose: np.ndarray) -> dict[str, tuple[int, np.ndarray]]:
    """The operations (GPU positions) of each kind of step, steps in time order, and of none:
    the kinds in the order they first appear, with their number of steps."""
    out: dict[str, tuple[int, np.ndarray]] = {}
    kind = steps.graph[steps.of]
    for graph in dict.fromkeys(steps.graph.tolist()):
        name = S.GRAPH_REPLAY if graph else S.FORWARD
        out[name] = (int((steps.graph == graph).sum()), steps.member[kind == graph])
    if len(loose):
        out[OUTSIDE_STEPS] = (0, loose)
    return out


def kernel_table(
    gpu: Table, names: list[str], kinds: dict[str, tuple[int, np.ndarray]], top: int = TOP_KERNELS
) -> dict[str, Any]:
    """GPU time per kernel name, per kind of step (``graph_replay`` / ``forward``: how the step
    ran) and ``outside steps`` (kernels on any stream no step holds): for each kind its steps,
    its kernel time, the ``top`` kernels by time with their share of that kind's time, and the
    GPU time (kernels and copies) by category (kernel_category.py)."""
    short: dict[str, int] = {}
    short_id = np.array([short.setdefault(n[:MAX_KERNEL_NAME], len(short)) for n in names])
    short_names = list(short)
    out = {}
    for kind, (steps, ops) in kinds.items():
        cat, name, dur = gpu.cat[ops], gpu.name[ops], gpu.dur[ops]
        kernels = cat == KERNEL
        ids, us, calls = ordered_sums(short_id[name[kernels]], dur[kernels])
        time_by = [(short_names[k], t, c) for k, t, c in zip(ids.tolist(), us, calls)]
        busy = sum(t for _, t, _ in time_by)
        categories = _categories(names, name, cat, dur)
        out[kind] = {
            "steps": steps,
            "kernel_us": round(busy, 3),
            "categories": {
                c: round(t, 3) for c, t in sorted(categories, key=lambda x: x[1], reverse=True)
            },
            "top": [
                {
                    "name": n,
                    "us": round(t, 3),
                    "share": round(t / busy, 6) if busy > 0 else 0.0,
                    "calls": c,
                }
                for n, t, c in sorted(time_by, key=lambda x: x[1], reverse=True)[:top]
            ],
        }
    return out


def _categories(names: list[str], name: np.ndarray, cat: np.ndarray, dur: np.ndarray):
    """(category, GPU time) of the operations, categories in the order they first appear."""
    pairs, inv = np.unique(name.astype(np.int64) * len(GPU_CATS) + cat, return_inverse=True)
    labels: dict[str, int] = {}
    code = np.array(
        [
            labels.setdefault(
                kernel_category(names[p // len(GPU_CATS)], GPU_CATS[p % len(GPU_CATS)]), len(labels)
            )
            for p in pairs.tolist()
        ],
        np.int64,
    )
    ids, us, _ = ordered_sums(code[inv.reshape(-1)] if len(pairs) else inv, dur)
    label = list(labels)
    return [(label[k], t) for k, t in zip(ids.tolist(), us)]


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


def _gpu_name(names: list[str], gpu: Table, j: int) -> str:
    name = names[gpu.name[j]]
    if GPU_CATS[gpu.cat[j]] == "gpu_memcpy":
        if "HtoD" in name:
            return S.COPY_H2D
        if "DtoH" in name:
            return S.COPY_D2H
    return name[:MAX_NAME]
