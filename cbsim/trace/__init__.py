"""The trace format shared by the simulator, the runtime and imported profiler traces."""

from cbsim.trace.builder import TraceBuilder
from cbsim.trace.io import TraceError, read_trace, validate, write_trace
from cbsim.trace.model import Trace

__all__ = ["Trace", "TraceBuilder", "TraceError", "read_trace", "validate", "write_trace"]
