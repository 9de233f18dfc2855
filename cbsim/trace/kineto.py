"""Import a PyTorch profiler (Kineto) trace into cbsim's trace format (source ``"kineto"``).

So the timeline of an engine not written here (transformers' own continuous batching under
``torch.profiler``, say) opens in the same report and is measured by the same metrics:

- **GPU**: every kernel, memcpy and memset goes to a lane by its CUDA stream. The stream that ran
  the most kernels is ``compute``; a stream whose copies are mostly host-to-device is ``h2d``, one
  mostly device-to-host ``d2h``; any other stream gets its own lane ``stream:N``. Copies keep their
  ``bytes``.
- **Steps**: each forward is found from a host range marker: ``record_function`` ranges whose name
  matches ``step_marker`` (default: ``forward`` or ``forward#N``, also ``graph_replay``), else
  ``ProfilerStep#N``, else each ``cudaGraphLaunch`` (then the compute kernels launched eagerly
  between two launches form one eager forward, if there are enough of them). A kernel belongs
  to the step whose marker encloses its launch (the CUDA runtime call it is correlated with).
  On the compute lane a step is ONE span, named
  ``graph_replay`` when it was launched by ``cudaGraphLaunch``, else ``forward``, from its first
  kernel's start to its last kernel's end (as the simulator and the runtime record a forward:
  the gaps between its kernels count as busy), with ``kernels`` and ``kernel_busy_us`` in args.
  Compute-stream kernels outside any step are spans of their own.
- **Host**: the busiest host thread's ``user_annotation``, ``cpu_op`` and CUDA runtime events, the
  outermost ones only (the host lane is one thread, so its spans never nest). Synchronize calls
  (``cuda*Synchronize``) are named ``wait``; ranges named like a host phase keep that name.

Times are shifted so the trace starts at 0. A file that cannot be imported raises ``TraceError``
with the reason. Command line: ``python -m cbsim.trace.kineto IN.json[.gz] OUT.json[.gz]``; the
report of the result: ``python -m cbsim.report OUT.json[.gz]``. The GPU side (lanes, steps, the
per-kernel table) is cbsim/trace/kineto_gpu.py.
"""

from __future__ import annotations

import math
import os
import re
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from cbsim.config.cli import Parser, existing_file, positive_int, writable_file
from cbsim.trace import schema as S
from cbsim.trace.builder import TraceBuilder
from cbsim.trace.checks import check_timed, validate
from cbsim.trace.errors import TraceError
from cbsim.trace.io import write_trace
from cbsim.trace.kineto_gpu import GRAPH_LAUNCH, MAX_NAME, gpu_spans, graph_launch, stream_lanes
from cbsim.trace.load import DEFAULT_MAX_BYTES, DEFAULT_MAX_EVENTS, load_json
from cbsim.trace.model import Trace

DEFAULT_STEP_MARKER = r"^(forward|graph_replay)(#\d+)?$"
PROFILER_STEP = re.compile(r"^ProfilerStep#\d+$")
HOST_CATS = ("user_annotation", "cpu_op", "cuda_runtime", "cuda_driver")
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
KINETO_CATS = set(HOST_CATS) | set(GPU_CATS) | {"gpu_user_annotation", "python_function"}
SYNC_CALLS = re.compile(r"^cuda(Stream|Event|Device)Synchronize$")


def import_kineto(
    path: str | os.PathLike[str],
    step_marker: str = DEFAULT_STEP_MARKER,
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_events: int = DEFAULT_MAX_EVENTS,
) -> Trace:
    """Read a Kineto JSON trace (``.json`` or ``.json.gz``) and return it as a cbsim Trace; a file
    past ``max_bytes`` (decompressed) or ``max_events`` is refused before it is parsed."""
    path = Path(path)
    obj = load_json(path, max_bytes, what="Kineto trace", max_events=max_events)
    try:
        return convert(obj, step_marker=step_marker, name=path.name)
    except TraceError as exc:
        raise TraceError(f"{path}: {exc}") from None


