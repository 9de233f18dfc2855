"""Plotly HTML reports: report.html for a run, sweep.html for a Hydra multirun (docs/reports.md)."""

from cbsim.report.run_report import write_run_report

__all__ = ["write_run_report"]
