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

Times are shifted so the trace starts at 0. The file is read as a stream, each event reduced to
the few fields these passes use as it is read (cbsim/trace/kineto_events.py), so memory grows
with the events, about 60 bytes each at the peak, not with the JSON (about 1 KB an event
parsed whole). A file that cannot be imported raises
``TraceError`` with the reason, at the first element that shows it. Command line:
``python -m cbsim.trace.kineto IN.json[.gz] OUT.json[.gz]``; the report of the result:
``python -m cbsim.report OUT.json[.gz]``. The GPU side (lanes, steps, the per-kernel table) is
cbsim/trace/kineto_gpu.py.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np

from cbsim.config.cli import Parser, existing_file, positive_int, writable_file
from cbsim.trace import schema as S
from cbsim.trace.builder import TraceBuilder
from cbsim.trace.checks import validate
from cbsim.trace.errors import TraceError
from cbsim.trace.io import write_trace
from cbsim.trace.kineto_events import (
    ABSENT,
    HOST_CATS,
    KERNEL,
    RUNTIME,
    KinetoEvents,
    Table,
    most_common,
    name_table,
)
from cbsim.trace.kineto_gpu import GRAPH_LAUNCH, MAX_NAME, gpu_spans, launches, stream_lanes
from cbsim.trace.load import read_pieces, stream_object
from cbsim.trace.model import Trace

DEFAULT_STEP_MARKER = r"^(forward|graph_replay)(#\d+)?$"
PROFILER_STEP = re.compile(r"^ProfilerStep#\d+$")
SYNC_CALLS = re.compile(r"^cuda(Stream|Event|Device)Synchronize$")
NOT_KINETO = 'not a Kineto trace: expected an object with a "traceEvents" list'
# The input is read as a stream, keeping a few dozen bytes of each profiler span
# (cbsim/trace/kineto_events.py): the events cap the memory, the decompressed size the time
# (benchmarks/bench_kineto_import.py: 10^7 events, 1.7 GB of JSON, in 0.6 GB and a minute).
KINETO_MAX_EVENTS = 10_000_000
KINETO_MAX_BYTES = 4 << 30


def import_kineto(
    path: str | os.PathLike[str],
    step_marker: str = DEFAULT_STEP_MARKER,
    max_bytes: int = KINETO_MAX_BYTES,
    max_events: int = KINETO_MAX_EVENTS,
) -> Trace:
    """Read a Kineto JSON trace (``.json`` or ``.json.gz``) as a stream and return it as a cbsim
    Trace; reading stops with a TraceError past ``max_bytes`` (decompressed) or ``max_events``
    elements of traceEvents, or at the first element that cannot be one."""
    path = Path(path)
    if not path.is_file():
        raise TraceError(f"{path}: no such Kineto trace file")
    events = KinetoEvents()
    pieces = read_pieces(path, max_bytes)
    try:
        top, count = stream_object(pieces, "traceEvents", events.add, _not_cbsim, max_events)
        if count is None:
            raise TraceError(NOT_KINETO)
        return _build(events, top, step_marker, path.name)
    except TraceError as exc:
        msg = str(exc)
        raise TraceError(msg if msg.startswith(f"{path}: ") else f"{path}: {msg}") from None
    except OSError as exc:
        raise TraceError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    except MemoryError:
        raise TraceError(f"{path}: not enough memory to import it (max_events)") from None
    finally:
        pieces.close()  # a file refused part way is closed now, not when collected


def convert(obj: Any, step_marker: str = DEFAULT_STEP_MARKER, name: str = "") -> Trace:
    """The conversion of a Kineto trace parsed whole (see the module docstring); the same
    result as ``import_kineto`` of its file."""
    if not isinstance(obj, dict) or not isinstance(obj.get("traceEvents"), list):
        raise TraceError(NOT_KINETO)
    _not_cbsim("otherData", obj.get("otherData"))
    events = KinetoEvents()
    for i, e in enumerate(obj["traceEvents"]):
        events.add(i, e)
    return _build(events, obj, step_marker, name)


def _not_cbsim(key: str, value: Any) -> None:
    if key == "otherData" and isinstance(value, dict) and value.get("schema") == S.SCHEMA_NAME:
        raise TraceError("this is already a cbsim trace: read it with cbsim.trace.read_trace")


def _build(events: KinetoEvents, top: dict[str, Any], step_marker: str, name: str) -> Trace:
    if not events.spans:
        raise TraceError(
            "no profiler events (cpu_op, user_annotation, kernel, gpu_memcpy ...): not a "
            "torch.profiler / Kineto trace, or an empty one"
        )
    pattern = _compile(step_marker)
    graph_id = events.name_id(GRAPH_LAUNCH)
    names = events.name_list()
    host, gpu = events.release()
    host.keep(_host_rows(host))
    gpu.keep(np.argsort(gpu.ts, kind="stable"))
    # a graph launch is one runtime call behind many kernels (CUPTI may not name it: CUDA 13
    # on the H200 gave transformers' graph launches the name "INVALID")
    graph_calls = _graph_calls(host, gpu, graph_id)
    runtime = np.isin(host.cat, RUNTIME)
    host.name[runtime & np.isin(host.corr, graph_calls)] = graph_id
    graph = runtime & (host.name == graph_id)
    markers, found = _step_markers(host, graph, names, pattern)
    lanes = stream_lanes(gpu, names)
    props = top.get("deviceProperties")
    b = TraceBuilder(
        "kineto",
        {
            "engine": "",
            "kineto": {
                "file": name,
                "step_marker": step_marker,
                "steps_from": found,
                "streams": {str(s): lane for s, lane in sorted(lanes.items(), key=_stream_order)},
                "devices": [d.get("name") for d in props if isinstance(d, dict)]
                if isinstance(props, list)
                else [],
                "cuda_runtime_version": top.get("cuda_runtime_version"),
                "base_time_ns": top.get("baseTimeNanoseconds"),
            },
        },
    )
    launch = launches(host, graph, gpu)
    group_eager = found == GRAPH_LAUNCH
    steps = gpu_spans(
        b, gpu, lanes, markers, launch, events.t0, group_eager, names, events.odd_bytes
    )
    _host_spans(b, host, names, markers, events.t0)
    b.other_data["kineto"]["steps"] = steps
    trace = b.build()
    _no_overlap(trace)
    return trace


