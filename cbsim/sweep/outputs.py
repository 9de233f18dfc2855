"""A sweep's own files, written once when it ends: summary.csv, comparison.csv, sweep.html.

Above both the tables (summary.py) and the page (report.py), so neither imports the other back.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig

from cbsim.rundir import COMPARISON_FILE, SUMMARY_FILE, SWEEP_HTML
from cbsim.sweep.report import jobs_verdict, write_sweep_report
from cbsim.sweep.summary import (
    FINISHED,
    Job,
    collect_jobs,
    comparison_frame,
    summary_frame,
    write_csv,
)


@dataclass
class SweepResult:
    jobs: list[Job]
    summary: Path
    comparison: Path
    html: Path | None
    verdict: str

    @property
    def finished(self) -> int:
        return sum(j.status == FINISHED for j in self.jobs)


def write_summary(
    sweep_dir: Path,
    multirun_cfg: DictConfig | None = None,
    html: bool = True,
    min_speedup: float = 1.05,
) -> SweepResult:
    """summary.csv, comparison.csv and (html=True) sweep.html in the sweep directory."""
    sweep_dir = Path(sweep_dir)
    return write_tables(sweep_dir, collect_jobs(sweep_dir, multirun_cfg), html, min_speedup)


def write_tables(
    sweep_dir: Path, jobs: list[Job], html: bool = True, min_speedup: float = 1.05
) -> SweepResult:
    """The sweep's files from its jobs (found on disk, or simulated in one process by the grid
    sweep)."""
    summary = write_csv(summary_frame(jobs, sweep_dir), sweep_dir / SUMMARY_FILE)
    comp = comparison_frame(jobs)
    comparison = write_csv(comp, sweep_dir / COMPARISON_FILE)
    page = write_sweep_report(jobs, comp, sweep_dir / SWEEP_HTML, min_speedup) if html else None
    return SweepResult(jobs, summary, comparison, page, jobs_verdict(jobs, comp, min_speedup))