def _check(obj: Any) -> list[dict[str, Any]]:
    if not isinstance(obj, dict) or not isinstance(obj.get("traceEvents"), list):
        raise TraceError('not a Kineto trace: expected an object with a "traceEvents" list')
    other = obj.get("otherData")
    if isinstance(other, dict) and other.get("schema") == S.SCHEMA_NAME:
        raise TraceError("this is already a cbsim trace: read it with cbsim.trace.read_trace")
    spans = []
    for i, e in enumerate(obj["traceEvents"]):
        if not isinstance(e, dict):
            raise TraceError(f"event {i} is not an object")
        if e.get("ph") != "X" or e.get("cat") not in KINETO_CATS:
            continue
        check_timed(e, i, "event")
        if not isinstance(e.get("name"), str):
            raise TraceError(f"event {i} has no name")
        spans.append(e)
    if not spans:
        raise TraceError(
            "no profiler events (cpu_op, user_annotation, kernel, gpu_memcpy ...): not a "
            "torch.profiler / Kineto trace, or an empty one"
        )
    return spans


def convert(obj: Any, step_marker: str = DEFAULT_STEP_MARKER, name: str = "") -> Trace:
    """The conversion itself, on a parsed Kineto object (see the module docstring)."""
    events = _check(obj)
    t0 = min(e["ts"] for e in events)
    host_thread = _host_thread(events)
    host = sorted(
        (e for e in events if e["cat"] in HOST_CATS and (e["pid"], e["tid"]) == host_thread),
        key=lambda e: (e["ts"], -e["dur"]),
    )
    gpu = sorted((e for e in events if e["cat"] in GPU_CATS), key=lambda e: e["ts"])
    # a graph launch is one runtime call behind many kernels (CUPTI may not name it: CUDA 13
    # on the H200 gave transformers' graph launches the name "INVALID")
    per_call = Counter(e["args"].get("correlation") for e in gpu if e["cat"] == "kernel")
    graph_calls = {c for c, n in per_call.items() if n > 1 and c is not None}
    for e in host:
        if e["name"] == GRAPH_LAUNCH and "correlation" in e.get("args", {}):
            graph_calls.add(e["args"]["correlation"])
    host = [
        {**e, "name": GRAPH_LAUNCH}
        if e["name"] != GRAPH_LAUNCH and graph_launch(e, graph_calls)
        else e
        for e in host
    ]
    markers, found = _step_markers(host, step_marker, graph_calls)
    lanes = stream_lanes(gpu)
    launch_of = {
        e["args"]["correlation"]: e
        for e in host
        if e["cat"] in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})
    }

    b = TraceBuilder(
        "kineto",
        {
            "engine": "",
            "kineto": {
                "file": name,
                "step_marker": step_marker,
                "steps_from": found,
                "streams": {str(s): lane for s, lane in sorted(lanes.items())},
                "devices": [
                    d.get("name") for d in obj.get("deviceProperties", []) if isinstance(d, dict)
                ],
                "cuda_runtime_version": obj.get("cuda_runtime_version"),
                "base_time_ns": obj.get("baseTimeNanoseconds"),
            },
        },
    )
    steps = gpu_spans(b, gpu, lanes, markers, launch_of, t0, found == GRAPH_LAUNCH, graph_calls)
    _host_spans(b, host, markers, t0)
    b.other_data["kineto"]["steps"] = steps
    trace = b.build()
    _no_overlap(trace)
    return trace


def _host_thread(events: list[dict[str, Any]]) -> tuple[Any, Any] | None:
    """The thread that launches the GPU work (transformers' generate_batch runs its loop in a
    thread of its own, not the one that called it)."""
    counts = Counter(
        (e["pid"], e["tid"]) for e in events if e["cat"] in ("cuda_runtime", "cuda_driver")
    )
    if not counts:
        counts = Counter(
            (e["pid"], e["tid"]) for e in events if e["cat"] in ("cpu_op", "user_annotation")
        )
    if not counts:
        counts = Counter((e["pid"], e["tid"]) for e in events if e["cat"] in HOST_CATS)
    return counts.most_common(1)[0][0] if counts else None