def _stream_order(item: tuple[Any, str]) -> tuple[bool, int]:
    return item[0] is None, item[0] or 0


def _compile(step_marker: str) -> re.Pattern[str]:
    try:
        return re.compile(step_marker)
    except re.error as exc:
        raise TraceError(
            f"step_marker {step_marker!r} is not a regular expression ({exc})"
        ) from None


def _host_rows(host: Table) -> np.ndarray:
    """The rows of the thread that launches the GPU work (transformers' generate_batch runs its
    loop in a thread of its own, not the one that called it), by start, longest first on ties,
    else in file order."""
    thread = None
    ops = tuple(HOST_CATS.index(c) for c in ("cpu_op", "user_annotation"))
    for cats in (RUNTIME, ops, tuple(range(len(HOST_CATS)))):
        threads = host.key[np.isin(host.cat, cats)]
        if len(threads):
            thread = most_common(threads)[0][0]
            break
    rows = np.flatnonzero(host.key == thread) if thread is not None else np.empty(0, np.int64)
    rows = rows[np.argsort(-host.dur[rows], kind="stable")]
    return rows[np.argsort(host.ts[rows], kind="stable")]


def _graph_calls(host: Table, gpu: Table, graph_id: int) -> np.ndarray:
    """The correlation ids of graph launches: of runtime calls behind more than one kernel,
    and of host events named cudaGraphLaunch."""
    corr = gpu.corr[(gpu.cat == KERNEL) & (gpu.corr != ABSENT)]
    uniq, counts = np.unique(corr, return_counts=True)
    named = host.corr[(host.name == graph_id) & (host.corr != ABSENT)]
    return np.union1d(uniq[counts > 1], named)


def _step_markers(
    host: Table, graph: np.ndarray, names: list[str], pattern: re.Pattern[str]
) -> tuple[list[tuple[float, float]], str]:
    """Host intervals of the forwards, in time order, and what they were found from."""
    ann = host.cat == HOST_CATS.index("user_annotation")
    found = "step_marker"
    chosen = ann & name_table(names, pattern.search)[host.name]
    if not chosen.any():
        found, chosen = "ProfilerStep", ann & name_table(names, PROFILER_STEP.match)[host.name]
    if not chosen.any():  # an engine without ranges: each graph launch is a forward
        found, chosen = GRAPH_LAUNCH, graph
    # the host is in time order; a marker nested in another marker is part of the same step
    out: list[tuple[float, float]] = []
    for ts, dur in zip(host.ts[chosen].tolist(), host.dur[chosen].tolist()):
        if out and ts < out[-1][1]:
            continue
        out.append((ts, ts + dur))
    return out, found if out else "none"


def _host_spans(b: TraceBuilder, host: Table, names: list[str], markers, t0: float) -> None:
    """The outermost host events (host is sorted by start, longest first on ties): after one,
    the next that starts at or after its end."""
    keep = ~name_table(names, PROFILER_STEP.match)[host.name]
    ts, dur = host.ts[keep], host.dur[keep]
    cat, name = host.cat[keep], host.name[keep]
    end = ts + dur
    starts = np.array([m[0] for m in markers])
    p, n = 0, len(ts)
    while p < n:
        label = names[name[p]]
        if SYNC_CALLS.match(label):
            label = S.WAIT
        b.span(
            S.HOST,
            label[:MAX_NAME],
            float(ts[p]) - t0,
            float(dur[p]),
            step=_host_step(float(ts[p]), starts),
            op=HOST_CATS[cat[p]],
        )
        p = max(p + 1, int(np.searchsorted(ts, end[p], "left")))


def _host_step(ts: float, starts: np.ndarray) -> int:
    """The step of the last marker started at or before the event (0 before the first)."""
    if not len(starts):
        return -1
    return max(int(np.searchsorted(starts, ts, "right")) - 1, 0)


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
        default=KINETO_MAX_BYTES >> 20,
        help="stop reading past this many MB of JSON, decompressed (default %(default)s): "
        "the file is read as a stream, so this bounds the time (1.7 GB: about a minute), not "
        "the memory",
    )
    p.add_argument(
        "--max-events",
        type=positive_int,
        default=KINETO_MAX_EVENTS,
        help="stop reading past this many events (default %(default)s): the memory grows with "
        "them, about 60 bytes each at the peak (10^7 events: 0.6 GB)",
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
