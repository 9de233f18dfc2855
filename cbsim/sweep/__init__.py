"""Hydra multirun sweeps: the summary callback, the summary tables and page (docs/reports.md)."""

from cbsim.sweep.callback import SweepSummary
from cbsim.sweep.outputs import SweepResult, write_summary
from cbsim.sweep.summary import collect_jobs, comparison_frame

__all__ = ["SweepResult", "SweepSummary", "collect_jobs", "comparison_frame", "write_summary"]