def _step_markers(
    host: list[dict[str, Any]], step_marker: str, graph_calls: set = frozenset()
) -> tuple[list[tuple[float, float]], str]:
    """Host intervals of the forwards, in time order, and what they were found from."""
    try:
        pattern = re.compile(step_marker)
    except re.error as exc:
        raise TraceError(
            f"step_marker {step_marker!r} is not a regular expression ({exc})"
        ) from None
    ann = [e for e in host if e["cat"] == "user_annotation"]
    found = "step_marker"
    chosen = [e for e in ann if pattern.search(e["name"])]
    if not chosen:
        found, chosen = "ProfilerStep", [e for e in ann if PROFILER_STEP.match(e["name"])]
    if not chosen:  # an engine without ranges: each graph launch is a forward
        found, chosen = GRAPH_LAUNCH, [e for e in host if graph_launch(e, graph_calls)]
    # a marker nested in another marker is part of the same step
    out: list[tuple[float, float]] = []
    for e in sorted(chosen, key=lambda e: e["ts"]):
        if out and e["ts"] < out[-1][1]:
            continue
        out.append((e["ts"], e["ts"] + e["dur"]))
    return out, found if out else "none"


def _host_spans(b: TraceBuilder, host, markers, t0) -> None:
    """The outermost host events (host is sorted by start, longest first on ties)."""
    end = -math.inf
    for e in host:
        if PROFILER_STEP.match(e["name"]):
            continue
        if e["ts"] < end:  # nested in (or overlapping) the previous outermost event
            continue
        end = e["ts"] + e["dur"]
        name = e["name"]
        if SYNC_CALLS.match(name):
            name = S.WAIT
        b.span(
            S.HOST,
            name[:MAX_NAME],
            e["ts"] - t0,
            e["dur"],
            step=_host_step(e, markers),
            op=e["cat"],
        )


def _host_step(e: dict[str, Any], markers: list[tuple[float, float]]) -> int:
    """The step of the last marker started at or before the event (0 before the first)."""
    lo, hi = 0, len(markers)
    while lo < hi:
        mid = (lo + hi) // 2
        if markers[mid][0] <= e["ts"]:
            lo = mid + 1
        else:
            hi = mid
    return max(lo - 1, 0) if markers else -1


def _no_overlap(trace: Trace) -> None:
    """Beyond CUPTI's timestamp jitter (``_settle``), an overlap on one lane means the stream
    mapping is wrong."""
    validate(trace.to_json_obj())


def main(argv: list[str] | None = None) -> int:
    """python -m cbsim.trace.kineto IN OUT [STEP_REGEX]"""
    p = Parser(
        "python -m cbsim.trace.kineto",
        "A torch.profiler (Kineto) trace as a cbsim trace: GPU lanes by CUDA stream, one\n"
        "span per forward, the busiest host thread as the host lane.\n\n"
        "    python -m cbsim.trace.kineto profile.json.gz k.json.gz\n"
        "    python -m cbsim.report k.json.gz -o report.html",
    )
    p.add_argument("input", type=existing_file, metavar="IN", help="the Kineto trace (.json[.gz])")
    p.add_argument("output", type=writable_file, metavar="OUT", help="the cbsim trace to write")
    p.add_argument(
        "step_marker",
        nargs="?",
        metavar="STEP_REGEX",
        help="the host ranges that mark a forward (default: forward, forward#N, graph_replay)",
    )
    p.add_argument(
        "--max-mb",
        type=positive_int,
        default=DEFAULT_MAX_BYTES >> 20,
        help="refuse a trace larger than this, decompressed (default %(default)s; the whole file "
        "is parsed in memory, about 6x its size)",
    )
    p.add_argument(
        "--max-events",
        type=positive_int,
        default=DEFAULT_MAX_EVENTS,
        help="refuse a trace with more events than this (default %(default)s)",
    )
    args = p.parse(argv)
    if isinstance(args, int):
        return args
    try:
        trace = import_kineto(
            args.input,
            args.step_marker or DEFAULT_STEP_MARKER,
            max_bytes=args.max_mb << 20,
            max_events=args.max_events,
        )
    except TraceError as exc:
        print(f"cbsim: {exc}", file=sys.stderr)
        return 1
    path = write_trace(trace, args.output)
    k = trace.other_data["kineto"]
    print(f"{path}: {k['steps']} steps, streams {k['streams']}")
    print(f"report: python -m cbsim.report {path} -o report.html")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
