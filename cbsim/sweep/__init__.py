"""Hydra multirun sweeps: the summary callback and the summary tables (docs/reports.md)."""

from cbsim.sweep.callback import SweepSummary
from cbsim.sweep.summary import collect_jobs, comparison_frame, write_summary

__all__ = ["SweepSummary", "collect_jobs", "comparison_frame", "write_summary"]
