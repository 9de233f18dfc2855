"""Read, write and validate trace files; a bad file is a TraceError with a reason."""

from __future__ import annotations

import gzip
import json
import math
import os
from pathlib import Path
from typing import Any

from cbsim.rundir import atomic_open
from cbsim.trace import schema as S
from cbsim.trace.model import Trace
from cbsim.trace.normalize import normalize

# Larger files are refused before parsing: the seed workload's full trace is about 40 MB.
DEFAULT_MAX_BYTES = 1 << 30
# Spans on one stream lane may touch; they may not overlap by more than this (microseconds),
# which absorbs the nanosecond rounding of timestamps.
OVERLAP_TOLERANCE_US = 0.002


class TraceError(ValueError):
    """A trace file that cannot be used, with the reason."""


def write_trace(trace: Trace, path: str | os.PathLike[str]) -> Path:
    """Write JSON (gzip when the name ends in .gz); compact and key-sorted so runs compare byte for byte."""
    path = Path(path)
    data = json.dumps(trace.to_json_obj(), separators=(",", ":"), sort_keys=True).encode()
    # atomic: an interrupted write leaves nothing under the final name
    with atomic_open(path) as raw:
        if path.suffix == ".gz":
            # mtime=0 keeps gzip output byte-identical across runs
            with gzip.GzipFile(filename="", fileobj=raw, mode="wb", mtime=0) as f:
                f.write(data)
        else:
            raw.write(data)
    return path


def load_json(
    path: str | os.PathLike[str], max_bytes: int = DEFAULT_MAX_BYTES, what: str = "trace"
) -> Any:
    """Parse a JSON file, gzip or not, refusing it over the size limit (before or after
    decompression); every failure is a TraceError naming the file and the reason."""
    path = Path(path)
    if not path.is_file():
        raise TraceError(f"{path}: no such {what} file")
    size = path.stat().st_size
    if size > max_bytes:
        raise TraceError(f"{path}: {size} bytes is over the limit of {max_bytes} bytes")
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as exc:
            raise TraceError(f"{path}: corrupt gzip data ({exc})") from None
        if len(raw) > max_bytes:
            raise TraceError(
                f"{path}: {len(raw)} bytes uncompressed is over the limit of {max_bytes}"
            )
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise TraceError(f"{path}: not JSON ({exc})") from None


def read_trace(path: str | os.PathLike[str], max_bytes: int = DEFAULT_MAX_BYTES) -> Trace:
    """Read and validate a trace file; a recorded runtime trace comes back normalised
    (cbsim.trace.normalize: clock drift and graph starts corrected)."""
    obj = load_json(path, max_bytes)
    try:
        return normalize(validate(obj))
    except TraceError as exc:
        raise TraceError(f"{path}: {exc}") from None


def validate(obj: Any) -> Trace:
    """Check a parsed trace object against format v1 and return it as a Trace."""
    if not isinstance(obj, dict) or "traceEvents" not in obj:
        raise TraceError('not a trace: expected an object with "traceEvents"')
    events, other = obj["traceEvents"], obj.get("otherData")
    if not isinstance(events, list):
        raise TraceError('"traceEvents" must be a list')
    if not isinstance(other, dict):
        raise TraceError('"otherData" missing: it holds the schema version and source')
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
    lanes: dict[tuple[int, int], str] = {}
    for i, e in enumerate(events):
        if not isinstance(e, dict) or "ph" not in e:
            raise TraceError(f"event {i} is not an event object with a 'ph' field")
        if e["ph"] == "M" and e.get("name") == "thread_name":
            lanes[(e.get("pid"), e.get("tid"))] = e.get("args", {}).get("name")
    missing = [lane for lane in S.REQUIRED_LANES if lane not in lanes.values()]
    if missing:
        raise TraceError(
            f"missing lanes: {', '.join(missing)} (declare them with thread_name metadata)"
        )
    by_lane: dict[str, list[tuple[float, float, int]]] = {}
    for i, e in enumerate(events):
        if e["ph"] != "X":
            if e["ph"] in ("i", "I", "C") and not _is_number(e.get("ts")):
                raise TraceError(f"event {i} ({e.get('name')!r}) has no numeric ts")
            continue
        ts, dur = e.get("ts"), e.get("dur")
        if not (_is_number(ts) and _is_number(dur)):
            raise TraceError(f"span {i} ({e.get('name')!r}) needs numeric ts and dur")
        if dur < 0:
            raise TraceError(f"span {i} ({e.get('name')!r}) has a negative duration {dur}")
        lane = lanes.get((e.get("pid"), e.get("tid")))
        if lane is None:
            raise TraceError(
                f"span {i} ({e.get('name')!r}) is on pid/tid {e.get('pid')}/{e.get('tid')}, "
                "which no thread_name metadata names"
            )
        if lane in S.STREAM_LANES:
            by_lane.setdefault(lane, []).append((ts, ts + dur, i))
    for lane, spans in by_lane.items():
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
    return Trace(events=events, other_data=other)


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
