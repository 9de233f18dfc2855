"""The Hydra callback behind every multirun: one sweep per directory, a progress bar, the summary.

Registered in conf/config.yaml under hydra.callbacks.sweep_summary. It runs in the process that
launched the sweep (on_multirun_*) and in each job's process (on_job_*), whichever launcher runs
the jobs; it only reads and writes files in the sweep directory, so it works the same on one
machine, with joblib, and on SLURM or Ray nodes sharing that directory.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from cbsim.rundir import SWEEP_FILE, atomic_write_json, read_finished, read_json
from cbsim.sweep.outputs import write_summary
from cbsim.sweep.progress import close_bar, open_bar, update_bar
from cbsim.sweep.summary import expected_overrides, job_dirs
from hydra_plugins.cbsim_launcher import register as register_plugins

log = logging.getLogger("cbsim.sweep")


def finished_jobs(sweep_dir: Path) -> int:
    """Job directories holding a finished run (sizes checked; checksums when resumed)."""
    return sum(
        read_finished(job_dir, verify=False) is not None
        for _num, job_dir in job_dirs(Path(sweep_dir)).values()
    )


def _in_multirun(config: DictConfig) -> bool:
    """Hydra calls the job hooks for single runs too; they only speak in sweeps."""
    return str(OmegaConf.select(config, "hydra.mode", default="")).endswith("MULTIRUN")


def sweep_identity(config: DictConfig) -> list[str]:
    """What makes a sweep this sweep: its task overrides (sweeps expanded by the jobs)."""
    params = OmegaConf.select(config, "hydra.sweeper.params") or {}
    task = list(OmegaConf.select(config, "hydra.overrides.task") or [])
    return sorted([*(f"{k}={v}" for k, v in params.items()), *map(str, task)])


def claim_sweep_dir(sweep_dir: Path, identity: list[str], total: int | None) -> None:
    """Refuse a sweep directory that holds another sweep's jobs, naming the difference."""
    state = read_json(sweep_dir / SWEEP_FILE)
    before = state.get("overrides") if isinstance(state, dict) else None
    if before is not None and before != identity:
        gone = sorted(set(before) - set(identity)) or ["-"]
        new = sorted(set(identity) - set(before)) or ["-"]
        print(
            f"cbsim: config error: hydra.sweep.dir={sweep_dir} holds another sweep (only in "
            f"it: {' '.join(gone)}; only in this one: {' '.join(new)}); allowed: the same "
            "overrides (resume) or another hydra.sweep.dir",
            file=sys.stderr,
        )
        raise SystemExit(2)
    sweep_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_json(sweep_dir / SWEEP_FILE, {"overrides": identity, "total": total})


class SweepSummary(Callback):
    """Claims the sweep directory, shows progress, writes the sweep's summary at its end."""

    def __init__(self, min_speedup: float = 1.05, html: bool = True) -> None:
        self.min_speedup = float(min_speedup)
        self.html = bool(html)

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(str(config.hydra.sweep.dir))
        jobs = expected_overrides(config)
        total = len(jobs) if jobs is not None else None
        claim_sweep_dir(sweep_dir, sweep_identity(config), total)
        register_plugins()  # Hydra instantiates the sweeper and the launcher next
        done = finished_jobs(sweep_dir)
        log.info(
            "sweep: %s jobs into %s%s",
            total if total is not None else "?",
            sweep_dir,
            f" ({done} already finished there: skipped)" if done else "",
        )
        open_bar(total, initial=0)

    def on_job_end(self, config: DictConfig, job_return: Any, **kwargs: Any) -> None:
        if _in_multirun(config):
            update_bar(1)  # a job run in the launching process (a job process has no bar)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        close_bar()
        sweep_dir = Path(str(config.hydra.sweep.dir))
        result = write_summary(sweep_dir, config, html=self.html, min_speedup=self.min_speedup)
        missing = len(result.jobs) - result.finished
        log.info(
            "sweep summary: %d/%d jobs finished%s; %s%s",
            result.finished,
            len(result.jobs),
            f" ({missing} not: run again with hydra.sweep.dir={sweep_dir})" if missing else "",
            result.summary,
            f", {result.html}" if result.html else "",
        )
        print(result.verdict, flush=True)
