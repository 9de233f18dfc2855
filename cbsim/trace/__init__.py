"""The trace format shared by the simulator, the runtime and imported profiler traces."""

from cbsim.trace.builder import NO_BATCH, TraceBuilder, batch_args
from cbsim.trace.io import (
    TraceError,
    read_trace,
    read_traces,
    validate,
    write_merged_trace,
    write_trace,
)
from cbsim.trace.merge import merge_traces, split_merged
from cbsim.trace.model import Trace
from cbsim.trace.normalize import normalize

__all__ = [
    "NO_BATCH",
    "Trace",
    "TraceBuilder",
    "TraceError",
    "batch_args",
    "normalize",
    "merge_traces",
    "read_trace",
    "read_traces",
    "split_merged",
    "validate",
    "write_merged_trace",
    "write_trace",
]
