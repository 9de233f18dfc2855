"""Read and write trace files; a bad file is a TraceError naming the file and the reason.

Reading is bounded (cbsim.trace.load: size, decompressed size, nesting) and checked
(cbsim.trace.checks); a recorded runtime trace comes back normalised (cbsim.trace.normalize).
Writing is atomic (cbsim.rundir.atomic_open): an interrupted write leaves nothing under the
final name.
"""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

from cbsim.rundir import PARTIAL, atomic_open
from cbsim.trace.checks import OVERLAP_TOLERANCE_US, validate
from cbsim.trace.errors import TraceError
from cbsim.trace.load import DEFAULT_MAX_BYTES, DEFAULT_MAX_EVENTS, load_json
from cbsim.trace.merge import merge_traces, split_merged
from cbsim.trace.model import Trace
from cbsim.trace.normalize import normalize
from cbsim.trace.perfetto import with_derived

# zlib's default: a 25 MB trace in 2 s to 2.0 MB (level 9: 5.7 s to 1.9 MB); the trace of an
# interrupted run is written as fast as gzip goes (level 1: 0.7 s to 2.7 MB), the user waiting
GZIP_LEVEL = 6
GZIP_LEVEL_PARTIAL = 1

__all__ = [
    "DEFAULT_MAX_BYTES",
    "DEFAULT_MAX_EVENTS",
    "OVERLAP_TOLERANCE_US",
    "TraceError",
    "load_json",
    "read_trace",
    "read_traces",
    "write_merged_trace",
    "validate",
    "write_trace",
]


def write_trace(trace: Trace, path: str | os.PathLike[str]) -> Path:
    """Write JSON (gzip when the name ends in .gz); compact and key-sorted so runs compare byte
    for byte. The file holds the flows and request slices derived from the trace's spans
    (cbsim.trace.perfetto); a trace written under a ``*_partial`` name is marked incomplete."""
    path = Path(path)
    trace = with_derived(trace)
    if PARTIAL in path.name and not trace.incomplete:
        trace = trace.mark_incomplete("interrupted")
    data = json.dumps(trace.to_json_obj(), separators=(",", ":"), sort_keys=True).encode()
    level = GZIP_LEVEL_PARTIAL if PARTIAL in path.name else GZIP_LEVEL
    with atomic_open(path) as raw:
        if path.suffix == ".gz":
            # mtime=0 keeps gzip output byte-identical across runs
            with gzip.GzipFile(
                filename="", fileobj=raw, mode="wb", mtime=0, compresslevel=level
            ) as f:
                f.write(data)
        else:
            raw.write(data)
    return path


def read_trace(
    path: str | os.PathLike[str],
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_events: int = DEFAULT_MAX_EVENTS,
) -> Trace:
    """Read and validate a trace file; a recorded runtime trace comes back normalised
    (cbsim.trace.normalize: clock drift and graph starts corrected)."""
    obj = load_json(path, max_bytes, max_events=max_events)
    try:
        return normalize(validate(obj))
    except TraceError as exc:
        raise TraceError(f"{path}: {exc}") from None
    except RecursionError:
        raise TraceError(f"{path}: nested too deeply to be a trace") from None


def read_traces(
    path: str | os.PathLike[str],
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_events: int = DEFAULT_MAX_EVENTS,
) -> dict[str, Trace]:
    """The runs in a trace file by label: the runs of a merged trace (cbsim.trace.merge), else
    the one run under its engine's name."""
    return split_merged(read_trace(path, max_bytes, max_events))


def write_merged_trace(traces: dict[str, Trace], path: str | os.PathLike[str]) -> Path:
    """One file with each run as a named Perfetto process ({"sync": ..., "async": ...})."""
    return write_trace(merge_traces(traces), path)
