"""The Hydra callback behind every multirun: progress lines, then summary.csv and sweep.html.

Registered in conf/config.yaml under hydra.callbacks.sweep_summary. It runs in the process that
launched the sweep (on_multirun_*) and in each job's process (on_job_*), whichever launcher runs
the jobs; it only reads and writes files in the sweep directory, so it works the same on one
machine, with joblib, and on SLURM or Ray nodes sharing that directory.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from cbsim.sweep.summary import METRICS_FILE, expected_overrides, write_summary

log = logging.getLogger("cbsim.sweep")
STATE_FILE = ".cbsim_sweep.json"


def finished_jobs(sweep_dir: Path) -> int:
    return sum(1 for _ in Path(sweep_dir).glob(f"**/{METRICS_FILE}"))


def _in_multirun(config: DictConfig) -> bool:
    """Hydra calls the job hooks for single runs too; they only speak in sweeps."""
    return str(OmegaConf.select(config, "hydra.mode", default="")).endswith("MULTIRUN")


class SweepSummary(Callback):
    """Logs "job i/N" as jobs start and end; writes the sweep's summary when the multirun ends."""

    def __init__(self, min_speedup: float = 1.05, html: bool = True) -> None:
        self.min_speedup = float(min_speedup)
        self.html = bool(html)
        self.total: int | None = None

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(str(config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        jobs = expected_overrides(config)
        self.total = len(jobs) if jobs is not None else None
        (sweep_dir / STATE_FILE).write_text(json.dumps({"total": self.total}))
        done = finished_jobs(sweep_dir)
        log.info(
            "sweep: %s jobs into %s%s",
            self.total if self.total is not None else "?",
            sweep_dir,
            f" ({done} job dirs hold metrics.json: those with the same config are skipped)"
            if done
            else "",
        )

    def _total(self, config: DictConfig) -> str:
        if self.total is None:
            try:
                state = Path(str(config.hydra.sweep.dir)) / STATE_FILE
                self.total = json.loads(state.read_text())["total"]
            except (OSError, ValueError, KeyError, TypeError):
                pass
        return str(self.total) if self.total is not None else "?"

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        if not _in_multirun(config):
            return
        num = OmegaConf.select(config, "hydra.job.num")
        overrides = " ".join(OmegaConf.select(config, "hydra.overrides.task") or [])
        log.info("job %s/%s started: %s", (num or 0) + 1, self._total(config), overrides)

    def on_job_end(self, config: DictConfig, job_return: Any, **kwargs: Any) -> None:
        if not _in_multirun(config):
            return
        num = OmegaConf.select(config, "hydra.job.num")
        status = getattr(getattr(job_return, "status", None), "name", "?").lower()
        done = finished_jobs(Path(str(config.hydra.sweep.dir)))
        log.info(
            "job %s/%s %s; %d/%s finished in the sweep",
            (num or 0) + 1,
            self._total(config),
            status,
            done,
            self._total(config),
        )

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
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
