"""Metrics from a trace alone: the same code measures the simulator, the runtime and imports.

``compute_metrics(trace)`` is ``metrics_from(inputs_from_trace(trace))``: every metric is computed
from a few tables (``MetricInputs``) that a back end can also build directly, without a trace.
Definitions (docs/trace-format.md, "Metrics", says the same in prose):
- total time: from the first event's start to the last span's end.
- GPU idle fraction: the share of the total time during which the compute stream (lane
  ``compute``; ``default`` when everything ran on the legacy default stream) executes nothing.
- lane busy share: the union of a lane's spans over the total time.
- CPU blocked fraction: host time in ``wait`` spans (blocked on the GPU) over the total time.
- step: one forward pass; step time: the interval between consecutive forward ends (the first
  step from the start of the run), so it includes any CPU time the GPU was left waiting for.
- GPU idle split as Holistic Trace Analysis names it, host wait, kernel wait and other (idle.py).
- host work per step: the host lane's spans but ``wait`` over the steps, against the forwards'
  time per step, and the most of a sync step async could hide (why.py).
- serving metrics (TTFT, TPOT, ITL, E2EL, throughputs, goodput, offered load): serving.py;
  host stalls: stalls.py.
"""

from __future__ import annotations

from typing import Any

from cbsim.metrics.idle import idle_split_metrics
from cbsim.metrics.inputs import INSTANT_FIELDS, SPAN_FIELDS, MetricInputs, inputs_from_trace
from cbsim.metrics.serving import serving_metrics
from cbsim.metrics.stalls import stall_metrics, stall_spans
from cbsim.metrics.table import SUMMARY_ROWS, compare_metrics, format_table
from cbsim.metrics.timeline import PERCENTILES, timeline_metrics, weight_bytes_read_per_step
from cbsim.metrics.why import host_work_metrics, why_line, why_sentence
from cbsim.trace.model import Trace

__all__ = [
    "INSTANT_FIELDS",
    "PERCENTILES",
    "SPAN_FIELDS",
    "SUMMARY_ROWS",
    "MetricInputs",
    "compare_metrics",
    "compute_metrics",
    "format_table",
    "inputs_from_trace",
    "metrics_from",
    "stall_spans",
    "weight_bytes_read_per_step",
    "why_line",
    "why_sentence",
]


def metrics_from(inp: MetricInputs) -> dict[str, Any]:
    """Every metric cbsim reports, as a flat JSON-ready dict (None where not measurable)."""
    out = timeline_metrics(inp)
    out.update(serving_metrics(inp))
    out.update(stall_metrics(inp))
    out.update(host_work_metrics(inp))
    out.update(idle_split_metrics(inp))
    return out


def compute_metrics(trace: Trace) -> dict[str, Any]:
    """``metrics_from`` the tables of a trace."""
    return metrics_from(inputs_from_trace(trace))
