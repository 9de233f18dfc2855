"""Trace format v1: the names both back ends write and every reader relies on.

A trace is a Chrome Trace Event file (``{"traceEvents": [...], "otherData": {...}}``, times in
microseconds) so it opens as it is in Perfetto UI and chrome://tracing. docs/trace-format.md is
the prose version of this module.
"""

from __future__ import annotations

SCHEMA_NAME = "cbsim.trace"
SCHEMA_VERSION = 1

# Lanes: (process id, thread id, process name). A lane is named by its thread_name metadata event.
HOST = "host"
H2D = "h2d"
COMPUTE = "compute"
D2H = "d2h"
DEFAULT = "default"
REQUESTS = "requests"
STREAM_LANES = (H2D, COMPUTE, D2H, DEFAULT)
REQUIRED_LANES = (HOST, H2D, COMPUTE, D2H)
LANE_IDS: dict[str, tuple[int, int]] = {
    HOST: (1, 1),
    H2D: (2, 1),
    COMPUTE: (2, 2),
    D2H: (2, 3),
    DEFAULT: (2, 4),
    REQUESTS: (3, 1),
}
PROCESS_NAMES = {1: "cpu", 2: "gpu", 3: "requests"}

# Host phases (category "host"). "wait" is the host blocked on the GPU (an event or a sync).
SCHEDULE, PREPARE, LAUNCH, WAIT, UPDATE = "schedule", "prepare", "launch", "wait", "update"
HOST_PHASES = (SCHEDULE, PREPARE, LAUNCH, WAIT, UPDATE)

# Stream operations (category "gpu").
COPY_H2D, COPY_D2H = "copy_h2d", "copy_d2h"
FORWARD, GRAPH_REPLAY, CARRY_OVER = "forward", "graph_replay", "carry_over"
FORWARD_NAMES = (FORWARD, GRAPH_REPLAY)
GPU_OPS = (COPY_H2D, COPY_D2H, FORWARD, GRAPH_REPLAY, CARRY_OVER)

# Request lifecycle instants (lane "requests"), args: rid (+ tokens on finish). "scheduled":
# the request's first admission into a batch (its queue time ends there).
ARRIVAL, SCHEDULED, FIRST_TOKEN, FINISH = "arrival", "scheduled", "first_token", "finish"
REQUEST_EVENTS = (ARRIVAL, SCHEDULED, FIRST_TOKEN, FINISH)
REQUEST_ENDS = (FIRST_TOKEN, FINISH)
# A hazard the simulator detected (instant, category "hazard"), args: kind, step, slot.
HAZARD = "hazard"
HAZARD_KINDS = ("slot_overwrite", "carry_over_before_ready", "missing_event_wait")
# The scheduler's counter track (phase "C"): waiting, running, kv_blocks_used.
SCHEDULER_COUNTER = "scheduler"

# Args every span carries (-1 / "" where it does not apply).
SPAN_ARGS = ("step", "slot", "requests", "query_tokens", "kv_tokens", "kind")
# Batch kinds in args.kind.
BATCH_KINDS = ("prefill", "decode", "mixed", "")

# Sources in otherData.source.
SOURCES = ("sim", "runtime", "kineto")
